"""Staging a version: hash the checkpoint once, copy it (inside the store where it can), check the copy.

Verification without moving the bytes twice: the manifest's sha256 of each file is computed
once, by reading the source. The copy is then checked by the store itself: CopyObject is asked
for a SHA-256 of the copy (x-amz-checksum-algorithm), compared with the manifest; where the
store gives none, the copy's ETag must equal the source's (same bytes, same part layout:
UploadPartCopy mirrors the source's parts) and the copy is pinned to the hashed source with
CopySourceIfMatch. Only a copy that neither check covers is read back and hashed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import shutil
import time
from collections.abc import Iterable
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


def _sha256(backend: Backend, fs: fsspec.AbstractFileSystem, path: str, listed: dict[str, Any] | None = None) -> str:
    h = hashlib.sha256()
    with _open_read(backend, fs, path, listed) as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


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
    files = {rel: {"sha256": d, "size": objects[rel]["size"]} for rel, d in zip(names, digests)}
    return {"format": "podium-serving/1", "source": checkpoint_uri, "files": files, **info}


def copy_checkpoint(source: str, dest: str, files: dict[str, dict[str, Any]],
                    etags: dict[str, str | None] | None = None) -> set[str]:
    """Copy the manifest's `files` from `source` to `dest`; returns those the store itself verified.

    Inside one store that can copy (S3) the copy is server-side (the backend's `copy_in_store`) and
    is verified there: the store's SHA-256 of the copy against the manifest, or the copy's ETag
    against the source's (`etags`, listed when the manifest was hashed). Across stores the bytes
    stream through, in parallel parts.
    """
    sfs, sroot = fsspec_filesystem(source)
    dfs, droot = fsspec_filesystem(dest)
    sbackend, dbackend = backend_for(source), backend_for(dest)
    server_side = sbackend is dbackend and sbackend.copies_in_store(sfs, dfs)
    same = type(sfs) is type(dfs) and getattr(sfs, "storage_options", None) == getattr(dfs, "storage_options", None)
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
        if same and not is_remote(dest):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            sfs.copy(src, dst)
        elif same:
            sfs.copy(src, dst)
        else:
            with _open_read(sbackend, sfs, src) as fin, _open_write(dbackend, dfs, dst) as fout:
                shutil.copyfileobj(fin, fout, CHUNK)
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
        digest = _sha256(backend, fs, path)
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
    written as soon as the number is claimed.
    """
    serving = normalize_location(serving)
    objects = list_objects(files_uri)
    manifest = build_manifest(files_uri, info, objects)
    try:
        version, version_dir = claim_version(serving)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        raise full_location_error(serving, "a new version", exc) from None
    if mark is not None:
        write_json(join(version_dir, STAGED), mark)
    manifest = {**manifest, "version": version, "created_at": time.time(), "content": content}
    target = join(version_dir, content_of(manifest))
    try:
        verified = copy_checkpoint(files_uri, target, manifest["files"], {rel: o["etag"] for rel, o in objects.items()})
    except Exception as exc:
        if not is_disk_full(exc):
            raise
        discard_version(version_dir, f"the disk filled up while it was copied ({exc})")
        raise full_location_error(serving, version, exc) from None
    verify_files(version_dir, manifest, [rel for rel in manifest["files"] if rel not in verified])
    return PromotedVersion(version=version, uri=target, manifest=manifest)
