"""How long the dataset digest takes: a ~1 GB Parquet dataset on S3 (moto on loopback) and on local disk.

    python benchmarks/digest.py                          # 1 GB in 16 files, moto started on loopback
    python benchmarks/digest.py --size-mb 256 --files 4  # a quick look
    python benchmarks/digest.py --output BENCHMARKS.md   # also write the section there

`podium.storage.fingerprint.dataset_digest` lists the dataset once and reads each file's last 64 KiB
(one ranged GET: trailer and footer), never decoding a data page. For contrast, the same dataset read whole with pyarrow
through podium's filesystem (once). Medians of --repeats digests; every digest lists afresh (podium's
S3 filesystem caches no listings).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.workload import load_average, machine_description, markdown_table, start_moto, update_markdown_section
from podium.storage import fingerprint
from podium.storage.backends.s3_client import s3_filesystem
from podium.storage.fingerprint import TAIL_READ, dataset_digest
from podium.storage.locations import arrow_filesystem

REPO = Path(__file__).resolve().parent.parent
FEATURES = 16
ROW_BYTES = FEATURES * 4 + 8  # float32 features and an int64 label; random floats do not compress


def log(msg: str) -> None:
    """Progress on stderr."""
    print(f"[digest {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def write_dataset(folder: Path, size_mb: int, files: int) -> None:
    """`files` Parquet files of about size_mb / files MB each."""
    rows = (size_mb << 20) // ROW_BYTES // files
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        cols = {f"f{j:02d}": pa.array(rng.random(rows, dtype=np.float32)) for j in range(FEATURES)}
        cols["label"] = pa.array(rng.integers(0, 4, rows))
        pq.write_table(pa.table(cols), folder / f"part-{i:03d}.parquet")


def floor_read(fs, folder: str) -> None:
    """The least a footer-reading digest does: list the folder, then read each file's last 64 KiB, all at once."""
    files = sorted((path, info["size"]) for path, info in fs.find(folder, detail=True).items())
    fs.cat_ranges([p for p, _ in files], [max(0, size - TAIL_READ) for _, size in files], [size for _, size in files])


def timed(fn, repeats: int) -> tuple[list[float], object]:
    """Wall times of `repeats` calls, and the last result."""
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return times, out


def main(argv: list[str] | None = None) -> int:
    """Measure, print, optionally write BENCHMARKS.md."""
    p = argparse.ArgumentParser(description="Dataset digest time on S3 (moto) and local disk.")
    p.add_argument("--size-mb", type=int, default=1024, help="dataset size in MB (default: 1024)")
    p.add_argument("--files", type=int, default=16, help="Parquet files (default: 16)")
    p.add_argument("--repeats", type=int, default=5, help="digests per location (the median is kept)")
    p.add_argument("--output", default="", help="markdown file to update (e.g. BENCHMARKS.md; default: none)")
    args = p.parse_args(argv)
    loads = [f"before: {load_average()}"]
    with tempfile.TemporaryDirectory(prefix="podium-digest-") as tmp:
        local = Path(tmp) / "data"
        write_dataset(local, args.size_mb, args.files)
        size = sum(f.stat().st_size for f in local.iterdir())
        moto = start_moto(Path(tmp))
        try:
            moto.create_bucket("podium-bench")
            fs = s3_filesystem()
            for f in sorted(local.iterdir()):
                fs.put_file(str(f), f"podium-bench/data/{f.name}")
            log(f"{size / 2**20:.0f} MB in {args.files} files on S3 and on local disk")
            floor_times, s3_times, s3_digest = [], [], None
            for _ in range(args.repeats):  # interleaved, so that each ratio compares the same moment
                floor_times += timed(lambda: floor_read(fs, "podium-bench/data"), 1)[0]
                times, s3_digest = timed(lambda: dataset_digest("s3://podium-bench/data"), 1)
                s3_times += times
            os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")  # the hashes kept between commands

            def local_new() -> object:  # files no command digested before (new, or written again)
                fingerprint._CONTENT_HASHES.clear()
                shutil.rmtree(fingerprint.content_cache_dir(), ignore_errors=True)
                return dataset_digest(str(local))

            def local_later() -> object:  # the same files in a later command: their hashes kept on disk
                fingerprint._CONTENT_HASHES.clear()
                return dataset_digest(str(local))

            local_times, local_digest = timed(local_new, args.repeats)
            later_times, _ = timed(local_later, args.repeats)
            warm_times, _ = timed(lambda: dataset_digest(str(local)), args.repeats)
            afs, path = arrow_filesystem("s3://podium-bench/data")
            read_times, table = timed(lambda: pq.read_table(path, filesystem=afs), 1)
            rows = table.num_rows  # type: ignore[attr-defined]
            del table
        finally:
            moto.stop()
    loads.append(f"after: {load_average()}")
    m = machine_description()

    def row(what: str, times: list[float], read: int) -> list[str]:
        spread = f"{min(times) * 1000:.0f}–{max(times) * 1000:.0f} ms" if len(times) > 1 else ""
        return [what, f"{statistics.median(times) * 1000:.0f} ms", spread, f"{read / 1024:.1f} KiB"]

    ratios = [d / f for d, f in zip(s3_times, floor_times)]
    table_rows = [row("digest, S3 (moto on loopback)", s3_times, s3_digest.bytes_read),  # type: ignore[attr-defined]
                  row("floor: the same listing + one 64 KiB ranged GET per file (s3fs `cat_ranges`)", floor_times,
                      args.files * TAIL_READ),
                  row("digest, local disk: files new to podium (every byte hashed)", local_times,
                      local_digest.bytes_read + local_digest.bytes_hashed),  # type: ignore[attr-defined]
                  row("digest, local disk: the same files in a later command (hashes kept)", later_times,
                      local_digest.bytes_read),  # type: ignore[attr-defined]
                  row("digest, local disk: again in the same command", warm_times,
                      local_digest.bytes_read),  # type: ignore[attr-defined]
                  row("for contrast: read it all (pyarrow, S3)", read_times, size)]
    text = "\n\n".join([
        "## Dataset digest (`benchmarks/digest.py`)",
        f"Command: `python benchmarks/digest.py --size-mb {args.size_mb} --files {args.files} --repeats {args.repeats}`. "
        f"Dataset: {size / 2**20:.0f} MB of Parquet in {args.files} files, {rows} rows. Measured "
        f"{time.strftime('%Y-%m-%d %H:%M %Z')} on {m['cpu']}, {m['cores']} cores, {m['memory']}; {m['versions']}.",
        "Load: " + "; ".join(loads),
        "The digest lists the folder once and reads each file's last 64 KiB (one ranged GET per file, all "
        "files at once: trailer and footer); it decodes no data page. On S3 the listed ETag is the hash of each "
        "file's bytes; local files new to podium are read once for a sha256 of their bytes, kept (by path, size, "
        "mtime and inode) for later digests of the same files. Median of the repeats, then the range. "
        "moto copies a whole object to answer a ranged GET (a 64 KiB read of a 64 MB object takes ~55 ms "
        "there, of a 1 MB one ~8 ms), so the absolute time is the test server's; the floor, measured "
        "alternately with the digest, is what any footer read costs on it.",
        markdown_table(["what", "time", "range", "bytes read"], table_rows),
        f"digest / floor: median {statistics.median(ratios):.2f}×, range {min(ratios):.2f}–{max(ratios):.2f}× "
        f"({len(ratios)} pairs)."]) + "\n"
    if args.output:
        update_markdown_section(args.output, "digest", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
