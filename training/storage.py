"""Locations as paths or URIs, resolved to pyarrow (for Ray) or fsspec (for file operations)."""

from __future__ import annotations

import os
from urllib.parse import urlparse

import fsspec
import pyarrow.fs as pafs


def is_remote(uri: str) -> bool:
    """True for URIs with a scheme other than file:// (s3://, gs://, ...)."""
    scheme = urlparse(uri).scheme
    return bool(scheme) and scheme != "file" and len(scheme) > 1


def normalize_location(uri: str) -> str:
    """Local paths become absolute; URIs are kept as given, without a trailing slash."""
    if is_remote(uri):
        return uri.rstrip("/")
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    return os.path.abspath(os.path.expanduser(uri))


def arrow_filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the path inside it, for Ray Train and pyarrow readers."""
    if not is_remote(uri):
        return pafs.LocalFileSystem(), normalize_location(uri)
    fs, path = fsspec_filesystem(uri)
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path


def fsspec_filesystem(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """An fsspec filesystem and the path inside it."""
    return fsspec.core.url_to_fs(normalize_location(uri))


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


def join(uri: str, *parts: str) -> str:
    """Join path parts onto a path or URI."""
    base = uri.rstrip("/")
    return "/".join([base, *(p.strip("/") for p in parts)])
