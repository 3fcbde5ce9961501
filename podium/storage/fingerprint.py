"""Which data is this? A digest of a Parquet dataset from its file identities and footers, never its rows.

`dataset_digest(uri)` of a Parquet file or a folder of Parquet files (a local path or a URI) reads:

1. one listing: every file's path, size and, where the store gives one, a hash of its bytes (S3's ETag, from
   ListObjectsV2: the MD5 of the bytes, or of its parts'; GCS's md5Hash or crc32c; Azure's Content-MD5). Files
   are chosen as `pyarrow.dataset` chooses them: none under a name starting with '.' or '_' (`_SUCCESS`,
   `_metadata`, `.tmp/`).
2. for each file, all files at once, one ranged read of its last 64 KiB (`TAIL_READ`, the size Arrow's own
   Parquet reader reads speculatively): the 8-byte trailer (footer length and `PAR1`) and, in almost every
   file, the whole footer (the Parquet FileMetaData: schema, row groups, row counts, column statistics).
   A longer footer costs one more read, of exactly the rest. Each read is the store backend's `read_range`:
   on S3 a GET pinned to the listed ETag (If-Match), so a file replaced meanwhile fails instead of mixing
   two versions.
3. a file whose listing has no hash of its bytes (a local file; a blob uploaded in blocks, a filesystem of your
   own) is read once, front to back, for a sha256 of its bytes (`CONTENT_CHUNK` at a time, all files at once). A
   process keeps it by (path, size, modification time), and a local file's is kept for later commands by (real
   path, size, modification time in ns, inode) under `content_cache_dir()`, as make and rsync trust a file
   unchanged: the next digest of the same files reads none of their bytes.

No data page is decoded (the content hash reads bytes, it does not parse them). The digest is the first 32 hex
characters of a sha256 over, per file in path order: the path relative to the dataset, its size, the hash of its
bytes and the sha256 of its footer bytes. So it is a function of the bytes and their relative names: the same data
written again, copied elsewhere or to another store kind gives the same digest (a rewrite with the same bytes is
not new data to the same-data gate), and a change of any byte gives another. What it costs on local disk: one read
of every file new or rewritten since the last digest (sha256 runs at several hundred MB/s a core); files digested
before cost a stat. See BENCHMARKS.md's digest section.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from podium.errors import PodiumError
from podium.storage.backends import backend_for
from podium.storage.backends.base import Backend
from podium.storage.backends.local import on_this_machine
from podium.storage.locations import fsspec_filesystem, normalize_location

MAGIC = b"PAR1"
TRAILER = 8  # 4-byte little-endian footer length, then the magic
TAIL_READ = 64 << 10  # one read per file brings its footer: Arrow's default speculative footer read size
PARALLEL_READS = 32  # footers fetched at once
DIGEST_CHARS = 32  # MLflow keeps dataset digests of up to 36 characters
CONTENT_CHUNK = 8 << 20  # a file without a listed hash is hashed 8 MiB at a time

# a file's footer and trailer, how many bytes were fetched to get them, its content identity, bytes read for that
Footer = tuple[bytes, int, str, int]
Listed = list[tuple[str, str, dict[str, Any]]]  # (path, path relative to the dataset, listing info)


class DatasetError(PodiumError, ValueError):
    """A dataset that cannot be described: missing, empty, or a file that is not Parquet."""


@dataclass(frozen=True)
class DatasetDigest:
    """A dataset's identity and shape, from its listing and Parquet footers."""

    uri: str
    digest: str
    files: int
    rows: int
    row_groups: int
    size_bytes: int
    schema: dict[str, str] = field(default_factory=dict)  # column -> Arrow type, in file order
    bytes_read: int = 0  # what describing it fetched: each file's tail (footer and trailer)
    # what it read to hash files whose listing gives no hash of their bytes (local files): 0 when this process had
    # hashed them already
    bytes_hashed: int = field(default=0, compare=False)

    @property
    def name(self) -> str:
        """A short name for the dataset: its file or folder name."""
        return posixpath.basename(self.uri.rstrip("/")) or self.uri

    @property
    def short(self) -> str:
        """The digest's first 12 characters, for text."""
        return self.digest[:12]

    def summary(self) -> dict[str, Any]:
        """What a manifest or a report keeps of it."""
        return {"uri": self.uri, "digest": self.digest, "rows": self.rows, "files": self.files,
                "size_bytes": self.size_bytes}


def _listed_hash(info: dict[str, Any]) -> str | None:
    """A hash of the file's bytes that its listing gives, or None: S3's ETag (MD5 of the bytes, or of its parts';
    Azure's and GCS's `etag` change on every write and are not one), GCS's md5Hash or crc32c, Azure's
    Content-MD5."""
    for key in ("ETag", "md5Hash", "crc32c"):
        if info.get(key):
            return str(info[key])
    settings = info.get("content_settings")
    md5 = getattr(settings, "content_md5", None) or (settings.get("content_md5") if isinstance(settings, dict) else None)
    return f"md5:{bytes(md5).hex()}" if md5 else None


# (path, size, modification time or etag) -> the sha256 of a file's bytes, read once per process
_CONTENT_HASHES: dict[tuple[str, int, str], str] = {}


def content_cache_dir() -> Path:
    """Where the sha256 of local files' bytes are kept between commands: `$XDG_CACHE_HOME/podium/content-hashes`
    (default `~/.cache/podium/content-hashes`), one small file per (path, size, mtime, inode)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "podium" / "content-hashes"


def _local_stamp(path: str) -> str | None:
    """What a local file's bytes are trusted unchanged by, as make and rsync trust it: its real path, size,
    modification time in ns, inode and device; None if it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{os.path.realpath(path)}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\0{st.st_dev}"


def _cached(stamp: str) -> Path:
    return content_cache_dir() / hashlib.sha256(stamp.encode()).hexdigest()[:40]


def _keep(stamp: str, value: str) -> None:
    """Keep a local file's hash for later commands (atomically; a cache that cannot be written is skipped)."""
    entry = _cached(stamp)
    with contextlib.suppress(OSError):
        entry.parent.mkdir(parents=True, exist_ok=True)
        partial = entry.with_name(f".{entry.name}.{os.getpid()}.{threading.get_ident()}")
        partial.write_text(value)
        os.replace(partial, entry)


def _content_hash(fs: fsspec.AbstractFileSystem, path: str, info: dict[str, Any]) -> tuple[str, int]:
    """(the file's content identity, bytes read for it): its listed hash, else the sha256 of its bytes, read
    front to back unless this process (any file) or an earlier command (a local file: `content_cache_dir`) hashed
    the same file, unchanged since (same path, size and modification time), before."""
    listed = _listed_hash(info)
    if listed is not None:
        return listed, 0
    stamp = next((str(info[k]) for k in ("mtime", "LastModified", "last_modified", "updated", "etag")
                  if info.get(k) is not None), "")
    key = (path, int(info["size"]), stamp)
    if key in _CONTENT_HASHES:
        return _CONTENT_HASHES[key], 0
    local = _local_stamp(path) if on_this_machine(fs) else None
    if local is not None:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            kept = _cached(local).read_text()
            if kept.startswith("sha256:"):
                _CONTENT_HASHES[key] = kept
                return kept, 0
    digest, read = hashlib.sha256(), 0
    with fs.open(path, "rb") as f:
        while chunk := f.read(CONTENT_CHUNK):
            digest.update(chunk)  # hashlib releases the GIL on large buffers: the files hash side by side
            read += len(chunk)
    _CONTENT_HASHES[key] = value = f"sha256:{digest.hexdigest()}"
    if local is not None and _local_stamp(path) == local:  # unchanged while it was read: kept for later commands
        _keep(local, value)
    return value, read


def _skipped(rel: str) -> bool:
    return any(part.startswith((".", "_")) for part in rel.split("/"))


def list_parquet_files(uri: str) -> tuple[fsspec.AbstractFileSystem, list[tuple[str, str, dict[str, Any]]]]:
    """One listing of a dataset: (filesystem, [(path, path relative to the dataset, listing info)]) by path."""
    location = normalize_location(uri)
    fs, root = fsspec_filesystem(location)
    try:
        found = fs.find(root, detail=True)
    except FileNotFoundError:
        found = {}
    if not found:
        raise DatasetError(f"dataset {uri!r} does not exist or is empty")
    root = root.rstrip("/")
    if root in found:  # a single file: find() lists the file itself
        return fs, [(root, posixpath.basename(root), found[root])]
    files = []
    for path, info in sorted(found.items()):
        rel = posixpath.relpath(path, root)
        if info.get("type", "file") == "file" and not _skipped(rel):
            files.append((path, rel, info))
    if not files:
        raise DatasetError(f"dataset {uri!r} has no data files (names starting with '.' or '_' are skipped)")
    return fs, files


def _check_trailer(uri: str, rel: str, size: int, trailer: bytes) -> int:
    if size < 12 or trailer[4:] != MAGIC:
        what = "an encrypted footer (PARE)" if trailer[4:] == b"PARE" else "no PAR1 footer"
        raise DatasetError(f"dataset {uri!r}: {rel} is not a readable Parquet file ({what})")
    length = struct.unpack("<I", trailer[:4])[0]
    if length > size - 12:
        raise DatasetError(f"dataset {uri!r}: {rel} says its footer has {length} bytes, more than the file holds")
    return length


def _footer_from_tail(uri: str, rel: str, size: int, tail: bytes) -> tuple[int, bytes | None]:
    """(footer length + trailer, the footer and trailer if `tail`, the file's last bytes, holds them all)."""
    need = _check_trailer(uri, rel, size, tail[-TRAILER:]) + TRAILER
    return need, (tail[-need:] if need <= len(tail) else None)


def _read_footers(backend: Backend, fs: fsspec.AbstractFileSystem, uri: str, files: Listed) -> list[Footer]:
    def footer(item: tuple[str, str, dict[str, Any]]) -> Footer:
        path, rel, info = item
        size = int(info["size"])
        tail = backend.read_range(fs, path, max(0, size - TAIL_READ), size, info) if size >= TRAILER else b""
        need, whole = _footer_from_tail(uri, rel, size, tail)
        if whole is None:
            rest = backend.read_range(fs, path, size - need, size - len(tail), info)
            whole, tail = rest + tail, rest + tail
        content, hashed = _content_hash(fs, path, info)
        return whole, len(tail), content, hashed

    if len(files) == 1:
        return [footer(files[0])]
    with ThreadPoolExecutor(max_workers=min(PARALLEL_READS, len(files))) as pool:  # a network disk answers slowly
        return list(pool.map(footer, files))


def dataset_digest(uri: str) -> DatasetDigest:
    """The digest, row count and schema of a Parquet file or folder, from its listing and footers only."""
    location = normalize_location(uri)
    fs, files = list_parquet_files(location)
    backend = backend_for(location)
    # the first file alone first: a folder of something else than Parquet fails after one read, not thousands
    footers = _read_footers(backend, fs, location, files[:1])
    footers += _read_footers(backend, fs, location, files[1:]) if len(files) > 1 else []
    entries: list[tuple[str, int, str, str]] = []
    rows, row_groups = 0, 0
    schema: dict[str, str] = {}
    for (_, rel, info), (footer, _, content, _) in zip(files, footers):
        try:
            meta = pq.read_metadata(pa.BufferReader(footer))
        except (pa.ArrowException, OSError) as exc:
            raise DatasetError(f"dataset {uri!r}: the footer of {rel} cannot be read as Parquet: {exc}") from None
        if not schema:
            schema = {f.name: str(f.type) for f in meta.schema.to_arrow_schema()}
        rows += meta.num_rows
        row_groups += meta.num_row_groups
        entries.append((rel, int(info["size"]), content, hashlib.sha256(footer).hexdigest()))
    digest = hashlib.sha256(json.dumps({"podium-dataset": 1, "files": entries}).encode()).hexdigest()[:DIGEST_CHARS]
    return DatasetDigest(uri=location, digest=digest, files=len(files), rows=rows, row_groups=row_groups,
                         size_bytes=sum(e[1] for e in entries), schema=schema,
                         bytes_read=sum(f[1] for f in footers), bytes_hashed=sum(f[3] for f in footers))
