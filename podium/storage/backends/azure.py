"""Azure Blob Storage (az://, abfs://, abfss://) through adlfs, with ETag conditions for create-only writes and the lease.

Every blob has an ETag that changes whenever it is written. An upload without overwrite fails if the
blob exists (If-None-Match: *); an upload or a delete that names an ETag with `IfNotModified` happens
only if the blob is still at it (If-Match), else the store answers 412: that is what a version claim
and the lease are built from. The account and its credentials are adlfs's own settings
(AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_ACCOUNT_NAME with a key or Azure's default chain);
only the account's name, never a key or a connection string, goes to processes started elsewhere.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, TypeVar
from urllib.parse import urlparse

import fsspec
from fsspec.asyn import sync

from podium.storage.backends.base import Backend, Conflict
from podium.storage.errors import StorageError

AZURE_SCHEMES = ("az", "abfs", "abfss")

# what adlfs reads to choose the account and its credentials (hashed into the cache key, never kept)
ACCOUNT_ENV = ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY",
               "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_CLIENT_ID", "AZURE_STORAGE_TENANT_ID",
               "AZURE_STORAGE_CLIENT_SECRET")

_FILESYSTEMS: dict[tuple[int, str], fsspec.AbstractFileSystem] = {}
_LOCK = threading.Lock()

T = TypeVar("T")


class AzureBackend(Backend):
    """az:// (and abfs://, abfss://) locations."""

    name: ClassVar[str] = "azure"
    schemes: ClassVar[tuple[str, ...]] = AZURE_SCHEMES
    conditional_writes: ClassVar[bool] = True
    setting_env: ClassVar[tuple[str, ...]] = ("AZURE_STORAGE_ACCOUNT_NAME",)

    def normalize(self, uri: str) -> str:
        """az://container[/prefix]: no query string or fragment (a SAS token there would be a credential)."""
        parsed = urlparse(uri)
        if parsed.query or parsed.fragment or not parsed.netloc:
            raise StorageError(uri, "expected az://container/prefix (no query or fragment: the account and its "
                                    "credentials come from AZURE_STORAGE_CONNECTION_STRING or "
                                    "AZURE_STORAGE_ACCOUNT_NAME and Azure's credential chain)")
        return uri.rstrip("/")

    def fsspec_filesystem(self, location: str) -> tuple[fsspec.AbstractFileSystem, str]:
        """adlfs, without a listings cache (other processes write the same prefixes). adlfs reads the account
        and credentials from the environment itself, so none is kept in the filesystem's arguments (which
        travel, pickled, to Ray workers); one filesystem per process and account settings."""
        key = (os.getpid(), hashlib.sha256(repr([os.environ.get(n) for n in ACCOUNT_ENV]).encode()).hexdigest())
        with _LOCK:
            fs = _FILESYSTEMS.get(key)
            if fs is None:
                fs = _FILESYSTEMS[key] = fsspec.filesystem("abfs", use_listings_cache=False, skip_instance_cache=True)
        return fs, fs._strip_protocol(location)

    def create(self, fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
        """An upload that does not overwrite (If-None-Match: *)."""
        fs.pipe_file(path, data, mode="create")

    # ---------------------------------------------------------------- conditional writes

    def _blob(self, fs: fsspec.AbstractFileSystem, path: str, call: Callable[[Any], Awaitable[T]]) -> T:
        """Run `call(blob_client)` on adlfs's event loop, its errors in podium's terms."""
        from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError

        container, blob, _ = fs.split_path(path)

        async def run() -> T:
            async with fs.service_client.get_blob_client(container=container, blob=blob) as client:
                return await call(client)

        try:
            return sync(fs.loop, run)
        except ResourceNotFoundError as exc:
            raise FileNotFoundError(f"az://{path}") from exc
        except (ResourceExistsError, ResourceModifiedError) as exc:  # 409 exists, 412 condition not met
            raise Conflict(f"az://{path}") from exc
        finally:
            fs.invalidate_cache(path)

    def read_versioned(self, fs: fsspec.AbstractFileSystem, path: str) -> tuple[bytes, str] | None:
        """The blob's bytes and the ETag they were read at, in one GET."""
        async def download(client: Any) -> tuple[bytes, str]:
            stream = await client.download_blob()
            return await stream.readall(), stream.properties.etag

        try:
            return self._blob(fs, path, download)
        except FileNotFoundError:
            return None

    def create_versioned(self, fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> str:
        """An upload without overwrite."""
        async def upload(client: Any) -> str:
            return (await client.upload_blob(data, overwrite=False))["etag"]

        return self._blob(fs, path, upload)

    def replace_versioned(self, fs: fsspec.AbstractFileSystem, path: str, data: bytes, token: str) -> str:
        """An upload with If-Match on the ETag."""
        from azure.core import MatchConditions

        async def upload(client: Any) -> str:
            return (await client.upload_blob(data, overwrite=True, etag=token,
                                             match_condition=MatchConditions.IfNotModified))["etag"]

        return self._blob(fs, path, upload)

    def delete_versioned(self, fs: fsspec.AbstractFileSystem, path: str, token: str) -> None:
        """A delete with If-Match on the ETag."""
        from azure.core import MatchConditions

        async def delete(client: Any) -> None:
            await client.delete_blob(etag=token, match_condition=MatchConditions.IfNotModified)

        self._blob(fs, path, delete)
