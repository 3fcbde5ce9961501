"""The serving location: immutable versions, each with a manifest, and one pointer that says which is current.

Layout (local path or URI):

    <serving>/CURRENT                          {"version": "v000003", ...}  written last, atomically
    <serving>/versions/v000003/MANIFEST.json   files with sha256 and size, source run, step, metrics
    <serving>/versions/v000003/checkpoint/...  the promoted checkpoint's files
    <serving>/versions/v000003/CLAIM           object stores only: who took the number (conditional PUT)
    <serving>/history/<time>-v000003.json      one record per promotion or rollback

A version is complete once its MANIFEST.json exists (written after every file
was copied and checked); CURRENT only ever names complete versions. A reader
follows CURRENT, so it sees the old version or the new one, never a mix.

On S3 (no rename), the same layout works because every step is one atomic PUT
of a new key and nothing complete is ever rewritten: a version's number is
claimed with a conditional PUT of `versions/vN/CLAIM` (If-None-Match), its files
are copied inside the store (CopyObject, or UploadPartCopy above 5 GiB), its
MANIFEST.json is one PUT, and CURRENT is one PUT, last. A promoter that dies
anywhere leaves at most an unreferenced, manifest-less version behind.

Verification without moving the bytes twice: the manifest's sha256 of each
file is computed once, by reading the source. The copy is then checked by the
store itself: CopyObject is asked for a SHA-256 of the copy (x-amz-checksum-
algorithm), compared with the manifest; where the store gives none, the copy's
ETag must equal the source's (same bytes, same part layout: UploadPartCopy
mirrors the source's parts) and the copy is pinned to the hashed source with
CopySourceIfMatch. Only a copy that neither check covers is read back and hashed.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import os
import posixpath
import re
import shutil
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, TypeVar

import fsspec
from fsspec.asyn import sync

from training.checkpoint import META_FILE, CheckpointFormatError, load_model
from training.storage import (
    MultipartWriter,
    fsspec_filesystem,
    is_remote,
    is_s3,
    join,
    normalize_location,
    open_range_reader,
    s3_error_code,
    s3_settings,
)

logger = logging.getLogger(__name__)

POINTER = "CURRENT"
MANIFEST = "MANIFEST.json"
CLAIM = "CLAIM"
VERSION_RE = re.compile(r"^v(\d{6,})$")
CHUNK = 8 << 20
PARALLEL_FILES = 8  # files hashed, copied or fetched at once
PARALLEL_PARTS = 8  # parts of one server-side multipart copy at once
COPY_OBJECT_LIMIT = 5 << 30  # S3: larger objects must be copied part by part
COPY_PART_MIN = 512 << 20  # part size of a multipart copy when the source's layout is unknown
UNSUPPORTED = {"InvalidArgument", "NotImplemented", "InvalidRequest", "XNotImplemented"}
T = TypeVar("T")
R = TypeVar("R")


class ServingError(RuntimeError):
    """The serving location is missing, inconsistent, or a copy failed verification."""


@dataclass(frozen=True)
class PromotedVersion:
    """A complete version under the serving location."""

    version: str
    uri: str
    manifest: dict[str, Any]


def _is_s3fs(fs: fsspec.AbstractFileSystem) -> bool:
    return "s3" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def _open_read(fs: fsspec.AbstractFileSystem, path: str, listed: dict[str, Any] | None = None):
    """A front-to-back reader: concurrent ranged GETs on S3 (`listed`: size and etag, to skip a HEAD)."""
    if _is_s3fs(fs):
        return open_range_reader(fs, path, **({"size": listed["size"], "etag": listed["etag"]} if listed else {}))
    return fs.open(path, "rb")


def _open_write(fs: fsspec.AbstractFileSystem, path: str):
    """A writer: a parallel multipart upload on S3, published only when closed without error."""
    if _is_s3fs(fs):
        s = s3_settings()
        return MultipartWriter(fs, path, s.part_size_mb << 20, s.concurrency)
    return fs.open(path, "wb")


def _parallel(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """fn over items on a few threads (network and hashing release the GIL); the first error is raised."""
    items = list(items)
    if len(items) <= 1:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(max_workers=min(PARALLEL_FILES, len(items))) as pool:
        return list(pool.map(fn, items))


def _sha256(fs: fsspec.AbstractFileSystem, path: str, listed: dict[str, Any] | None = None) -> str:
    h = hashlib.sha256()
    with _open_read(fs, path, listed) as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _safe_relpath(rel: str) -> str:
    """Reject manifest entries that would escape the version folder."""
    norm = posixpath.normpath(rel)
    if norm.startswith("/") or norm == ".." or norm.startswith("../") or "\\" in rel or norm == ".":
        raise ServingError(f"manifest entry {rel!r} escapes its folder")
    return norm


def list_objects(uri: str) -> dict[str, dict[str, Any]]:
    """Relative path -> {"size", "etag"} of every file under a directory (path or URI; etag on object stores)."""
    fs, root = fsspec_filesystem(uri)
    # no fs.isdir first: s3fs's isdir answers False when the store cannot be reached, which would turn an
    # outage into "not a directory"; find raises the connection error itself
    found = fs.find(root, detail=True)
    if not found:
        raise ServingError(f"checkpoint {uri!r} does not exist or is empty")
    if root.rstrip("/") in found:  # find() of a file lists the file itself
        raise ServingError(f"checkpoint {uri!r} is not a directory")
    out = {}
    for path, info in found.items():
        rel = posixpath.relpath(path, root.rstrip("/"))
        out[_safe_relpath(rel)] = {"size": int(info.get("size") or 0), "etag": info.get("ETag")}
    return out


def list_files(uri: str) -> dict[str, int]:
    """Relative path -> size of every file under a directory (path or URI)."""
    return {rel: o["size"] for rel, o in list_objects(uri).items()}


def build_manifest(checkpoint_uri: str, info: dict[str, Any],
                   objects: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Manifest of a checkpoint: each file's sha256 and size, plus `info` (source run, step, metrics).

    The files are read once, several at a time (on S3 in concurrent ranges).
    """
    fs, root = fsspec_filesystem(checkpoint_uri)
    objects = objects if objects is not None else list_objects(checkpoint_uri)
    names = sorted(objects)
    digests = _parallel(lambda rel: _sha256(fs, posixpath.join(root, rel), objects[rel]), names)
    files = {rel: {"sha256": d, "size": objects[rel]["size"]} for rel, d in zip(names, digests)}
    return {"format": "podium-serving/1", "source": checkpoint_uri, "files": files, **info}


def _versions(serving: str) -> list[str]:
    fs, root = fsspec_filesystem(join(serving, "versions"))
    try:
        names = [posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False)]
    except FileNotFoundError:
        return []
    return sorted(n for n in names if VERSION_RE.match(n))


def _new_version(serving: str) -> str:
    existing = [int(VERSION_RE.match(v).group(1)) for v in _versions(serving)]
    return f"v{(max(existing) + 1) if existing else 1:06d}"


def _copy_ranges(fs: fsspec.AbstractFileSystem, bucket: str, key: str, size: int,
                 etag: str | None) -> list[tuple[int, int]]:
    """Byte ranges for a multipart copy: the source's own parts (so the copy gets the same ETag) when known."""
    count = int(etag.strip('"').rpartition("-")[2]) if etag and "-" in etag else 0
    if count:
        async def part_sizes() -> list[int]:
            gate = asyncio.Semaphore(PARALLEL_PARTS)

            async def head(number: int) -> int:
                async with gate:
                    out = await fs._call_s3("head_object", Bucket=bucket, Key=key, PartNumber=number)
                return int(out["ContentLength"])

            return list(await asyncio.gather(*(head(i) for i in range(1, count + 1))))
        try:
            sizes = sync(fs.loop, part_sizes)
        except OSError:  # a store without per-part HEAD: fixed parts, verified by reading instead
            sizes = []
        if sum(sizes) == size:
            starts = [sum(sizes[:i]) for i in range(len(sizes))]
            return [(start, start + n) for start, n in zip(starts, sizes)]
    part = max(COPY_PART_MIN, -(-size // 10_000))
    return [(start, min(start + part, size)) for start in range(0, size, part)]


def copy_s3_object(fs: fsspec.AbstractFileSystem, src: str, dst: str, size: int, etag: str | None,
                   single_copy_limit: int = COPY_OBJECT_LIMIT) -> str | None:
    """Copy one object inside the store, pinned to the source's ETag; no byte passes through this process.

    Up to `single_copy_limit` (S3: 5 GiB) one CopyObject, which also asks the
    store for the copy's SHA-256: returned (hex) when the store computed it.
    Larger objects: UploadPartCopy of the source's own parts, in parallel
    (the copy keeps the source's ETag); returns None.
    """
    sbucket, skey, _ = fs.split_path(src)
    dbucket, dkey, _ = fs.split_path(dst)
    source = {"Bucket": sbucket, "Key": skey}
    match = {"CopySourceIfMatch": etag} if etag else {}
    if size <= single_copy_limit:
        try:
            out = fs.call_s3("copy_object", Bucket=dbucket, Key=dkey, CopySource=source,
                             ChecksumAlgorithm="SHA256", **match)
        except OSError as exc:
            if s3_error_code(exc) not in UNSUPPORTED:
                raise
            out = fs.call_s3("copy_object", Bucket=dbucket, Key=dkey, CopySource=source, **match)
        result = out.get("CopyObjectResult", {})
        checksum = result.get("ChecksumSHA256")
        if not checksum or "-" in checksum or result.get("ChecksumType") == "COMPOSITE":
            return None
        return base64.b64decode(checksum).hex()

    ranges = _copy_ranges(fs, sbucket, skey, size, etag)

    async def copy_parts() -> None:
        upload = (await fs._call_s3("create_multipart_upload", Bucket=dbucket, Key=dkey))["UploadId"]
        gate = asyncio.Semaphore(PARALLEL_PARTS)

        async def part(number: int, start: int, end: int) -> dict[str, Any]:
            async with gate:
                out = await fs._call_s3("upload_part_copy", Bucket=dbucket, Key=dkey, UploadId=upload,
                                        PartNumber=number, CopySource=source,
                                        CopySourceRange=f"bytes={start}-{end - 1}", **match)
            return {"PartNumber": number, "ETag": out["CopyPartResult"]["ETag"]}

        try:
            parts = await asyncio.gather(*(part(i, a, b) for i, (a, b) in enumerate(ranges, 1)))
            await fs._call_s3("complete_multipart_upload", Bucket=dbucket, Key=dkey, UploadId=upload,
                              MultipartUpload={"Parts": list(parts)})
        except BaseException:
            try:
                await fs._call_s3("abort_multipart_upload", Bucket=dbucket, Key=dkey, UploadId=upload)
            except Exception:  # best effort: the copy was never completed, so nothing is visible
                pass
            raise

    sync(fs.loop, copy_parts)
    return None


def copy_checkpoint(source: str, dest: str, files: dict[str, dict[str, Any]],
                    etags: dict[str, str | None] | None = None) -> set[str]:
    """Copy the manifest's `files` from `source` to `dest`; returns those the store itself verified.

    Inside one S3 store the copy is server-side (`copy_s3_object`) and is
    verified there: the store's SHA-256 of the copy against the manifest, or
    the copy's ETag against the source's (`etags`, listed when the manifest
    was hashed). Across stores the bytes stream through, in parallel parts.
    """
    sfs, sroot = fsspec_filesystem(source)
    dfs, droot = fsspec_filesystem(dest)
    server_side = is_s3(source) and is_s3(dest) and sfs is dfs
    same = type(sfs) is type(dfs) and getattr(sfs, "storage_options", None) == getattr(dfs, "storage_options", None)
    etags = etags or {}

    def copy_one(rel: str) -> str | None:
        src, dst = posixpath.join(sroot, rel), posixpath.join(droot, rel)
        entry = files[rel]
        if server_side:
            digest = copy_s3_object(sfs, src, dst, entry["size"], etags.get(rel))
            if digest is not None:
                if digest != entry["sha256"]:
                    raise ServingError(f"{dest}/{rel}: the store's sha256 of the copy is {digest[:12]}…, "
                                       f"manifest says {entry['sha256'][:12]}…")
                return rel
            copied = dfs.info(dst)
            if etags.get(rel) and copied.get("ETag") == etags[rel] and int(copied.get("size", -1)) == entry["size"]:
                return rel
            return None
        if same and not is_remote(dest):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            sfs.copy(src, dst)
        elif same:
            sfs.copy(src, dst)
        else:
            with _open_read(sfs, src) as fin, _open_write(dfs, dst) as fout:
                shutil.copyfileobj(fin, fout, CHUNK)
        return None

    verified = {rel for rel in _parallel(copy_one, sorted(files)) if rel}
    if server_side:
        logger.info("copied %d files inside the store; %d verified by the store, %d to read back",
                    len(files), len(verified), len(files) - len(verified))
    return verified


def verify_files(version_dir: str, manifest: dict[str, Any], files: Iterable[str] | None = None) -> None:
    """Check the version's files (default: all) against the manifest (size and sha256); raise ServingError if not."""
    fs, root = fsspec_filesystem(join(version_dir, "checkpoint"))
    names = sorted(manifest["files"] if files is None else files)

    def check(rel: str) -> None:
        entry = manifest["files"][rel]
        path = posixpath.join(root, _safe_relpath(rel))
        if not fs.exists(path):
            raise ServingError(f"{version_dir}: {rel} is missing")
        digest = _sha256(fs, path)
        if digest != entry["sha256"]:
            raise ServingError(f"{version_dir}: {rel} has sha256 {digest[:12]}…, manifest says {entry['sha256'][:12]}…")

    _parallel(check, names)


def stage_version(serving: str, checkpoint_uri: str, info: dict[str, Any]) -> PromotedVersion:
    """Copy a checkpoint into a new version and check every file's sha256 against the source.

    The version is not complete until `seal_version` writes its manifest; nothing
    that reads CURRENT sees it before `switch_current`.
    """
    serving = normalize_location(serving)
    objects = list_objects(checkpoint_uri)
    manifest = build_manifest(checkpoint_uri, info, objects)
    version, version_dir = _claim_version(serving)
    manifest = {**manifest, "version": version, "created_at": time.time()}
    verified = copy_checkpoint(checkpoint_uri, join(version_dir, "checkpoint"), manifest["files"],
                               {rel: o["etag"] for rel, o in objects.items()})
    verify_files(version_dir, manifest, [rel for rel in manifest["files"] if rel not in verified])
    return PromotedVersion(version=version, uri=join(version_dir, "checkpoint"), manifest=manifest)


def _claim_version(serving: str) -> tuple[str, str]:
    """Take the next free version number: atomically, so two promoters never share one."""
    for _ in range(20):  # another promoter may take the same number: then take the next
        version = _new_version(serving)
        version_dir = join(serving, "versions", version)
        fs, root = fsspec_filesystem(version_dir)
        if not is_remote(serving):
            try:  # mkdir is atomic: it claims the number locally
                os.makedirs(root, exist_ok=False)
            except FileExistsError:
                continue
            return version, version_dir
        if fs.exists(root):
            continue
        claim = json.dumps({"claimed_at": time.time(), "by": uuid.uuid4().hex}).encode()
        try:  # a conditional PUT (If-None-Match: *) claims the number on S3; elsewhere, a plain write
            if is_s3(serving):
                fs.pipe_file(posixpath.join(root, CLAIM), claim, mode="create")
            else:
                fs.pipe_file(posixpath.join(root, CLAIM), claim)
        except FileExistsError:
            continue
        return version, version_dir
    raise ServingError(f"{serving}: could not allocate a new version")


def seal_version(serving: str, version: PromotedVersion) -> None:
    """Write the version's manifest: from now on it is complete and may become current."""
    write_json(join(normalize_location(serving), "versions", version.version, MANIFEST), version.manifest)


def write_json(uri: str, doc: dict[str, Any]) -> None:
    """Write a JSON document so that readers see the old content or the new, never a partial file.

    Locally: a temporary file in the same folder, then an atomic rename. On an object
    store a single PUT is already atomic.
    """
    data = json.dumps(doc, indent=2, sort_keys=True).encode()
    if is_remote(uri):
        fs, path = fsspec_filesystem(uri)
        fs.pipe_file(path, data)
        return
    path = normalize_location(uri)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_json(uri: str) -> dict[str, Any] | None:
    """Read a JSON document, or None if it does not exist."""
    fs, path = fsspec_filesystem(uri)
    try:
        # one GET: no size from an earlier listing can cut a document another process rewrote
        return json.loads(fs.cat_file(path))
    except FileNotFoundError:
        return None


def read_pointer(serving: str) -> dict[str, Any] | None:
    """The CURRENT pointer document (version, previous, reason), or None before the first promotion."""
    return read_json(join(normalize_location(serving), POINTER))


def read_version(serving: str, version: str) -> PromotedVersion | None:
    """A complete version (one with a manifest), or None if it is missing or incomplete."""
    if not VERSION_RE.match(str(version)):
        raise ServingError(f"{serving}: {version!r} is not a version name like 'v000001'")
    serving = normalize_location(serving)
    manifest = read_json(join(serving, "versions", version, MANIFEST))
    if manifest is None:
        return None
    return PromotedVersion(version=version, uri=join(serving, "versions", version, "checkpoint"), manifest=manifest)


def read_current(serving: str) -> PromotedVersion | None:
    """The version CURRENT points at (with its manifest), or None before the first promotion."""
    pointer = read_pointer(serving)
    if pointer is None:
        return None
    version = pointer.get("version", "")
    if not VERSION_RE.match(str(version)):
        raise ServingError(f"{serving}/{POINTER} names {version!r}, expected a version like 'v000001'")
    current = read_version(serving, version)
    if current is None:
        raise ServingError(f"{serving}/{POINTER} names {version}, which has no {MANIFEST}")
    return current


def switch_current(serving: str, version: PromotedVersion, reason: str) -> None:
    """Point CURRENT at a complete version (atomically) and record it in the history."""
    serving = normalize_location(serving)
    if read_json(join(serving, "versions", version.version, MANIFEST)) is None:
        raise ServingError(f"{serving}: version {version.version} is incomplete (no {MANIFEST})")
    previous = read_current(serving)
    pointer = {"version": version.version, "switched_at": time.time(),
               "previous": previous.version if previous else None, "reason": reason}
    write_json(join(serving, POINTER), pointer)
    # names sort in the order of the switches (nanoseconds), readable thanks to the date prefix
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{time.time_ns():020d}"
    write_json(join(serving, "history", f"{stamp}-{version.version}-{uuid.uuid4().hex[:6]}.json"),
               {**pointer, "step": version.manifest.get("step"), "source": version.manifest.get("source")})


def read_history(serving: str) -> list[dict[str, Any]]:
    """Every pointer switch recorded under the serving location, oldest first."""
    fs, root = fsspec_filesystem(join(normalize_location(serving), "history"))
    try:
        paths = sorted(fs.ls(root, detail=False))
    except FileNotFoundError:
        return []
    return [doc for p in paths if p.endswith(".json") and (doc := read_json(_uri_for(serving, p)))]


def _uri_for(serving: str, path: str) -> str:
    if not is_remote(serving):
        return path
    scheme = serving.split("://", 1)[0]
    return f"{scheme}://{path}"


def fetch_version(version: PromotedVersion, dest: str) -> str:
    """Download a version's checkpoint into local `dest` and check it against its manifest."""
    fs, root = fsspec_filesystem(version.uri)

    def fetch(item: tuple[str, dict[str, Any]]) -> None:
        rel, entry = _safe_relpath(item[0]), item[1]
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fs.get_file(posixpath.join(root, rel), target)
        h = hashlib.sha256()
        with open(target, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
        if h.hexdigest() != entry["sha256"]:
            raise ServingError(f"{version.uri}/{rel}: sha256 does not match the manifest")

    _parallel(fetch, sorted(version.manifest["files"].items()))
    return dest


def load_version_model(version: PromotedVersion):
    """A version's model as a torch module in eval mode (podium's checkpoint format, safe loading).

    A local version is loaded where it is; a remote one is fetched and checked
    against its manifest first.
    """
    try:
        if not is_remote(version.uri):
            return load_model(version.uri)[0]
        with tempfile.TemporaryDirectory(prefix="podium-serving-") as tmp:
            fetch_version(version, tmp)
            return load_model(tmp)[0]
    except CheckpointFormatError as exc:
        raise ServingError(f"{version.uri}: {exc}") from None


def check_loadable(version: PromotedVersion) -> None:
    """A staged version in podium's format must load as a model; other formats are left to their hashes."""
    if META_FILE not in version.manifest["files"]:
        logger.info("%s is not in podium's checkpoint format: checked by its hashes only", version.uri)
        return
    load_version_model(version)


def load_promoted_model(serving: str):
    """The current champion as a torch module in eval mode, checked against its manifest.

    Serving code calls this (or follows CURRENT itself). Works for checkpoints in
    podium's built-in format; for other formats use `fetch_version(read_current(...))`.
    """
    current = read_current(serving)
    if current is None:
        raise ServingError(f"nothing has been promoted to {serving!r} yet")
    if not is_remote(current.uri):
        verify_files(os.path.dirname(current.uri.rstrip("/")), current.manifest)  # served in place: check it first
    return load_version_model(current)
