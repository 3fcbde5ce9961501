"""Locations as paths or URIs, resolved to pyarrow (for Ray and Parquet readers) or fsspec (for file operations)."""

from __future__ import annotations

import fsspec
import pyarrow.fs as pafs

from podium.storage.backends import backend_for, uri_of


def is_remote(uri: str) -> bool:
    """True for a location in a store (s3://, gs://, ...), False for a path on this machine's disk (or file://):
    its backend says."""
    return not backend_for(uri).on_this_disk


def normalize_location(uri: str) -> str:
    """Local paths become absolute; URIs are kept as given, without a trailing slash.

    Each store refuses what it cannot take safely: an s3:// URI must be s3://bucket[/prefix], with no
    credentials, query string or fragment in it (podium.storage.backends), so no secret travels inside a location.
    """
    return backend_for(uri).normalize(uri)


def fsspec_filesystem(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """An fsspec filesystem and the path inside it."""
    location = normalize_location(uri)
    return backend_for(location).fsspec_filesystem(location)


def arrow_filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the path inside it, for Ray Train and pyarrow readers."""
    location = normalize_location(uri)
    return backend_for(location).arrow_filesystem(location)


def persisted_uri(fs: pafs.FileSystem, path: str, storage: str | None = None, relative: str = "") -> str:
    """The URI of what Ray Train persisted at `path` in `fs`: `relative` under the storage location it was given,
    spelled as the user named that location (s3://, az://, a filesystem of your own's userfs://); where that
    location is not known (a Ray Train job of your own with podium's callback), from Ray's filesystem (`uri_of`)."""
    if storage is not None:
        return join(storage, relative)
    return uri_of(fs, path)


def join(uri: str, *parts: str) -> str:
    """Join path parts onto a path or URI."""
    base = uri.rstrip("/")
    return "/".join([base, *(p.strip("/") for p in parts)])
