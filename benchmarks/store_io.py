"""Checkpoint I/O on each store: podium against the store's own SDK copying the same bytes.

    python benchmarks/store_io.py                                   # local, S3, GCS, Azure; 4 .. 256 MB
    python benchmarks/store_io.py --stores local,gs --sizes 4,16,64 # a quick look
    python benchmarks/store_io.py --stores s3 --endpoint http://minio:9000 --bucket scratch   # a real S3 store

Each store runs on loopback: local disk (a temporary folder), S3 on moto, GCS on gcp-storage-emulator and
Azure Blob on Azurite, started with the tests' helpers (tests/helpers) and stopped at the end. For each size, a
checkpoint folder like podium's (model.pt ⅓, optimizer.pt ⅔, podium.json) is

  upload    persisted the way Ray Train 2.60 does it (`create_dir` + `pyarrow.fs.copy_files`) onto podium's
            pyarrow filesystem for the store (`podium.storage.locations.arrow_filesystem`)
  download  fetched with `ray.train.Checkpoint.to_directory` from the same filesystem
  promote   staged into a serving version on the same store (`podium.serving.staging.stage_version`: the
            manifest's sha256 of every file, the copy, its verification)

against the SDK's own copy of the same folder: `shutil.copytree` on local disk; s3fs / gcsfs / adlfs `put`
(upload) and `get` (download, promotion: hashing the source reads its bytes once, a `get` is that read alone).
The ratio raw time / podium time, per round, is the fraction of what the store takes that podium gets (goal
≥ 0.8). Methods are interleaved within a round so load drift hits all of them alike; medians of --repeats
rounds with their range, after one untimed round (connections, imports). CPU-seconds are this process's
(user + system, `resource.getrusage`): the servers' own CPU is not in them, so on a shared, noisy machine
they say what each method costs podium's side.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fsspec

from benchmarks.checkpoint_io import ray_download, ray_upload, write_checkpoint
from benchmarks.workload import load_average, machine_description, markdown_table, start_moto, update_markdown_section
from podium.serving import staging
from podium.storage.locations import arrow_filesystem, fsspec_filesystem

STORES = {"local": "local disk", "s3": "S3 (moto)", "gs": "GCS (gcp-storage-emulator)", "az": "Azure (Azurite)"}
OPERATIONS = ["upload", "download", "promote"]
Plan = list[tuple[str, Callable[[], None], Callable[[], None]]]


def log(msg: str) -> None:
    """Progress on stderr."""
    print(f"[store_io {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load_of() -> str:
    """The 1, 5 and 15 minute load averages."""
    return load_average().rsplit("load average:", 1)[-1].strip()


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@contextlib.contextmanager
def serve_store(store: str, work: Path, bucket: str, endpoint: str | None) -> Iterator[str]:
    """The root URI of `bucket` on `store`, its server started (and stopped after) and this process pointed at it."""
    if store == "local":
        yield str(work / "store")
        return
    tests = str(Path(__file__).resolve().parent.parent / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)  # the tests' helpers package
    from helpers.object_stores import start_azurite, start_gcs_emulator

    if store == "s3" and endpoint:
        os.environ["PODIUM_S3_ENDPOINT_URL"] = endpoint
        yield f"s3://{bucket}"
        return
    if store == "s3":
        server = start_moto(work)
        server.create_bucket(bucket)
    elif store == "gs":
        server = start_gcs_emulator(work / "gcs.log", bucket, preconditions=True)
        fsspec.config.conf["gs"] = {"token": "anon"}  # fsspec read FSSPEC_GCS_TOKEN when it was imported
    else:
        server = start_azurite(work / "azurite.log")
    os.environ.update(server.env())
    try:
        if store == "az":
            fs, _ = fsspec_filesystem(f"az://{bucket}")
            fs.mkdir(bucket)
        yield f"{store}://{bucket}"
    finally:
        server.stop()


def plan_for(root: str, src: Path, work: Path, size_mb: int) -> tuple[Plan, Callable[[], None]]:
    """The methods of one round (name, run, clean up), and how to remove what they share."""
    fs, base = fsspec_filesystem(f"{root}/podium-store-io/{size_mb}")
    arrow, _ = arrow_filesystem(root)
    persisted, scratch, serving, dst = f"{base}/persisted", f"{base}/scratch", f"{base}/serving", work / "dst"
    uri = (lambda path: path) if root.startswith("/") else (lambda path: f"{root.split('://')[0]}://{path}")
    local = root.startswith("/")
    if local:
        shutil.copytree(src, persisted)
    else:
        fs.put(f"{src}/", f"{persisted}/", recursive=True)

    def rm(path: str) -> Callable[[], None]:
        def clean() -> None:
            if fs.exists(path):
                fs.rm(path, recursive=True)
            fs.invalidate_cache()
        return clean

    def rm_local() -> None:
        shutil.rmtree(dst, ignore_errors=True)

    promote: tuple[str, Callable[[], None], Callable[[], None]] = (
        "promote podium", lambda: staging.stage_version(uri(serving), uri(persisted), {"step": 0}), rm(serving))
    upload: tuple[str, Callable[[], None], Callable[[], None]] = (
        "upload podium", lambda: ray_upload(str(src), scratch, arrow), rm(scratch))
    download: tuple[str, Callable[[], None], Callable[[], None]] = (
        "download podium", lambda: ray_download(persisted, str(dst), arrow), rm_local)
    if local:  # one raw copy stands for all three: copytree reads the folder once and writes it once
        plan: Plan = [("copy raw", lambda: shutil.copytree(src, scratch), rm(scratch)), upload, download, promote]
    else:
        plan = [("upload raw", lambda: fs.put(f"{src}/", f"{scratch}/", recursive=True), rm(scratch)), upload,
                ("download raw", lambda: fs.get(f"{persisted}/", f"{dst}/", recursive=True), rm_local), download,
                promote]
    return plan, rm(base)


def run_rounds(plan: Plan, repeats: int) -> dict[str, list[tuple[float, float]]]:
    """(seconds, CPU-seconds of this process) of every method in each of `repeats` interleaved rounds."""
    out: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in plan}
    for _ in range(repeats):
        for name, fn, cleanup in plan:
            os.sync()
            cpu, t = _cpu_s(), time.perf_counter()
            fn()
            out[name].append((time.perf_counter() - t, _cpu_s() - cpu))
            cleanup()
    return out


def raw_of(times: dict[str, list[tuple[float, float]]], operation: str) -> str:
    """The raw method podium's `operation` is measured against."""
    if "copy raw" in times:
        return "copy raw"
    return "upload raw" if operation == "upload" else "download raw"


def ratios(times: dict[str, list[tuple[float, float]]], operation: str) -> list[float]:
    """raw seconds / podium seconds, round by round."""
    raw = times[raw_of(times, operation)]
    return [r[0] / p[0] for r, p in zip(raw, times[f"{operation} podium"])]


def spread(values: list[float]) -> str:
    """median (min–max), two decimals."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def median_s(times: dict[str, list[tuple[float, float]]], name: str, field: int) -> float:
    """The median of one method's seconds (field 0) or CPU-seconds (field 1)."""
    return statistics.median(t[field] for t in times[name])


def render(results: dict[str, dict[int, tuple[int, dict]]], args: argparse.Namespace, loads: list[str]) -> str:
    """The BENCHMARKS.md section: one row per store, the sizes side by side in each cell."""
    m = machine_description()
    largest = max(next(iter(results.values())))
    rows = []
    for store, by_size in results.items():
        sizes = sorted(by_size)
        nbytes, big = by_size[largest]
        mbs = " / ".join(f"{nbytes / 2**20 / median_s(big, raw_of(big, op), 0):,.0f}" for op in OPERATIONS[:2])
        cpu = " · ".join(f"{median_s(big, f'{op} podium', 1):.2f}/{median_s(big, raw_of(big, op), 1):.2f}"
                         for op in OPERATIONS)
        rows.append([STORES[store], mbs, *(" · ".join(spread(ratios(by_size[size][1], op)) for size in sizes)
                                          for op in OPERATIONS), cpu])
    worst = [f"{STORES[store]} " + " / ".join(
        f"{min(statistics.median(ratios(t, op)) for _, t in by_size.values()):.2f}" for op in OPERATIONS)
        for store, by_size in results.items()]
    command = " ".join(["python benchmarks/store_io.py", *args.argv])
    sizes_mb = " · ".join(f"{size} MB" for size in sorted(next(iter(results.values()))))
    head = (f"Command: `{command}` ({args.repeats} interleaved rounds), every server on loopback sharing the cores. "
            f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory']}; {m['versions']}. load average {'; '.join(loads)}. "
            f"Ratios: raw time / podium time, median (range) over the rounds, at {sizes_mb} (goal ≥ 0.80). Raw: "
            "`shutil.copytree` on local disk; the SDK's (s3fs, gcsfs, adlfs) `put` for uploads, `get` for downloads "
            f"and promotion. Raw MB/s and this process's CPU-s (podium/raw) at {largest} MB.")
    headers = ["store", "raw MB/s up / down", *OPERATIONS, "CPU-s up · down · promote"]
    return "\n\n".join(["## Checkpoint I/O on each store (`benchmarks/store_io.py`)", head,
                        markdown_table(headers, rows),
                        "Worst median ratio over sizes, upload / download / promote: " + "; ".join(worst) + "."]) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Measure, print, optionally write BENCHMARKS.md."""
    p = argparse.ArgumentParser(description="Checkpoint upload, download and promotion on each store vs its SDK.")
    p.add_argument("--stores", default=",".join(STORES), help=f"comma-separated, of {', '.join(STORES)}")
    p.add_argument("--sizes", default="4,16,64,256", help="checkpoint sizes in MB, comma-separated")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds per size (median and range kept)")
    p.add_argument("--endpoint", help="an S3 endpoint to measure instead of moto (credentials from the AWS chain)")
    p.add_argument("--bucket", default="podium-bench", help="bucket (container) to use; made on the emulators")
    p.add_argument("--output", default="", help="markdown file to update (e.g. BENCHMARKS.md; default: none)")
    args = p.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    stores = args.stores.split(",")
    unknown = sorted(set(stores) - set(STORES))
    if unknown:
        p.error(f"--stores: unknown {', '.join(unknown)}; expected some of {', '.join(STORES)}")
    sizes = [int(s) for s in args.sizes.split(",")]
    loads = [f"before {load_of()}"]
    results: dict[str, dict[int, tuple[int, dict]]] = {}
    with tempfile.TemporaryDirectory(prefix="podium-store-io-") as tmp:
        work = Path(tmp)
        sources = {size: (work / f"src-{size}", write_checkpoint(work / f"src-{size}", size)) for size in sizes}
        for store in stores:
            with serve_store(store, work, args.bucket, args.endpoint) as root:
                results[store] = {}
                plan, remove = plan_for(root, *sources[sizes[0]][:1], work, 0)
                run_rounds(plan, 1)  # untimed: connections, imports and the server's first requests
                remove()
                for size, (src, nbytes) in sources.items():
                    plan, remove = plan_for(root, src, work, size)
                    times = run_rounds(plan, args.repeats)
                    remove()
                    results[store][size] = (nbytes, times)
                    log(f"{store} {size} MB: " + ", ".join(
                        f"{op} {statistics.median(ratios(times, op)):.2f}×" for op in OPERATIONS))
    print(text := render(results, args, [*loads, f"after {load_of()}"]))
    if args.output:
        update_markdown_section(args.output, "store_io", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
