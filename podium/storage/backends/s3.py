"""S3 and S3-compatible stores (AWS, MinIO, Ceph, moto) through s3fs, with what S3 does better than plain fsspec.

- Ray Train's checkpoints move in concurrent parts (podium.storage.backends.s3_transfer: multipart uploads, ranged GETs).
- A copy inside one store is server-side (CopyObject, UploadPartCopy above 5 GiB), pinned to the hashed
  source's ETag, and verified by the store: its SHA-256 of the copy, or the copy's ETag equal to the source's.
- Create-only writes and the lease's conditional writes: If-None-Match: * and If-Match on the ETag
  (AWS S3 since 2024, and moto).
- URIs carry no credentials; the endpoint and the rest come from `S3Settings`, credentials from the AWS chain.
- Preflight asks botocore directly, with short timeouts and no retries, and names what to fix.

The client internals (s3fs's event loop, retries, error codes) stay in podium.storage.backends.s3_client.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from typing import Any, ClassVar
from urllib.parse import urlparse

import fsspec
import pyarrow.fs as pafs

from podium.storage.backends.base import Backend, BinaryStream, Conflict
from podium.storage.backends.s3_client import (
    CREDENTIALS_HINT,
    S3_SCHEMES,
    S3_SETTING_ENV,
    MiB,
    S3Settings,
    s3_call,
    s3_call_async,
    s3_error_code,
    s3_filesystem,
    s3_run,
    s3_settings,
    split_object_path,
)
from podium.storage.backends.s3_transfer import MultipartWriter, S3Handler, get_range, open_range_reader
from podium.storage.errors import StorageError

PARALLEL_PARTS = 8  # parts of one server-side multipart copy at once


COPY_OBJECT_LIMIT = 5 << 30  # S3: larger objects must be copied part by part


COPY_PART_MIN = 512 << 20  # part size of a multipart copy when the source's layout is unknown


UNSUPPORTED = {"InvalidArgument", "NotImplemented", "InvalidRequest", "XNotImplemented"}


CONFLICT_CODES = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}


def split_s3(uri: str) -> tuple[str, str]:
    """(bucket, key prefix) of an s3:// URI."""
    parsed = urlparse(uri)
    return parsed.netloc, parsed.path.strip("/")


REJECTED_CREDENTIALS = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken",
                        "InvalidClientTokenId", "AuthorizationHeaderMalformed", "TokenRefreshRequired"}


ACCESS_DENIED = {"AccessDenied", "AllAccessDisabled", "Forbidden", "403"}


def _probe_client(settings: S3Settings) -> Any:
    """A botocore S3 client for preflight checks: short timeouts, no retries, the standard credential chain."""
    import botocore.session
    from botocore.config import Config

    config = Config(connect_timeout=3, read_timeout=10, retries={"total_max_attempts": 1},
                    s3={"addressing_style": settings.style})
    return botocore.session.get_session().create_client(
        "s3", endpoint_url=settings.endpoint_url, region_name=settings.region, config=config)


def describe_s3_error(exc: BaseException, location: str, action: str, settings: S3Settings) -> str:
    """What went wrong with `location` and what to check, in one line; never echoes credentials."""
    from botocore.exceptions import (
        ClientError,
        HTTPClientError,
        NoCredentialsError,
        PartialCredentialsError,
    )
    from botocore.exceptions import (
        ConnectionError as BotoConnectionError,
    )

    endpoint = settings.endpoint_name
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return f"no AWS credentials found; set them through {CREDENTIALS_HINT}"
    if isinstance(exc, (BotoConnectionError, HTTPClientError)):  # refused, DNS, timeouts
        return (f"cannot reach the S3 endpoint {endpoint} ({type(exc).__name__}); check "
                "PODIUM_S3_ENDPOINT_URL / AWS_ENDPOINT_URL and the network")
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in REJECTED_CREDENTIALS:
            return (f"the S3 endpoint {endpoint} rejected the credentials ({code}); "
                    f"check {CREDENTIALS_HINT}")
        if code in ("NoSuchBucket", "404") and action == "list":
            bucket = urlparse(location).netloc
            return f"bucket {bucket!r} does not exist at {endpoint}"
        if code in ACCESS_DENIED or status == 403:
            what = {"list": "listing (s3:ListBucket)", "write": "writing (s3:PutObject)",
                    "delete": "deleting (s3:DeleteObject)"}.get(action, action)
            return f"access denied {what} at {endpoint}; the credentials lack that permission"
        return f"{action} failed at {endpoint}: {code or status} {error.get('Message', '')}".rstrip()
    return f"{action} failed at {endpoint}: {type(exc).__name__}"


def check_s3_location(location: str, write: bool) -> None:
    """Prove an s3:// location usable with one quick attempt per request (see preflight.check_location)."""
    settings = s3_settings()
    bucket, key = split_s3(location)
    client = _probe_client(settings)
    action = "list"
    try:
        listed = client.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1)
        if write:
            probe = "/".join(p for p in (key, f".podium-write-probe-{uuid.uuid4().hex}") if p)
            action = "write"
            client.put_object(Bucket=bucket, Key=probe, Body=b"ok")
            action = "delete"
            client.delete_object(Bucket=bucket, Key=probe)
    except Exception as exc:
        raise StorageError(location, describe_s3_error(exc, location, action, settings)) from None
    if not write and not listed.get("KeyCount", len(listed.get("Contents", []))):
        raise FileNotFoundError(f"{location}: no such object or prefix at {settings.endpoint_name}")


def _copy_ranges(fs: fsspec.AbstractFileSystem, bucket: str, key: str, size: int,
                 etag: str | None) -> list[tuple[int, int]]:
    """Byte ranges for a multipart copy: the source's own parts (so the copy gets the same ETag) when known."""
    count = int(etag.strip('"').rpartition("-")[2]) if etag and "-" in etag else 0
    if count:
        async def part_sizes() -> list[int]:
            gate = asyncio.Semaphore(PARALLEL_PARTS)

            async def head(number: int) -> int:
                async with gate:
                    out = await s3_call_async(fs, "head_object", Bucket=bucket, Key=key, PartNumber=number)
                return int(out["ContentLength"])

            return list(await asyncio.gather(*(head(i) for i in range(1, count + 1))))
        try:
            sizes = s3_run(fs, part_sizes)
        except OSError:  # a store without per-part HEAD: fixed parts, verified by reading instead
            sizes = []
        if sum(sizes) == size:
            starts = [sum(sizes[:i]) for i in range(len(sizes))]
            return [(start, start + n) for start, n in zip(starts, sizes)]
    part = max(COPY_PART_MIN, -(-size // 10_000))
    return [(start, min(start + part, size)) for start in range(0, size, part)]


def copy_object(fs: fsspec.AbstractFileSystem, src: str, dst: str, size: int, etag: str | None,
                   single_copy_limit: int = COPY_OBJECT_LIMIT) -> str | None:
    """Copy one object inside the store, pinned to the source's ETag; no byte passes through this process.

    Up to `single_copy_limit` (S3: 5 GiB) one CopyObject, which also asks the
    store for the copy's SHA-256: returned (hex) when the store computed it.
    Larger objects: UploadPartCopy of the source's own parts, in parallel
    (the copy keeps the source's ETag); returns None.
    """
    sbucket, skey = split_object_path(fs, src)
    dbucket, dkey = split_object_path(fs, dst)
    source = {"Bucket": sbucket, "Key": skey}
    match = {"CopySourceIfMatch": etag} if etag else {}
    if size <= single_copy_limit:
        try:
            out = s3_call(fs, "copy_object", Bucket=dbucket, Key=dkey, CopySource=source,
                             ChecksumAlgorithm="SHA256", **match)
        except OSError as exc:
            if s3_error_code(exc) not in UNSUPPORTED:
                raise
            out = s3_call(fs, "copy_object", Bucket=dbucket, Key=dkey, CopySource=source, **match)
        result = out.get("CopyObjectResult", {})
        checksum = result.get("ChecksumSHA256")
        if not checksum or "-" in checksum or result.get("ChecksumType") == "COMPOSITE":
            return None
        return base64.b64decode(checksum).hex()

    ranges = _copy_ranges(fs, sbucket, skey, size, etag)

    async def copy_parts() -> None:
        upload = (await s3_call_async(fs, "create_multipart_upload", Bucket=dbucket, Key=dkey))["UploadId"]
        gate = asyncio.Semaphore(PARALLEL_PARTS)

        async def part(number: int, start: int, end: int) -> dict[str, Any]:
            async with gate:
                out = await s3_call_async(fs, "upload_part_copy", Bucket=dbucket, Key=dkey, UploadId=upload,
                                        PartNumber=number, CopySource=source,
                                        CopySourceRange=f"bytes={start}-{end - 1}", **match)
            return {"PartNumber": number, "ETag": out["CopyPartResult"]["ETag"]}

        try:
            parts = await asyncio.gather(*(part(i, a, b) for i, (a, b) in enumerate(ranges, 1)))
            await s3_call_async(fs, "complete_multipart_upload", Bucket=dbucket, Key=dkey, UploadId=upload,
                              MultipartUpload={"Parts": list(parts)})
        except BaseException:
            try:
                await s3_call_async(fs, "abort_multipart_upload", Bucket=dbucket, Key=dkey, UploadId=upload)
            except Exception:  # best effort: the copy was never completed, so nothing is visible
                pass
            raise

    s3_run(fs, copy_parts)
    return None


class S3Backend(Backend):
    """s3:// and s3a:// (see the module docstring)."""

    name: ClassVar[str] = "s3"
    schemes: ClassVar[tuple[str, ...]] = S3_SCHEMES
    conditional_writes: ClassVar[bool] = True
    setting_env: ClassVar[tuple[str, ...]] = S3_SETTING_ENV

    def normalize(self, uri: str) -> str:
        """s3://bucket[/prefix]: credentials, query strings or fragments are refused (credentials come from the
        AWS chain, the endpoint from S3Settings), so no secret can travel inside a location."""
        parsed = urlparse(uri)
        if "@" in parsed.netloc:
            raise StorageError(uri, f"credentials in the URI are refused; use {CREDENTIALS_HINT}")
        if parsed.query or parsed.fragment or not parsed.netloc:
            raise StorageError(uri, "expected s3://bucket/prefix (no query or fragment; the endpoint "
                                    "comes from PODIUM_S3_ENDPOINT_URL or AWS_ENDPOINT_URL)")
        return uri.rstrip("/")

    def fsspec_filesystem(self, location: str) -> tuple[fsspec.AbstractFileSystem, str]:
        """podium's shared s3fs filesystem (podium.storage.backends.s3_client.s3_filesystem) and 'bucket/key'."""
        bucket, key = split_s3(location)
        return s3_filesystem(), f"{bucket}/{key}".rstrip("/")

    def arrow_filesystem(self, location: str) -> tuple[pafs.FileSystem, str]:
        """A pyarrow filesystem whose streams move one file in concurrent parts (podium.storage.backends.s3_transfer)."""
        fs, path = self.fsspec_filesystem(location)
        s = s3_settings()
        return pafs.PyFileSystem(S3Handler(fs, part_size=s.part_size_mb * MiB, concurrency=s.concurrency)), path

    def check_location(self, location: str, *, write: bool) -> None:
        """botocore, one attempt per request, a message that says what to fix."""
        check_s3_location(location, write)

    def open_read(self, fs: fsspec.AbstractFileSystem, path: str, listed: dict[str, Any] | None = None) -> BinaryStream:
        """Concurrent ranged GETs, pinned to the listed ETag."""
        return open_range_reader(fs, path, **({"size": listed["size"], "etag": listed["etag"]} if listed else {}))

    def open_write(self, fs: fsspec.AbstractFileSystem, path: str) -> BinaryStream:
        """A parallel multipart upload, completed only by a close without error."""
        s = s3_settings()
        return MultipartWriter(fs, path, s.part_size_mb << 20, s.concurrency)

    def read_range(self, fs: fsspec.AbstractFileSystem, path: str, start: int, end: int,
                   listed: dict[str, Any]) -> bytes:
        """A GET pinned to the listed ETag (If-Match): a file replaced meanwhile fails instead of mixing versions."""
        return s3_run(fs, get_range, fs, path, start, end, listed.get("ETag"))

    def copies_in_store(self, source: fsspec.AbstractFileSystem, dest: fsspec.AbstractFileSystem) -> bool:
        """Inside one store (one s3fs filesystem: one endpoint and one set of credentials)."""
        return source is dest

    def copy_in_store(self, fs: fsspec.AbstractFileSystem, src: str, dst: str, size: int,
                      etag: str | None) -> str | None:
        """CopyObject or UploadPartCopy (`copy_object`)."""
        return copy_object(fs, src, dst, size, etag)

    def same_copy(self, listed_etag: str | None, size: int, copied: dict[str, Any]) -> bool:
        """The copy's ETag is the source's (same bytes, same part layout) and so is its size."""
        return bool(listed_etag) and copied.get("ETag") == listed_etag and int(copied.get("size", -1)) == size

    # ---------------------------------------------------------------- conditional writes

    def _call(self, fs: fsspec.AbstractFileSystem, path: str, method: str, **kwargs: Any) -> dict[str, Any]:
        bucket, key = split_object_path(fs, path)
        try:
            return s3_run(fs, s3_call_async, fs, method, Bucket=bucket, Key=key, **kwargs)
        except Exception as exc:
            if isinstance(exc, FileExistsError) or s3_error_code(exc) in CONFLICT_CODES:
                raise Conflict(f"s3://{path}") from exc
            raise

    def create(self, fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
        """A conditional PUT (If-None-Match: *)."""
        fs.pipe_file(path, data, mode="create")

    def read_versioned(self, fs: fsspec.AbstractFileSystem, path: str) -> tuple[bytes, str] | None:
        """The object and its ETag, in one GET."""
        try:
            out = self._call(fs, path, "get_object")
        except FileNotFoundError:
            return None
        return s3_run(fs, out["Body"].read), out["ETag"]

    def create_versioned(self, fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> str:
        """PUT with If-None-Match: *."""
        return self._call(fs, path, "put_object", Body=data, IfNoneMatch="*")["ETag"]

    def replace_versioned(self, fs: fsspec.AbstractFileSystem, path: str, data: bytes, token: str) -> str:
        """PUT with If-Match on the ETag."""
        return self._call(fs, path, "put_object", Body=data, IfMatch=token)["ETag"]

    def delete_versioned(self, fs: fsspec.AbstractFileSystem, path: str, token: str) -> None:
        """DELETE with If-Match on the ETag."""
        self._call(fs, path, "delete_object", IfMatch=token)

    def lease_ttl_s(self) -> float:
        """PODIUM_S3_LEASE_TTL_S."""
        return s3_settings().lease_ttl_s
