"""The serving location: immutable versions, each with a manifest, and one pointer that says which is current.

Layout (local path or URI):

    <serving>/CURRENT                          {"version": "v000003", ...}  written last, atomically
    <serving>/versions/v000003/MANIFEST.json   files with sha256 and size, source run, step, metrics
    <serving>/versions/v000003/checkpoint/...  the promoted checkpoint's files
    <serving>/history/<time>-v000003.json      one record per promotion or rollback

A version is complete once its MANIFEST.json exists (written after every file
was copied and checked); CURRENT only ever names complete versions. A reader
follows CURRENT, so it sees the old version or the new one, never a mix.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any

import fsspec

from training.checkpoint import CheckpointFormatError, load_model
from training.storage import fsspec_filesystem, is_remote, join, normalize_location

POINTER = "CURRENT"
MANIFEST = "MANIFEST.json"
VERSION_RE = re.compile(r"^v(\d{6,})$")
CHUNK = 8 << 20


class ServingError(RuntimeError):
    """The serving location is missing, inconsistent, or a copy failed verification."""


@dataclass(frozen=True)
class PromotedVersion:
    """A complete version under the serving location."""

    version: str
    uri: str
    manifest: dict[str, Any]


def _sha256(fs: fsspec.AbstractFileSystem, path: str) -> str:
    h = hashlib.sha256()
    with fs.open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _safe_relpath(rel: str) -> str:
    """Reject manifest entries that would escape the version folder."""
    norm = posixpath.normpath(rel)
    if norm.startswith("/") or norm == ".." or norm.startswith("../") or "\\" in rel or norm == ".":
        raise ServingError(f"manifest entry {rel!r} escapes its folder")
    return norm


def list_files(uri: str) -> dict[str, int]:
    """Relative path -> size of every file under a directory (path or URI)."""
    fs, root = fsspec_filesystem(uri)
    if not fs.isdir(root):
        raise ServingError(f"checkpoint {uri!r} is not a directory")
    out = {}
    for path, info in fs.find(root, detail=True).items():
        rel = posixpath.relpath(path, root.rstrip("/"))
        out[_safe_relpath(rel)] = int(info.get("size") or 0)
    if not out:
        raise ServingError(f"checkpoint {uri!r} is empty")
    return out


def build_manifest(checkpoint_uri: str, info: dict[str, Any]) -> dict[str, Any]:
    """Manifest of a checkpoint: each file's sha256 and size, plus `info` (source run, step, metrics)."""
    fs, root = fsspec_filesystem(checkpoint_uri)
    files = {
        rel: {"sha256": _sha256(fs, posixpath.join(root, rel)), "size": size}
        for rel, size in sorted(list_files(checkpoint_uri).items())
    }
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


def copy_checkpoint(source: str, dest: str, files: list[str]) -> None:
    """Copy files from `source` to `dest`; server-side when both are on the same object store."""
    sfs, sroot = fsspec_filesystem(source)
    dfs, droot = fsspec_filesystem(dest)
    same = type(sfs) is type(dfs) and getattr(sfs, "storage_options", None) == getattr(dfs, "storage_options", None)
    for rel in files:
        src, dst = posixpath.join(sroot, rel), posixpath.join(droot, rel)
        if same:
            if not is_remote(dest):
                os.makedirs(os.path.dirname(dst), exist_ok=True)
            sfs.copy(src, dst)
        else:
            with sfs.open(src, "rb") as fin, dfs.open(dst, "wb") as fout:
                shutil.copyfileobj(fin, fout, CHUNK)


def verify_files(version_dir: str, manifest: dict[str, Any]) -> None:
    """Check every file of the version against the manifest (size and sha256); raise ServingError if not."""
    fs, root = fsspec_filesystem(join(version_dir, "checkpoint"))
    for rel, entry in manifest["files"].items():
        path = posixpath.join(root, _safe_relpath(rel))
        if not fs.exists(path):
            raise ServingError(f"{version_dir}: {rel} is missing")
        digest = _sha256(fs, path)
        if digest != entry["sha256"]:
            raise ServingError(f"{version_dir}: {rel} has sha256 {digest[:12]}…, manifest says {entry['sha256'][:12]}…")


def stage_version(serving: str, checkpoint_uri: str, info: dict[str, Any]) -> PromotedVersion:
    """Copy a checkpoint into a new version and check every file's sha256 against the source.

    The version is not complete until `seal_version` writes its manifest; nothing
    that reads CURRENT sees it before `switch_current`.
    """
    serving = normalize_location(serving)
    manifest = build_manifest(checkpoint_uri, info)
    for _ in range(20):  # another promoter may take the same number: then take the next
        version = _new_version(serving)
        version_dir = join(serving, "versions", version)
        fs, root = fsspec_filesystem(version_dir)
        if fs.exists(root):
            continue
        if not is_remote(serving):
            try:  # mkdir is atomic: it claims the number locally
                os.makedirs(root, exist_ok=False)
            except FileExistsError:
                continue
        break
    else:
        raise ServingError(f"{serving}: could not allocate a new version")
    manifest = {**manifest, "version": version, "created_at": time.time()}
    copy_checkpoint(checkpoint_uri, join(version_dir, "checkpoint"), list(manifest["files"]))
    verify_files(version_dir, manifest)
    return PromotedVersion(version=version, uri=join(version_dir, "checkpoint"), manifest=manifest)


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
        with fs.open(path, "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        return None


def read_current(serving: str) -> PromotedVersion | None:
    """The version CURRENT points at (with its manifest), or None before the first promotion."""
    serving = normalize_location(serving)
    pointer = read_json(join(serving, POINTER))
    if pointer is None:
        return None
    version = pointer.get("version", "")
    if not VERSION_RE.match(str(version)):
        raise ServingError(f"{serving}/{POINTER} names {version!r}, expected a version like 'v000001'")
    manifest = read_json(join(serving, "versions", version, MANIFEST))
    if manifest is None:
        raise ServingError(f"{serving}/{POINTER} names {version}, which has no {MANIFEST}")
    return PromotedVersion(version=version, uri=join(serving, "versions", version, "checkpoint"), manifest=manifest)


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
    for rel, entry in version.manifest["files"].items():
        rel = _safe_relpath(rel)
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fs.get_file(posixpath.join(root, rel), target)
        h = hashlib.sha256()
        with open(target, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
        if h.hexdigest() != entry["sha256"]:
            raise ServingError(f"{version.uri}/{rel}: sha256 does not match the manifest")
    return dest


def load_promoted_model(serving: str):
    """The current champion as a torch module in eval mode, checked against its manifest.

    Serving code calls this (or follows CURRENT itself). Works for checkpoints in
    podium's built-in format; for other formats use `fetch_version(read_current(...))`.
    """
    current = read_current(serving)
    if current is None:
        raise ServingError(f"nothing has been promoted to {serving!r} yet")
    with tempfile.TemporaryDirectory(prefix="podium-serving-") as tmp:
        fetch_version(current, tmp)
        try:
            model, _ = load_model(tmp)
        except CheckpointFormatError as exc:
            raise ServingError(f"{current.uri}: {exc}") from None
    return model
