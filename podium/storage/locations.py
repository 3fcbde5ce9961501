"""Locations as paths or URIs, resolved to pyarrow (for Ray and Parquet readers) or fsspec (for file operations)."""

from __future__ import annotations

import fsspec
import pyarrow.fs as pafs

from podium.storage.backends import backend_for, scheme_of


def is_remote(uri: str) -> bool:
    """True for URIs with a scheme other than file:// (s3://, gs://, ...)."""
    return scheme_of(uri) not in ("", "file")


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


def uri_of(fs: pafs.FileSystem, path: str) -> str:
    """Turn a (pyarrow filesystem, path) pair from Ray back into a URI a user can read."""
    if isinstance(fs, pafs.LocalFileSystem):
        return path
    if isinstance(fs, pafs.S3FileSystem):
        return f"s3://{path}"
    if isinstance(fs, pafs.GcsFileSystem):
        return f"gs://{path}"
    if isinstance(fs, pafs.PyFileSystem):
        handler = fs.handler
        inner = getattr(handler, "fs", None)
        if inner is not None:
            protocol = inner.protocol if isinstance(inner.protocol, str) else inner.protocol[0]
            if protocol in ("file", "local"):
                return path
            return f"{protocol}://{path}"
    return path


def persisted_uri(fs: pafs.FileSystem, path: str, storage: str | None = None, relative: str = "") -> str:
    """The URI of what Ray Train persisted at `path` in `fs`: where the storage location it was given is known,
    `relative` under it if that location's store names it so (a filesystem of your own), else `uri_of`."""
    if storage is not None and backend_for(storage).uris_from_location:
        return join(storage, relative)
    return uri_of(fs, path)


def join(uri: str, *parts: str) -> str:
    """Join path parts onto a path or URI."""
    base = uri.rstrip("/")
    return "/".join([base, *(p.strip("/") for p in parts)])
