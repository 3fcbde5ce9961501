"""Promotion's copy of a checkpoint of many files (a sharded DCP checkpoint) and of a few large ones, against a
plain copy of the same bytes, on local disk and on S3.

    python benchmarks/promotion_copy.py                                   # many=64x4, few=4x64 MB; local and moto
    python benchmarks/promotion_copy.py --layouts many=64x16,few=4x256    # 1 GB each
    python benchmarks/promotion_copy.py --where s3 --endpoint http://minio:9000 --bucket scratch

For each layout (FILESxMB: that many files of random bytes, `__<rank>_0.distcp` and a `.metadata`, as
`torch.distributed.checkpoint.save` writes them) podium's promotion copy,
`podium.serving.staging.stage_version` (on disk: each file read once, hashed as it is copied and the copy read
back and compared as it is written; on S3: the source hashed, the copy made and checked by the store itself,
server-side; the files in parallel), is timed
against a plain copy:
  local  `shutil.copytree` of the folder (no hashing at all)
  s3     s3fs's recursive `copy` (server-side CopyObject, no verification) and its recursive `get` (the bytes
         read once, as hashing the source reads them)
Methods are interleaved in each of --repeats rounds, so load drift hits all of them alike; each cell is the
median MB/s and, in brackets, the range over the rounds.
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

import numpy as np

from benchmarks.workload import load_average, machine_description, markdown_table, start_moto
from podium.serving import staging
from podium.storage.backends.s3_client import s3_filesystem

Plan = list[tuple[str, Callable[[], object], Callable[[], None]]]


def log(msg: str) -> None:
    """Progress on stderr."""
    print(f"[promotion_copy {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_layouts(text: str) -> dict[str, tuple[int, int]]:
    """'many=64x16,few=4x256' -> {'many': (64, 16), 'few': (4, 256)} (files, MB per file)."""
    layouts = {}
    for item in text.split(","):
        name, _, shape = item.partition("=")
        files, _, mb = shape.partition("x")
        layouts[name.strip()] = (int(files), int(mb))
    return layouts


def write_shards(path: Path, files: int, mb: int) -> int:
    """A DCP-like folder of `files` shards of `mb` MiB of random bytes and a small `.metadata`; its size."""
    path.mkdir(parents=True)
    rng = np.random.default_rng(files * 1000 + mb)
    for rank in range(files):
        (path / f"__{rank}_0.distcp").write_bytes(rng.bytes(mb << 20))
    (path / ".metadata").write_bytes(rng.bytes(64 << 10))
    return sum(p.stat().st_size for p in path.iterdir())


def run_rounds(plan: Plan, repeats: int) -> dict[str, list[float]]:
    """Seconds of every method in each of `repeats` interleaved rounds."""
    times: dict[str, list[float]] = {name: [] for name, _, _ in plan}
    for _ in range(repeats):
        for name, fn, cleanup in plan:
            os.sync()
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
            cleanup()
    return times


def local_plan(src: Path, work: Path) -> Plan:
    """Promotion into a local serving folder against `shutil.copytree`."""
    dst, serving = work / "dst", work / "serving"
    return [("plain copy", lambda: shutil.copytree(src, dst), lambda: shutil.rmtree(dst)),
            ("podium promote", lambda: staging.stage_version(str(serving), str(src), {"step": 0}),
             lambda: shutil.rmtree(serving))]


def s3_plan(src: Path, work: Path, bucket: str, name: str) -> tuple[Plan, Callable[[], None]]:
    """Promotion inside one S3 store against s3fs's server-side copy and its get; and how to clean up."""
    fs = s3_filesystem()
    base = f"{bucket}/podium-promotion-copy/{name}"
    source, scratch, dst = f"{base}/source", f"{base}/scratch", work / "dst"
    fs.put(f"{src}/", f"{source}/", recursive=True)

    def rm_scratch() -> None:
        fs.rm(scratch, recursive=True)
        fs.invalidate_cache()

    plan: Plan = [("s3fs get", lambda: fs.get(f"{source}/", f"{dst}/", recursive=True), lambda: shutil.rmtree(dst)),
                  ("s3fs copy", lambda: fs.copy(f"{source}/", f"{scratch}/", recursive=True), rm_scratch),
                  ("podium promote", lambda: staging.stage_version(f"s3://{scratch}", f"s3://{source}", {"step": 0}),
                   rm_scratch)]
    return plan, lambda: fs.rm(base, recursive=True)


def cells(nbytes: int, times: dict[str, list[float]], baselines: list[str]) -> list[str]:
    """MB/s of each method, median (min–max); podium's with its ratio to each baseline (baseline time / podium's)."""
    mb = nbytes / 2**20
    out = []
    for name, values in times.items():
        rates = [mb / t for t in values]
        cell = f"{statistics.median(rates):,.0f} ({min(rates):,.0f}–{max(rates):,.0f})"
        if name == "podium promote":
            ratios = [f"{statistics.median(times[b]) / statistics.median(values):.2f}× {b}" for b in baselines]
            cell += " = " + ", ".join(ratios)
        out.append(cell)
    return out


def main(argv: list[str] | None = None) -> int:
    """Measure and print the table (BENCHMARKS.md is the lead's to update)."""
    p = argparse.ArgumentParser(description="Promotion copy of many and of large checkpoint files vs a plain copy.")
    p.add_argument("--layouts", default="many=64x4,few=4x64", help="NAME=FILESxMB, comma-separated")
    p.add_argument("--where", default="local,s3", help="local, s3 or both")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (median and range kept)")
    p.add_argument("--endpoint", help="an S3 endpoint to measure (credentials from the AWS chain); "
                                      "default: start moto on loopback")
    p.add_argument("--bucket", default="podium-bench", help="bucket to use (created on moto)")
    args = p.parse_args(argv)
    layouts, where = parse_layouts(args.layouts), args.where.split(",")
    loads, rows = [f"before: {load_average()}"], []
    with tempfile.TemporaryDirectory(prefix="podium-promotion-copy-") as tmp:
        work = Path(tmp)
        moto, server = None, "local disk"
        if "s3" in where:
            if args.endpoint:
                os.environ["PODIUM_S3_ENDPOINT_URL"] = args.endpoint
                server = args.endpoint
            else:
                moto = start_moto(work)
                moto.create_bucket(args.bucket)
                server = "moto_server (Python, one process) on loopback"
        try:
            for name, (files, mb) in layouts.items():
                src = work / f"src-{name}"
                nbytes = write_shards(src, files, mb)
                shape = f"{name}: {files} × {mb} MB"
                if "local" in where:
                    times = run_rounds(local_plan(src, work), args.repeats)
                    rows.append([shape, "local", *cells(nbytes, times, ["plain copy"]), "–"])
                    log(f"{shape} local: {rows[-1][2:]}")
                if "s3" in where:
                    plan, cleanup = s3_plan(src, work, args.bucket, name)
                    times = run_rounds(plan, args.repeats)
                    cleanup()
                    get, copy, promote = cells(nbytes, times, ["s3fs copy", "s3fs get"])
                    rows.append([shape, "s3", copy, promote, get])
                    log(f"{shape} s3: {rows[-1][2:]}")
                shutil.rmtree(src)
        finally:
            if moto is not None:
                moto.stop()
    loads.append(f"after: {load_average()}")
    m = machine_description()
    command = " ".join(["python benchmarks/promotion_copy.py", *(argv if argv is not None else sys.argv[1:])])
    print("\n\n".join([
        "## Promotion copy of many and of large files (`benchmarks/promotion_copy.py`)",
        f"Command: `{command}` (repeats {args.repeats}); S3: {server}. Measured {time.strftime('%Y-%m-%d %H:%M %Z')} "
        f"on {m['cpu']}, {m['cores']} cores, {m['memory']}; {m['versions']}.",
        "Load: " + "; ".join(loads),
        "MB/s, median (min–max) over the rounds. *plain copy*: `shutil.copytree` locally, s3fs's recursive "
        "server-side `copy` on S3 (neither verifies anything); *podium promote*: `stage_version` (sha256 of the "
        "source, parallel copy, the copy verified), with the ratio baseline time / podium time (1.00× = as fast); "
        "*s3fs get*: the bytes read once, what hashing the source costs at least.",
        markdown_table(["layout", "where", "plain copy", "podium promote", "s3fs get"], rows)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
