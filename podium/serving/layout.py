"""The serving location: immutable versions, each with a manifest, and one pointer that says which is current.

Layout (local path or URI):

    <serving>/CURRENT                          {"version": "v000003", ...}  written last, atomically
    <serving>/versions/v000003/MANIFEST.json   files with sha256 and size, source run, step, metrics
    <serving>/versions/v000003/model/...       the served model (an MLflow model folder), or
    <serving>/versions/v000003/checkpoint/...  the promoted checkpoint's files, where podium cannot build one
    <serving>/versions/v000003/CLAIM           object stores only: who took the number (conditional PUT)
    <serving>/versions/v000004/STAGED.json     a version being staged or awaiting approval: who stages it
    <serving>/versions/v000005/DISCARDED.json  a version that never became complete (rejected, withdrawn, a
                                               failed copy): its number stays taken, its files are gone
    <serving>/history/<time>-v000003.json      one record per promotion or rollback
    <serving>/LOCATION.json                    the location's identity: its id, registered model and alias

A version number is never reused, so a number names one model for good: a candidate that is rejected
keeps its folder as a tombstone. Each version's manifest carries a `version_uid`, which the registry's
version is tagged with (`podium.version_uid`): the registry and the serving location are matched by
that identity, never by path.

A version is complete once its MANIFEST.json exists (written after every file
was copied and checked); CURRENT only ever names complete versions. A reader
follows CURRENT, so it sees the old version or the new one, never a mix.

On an object store (no rename), the same layout works because every step is one atomic PUT
of a new key and nothing complete is ever rewritten: a version's number is
claimed with a create-only write of `versions/vN/CLAIM` (S3 If-None-Match, GCS ifGenerationMatch=0,
Azure If-None-Match), its files are copied inside the store where it can (S3: CopyObject, or
UploadPartCopy above 5 GiB), its MANIFEST.json is one PUT, and CURRENT is one PUT, last. A promoter that dies
anywhere leaves at most an unreferenced, manifest-less version behind.

Verification (podium.serving.staging): the manifest's sha256 of each file comes from
one read of the source. A copy through this process hashes the bytes as it copies them,
then reads the copy back (compared chunk by chunk on a local disk, hashed on a store).
Inside S3 the store checks its own copy: CopyObject is asked for a SHA-256 of the copy
(x-amz-checksum-algorithm), compared with the manifest; where the store gives none, the
copy's ETag must equal the source's (same bytes, same part layout: UploadPartCopy mirrors
the source's parts) and the copy is pinned to the hashed source with CopySourceIfMatch. A
store's copy that neither check covers is read back and hashed.
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import re
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from podium.errors import ServingError
from podium.serving.history import Lineage, lineage_of, parse_switch
from podium.storage.backends import backend_for
from podium.storage.documents import read_json, write_json
from podium.storage.locations import fsspec_filesystem, is_remote, join, normalize_location

POINTER = "CURRENT"


MANIFEST = "MANIFEST.json"


CLAIM = "CLAIM"


STAGED = "STAGED.json"


DISCARDED = "DISCARDED.json"


LOCATION = "LOCATION.json"


VERSION_RE = re.compile(r"^v(\d{6,})$")


# what a version folder holds: the served MLflow model, or a checkpoint's files (also every version
# written before podium built served models, whose manifests do not say)
CONTENTS = ("model", "checkpoint")


CHUNK = 8 << 20


PARALLEL_FILES = 8  # files hashed, copied or fetched at once


T = TypeVar("T")


R = TypeVar("R")


@dataclass(frozen=True)
class PromotedVersion:
    """A complete version under the serving location."""

    version: str
    uri: str
    manifest: dict[str, Any]


def parallel(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """fn over items on a few threads (network and hashing release the GIL); the first error is raised."""
    items = list(items)
    if len(items) <= 1:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(max_workers=min(PARALLEL_FILES, len(items))) as pool:
        return list(pool.map(fn, items))


def safe_relpath(rel: str) -> str:
    """Reject manifest entries that would escape the version folder."""
    norm = posixpath.normpath(rel)
    if norm.startswith("/") or norm == ".." or norm.startswith("../") or "\\" in rel or norm == ".":
        raise ServingError(f"manifest entry {rel!r} escapes its folder")
    return norm


def version_names(serving: str) -> list[str]:
    """Every version number taken at the location (complete, staged or discarded), in order."""
    fs, root = fsspec_filesystem(join(serving, "versions"))
    try:
        names = [posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False)]
    except FileNotFoundError:
        return []
    return sorted(n for n in names if VERSION_RE.match(n))


def _new_version(serving: str) -> str:
    existing = [int(v[1:]) for v in version_names(serving)]  # names matched VERSION_RE
    return f"v{(max(existing) + 1) if existing else 1:06d}"


def claim_version(serving: str) -> tuple[str, str]:
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
        try:  # a create-only write claims the number (a plain write on a store that has none)
            backend_for(serving).create(fs, posixpath.join(root, CLAIM), claim)
        except FileExistsError:
            continue
        return version, version_dir
    raise ServingError(f"{serving}: could not allocate a new version")


class ServingFull(ServingError):
    """The serving location ran out of space (or quota) while a version was written."""


def is_disk_full(exc: BaseException) -> bool:
    """Whether an error is a full disk or an exhausted quota (ENOSPC, EDQUOT), also as the cause of another."""

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


def discard_version(version_dir: str, why: str = "its copy did not complete") -> None:
    """Remove a version that never became current (a copy that failed half way, a rejected or withdrawn
    candidate): its files go, its number stays taken by a tombstone (`DISCARDED.json`, written first, so that
    no other promoter can claim the number between the two). Best effort: what remains of it is
    unreferenced (no manifest, not in CURRENT)."""
    fs, root = fsspec_filesystem(version_dir)
    root = root.rstrip("/")
    try:
        staged = read_json(join(version_dir, STAGED), ServingError) or {}
    except ServingError:
        staged = {}
    tombstone = json.dumps({"version": posixpath.basename(root), "version_uid": staged.get("version_uid"),
                            "why": why, "at": time.time(), "staged_by": staged}, indent=2, sort_keys=True).encode()
    try:
        fs.pipe_file(posixpath.join(root, DISCARDED), tombstone)
        written = True
    except OSError:  # a full disk: the files go first, then the tombstone fits
        written = False
    try:
        for path in fs.ls(root, detail=False):
            if posixpath.basename(path.rstrip("/")) not in (DISCARDED, CLAIM):
                fs.rm(path, recursive=True)
        if not written:
            fs.pipe_file(posixpath.join(root, DISCARDED), tombstone)
    except OSError:
        pass


def full_location_error(serving: str, version: str, exc: BaseException) -> ServingFull:
    """One sentence for a version that did not fit: where, what was undone, what serves now."""
    try:
        current = read_pointer(serving)
    except (ServingError, OSError):
        current = None
    now = f"{current['version']} stays current" if current and current.get("version") else "nothing was being served"
    undone = f"the partial {version} was removed" if version.startswith("v") else "nothing was written"
    return ServingFull(f"no space left at the serving location {serving} while writing {version} "
                       f"({getattr(exc, 'strerror', None) or exc}): {undone} and {now}; "
                       "free space there and run `podium promote` with the same --run-name to promote again")


def seal_version(serving: str, version: PromotedVersion) -> None:
    """Write the version's manifest: from now on it is complete and may become current."""
    write_json(join(normalize_location(serving), "versions", version.version, MANIFEST), version.manifest)


def read_pointer(serving: str) -> dict[str, Any] | None:
    """The CURRENT pointer document (version, previous, reason), or None before the first promotion."""
    return read_json(join(normalize_location(serving), POINTER), ServingError)


def read_version(serving: str, version: str) -> PromotedVersion | None:
    """A complete version (one with a manifest), or None if it is missing or incomplete."""
    if not VERSION_RE.match(str(version)):
        raise ServingError(f"{serving}: {version!r} is not a version name like 'v000001'")
    serving = normalize_location(serving)
    manifest = read_json(join(serving, "versions", version, MANIFEST), ServingError)
    if manifest is None:
        return None
    return PromotedVersion(version=version, uri=join(serving, "versions", version, content_of(manifest)),
                           manifest=manifest)


def content_of(manifest: dict[str, Any]) -> str:
    """The folder of a version that holds its files: 'model' or 'checkpoint'."""
    content = manifest.get("content", "checkpoint")
    if content not in CONTENTS:
        raise ServingError(f"manifest of {manifest.get('version')}: content {content!r}, expected one of {CONTENTS}")
    return str(content)


def promoted_by(serving: str, mlflow_run_id: str) -> PromotedVersion | None:
    """The newest complete version a given run promoted (its manifest names the MLflow run), or None."""
    for name in reversed(version_names(normalize_location(serving))):
        version = read_version(serving, name)
        if version is not None and version.manifest.get("mlflow_run_id") == mlflow_run_id:
            return version
    return None


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


def switch_current(serving: str, version: PromotedVersion, reason: str, *, action: str = "promote",
                   withdrawn: str | None = None, origin: dict[str, Any] | None = None) -> None:
    """Point CURRENT at a complete version (atomically) and record the switch in the history.

    The history record says what it was (`action`: promote or rollback), why (`reason`), which
    version it withdrew (a rollback's), and what started it (`origin`: the flow run or command,
    user, host); `podium.serving.history` reads the lineage of champions back from these."""
    serving = normalize_location(serving)
    if read_json(join(serving, "versions", version.version, MANIFEST), ServingError) is None:
        raise ServingError(f"{serving}: version {version.version} is incomplete (no {MANIFEST})")
    previous = read_current(serving)
    pointer = {"version": version.version, "switched_at": time.time(),
               "previous": previous.version if previous else None, "reason": reason, "action": action}
    write_json(join(serving, POINTER), pointer)
    # names sort in the order of the switches (nanoseconds), readable thanks to the date prefix
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{time.time_ns():020d}"
    m = version.manifest
    write_json(join(serving, "history", f"{stamp}-{version.version}-{uuid.uuid4().hex[:6]}.json"),
               {**pointer, "withdrawn": withdrawn, "origin": origin or {}, "step": m.get("step"),
                "source": m.get("source"), "run_name": m.get("run_name"), "metric": m.get("metric"),
                "value": m.get("value")})


def read_history(serving: str) -> list[dict[str, Any]]:
    """Every pointer switch recorded under the serving location, oldest first."""
    fs, root = fsspec_filesystem(join(normalize_location(serving), "history"))
    try:
        paths = sorted(fs.ls(root, detail=False))
    except FileNotFoundError:
        return []
    return [doc for p in paths if p.endswith(".json") and (doc := read_json(_uri_for(serving, p), ServingError))]


def read_lineage(serving: str) -> Lineage:
    """The champions of a serving location in promotion order, and the withdrawn ones (from its history)."""
    return lineage_of(parse_switch(doc) for doc in read_history(serving))


def withdrawn_checkpoints(serving: str) -> dict[str, str]:
    """Source checkpoint URI -> why, for every version a rollback withdrew from this serving location
    (and that was not served again since): promotion never picks these checkpoints again."""
    out = {}
    for version, switch in read_lineage(serving).withdrawn.items():
        promoted = read_version(serving, version)
        if promoted is not None and promoted.manifest.get("source"):
            when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(switch.at))
            out[str(promoted.manifest["source"])] = (
                f"served as {version}, withdrawn by a rollback on {when} ({switch.reason}); "
                f"`podium rollback --to {version}` serves it again")
    return out


def _uri_for(serving: str, path: str) -> str:
    if not is_remote(serving):
        return path
    scheme = serving.split("://", 1)[0]
    return f"{scheme}://{path}"
