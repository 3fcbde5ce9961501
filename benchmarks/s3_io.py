"""Checkpoint I/O on S3: podium's filesystem under Ray Train against raw s3fs put/get of the same bytes.

    python benchmarks/s3_io.py                        # 4 MB .. 1 GB against moto on loopback
    python benchmarks/s3_io.py --sizes 4,16,64        # a quick look
    python benchmarks/s3_io.py --endpoint http://minio:9000 --bucket scratch   # a real store (AWS chain creds)

For each size, a checkpoint folder like podium's (model.pt ⅓, optimizer.pt ⅔, podium.json) is
  upload    persisted the way Ray Train 2.60 does it (`create_dir` + `pyarrow.fs.copy_files`, 64 MiB
            chunks) onto a filesystem: podium's (`podium.storage.locations.arrow_filesystem`: parallel multipart
            uploads), the fsspec wrapper podium used before (`FSSpecHandler(s3fs)`: one part at a time),
            and Ray's default for a bare s3:// storage_path (pyarrow's S3FileSystem, `use_threads=False`)
  download  fetched with `ray.train.Checkpoint.to_directory` (what `as_directory` does) from the same three
  promote   copied into a serving version on the same store (`podium.serving.staging.stage_version`: sha256 of
            the source read once, server-side copy verified by the store)
against `s3fs.S3FileSystem.put` / `.get` (recursive) of the same folder to the same server: the ratio
raw time / podium time is the fraction of what the store takes that podium gets (goal ≥ 0.8).
Medians of --repeats runs, methods interleaved so load drift hits all of them alike.
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

import pyarrow.fs as pafs

from benchmarks.checkpoint_io import ray_download, ray_upload, write_checkpoint
from benchmarks.workload import load_average, machine_description, markdown_table, start_moto, update_markdown_section
from podium.serving import staging
from podium.storage.locations import arrow_filesystem
from podium.storage.s3 import s3_filesystem, s3_settings

REPO = Path(__file__).resolve().parent.parent
METHODS = ["upload raw", "upload podium", "upload fsspec", "upload ray-default",
           "download raw", "download podium", "download fsspec", "download ray-default", "promote podium"]


def log(msg: str) -> None:
    """Progress on stderr."""
    print(f"[s3_io {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def filesystems() -> dict[str, pafs.FileSystem]:
    """The three ways Ray can be handed an S3 storage path."""
    s = s3_settings()
    native = pafs.S3FileSystem(endpoint_override=s.endpoint_url, region=s.region or "us-east-1",
                               scheme="https" if (s.endpoint_url or "https").startswith("https") else "http")
    return {"podium": arrow_filesystem("s3://bucket")[0],
            "fsspec": pafs.PyFileSystem(pafs.FSSpecHandler(s3_filesystem())),
            "ray-default": native}


def timed(fn: Callable[[], None], cleanup: Callable[[], None]) -> float:
    """Seconds of one run of `fn`, `cleanup` after it."""
    t = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - t
    cleanup()
    return elapsed


def measure(work: Path, bucket: str, size_mb: int, repeats: int) -> dict[str, float]:
    """Median seconds per method for one size."""
    fs = s3_filesystem()
    src = work / f"src-{size_mb}"
    nbytes = write_checkpoint(src, size_mb)
    base = f"{bucket}/podium-s3-io/{size_mb}"
    persisted, scratch, dst = f"{base}/persisted", f"{base}/scratch", work / "dst"
    fs.put(f"{src}/", f"{persisted}/", recursive=True)
    arrow = filesystems()

    def rm_remote() -> None:
        if fs.exists(scratch):
            fs.rm(scratch, recursive=True)

    def rm_local() -> None:
        shutil.rmtree(dst, ignore_errors=True)

    plan: list[tuple[str, Callable[[], None], Callable[[], None]]] = [
        ("upload raw", lambda: fs.put(f"{src}/", f"{scratch}/", recursive=True), rm_remote),
        *[(f"upload {k}", (lambda a=a: ray_upload(str(src), scratch, a)), rm_remote) for k, a in arrow.items()],
        ("download raw", lambda: fs.get(f"{persisted}/", f"{dst}/", recursive=True), rm_local),
        *[(f"download {k}", (lambda a=a: ray_download(persisted, str(dst), a)), rm_local) for k, a in arrow.items()],
        ("promote podium", lambda: staging.stage_version(f"s3://{scratch}", f"s3://{persisted}", {"step": 0}),
         rm_remote),
    ]
    times: dict[str, list[float]] = {name: [] for name, _, _ in plan}
    for _ in range(repeats):
        for name, fn, cleanup in plan:
            times[name].append(timed(fn, cleanup))
    fs.rm(base, recursive=True)
    shutil.rmtree(src)
    return {"bytes": nbytes, **{k: statistics.median(v) for k, v in times.items()}}


def render(results: dict[int, dict[str, float]], args: argparse.Namespace, server: str, loads: list[str]) -> str:
    """The BENCHMARKS.md section."""
    m = machine_description()
    rows = []
    for size, r in sorted(results.items()):
        mb = r["bytes"] / 2**20

        def cell(key: str) -> str:
            raw = r["download raw" if key.startswith(("download", "promote")) else "upload raw"]
            return f"{mb / r[key]:,.0f} MB/s ({raw / r[key]:.2f}×)"

        rows.append([f"{size} MB"] + [f"{mb / r[k]:,.0f} MB/s" if k.endswith("raw") else cell(k) for k in METHODS])
    worst = {k: min(r["download raw" if k.startswith(("download", "promote")) else "upload raw"] / r[k]
                    for r in results.values()) for k in METHODS if not k.endswith("raw")}
    command = " ".join(["python benchmarks/s3_io.py", *args.argv])
    measured = (f"Command: `{command}` (repeats {args.repeats}); server: {server}. Measured "
                f"{time.strftime('%Y-%m-%d %H:%M %Z')} on {m['cpu']}, {m['cores']} cores, {m['memory']}; "
                f"{m['versions']}.")
    legend = ("Throughput, and in brackets the ratio to raw s3fs `put` (uploads) or `get` (downloads, promotion) "
              "of the same folder to the same server (1.00× = as fast; goal ≥ 0.80×). *podium*: "
              "`podium.storage.locations.arrow_filesystem` (parallel multipart / ranged GETs); *fsspec*: "
              "`PyFileSystem(FSSpecHandler(s3fs))`; *ray-default*: pyarrow's `S3FileSystem`, as Ray builds it from "
              "a bare s3:// path (uploads with `use_threads=False`). *promote*: sha256 of the source read once + "
              "server-side copy verified by the store, against a raw get of the same bytes.")
    worst_line = "Worst ratio over sizes: " + ", ".join(f"{k} {v:.2f}×" for k, v in worst.items()) + "."
    return "\n\n".join(["## Checkpoint I/O on S3 (`benchmarks/s3_io.py`)", measured, "Load: " + "; ".join(loads),
                        legend, markdown_table(["size", *METHODS], rows), worst_line]) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Measure, print, optionally write BENCHMARKS.md."""
    p = argparse.ArgumentParser(description="Checkpoint upload/download on S3 through Ray Train vs raw s3fs.")
    p.add_argument("--sizes", default="4,16,64,256,1024", help="checkpoint sizes in MB, comma-separated")
    p.add_argument("--repeats", type=int, default=3, help="runs per method and size (the median is kept)")
    p.add_argument("--endpoint", help="an S3 endpoint to measure (credentials from the AWS chain); "
                                      "default: start moto on loopback")
    p.add_argument("--bucket", default="podium-bench", help="bucket to use (created on moto)")
    p.add_argument("--output", default="", help="markdown file to update (e.g. BENCHMARKS.md; default: none)")
    args = p.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    sizes = [int(s) for s in args.sizes.split(",")]
    loads = [f"before: {load_average()}"]
    results = {}
    with tempfile.TemporaryDirectory(prefix="podium-s3-io-") as tmp:
        moto = None
        if args.endpoint:
            os.environ["PODIUM_S3_ENDPOINT_URL"] = args.endpoint
            server = args.endpoint
        else:
            moto = start_moto(Path(tmp))
            moto.create_bucket(args.bucket)
            server = "moto_server (Python, one process) on loopback"
        try:
            for size in sizes:
                results[size] = r = measure(Path(tmp), args.bucket, size, args.repeats)
                log(f"{size} MB: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in r.items() if k != "bytes"))
        finally:
            if moto is not None:
                moto.stop()
    text = render(results, args, server, [*loads, f"after: {load_average()}"])
    if args.output:
        update_markdown_section(args.output, "s3_io", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
