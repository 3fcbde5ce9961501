"""JSON documents where bytes live (a local path or an object store): written so that readers see the old
content or the new, never a partial file, and read in one GET."""

from __future__ import annotations

import json
from typing import Any

from podium.errors import PodiumError
from podium.storage.backends import backend_for
from podium.storage.locations import fsspec_filesystem


class DocumentError(PodiumError, ValueError):
    """A JSON document that is not one: truncated, corrupt, or not a JSON object."""


def write_json(uri: str, doc: dict[str, Any]) -> None:
    """Write a JSON document so that readers see the old content or the new, never a partial file.

    Locally: a temporary file in the same folder, then an atomic rename. On an object
    store a single PUT is already atomic.
    """
    data = json.dumps(doc, indent=2, sort_keys=True).encode()
    fs, path = fsspec_filesystem(uri)
    backend_for(uri).write(fs, path, data)


def read_json(uri: str, error: type[Exception] = DocumentError) -> dict[str, Any] | None:
    """Read a JSON document (an object), or None if it does not exist. One that is not a JSON object raises
    `error` (DocumentError, or the caller's own, which says whose document it is: ServingError for a
    serving location's)."""
    fs, path = fsspec_filesystem(uri)
    try:
        # one GET: no size from an earlier listing can cut a document another process rewrote
        data = fs.cat_file(path)
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(data)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise error(f"{uri} is not valid JSON (truncated or corrupt?): {exc}") from None
    if not isinstance(doc, dict):
        raise error(f"{uri} is corrupt: expected a JSON object, found a {type(doc).__name__}")
    return doc
