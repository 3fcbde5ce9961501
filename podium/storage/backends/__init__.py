"""One backend per store, chosen by the location's URI scheme.

`backend_for(location)` is the only place that looks at a scheme (and `uri_of` the only one that names a
pyarrow filesystem's). Each backend is one module of this package (a `Backend` subclass, see `base`); adding
a store is that module and its line in `REGISTRY`.
A backend's module is imported when a location of its scheme is first used, so a local run never loads
s3fs, gcsfs or adlfs. A scheme no backend claims goes to plain fsspec: it works wherever fsspec reaches,
with no lease (a warning says so) and no copy inside the store.

- `base`: the `Backend` every store implements, with plain fsspec defaults
- `local`: local paths and file:// URIs
- `s3`: S3 and S3-compatible stores (s3fs; server-side copies, conditional PUTs, botocore preflight)
- `s3_client`: S3's settings, the s3fs client podium shares, retries and error codes (the only module that knows
  s3fs's internals)
- `s3_transfer`: one S3 object in concurrent parts (multipart upload, ranged GETs) under pyarrow's streams
- `gcs`: Google Cloud Storage (gcsfs; generation preconditions)
- `azure`: Azure Blob Storage (adlfs; ETag conditions)
- `userfs`: a filesystem of your own, a pyarrow filesystem built by your function (a `[storage]` table)
"""

from __future__ import annotations

import functools
import importlib
from urllib.parse import urlparse

import pyarrow.fs as pafs

from podium.storage.backends.base import Backend

# scheme -> "module:class"; "" is a local path
REGISTRY: dict[str, str] = {
    "": "podium.storage.backends.local:LocalBackend",
    "file": "podium.storage.backends.local:LocalBackend",
    "s3": "podium.storage.backends.s3:S3Backend",
    "s3a": "podium.storage.backends.s3:S3Backend",
    "gs": "podium.storage.backends.gcs:GcsBackend",
    "gcs": "podium.storage.backends.gcs:GcsBackend",
    "az": "podium.storage.backends.azure:AzureBackend",
    "abfs": "podium.storage.backends.azure:AzureBackend",
    "abfss": "podium.storage.backends.azure:AzureBackend",
    "userfs": "podium.storage.backends.userfs:UserFilesystemBackend",
}


def scheme_of(uri: str) -> str:
    """The URI's scheme, lower case; '' for a local path (a Windows drive letter is a path, not a scheme)."""
    scheme = urlparse(uri).scheme.lower()
    return scheme if len(scheme) > 1 else ""


@functools.cache
def _backend(target: str) -> Backend:
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)()


def backend_for(uri: str) -> Backend:
    """The backend of the store `uri` (a path or a URI) lives in."""
    return _backend(REGISTRY.get(scheme_of(uri), "podium.storage.backends.base:Backend"))


def store_of(uri: str) -> str | None:
    """The kind of store `uri` lives in, by its backend's name ('s3', 'gcs', 'azure', 'userfs'), or None for a local
    path: what a caller outside storage (the Kubernetes manifests' volumes and credentials) asks instead of reading
    schemes itself. A scheme no backend claims is named as written."""
    scheme = scheme_of(uri)
    if scheme not in REGISTRY:
        return scheme or None
    backend = backend_for(uri)
    return None if backend.on_this_disk else backend.name


def uri_of(fs: pafs.FileSystem, path: str) -> str:
    """A URI a user can read for a (pyarrow filesystem, path) pair Ray hands back: pyarrow's own S3 and GCS
    filesystems, and an fsspec filesystem wrapped for Ray (PyFileSystem), by its protocol."""
    if isinstance(fs, pafs.S3FileSystem):
        return f"s3://{path}"
    if isinstance(fs, pafs.GcsFileSystem):
        return f"gs://{path}"
    inner = getattr(fs.handler, "fs", None) if isinstance(fs, pafs.PyFileSystem) else None
    if inner is not None:
        protocol = inner.protocol if isinstance(inner.protocol, str) else inner.protocol[0]
        if protocol not in ("file", "local"):
            return f"{protocol}://{path}"
    return path


def worker_environment() -> dict[str, str]:
    """What every store's settings set in this process (never credentials), for processes started elsewhere."""
    env: dict[str, str] = {}
    for target in sorted(set(REGISTRY.values())):
        env.update(_backend(target).environment())
    return env
