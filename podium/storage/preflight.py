"""Preflight: is a location usable? Fast, one attempt, a message that says what to fix."""

from __future__ import annotations

from podium.storage.backends import backend_for
from podium.storage.locations import normalize_location


def check_location(uri: str, *, write: bool) -> str:
    """Prove a location is usable before anything runs; returns it normalized.

    With `write`, a probe object is written and removed (nothing is left; a
    missing bucket or container is reported, never created). Without, the location must
    exist (FileNotFoundError otherwise). Raises StorageError naming the
    location and what to fix: unreachable endpoint, rejected or missing
    credentials, missing bucket, no permission (each store's backend says it in its own terms).
    """
    location = normalize_location(uri)
    backend_for(location).check_location(location, write=write)
    return location
