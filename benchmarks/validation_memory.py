"""The validation's memory as its data grows: podium's reader against the ones it replaced, and against
the reader that keeps freed memory run with the system allocator, in fresh processes, interleaved.

    python benchmarks/validation_memory.py              # 3 rounds, about 3 minutes; writes BENCHMARKS.md
    python benchmarks/validation_memory.py --no-write   # print only

What runs: podium's built-in model (16 features, 4 classes) evaluated on benchmarks/data_scale.py's
validation data, 1x (one 40,000-row file) then 16x (16 such files), three calls at each, in one process per
way and round (no Ray: the process is what a validation worker is, minus Ray's own memory). Ways:
- scanner: one pyarrow scanner over the whole dataset (`fragment_readahead=1`, `batch_readahead=1`), what
  `podium.training.data.iter_arrays` did before 2026-11-24;
- files, kept: `iter_arrays` as it was from 2026-11-24 (`8d1551a`): the files one after another, and what
  the allocators keep of each file's buffers kept;
- files: `iter_arrays` as it is: the same, and that memory given back to the system after each batch
  (each file here: one batch of 40,000 rows) (`release_freed_memory`: pyarrow's pool `release_unused()`,
  glibc's `malloc_trim(0)`);
- files, system allocator: "files, kept" with `ARROW_DEFAULT_MEMORY_POOL=system` and
  `MALLOC_MMAP_THRESHOLD_=131072` (every buffer over 128 KiB mapped and unmapped: freed memory goes back
  to the system at once).
Per call: the wall time, and the private memory (RssAnon) before and at its peak (sampled every 5 ms).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

WAYS = {"scanner": {}, "files, kept": {}, "files": {},
        "files, system allocator": {"ARROW_DEFAULT_MEMORY_POOL": "system", "MALLOC_MMAP_THRESHOLD_": "131072"}}
SCALES, CALLS = (1, 16), 3


def _private_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(way: str, root: Path) -> None:
    """One process of one way: CALLS calls at each scale, a JSON line each."""
    import torch

    from benchmarks.data_scale import FEATURES
    from podium.training import data
    from podium.training.data import _to_arrays, iter_arrays, open_dataset
    from podium.training.model import ModelSpec, build_model, evaluate_batches

    torch.set_num_threads(1)
    if way != "files":
        data.RELEASE_AFTER_BYTES = sys.maxsize  # never given back
    model = build_model(ModelSpec(FEATURES, 4))
    features = [f"f{i:02d}" for i in range(FEATURES)]

    def batches(uri: str) -> Any:
        if way == "scanner":
            scanner = open_dataset(uri).scanner(columns=[*features, "label"], batch_size=65536, batch_readahead=1,
                                                fragment_readahead=1)
            arrays = (_to_arrays(b, "label", features) for b in scanner.to_batches() if b.num_rows)
        else:
            arrays = iter_arrays(uri, "label", features)
        return ((torch.from_numpy(x), torch.from_numpy(y)) for x, y in arrays)

    for scale in SCALES:
        for call in range(CALLS):
            before, peak, stop = _private_mb(), [0.0], threading.Event()

            def sample() -> None:
                while not stop.wait(0.005):
                    peak[0] = max(peak[0], _private_mb())

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            began = time.perf_counter()
            evaluate_batches(model, batches(str(root / f"x{scale}" / "val")))
            wall = time.perf_counter() - began
            stop.set()
            sampler.join()
            print(json.dumps({"scale": scale, "call": call, "wall_s": wall, "before_mb": before,
                              "peak_mb": max(peak[0], _private_mb())}), flush=True)


def make_val_data(root: Path) -> None:
    """benchmarks/data_scale.py's validation data at 1x and 16x (the same files its make_data writes)."""
    from benchmarks.data_scale import VAL_ROWS_1X, write_part

    for scale in SCALES:
        for i in range(scale):
            part = root / f"x{scale}" / "val" / f"part-{i:02d}.parquet"
            if not part.exists():
                write_part(part, VAL_ROWS_1X, 2000 + i)


def main() -> None:
    """Run the ways interleaved, print the table, write it into BENCHMARKS.md."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="rounds of every way, interleaved (default 3)")
    p.add_argument("--workdir", help="keep the data here (default: a temporary folder)")
    p.add_argument("--no-write", action="store_true", help="print only")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    root = Path(args.workdir or tempfile.mkdtemp(prefix="podium-valmem-"))
    if args.child:
        child(args.child, root)
        return
    from benchmarks.report import spread

    make_val_data(root)
    started = time.time()
    rows: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS}
    for _ in range(args.repeats):
        for way, env in WAYS.items():
            out = subprocess.run([sys.executable, __file__, "--child", way, "--workdir", str(root)],
                                 env={**os.environ, **env}, capture_output=True, text=True, check=True).stdout
            rows[way] += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    lines = ["| way | 1×: call (s) | 1×: private peak (MB) | 16×: call (s) | 16×: private peak (MB) | peak 16× / 1× |",
             "|---|---|---|---|---|---|"]
    for way, rs in rows.items():
        at = {s: [r for r in rs if r["scale"] == s] for s in SCALES}
        peaks = {s: statistics.median(r["peak_mb"] for r in at[s]) for s in SCALES}
        lines.append(f"| {way} | {spread([r['wall_s'] for r in at[1]], 3)} | {spread([r['peak_mb'] for r in at[1]], 0)} "
                     f"| {spread([r['wall_s'] for r in at[16]], 3)} | {spread([r['peak_mb'] for r in at[16]], 0)} "
                     f"| {peaks[16] / peaks[1]:.2f} |")
    table = "\n".join(lines)
    print(table)
    if args.no_write:
        return
    from benchmarks.workload import machine_description, update_markdown_section

    m = machine_description()
    body = (f"## Validation memory as the data grows (`benchmarks/validation_memory.py`)\n\n"
            f"Command: `python benchmarks/validation_memory.py --repeats {args.repeats}`. Measured "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, {args.repeats} interleaved rounds of "
            f"every way, one process each, {CALLS} calls at 1× then {CALLS} at 16× (the 16× calls follow the 1× "
            f"ones in the same process); median (min–max) over all calls. Machine: {m['cpu']}, {m['cores']} "
            f"cores; {m['versions']}; podium at {m['revision']}.\n\n{table}\n")
    update_markdown_section(REPO / "BENCHMARKS.md", "validation_memory", body)


if __name__ == "__main__":
    main()
