"""A serving location's identity: which registered model it promotes, under which alias.

`<serving>/LOCATION.json` is written by the first promotion there ({"id", "registered_model", "alias"})
and never changes. The location owns its alias: the registry's registered model carries the tag
`podium.location.<alias>` naming the location's id (podium.tracking.registry), and a second serving
location of the same model must promote under an alias of its own (`promotion.alias`). Commands that
act on a location (rollback, status, history) take its model and alias from here, so nothing done at
one location moves another's alias.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from podium.errors import ServingError
from podium.serving.layout import LOCATION
from podium.storage.backends import backend_for
from podium.storage.documents import read_json
from podium.storage.locations import fsspec_filesystem, join, normalize_location


@dataclass(frozen=True)
class Location:
    """A serving location's identity."""

    id: str
    uri: str
    registered_model: str
    alias: str


def read_location(serving: str) -> Location | None:
    """The location's identity, or None before its first promotion."""
    serving = normalize_location(serving)
    doc = read_json(join(serving, LOCATION), ServingError)
    if doc is None:
        return None
    try:
        return Location(id=str(doc["id"]), uri=serving, registered_model=str(doc["registered_model"]),
                        alias=str(doc["alias"]))
    except KeyError as exc:
        raise ServingError(f"{join(serving, LOCATION)} is corrupt: it has no {exc.args[0]!r}") from None


def check_belongs(location: Location | None, registered_model: str, alias: str) -> None:
    """ServingError if a promotion of `registered_model` under `alias` does not belong at this location (None: a
    location without its first promotion, where anything does)."""
    if location is None or (location.registered_model, location.alias) == (registered_model, alias):
        return
    raise ServingError(f"serving location {location.uri} promotes registered model {location.registered_model!r} "
                       f"under alias @{location.alias} (its {LOCATION}); this asks for {registered_model!r} "
                       f"@{alias}: use that model and alias there, or another serving location")


def ensure_location(serving: str, registered_model: str, alias: str) -> Location:
    """The location's identity, written now if this is its first promotion; ServingError if it belongs to
    another registered model or alias. Written with a create-only write, so two first promoters agree."""
    serving = normalize_location(serving)
    found = read_location(serving)
    if found is None:
        doc: dict[str, Any] = {"id": uuid.uuid4().hex, "registered_model": registered_model, "alias": alias,
                               "created_at": time.time()}
        _create(join(serving, LOCATION), json.dumps(doc, indent=2, sort_keys=True).encode())
        found = read_location(serving)
        assert found is not None
    check_belongs(found, registered_model, alias)
    return found


def _create(uri: str, data: bytes) -> None:
    """Write `uri` only if it does not exist (another writer's document stands)."""
    fs, path = fsspec_filesystem(uri)
    try:
        backend_for(uri).create(fs, path, data)
    except FileExistsError:
        pass
