"""Google Cloud Storage (gs://) through gcsfs, with generation preconditions for create-only writes and the lease.

Every GCS object has a generation, a number that changes whenever the object is written. A write or
delete that names `ifGenerationMatch` happens only if the object is still at that generation (0: there
is no object), else the store answers 412: that is what a version claim and the lease are built from.
Where the store is (STORAGE_EMULATOR_HOST for an emulator) and the credentials (Google's default chain)
are gcsfs's own settings; a gs:// URI names a bucket and a prefix only.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar
from urllib.parse import quote, urlparse

import fsspec

from podium.storage.backends.base import Backend, Conflict
from podium.storage.errors import StorageError

GCS_SCHEMES = ("gs", "gcs")


class GcsBackend(Backend):
    """gs:// (and gcs://) locations."""

    name: ClassVar[str] = "gcs"
    schemes: ClassVar[tuple[str, ...]] = GCS_SCHEMES
    conditional_writes: ClassVar[bool] = True
    setting_env: ClassVar[tuple[str, ...]] = ("STORAGE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT")

    def normalize(self, uri: str) -> str:
        """gs://bucket[/prefix]: no query string or fragment (a signed URL's are credentials)."""
        parsed = urlparse(uri)
        if parsed.query or parsed.fragment or not parsed.netloc or "@" in parsed.netloc:
            raise StorageError(uri, "expected gs://bucket/prefix (no credentials, query or fragment: credentials "
                                    "come from Google's default chain, an emulator from STORAGE_EMULATOR_HOST)")
        return uri.rstrip("/")

    def fsspec_filesystem(self, location: str) -> tuple[fsspec.AbstractFileSystem, str]:
        """gcsfs, without a listings cache (other processes write the same prefixes), one per endpoint."""
        fs = fsspec.filesystem("gs", use_listings_cache=False, endpoint_url=os.environ.get("STORAGE_EMULATOR_HOST"))
        return fs, fs._strip_protocol(location)

    # ---------------------------------------------------------------- conditional writes

    def _upload(self, fs: fsspec.AbstractFileSystem, path: str, data: bytes, generation: str) -> str:
        bucket, key, _ = fs.split_path(path)
        try:
            out = fs.call("POST", f"{fs._location}/upload/storage/v1/b/{quote(bucket)}/o", uploadType="media",
                          name=key, ifGenerationMatch=generation, data=data, json_out=True,
                          headers={"Content-Type": "application/octet-stream"})
        except FileExistsError as exc:  # gcsfs's word for 412 Precondition Failed
            raise Conflict(f"gs://{path}") from exc
        fs.invalidate_cache(path)
        return str(out["generation"])

    def create(self, fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
        """An upload with ifGenerationMatch=0."""
        try:
            self._upload(fs, path, data, "0")
        except Conflict:
            raise FileExistsError(f"gs://{path}") from None

    def read_versioned(self, fs: fsspec.AbstractFileSystem, path: str) -> tuple[bytes, str] | None:
        """The object's generation, then its bytes at that generation (a newer write in between: read again)."""
        bucket, key, _ = fs.split_path(path)
        while True:
            try:
                meta: dict[str, Any] = fs.call("GET", "b/{}/o/{}", bucket, key, json_out=True)
                generation = str(meta["generation"])
                _, data = fs.call("GET", "b/{}/o/{}", bucket, key, alt="media", ifGenerationMatch=generation)
            except FileNotFoundError:
                return None
            except FileExistsError:  # rewritten between the two requests
                continue
            return data, generation

    def create_versioned(self, fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> str:
        """An upload with ifGenerationMatch=0."""
        return self._upload(fs, path, data, "0")

    def replace_versioned(self, fs: fsspec.AbstractFileSystem, path: str, data: bytes, token: str) -> str:
        """An upload with ifGenerationMatch=<token> (a deleted object fails it too: 412, a Conflict)."""
        return self._upload(fs, path, data, token)

    def delete_versioned(self, fs: fsspec.AbstractFileSystem, path: str, token: str) -> None:
        """A delete with ifGenerationMatch=<token>."""
        bucket, key, _ = fs.split_path(path)
        try:
            fs.call("DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=token)
        except FileExistsError as exc:
            raise Conflict(f"gs://{path}") from exc
        fs.invalidate_cache(path)
