"""Checkpoint I/O: Ray Train's storage path against a plain copy of the same bytes on local disk.

    python benchmarks/checkpoint_io.py           # 4 MB .. 1 GB, writes BENCHMARKS.md
    python benchmarks/checkpoint_io.py --quick   # 4 MB .. 64 MB

For each size, a checkpoint folder like podium's (model.pt ⅓, optimizer.pt ⅔, podium.json) of
random bytes is
  upload    persisted the way Ray Train 2.60 does it (`StorageContext.persist_current_checkpoint`:
            `create_dir` + `pyarrow.fs.copy_files` with a 64 MiB chunk, from the Checkpoint's filesystem
            to the storage filesystem podium passes, `podium.storage.locations.arrow_filesystem`)
  download  fetched with `ray.train.Checkpoint.to_directory` (what `as_directory` does for a
            non-local checkpoint; for a local one it is zero-copy)
  promote   copied into a serving version by podium (`podium.serving.staging.stage_version`: sha256 of
            the source, fsspec copy, sha256 of the copy)
each against `shutil.copytree` of the same folder. "via fsspec" rows put the local disk behind
`pyarrow.fs.PyFileSystem(FSSpecHandler(...))`, which is how podium hands Ray a remote URI (s3://, gs://):
on local disk it isolates the cost of that wrapper. Times are medians of --repeats runs, page cache warm
(every source was just written), no fsync on either side; `os.sync()` before each timed copy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fsspec
import numpy as np
import pyarrow.fs as pafs
import ray.train
from ray.train.v2._internal.execution.storage import _pyarrow_fs_copy_files

from benchmarks.workload import (
    load_average,
    machine_description,
    markdown_table,
    update_markdown_section,
)
from podium.serving import staging
from podium.storage.locations import arrow_filesystem

REPO = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    """Progress on stderr."""
    print(f"[checkpoint_io {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def write_checkpoint(path: Path, size_mb: int) -> int:
    """A podium-like checkpoint folder of `size_mb` MiB of random bytes; returns its size in bytes."""
    path.mkdir(parents=True)
    rng = np.random.default_rng(size_mb)
    total = size_mb << 20
    parts = {"model.pt": total // 3, "optimizer.pt": total - total // 3}
    for name, n in parts.items():
        with open(path / name, "wb") as f:
            left = n
            while left:
                chunk = min(left, 64 << 20)
                f.write(rng.bytes(chunk))
                left -= chunk
    (path / "podium.json").write_text('{"format": "podium/1"}')
    return sum(p.stat().st_size for p in path.iterdir())


def fsspec_wrapped() -> pafs.FileSystem:
    """Local disk behind pyarrow's fsspec handler: podium's route for remote URIs, minus the network."""
    return pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem("file")))


def ray_upload(src: str, dst: str, dest_fs: pafs.FileSystem) -> None:
    """StorageContext.persist_current_checkpoint, for a checkpoint made with Checkpoint.from_directory."""
    checkpoint = ray.train.Checkpoint.from_directory(src)
    dest_fs.create_dir(dst)
    _pyarrow_fs_copy_files(source=checkpoint.path, destination=dst, source_filesystem=checkpoint.filesystem,
                           destination_filesystem=dest_fs)


def ray_download(src: str, dst: str, fs: pafs.FileSystem) -> None:
    """Checkpoint.to_directory of a persisted checkpoint."""
    ray.train.Checkpoint(path=src, filesystem=fs).to_directory(dst)


def timed(fn: Callable[[], None], cleanup: Callable[[], None], repeats: int) -> float:
    """Median seconds of `fn` over `repeats` runs, `cleanup` after each."""
    times = []
    for _ in range(repeats):
        os.sync()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        cleanup()
    return statistics.median(times)


def measure(work: Path, size_mb: int, repeats: int) -> dict[str, float]:
    """Seconds per method for one size."""
    src = work / f"src-{size_mb}"
    nbytes = write_checkpoint(src, size_mb)
    persisted = work / f"persisted-{size_mb}"
    storage_fs, _ = arrow_filesystem(str(work))  # what podium passes to RunConfig for a local storage path
    ray_upload(str(src), str(persisted), storage_fs)
    dst = work / "dst"

    def rm() -> None:
        shutil.rmtree(dst, ignore_errors=True)

    wrapped = fsspec_wrapped()
    out = {"bytes": nbytes}
    # interleave methods, so drift in machine load hits all of them alike
    plan = [
        ("upload raw", lambda: shutil.copytree(src, dst)),
        ("upload ray", lambda: ray_upload(str(src), str(dst), storage_fs)),
        ("upload ray via fsspec", lambda: ray_upload(str(src), str(dst), wrapped)),
        ("download raw", lambda: shutil.copytree(persisted, dst)),
        ("download ray", lambda: ray_download(str(persisted), str(dst), pafs.LocalFileSystem())),
        ("download ray via fsspec", lambda: ray_download(str(persisted), str(dst), wrapped)),
        ("promote podium", lambda: staging.stage_version(str(dst), str(persisted), {"step": 0})),
    ]
    for name, fn in plan:
        out[name] = timed(fn, rm, repeats)
    shutil.rmtree(src)
    shutil.rmtree(persisted)
    return out


def render(results: dict[int, dict[str, float]], args: argparse.Namespace, loads: list[str]) -> str:
    """The BENCHMARKS.md section."""
    m = machine_description()
    cmd = "python benchmarks/checkpoint_io.py" + (" --quick" if args.quick else "")
    rows = []
    for size, r in sorted(results.items()):
        mb = r["bytes"] / 2**20

        def cell(key: str, raw: str) -> str:
            thr = mb / r[key]
            return f"{thr:,.0f} MB/s ({r[raw] / r[key]:.2f}×)"

        rows.append([f"{size} MB", f"{mb / r['upload raw']:,.0f} MB/s", cell("upload ray", "upload raw"),
                     cell("upload ray via fsspec", "upload raw"), f"{mb / r['download raw']:,.0f} MB/s",
                     cell("download ray", "download raw"), cell("download ray via fsspec", "download raw"),
                     cell("promote podium", "upload raw")])
    worst = {k: min(r["upload raw" if k.startswith(("upload", "promote")) else "download raw"] / r[k]
                    for r in results.values())
             for k in ("upload ray", "upload ray via fsspec", "download ray", "download ray via fsspec",
                       "promote podium")}
    lines = [
        "## Checkpoint I/O through Ray Train's storage path (`benchmarks/checkpoint_io.py`)", "",
        f"Command: `{cmd}` (repeats {args.repeats}). Measured {time.strftime('%Y-%m-%d %H:%M %Z')} on "
        f"{m['cpu']}, {m['cores']} cores, {m['memory']}; local disk (ext4 on a virtual block device), "
        f"{m['versions']}; podium at {m['revision']}.", "",
        "Load: " + "; ".join(loads), "",
        "Throughput, and in brackets the ratio to a raw `shutil.copytree` of the same bytes (1.00× = as fast; "
        "goal ≥ 0.80×). Page cache warm, no fsync on either side.", "",
        markdown_table(["size", "upload raw", "upload Ray", "upload Ray via fsspec", "download raw",
                        "download Ray (`to_directory`)", "download Ray via fsspec",
                        "podium promote copy (sha256 ×2 + copy)"], rows), "",
        "Worst ratio over sizes: " + ", ".join(f"{k} {v:.2f}×" for k, v in worst.items()) + ".", "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure, print, write BENCHMARKS.md."""
    p = argparse.ArgumentParser(description="Checkpoint upload/download through Ray Train vs a raw copy.")
    p.add_argument("--quick", action="store_true", help="sizes up to 64 MB")
    p.add_argument("--sizes", help="comma-separated sizes in MB (overrides --quick)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workdir", help="scratch folder on the disk to measure (default: a temporary folder)")
    p.add_argument("--output", default=str(REPO / "BENCHMARKS.md"), help="markdown file to update ('' for none)")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else \
        [4, 16, 64] if args.quick else [4, 16, 64, 256, 1024]
    loads = [f"before: {load_average()}"]
    results = {}
    with tempfile.TemporaryDirectory(prefix="podium-ckpt-io-", dir=args.workdir) as tmp:
        for size in sizes:
            results[size] = measure(Path(tmp), size, args.repeats)
            r = results[size]
            log(f"{size} MB: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in r.items() if k != "bytes"))
    loads.append(f"after: {load_average()}")
    text = render(results, args, loads)
    print(text)
    if args.output:
        update_markdown_section(args.output, "checkpoint_io", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
