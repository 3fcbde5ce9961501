"""Loading what was promoted: the champion as a model, checked against its manifest first."""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import tempfile
from typing import Any

from podium.serving.layout import CHUNK, PromotedVersion, ServingError, parallel, read_current, safe_relpath
from podium.serving.staging import verify_files
from podium.storage.locations import fsspec_filesystem, is_remote

logger = logging.getLogger(__name__)

def fetch_version(version: PromotedVersion, dest: str) -> str:
    """Download a version's checkpoint into local `dest` and check it against its manifest."""
    fs, root = fsspec_filesystem(version.uri)

    def fetch(item: tuple[str, dict[str, Any]]) -> None:
        rel, entry = safe_relpath(item[0]), item[1]
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fs.get_file(posixpath.join(root, rel), target)
        h = hashlib.sha256()
        with open(target, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
        if h.hexdigest() != entry["sha256"]:
            raise ServingError(f"{version.uri}/{rel}: sha256 does not match the manifest")

    parallel(fetch, sorted(version.manifest["files"].items()))
    return dest


def load_version_model(version: PromotedVersion) -> Any:
    """A version's model as a torch module in eval mode (podium's checkpoint format, safe loading).

    A local version is loaded where it is; a remote one is fetched and checked
    against its manifest first.
    """
    from podium.training.checkpoint import CheckpointFormatError, load_model  # torch loads only here

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
    from podium.training.checkpoint import META_FILE

    if META_FILE not in version.manifest["files"]:
        logger.info("%s is not in podium's checkpoint format: checked by its hashes only", version.uri)
        return
    load_version_model(version)


def load_promoted_model(serving: str) -> Any:
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
