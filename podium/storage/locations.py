"""Locations as paths or URIs, resolved to pyarrow (for Ray and Parquet readers) or fsspec (for file operations)."""

from __future__ import annotations

import os
from urllib.parse import urlparse

import fsspec
import pyarrow.fs as pafs

from podium.storage.s3 import (
    CREDENTIALS_HINT,
    S3_SCHEMES,
    MiB,
    StorageError,
    s3_filesystem,
    s3_settings,
)
from podium.storage.transfer import S3Handler


def _scheme(uri: str) -> str:
    return urlparse(uri).scheme.lower()


def is_remote(uri: str) -> bool:
    """True for URIs with a scheme other than file:// (s3://, gs://, ...)."""
    scheme = _scheme(uri)
    return bool(scheme) and scheme != "file" and len(scheme) > 1


def is_s3(uri: str) -> bool:
    """True for s3:// (and s3a://) URIs."""
    return _scheme(uri) in S3_SCHEMES


def normalize_location(uri: str) -> str:
    """Local paths become absolute; URIs are kept as given, without a trailing slash.

    An s3:// URI must be s3://bucket[/prefix]: credentials, query strings or
    fragments in it are refused (credentials come from the AWS chain, the
    endpoint from S3Settings), so no secret can travel inside a location.
    """
    if is_remote(uri):
        if is_s3(uri):
            parsed = urlparse(uri)
            if "@" in parsed.netloc:
                raise StorageError(uri, f"credentials in the URI are refused; use {CREDENTIALS_HINT}")
            if parsed.query or parsed.fragment or not parsed.netloc:
                raise StorageError(uri, "expected s3://bucket/prefix (no query or fragment; the endpoint "
                                        "comes from PODIUM_S3_ENDPOINT_URL or AWS_ENDPOINT_URL)")
        return uri.rstrip("/")
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    return os.path.abspath(os.path.expanduser(uri))


def split_s3(uri: str) -> tuple[str, str]:
    """(bucket, key prefix) of an s3:// URI."""
    parsed = urlparse(normalize_location(uri))
    return parsed.netloc, parsed.path.strip("/")


def fsspec_filesystem(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """An fsspec filesystem and the path inside it."""
    location = normalize_location(uri)
    if is_s3(location):
        bucket, key = split_s3(location)
        return s3_filesystem(), f"{bucket}/{key}".rstrip("/")
    return fsspec.core.url_to_fs(location)


def arrow_filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the path inside it, for Ray Train and pyarrow readers."""
    if not is_remote(uri):
        return pafs.LocalFileSystem(), normalize_location(uri)
    fs, path = fsspec_filesystem(uri)
    if is_s3(uri):
        s = s3_settings()
        return pafs.PyFileSystem(S3Handler(fs, part_size=s.part_size_mb * MiB, concurrency=s.concurrency)), path
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path


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
