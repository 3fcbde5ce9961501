"""Staging a version: copy a checkpoint into a new version folder, hash it, check the copy.

Where the bytes pass through this process (on a local disk, and from one store to another), each
file is read once: what is read is written to the copy and hashed at the same time, and that sha256
is the manifest's. The copy is then read back: on a local disk each chunk as soon as it is written,
compared with the bytes hashed; on a store, once uploaded, hashed again and compared with the
manifest. Either way the copy holds exactly the bytes the manifest's sha256 was computed from, and
the source is read once instead of twice (the sha256 of the bytes, not their reading, is most of
a promotion's cost: one pass of it is several times a plain copy).

Where the store copies by itself (inside S3: CopyObject; inside GCS and Azure: their server-side
copy), the manifest's sha256 is computed first, by reading the source, and the copy is checked by
the store where it can: CopyObject is asked for a SHA-256 of the copy (x-amz-checksum-algorithm),
compared with the manifest; where the store gives none, the copy's ETag must equal the source's
(same bytes, same part layout: UploadPartCopy mirrors the source's parts) and the copy is pinned to
the hashed source with CopySourceIfMatch. A copy that neither check covers is read back and hashed.

A copy that fails half way (a source that vanished, a store error, a full disk) or that does not
match leaves its version discarded (`discard_version`: a tombstone, no files), never half written.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import posixpath
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import fsspec

from podium.errors import ServingError
from podium.serving.layout import (
    CHUNK,
    STAGED,
    PromotedVersion,
    claim_version,
    content_of,
    discard_version,
    full_location_error,
    is_disk_full,
    parallel,
    safe_relpath,
    write_json,
)
from podium.storage.backends import backend_for
from podium.storage.backends.base import Backend, BinaryStream
from podium.storage.locations import fsspec_filesystem, is_remote, join, normalize_location

logger = logging.getLogger(__name__)


def _open_read(backend: Backend, fs: fsspec.AbstractFileSystem, path: str,
               listed: dict[str, Any] | None = None) -> BinaryStream:
    """A front-to-back reader (the store's fastest: concurrent ranged GETs on S3; `listed` spares a HEAD)."""
    return backend.open_read(fs, path, listed)


def _open_write(backend: Backend, fs: fsspec.AbstractFileSystem, path: str) -> BinaryStream:
    """A writer published only when closed without error (a parallel multipart upload on S3)."""
    return backend.open_write(fs, path)


def _buffer_size(backend: Backend, size: int | None) -> int | None:
    """The buffers `_chunks` reads a file of this machine into (the file's size, up to CHUNK); None for a store."""
    if not backend.on_this_disk:
        return None
    return CHUNK if size is None else min(CHUNK, max(size, 1 << 16))


def _chunks(f: BinaryStream, buffer_size: int | None) -> Iterator[bytes | memoryview]:
    """`f` front to back, CHUNK at a time. A file of this machine (`buffer_size`, from `_buffer_size`) is read into
    two buffers in turn (new memory per chunk would cost its page faults, about as much as the read): a chunk is
    valid until the one after next is read."""
    if buffer_size is None:
        while chunk := f.read(CHUNK):
            yield chunk
        return
    buffers = [bytearray(buffer_size), bytearray(buffer_size)]
    views = [memoryview(b) for b in buffers]
    turn = 0
    while n := f.readinto(buffers[turn]):
        yield views[turn][:n]
        turn ^= 1


def _hashed(chunks: Iterable[bytes | memoryview], h: Any) -> Iterator[bytes | memoryview]:
    """The chunks, each fed to the hash `h` on a thread of its own while the caller uses it (writes it) and the next
    is read: hashing releases the GIL. A chunk's hash is done before the one after next is read (`_chunks`'s turns)."""
    with ThreadPoolExecutor(max_workers=1) as hasher:
        hashing: Future[None] | None = None
        for chunk in chunks:
            if hashing is not None:
                hashing.result()
            hashing = hasher.submit(h.update, chunk)
            yield chunk
        if hashing is not None:
            hashing.result()


def _sha256(backend: Backend, fs: fsspec.AbstractFileSystem, path: str, listed: dict[str, Any] | None = None,
            size: int | None = None) -> str:
    """The file's sha256 (hex); `size`: what it should be, to size the buffers by."""
    h = hashlib.sha256()
    with _open_read(backend, fs, path, listed) as f:
        for _ in _hashed(_chunks(f, _buffer_size(backend, listed["size"] if listed else size)), h):
            pass
    return h.hexdigest()


def _read_back(copy: BinaryStream, chunk: bytes | memoryview, into: bytearray, where: str) -> None:
    """Read the next len(chunk) bytes of the copy (`into`, if it is that size) and require them equal to `chunk`."""
    buffer = into if len(into) == len(chunk) else bytearray(len(chunk))
    view, got = memoryview(buffer), 0
    while got < len(buffer) and (n := copy.readinto(view[got:])):
        got += n
    if got != len(chunk):
        raise ServingError(f"{where}: {got} of the {len(chunk)} bytes written could be read back from the copy")
    if buffer != chunk:  # bytearray against a buffer: one memcmp
        raise ServingError(f"{where}: the copy read back differs from the bytes written (and hashed)")


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
        out[safe_relpath(rel)] = {"size": int(info.get("size") or 0), "etag": info.get("ETag")}
    return out


def build_manifest(checkpoint_uri: str, info: dict[str, Any],
                   objects: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Manifest of a checkpoint: each file's sha256 and size, plus `info` (source run, step, metrics).

    The files are read once, several at a time (on S3 in concurrent ranges).
    """
    fs, root = fsspec_filesystem(checkpoint_uri)
    backend = backend_for(checkpoint_uri)
    objects = objects if objects is not None else list_objects(checkpoint_uri)
    names = sorted(objects)
    digests = parallel(lambda rel: _sha256(backend, fs, posixpath.join(root, rel), objects[rel]), names)
    return manifest_of(checkpoint_uri, {rel: {"sha256": d, "size": objects[rel]["size"]} for rel, d in zip(names, digests)},
                       info)


def manifest_of(source: str, files: dict[str, dict[str, Any]], info: dict[str, Any]) -> dict[str, Any]:
    """The manifest of the folder `source`: its `files` (relative path -> sha256 and size, in order), plus `info`."""
    return {"format": "podium-serving/1", "source": source, "files": {rel: files[rel] for rel in sorted(files)}, **info}


def copies_in_process(source: str, dest: str) -> bool:
    """Whether a copy from `source` to `dest` streams the bytes through this process (a local disk, or two
    different stores), rather than being made by the store itself (inside one S3, GCS or Azure store)."""
    sfs, _ = fsspec_filesystem(source)
    dfs, _ = fsspec_filesystem(dest)
    return not (is_remote(dest) and _same_store(sfs, dfs))


def _same_store(sfs: fsspec.AbstractFileSystem, dfs: fsspec.AbstractFileSystem) -> bool:
    return type(sfs) is type(dfs) and getattr(sfs, "storage_options", None) == getattr(dfs, "storage_options", None)


def _copy_hashing(sbackend: Backend, sfs: fsspec.AbstractFileSystem, src: str, dbackend: Backend,
                  dfs: fsspec.AbstractFileSystem, dst: str, listed: dict[str, Any]) -> tuple[str, int, bool]:
    """Copy one file, its bytes read once: each chunk read is written and hashed (the hash overlapping the write and
    the next read). On this machine's disk each chunk is also read back from the copy once written and compared
    with the bytes hashed (a memcmp instead of a second hash of the copy). Returns the sha256 (hex) and the size
    of what was copied, and whether the copy was read back."""
    h, size = hashlib.sha256(), 0
    read_back = dbackend.on_this_disk
    with (_open_read(sbackend, sfs, src, listed) as fin, _open_write(dbackend, dfs, dst) as fout,
          open(dst, "rb", buffering=0) if read_back else contextlib.nullcontext() as back):
        into = bytearray(min(CHUNK, max(int(listed["size"]), 1)))
        for chunk in _hashed(_chunks(fin, _buffer_size(sbackend, int(listed["size"]))), h):
            fout.write(chunk)
            if back is not None:
                fout.flush()
                _read_back(back, chunk, into, f"{dst} at byte {size}")
            size += len(chunk)
        if back is not None and back.read(1):
            raise ServingError(f"{dst}: the copy is longer than the {size} bytes written")
    return h.hexdigest(), size, read_back


def copy_hashing(source: str, dest: str,
                 objects: dict[str, dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], set[str]]:
    """Copy the listed files (`list_objects`) from `source` to `dest` through this process, each read once and
    hashed as it is copied. Returns the manifest's files (sha256 and size of the bytes copied) and those already
    checked (read back as they were written: on this machine's disk); the others are for `verify_files`. Raises
    ServingError if a file's size is not the listed one (it changed while it was copied)."""
    sfs, sroot = fsspec_filesystem(source)
    dfs, droot = fsspec_filesystem(dest)
    sbackend, dbackend = backend_for(source), backend_for(dest)

    def copy_one(rel: str) -> tuple[dict[str, Any], bool]:
        src, dst = posixpath.join(sroot, rel), posixpath.join(droot, rel)
        if dbackend.on_this_disk:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
        digest, size, checked = _copy_hashing(sbackend, sfs, src, dbackend, dfs, dst, objects[rel])
        if size != objects[rel]["size"]:
            raise ServingError(f"{source}/{rel}: {size} bytes were copied, {objects[rel]['size']} listed: "
                               "the checkpoint changed while it was copied")
        return {"sha256": digest, "size": size}, checked

    names = sorted(objects)
    copied = parallel(copy_one, names)
    return ({rel: entry for rel, (entry, _) in zip(names, copied)},
            {rel for rel, (_, checked) in zip(names, copied) if checked})


def copy_checkpoint(source: str, dest: str, files: dict[str, dict[str, Any]],
                    etags: dict[str, str | None] | None = None) -> set[str]:
    """Copy the manifest's `files` from `source` to `dest` inside one store; returns those the store itself verified.

    Inside one store that can copy (S3) the copy is server-side (the backend's `copy_in_store`) and
    is verified there: the store's SHA-256 of the copy against the manifest, or the copy's ETag
    against the source's (`etags`, listed when the manifest was hashed). GCS and Azure copy with
    their own server-side copy, checked by reading it back (`verify_files`). Copies through this
    process are `copy_hashing`'s.
    """
    sfs, sroot = fsspec_filesystem(source)
    dfs, droot = fsspec_filesystem(dest)
    if copies_in_process(source, dest):
        raise ServingError(f"{source} -> {dest}: not a copy inside one store (copy_hashing copies it)")
    sbackend = backend_for(source)
    server_side = sbackend is backend_for(dest) and sbackend.copies_in_store(sfs, dfs)
    etags = etags or {}

    def copy_one(rel: str) -> str | None:
        src, dst = posixpath.join(sroot, rel), posixpath.join(droot, rel)
        entry = files[rel]
        if server_side:
            digest = sbackend.copy_in_store(sfs, src, dst, entry["size"], etags.get(rel))
            if digest is not None:
                if digest != entry["sha256"]:
                    raise ServingError(f"{dest}/{rel}: the store's sha256 of the copy is {digest[:12]}…, "
                                       f"manifest says {entry['sha256'][:12]}…")
                return rel
            if sbackend.same_copy(etags.get(rel), entry["size"], dfs.info(dst)):
                return rel
            return None
        sfs.copy(src, dst)
        return None

    verified = {rel for rel in parallel(copy_one, sorted(files)) if rel}
    if server_side:
        logger.info("copied %d files inside the store; %d verified by the store, %d to read back",
                    len(files), len(verified), len(files) - len(verified))
    return verified


def verify_files(version_dir: str, manifest: dict[str, Any], files: Iterable[str] | None = None) -> None:
    """Check the version's files (default: all) against the manifest (size and sha256); raise ServingError if not."""
    fs, root = fsspec_filesystem(join(version_dir, content_of(manifest)))
    backend = backend_for(version_dir)
    names = sorted(manifest["files"] if files is None else files)

    def check(rel: str) -> None:
        entry = manifest["files"][rel]
        path = posixpath.join(root, safe_relpath(rel))
        if not fs.exists(path):
            raise ServingError(f"{version_dir}: {rel} is missing")
        digest = _sha256(backend, fs, path, size=int(entry["size"]))
        if digest != entry["sha256"]:
            raise ServingError(f"{version_dir}: {rel} has sha256 {digest[:12]}…, manifest says {entry['sha256'][:12]}…")

    parallel(check, names)


def stage_version(serving: str, files_uri: str, info: dict[str, Any], content: str = "checkpoint",
                  mark: dict[str, Any] | None = None) -> PromotedVersion:
    """Copy the folder `files_uri` (a checkpoint, or the served model built from one) into a new
    version's `content` folder and check every file's sha256 against the source.

    `info` lands in the manifest (its `source` names the checkpoint, wherever the files came from).
    The version is not complete until `seal_version` writes its manifest; nothing
    that reads CURRENT sees it before `switch_current`. `mark` (podium.serving.staged) says who stages it,
    written as soon as the number is claimed. A copy that fails or does not match is discarded (a tombstone keeps
    its number) before the error is raised; a full disk raises `ServingFull`.
    """
    serving = normalize_location(serving)
    objects = list_objects(files_uri)
    in_process = copies_in_process(files_uri, join(serving, "versions"))
    # a store's own copy needs the hashes first (to check the copy against); a copy through this process makes them
    manifest = manifest_of(files_uri, {}, info) if in_process else build_manifest(files_uri, info, objects)
    try:
        version, version_dir = claim_version(serving)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        raise full_location_error(serving, "a new version", exc) from None
    try:
        if mark is not None:
            write_json(join(version_dir, STAGED), mark)
        manifest = {**manifest, "version": version, "created_at": time.time(), "content": content}
        target = join(version_dir, content_of(manifest))
        if in_process:
            files, verified = copy_hashing(files_uri, target, objects)
            manifest = {**manifest, "files": files}
        else:
            etags = {rel: o["etag"] for rel, o in objects.items()}
            verified = copy_checkpoint(files_uri, target, manifest["files"], etags)
        verify_files(version_dir, manifest, [rel for rel in manifest["files"] if rel not in verified])
    except Exception as exc:
        full = is_disk_full(exc)
        why = f"the disk filled up while it was copied ({exc})" if full else f"its copy failed ({exc})"
        try:
            discard_version(version_dir, why)
        except Exception:  # best effort: the version has no manifest, nothing serves it
            logger.warning("could not discard %s after its copy failed", version_dir, exc_info=True)
        if full:
            raise full_location_error(serving, version, exc) from None
        raise
    return PromotedVersion(version=version, uri=target, manifest=manifest)
