"""Preflight: is a location usable? Fast, one attempt, a message that says what to fix."""

from __future__ import annotations

import contextlib
import posixpath
import uuid

from podium.storage.backends import backend_for
from podium.storage.backends.base import Conflict
from podium.storage.errors import ConditionalWritesIgnored, StorageError
from podium.storage.locations import fsspec_filesystem, is_remote, normalize_location

_HONOURED: set[str] = set()  # the folders whose store was seen to refuse a second create, in this process


def check_location(uri: str, *, write: bool) -> str:
    """Prove a location is usable before anything runs; returns it normalized.

    With `write`, a probe object is written and removed (nothing is left; a
    missing bucket or container is reported, never created); on an object store whose locks and pointers
    podium builds from conditional writes, a second create-only write of a probe object must be refused
    (`check_conditional_writes`). Without, the location must
    exist (FileNotFoundError otherwise). Raises StorageError naming the
    location and what to fix: unreachable endpoint, rejected or missing
    credentials, missing bucket, no permission (each store's backend says it in its own terms), a store that
    ignores conditional writes (ConditionalWritesIgnored).
    """
    location = normalize_location(uri)
    backend = backend_for(location)
    backend.check_location(location, write=write)
    if write and is_remote(location) and backend.conditional_writes:
        check_conditional_writes(location)
    return location


def check_folder(uri: str, what: str) -> str:
    """A location where a folder is expected (`what` says whose: "--serving"): returns it normalized, or raises
    StorageError where a file stands at it or above it (a local path whose parent is a regular file), before any
    read meets it as NotADirectoryError."""
    location = normalize_location(uri)
    found = backend_for(location).file_in_the_way(location)
    if found is not None:
        at = "" if found == location else f" ({found})"
        raise StorageError(location, f"a file{at} stands where {what} expects a folder: give a folder, or a path "
                                     "under one, that podium can create")
    return location


def check_conditional_writes(folder: str) -> None:
    """Prove that the store under `folder` refuses a second create-only write of one object, once per folder and
    process; the probe object is removed again.

    A store that accepted it (an emulator that ignores GCS's ifGenerationMatch, an S3 gateway that drops
    If-None-Match) would let two promoters both take the promotion lease and both switch CURRENT:
    ConditionalWritesIgnored instead, before anything is done. Other errors of the store (unreachable, no
    permission) are its StorageError or OSError, as for any write.
    """
    folder = folder.rstrip("/")
    if folder in _HONOURED:
        return
    backend = backend_for(folder)
    fs, probe = fsspec_filesystem(posixpath.join(folder, f".podium-lease-probe-{uuid.uuid4().hex}"))
    failed: Exception | None = None
    try:
        first = backend.create_versioned(fs, probe, b"probe")
        second = backend.create_versioned(fs, probe, b"probe")
    except Conflict:
        _HONOURED.add(folder)
        return
    except StorageError:
        raise
    except Exception as exc:  # a store that has no conditional writes at all may answer 501, or 400
        failed = exc
    finally:
        with contextlib.suppress(Exception):  # a leftover probe is a few bytes that nothing reads
            fs.rm_file(probe)
    expected = ("expected a store that refuses a create-only write of an object that exists (GCS: "
                "ifGenerationMatch=0; S3 and Azure Blob: If-None-Match: *)")
    if failed is not None:
        raise ConditionalWritesIgnored(
            folder, f"this {backend.name} store did not take a create-only write of a probe object "
                    f"({type(failed).__name__}: {failed}), so no promotion lock can be taken on it; {expected}")
    raise ConditionalWritesIgnored(
        folder, f"this {backend.name} store ignores conditional writes (a second create-only write of one object "
                f"succeeded: versions {first} then {second}), so no promotion lock can be taken on it and two "
                f"promoters could both switch CURRENT; {expected}")
