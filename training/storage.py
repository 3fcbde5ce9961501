"""Locations as paths or URIs, resolved to pyarrow (for Ray) or fsspec (for file operations).

S3 and S3-compatible stores (MinIO, Ceph, moto) go through s3fs. The endpoint,
region and addressing style come from `S3Settings` (environment variables);
credentials come only from the standard AWS chain (environment, profile,
instance role): podium never takes, stores or prints them.

For Ray Train, an s3:// location becomes a `pyarrow.fs.PyFileSystem` around
`S3Handler`, which moves the bytes of one file in concurrent parts: a parallel
multipart upload when Ray persists a checkpoint, concurrent ranged GETs when
`Checkpoint.as_directory` downloads one. Ray's own loops call pyarrow's
`copy_files` on it unchanged.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import io
import os
import threading
import uuid
from collections import deque
from typing import Any, Literal
from urllib.parse import urlparse

import fsspec
import pyarrow as pa
import pyarrow.fs as pafs
from pydantic import AliasChoices, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

S3_SCHEMES = ("s3", "s3a")
MiB = 1 << 20
# environment variables whose values decide which credentials the AWS chain finds (only hashed, never kept)
CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                  "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN")
CREDENTIALS_HINT = ("the standard AWS credential chain: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                    "AWS_PROFILE, or an instance role")
REJECTED_CREDENTIALS = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken",
                        "InvalidClientTokenId", "AuthorizationHeaderMalformed", "TokenRefreshRequired"}
ACCESS_DENIED = {"AccessDenied", "AllAccessDisabled", "Forbidden", "403"}


class StorageError(OSError):
    """A location that cannot be used: unreachable endpoint, rejected credentials, missing bucket, no permission.

    The message is '<location>: <reason>' and never contains credentials.
    """

    def __init__(self, location: str, reason: str):
        self.location, self.reason = redact(location), reason
        super().__init__(f"{self.location}: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.location, self.reason)


class S3Settings(BaseSettings):
    """Where s3:// URIs go, read from the environment when asked for. Holds no credentials."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True)

    endpoint_url: str | None = Field(
        None, validation_alias=AliasChoices("PODIUM_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
        description="S3-compatible endpoint (MinIO, Ceph...); default: AWS S3.")
    region: str | None = Field(
        None, validation_alias=AliasChoices("PODIUM_S3_REGION", "AWS_REGION", "AWS_DEFAULT_REGION"),
        description="Region; default: botocore's.")
    addressing_style: Literal["auto", "path", "virtual"] | None = Field(
        None, validation_alias="PODIUM_S3_ADDRESSING_STYLE",
        description="'path' or 'virtual' bucket addressing; default: path with a custom endpoint, else auto.")
    part_size_mb: int = Field(64, ge=5, le=5120, validation_alias="PODIUM_S3_PART_SIZE_MB",
                              description="Part size of checkpoint uploads and ranged downloads (MiB).")
    concurrency: int = Field(4, ge=1, le=64, validation_alias="PODIUM_S3_CONCURRENCY",
                             description="Parts of one file in flight at once.")
    lease_ttl_s: float = Field(30.0, gt=0, le=3600, validation_alias="PODIUM_S3_LEASE_TTL_S",
                               description="Promotion lock on S3: a holder that stops renewing its lease for "
                                           "this long (it died) is taken over.")

    @property
    def style(self) -> str:
        """The effective addressing style."""
        return self.addressing_style or ("path" if self.endpoint_url else "auto")

    @property
    def endpoint_name(self) -> str:
        """The endpoint in words, for messages."""
        if self.endpoint_url:
            return self.endpoint_url
        return f"AWS S3 ({self.region})" if self.region else "AWS S3"


# where s3:// goes, never who is asking: safe to forward to Ray workers (runtime_env) and to show
S3_SETTING_ENV = ("PODIUM_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "PODIUM_S3_REGION", "AWS_REGION",
                  "AWS_DEFAULT_REGION", "PODIUM_S3_ADDRESSING_STYLE", "PODIUM_S3_PART_SIZE_MB", "PODIUM_S3_CONCURRENCY",
                  "PODIUM_S3_LEASE_TTL_S", "AWS_RETRY_MODE", "AWS_MAX_ATTEMPTS")


def s3_environment() -> dict[str, str]:
    """The S3 settings variables set in this process (no credentials), for processes started elsewhere."""
    return {name: os.environ[name] for name in S3_SETTING_ENV if os.environ.get(name)}


def s3_settings() -> S3Settings:
    """Read the S3 settings from the environment; an invalid value raises StorageError naming the variable."""
    try:
        return S3Settings()
    except ValidationError as err:
        lines = [f"{'.'.join(map(str, e['loc']))} = {e.get('input')!r}: {e['msg']}" for e in err.errors()]
        raise StorageError("S3 settings", "invalid value: " + "; ".join(lines)) from None


def _scheme(uri: str) -> str:
    return urlparse(uri).scheme.lower()


def is_remote(uri: str) -> bool:
    """True for URIs with a scheme other than file:// (s3://, gs://, ...)."""
    scheme = _scheme(uri)
    return bool(scheme) and scheme != "file" and len(scheme) > 1


def is_s3(uri: str) -> bool:
    """True for s3:// (and s3a://) URIs."""
    return _scheme(uri) in S3_SCHEMES


def redact(uri: str) -> str:
    """The URI without any user:password@ part, for messages."""
    parsed = urlparse(uri)
    if parsed.scheme and "@" in parsed.netloc:
        return uri.replace(parsed.netloc, "***@" + parsed.netloc.rsplit("@", 1)[1], 1)
    return uri


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


def s3_error_code(exc: BaseException) -> str:
    """The S3 error code behind an s3fs exception, which keeps botocore's error as its cause ('' if none)."""
    for e in (exc, exc.__cause__):
        response = getattr(e, "response", None)
        if response:
            return str(response.get("Error", {}).get("Code", ""))
    return ""


def _credential_fingerprint() -> str:
    """A digest of the variables that select credentials: a changed key gets a fresh client, nothing is kept."""
    h = hashlib.sha256()
    for name in CREDENTIAL_ENV:
        h.update(f"{name}={os.environ.get(name, '')}\0".encode())
    return h.hexdigest()


# botocore's default ("legacy" mode, 5 attempts) gives up on a store that refuses connections for
# about 6 s. "standard" mode with 8 attempts waits up to 1, 2, 4, 8, 16, 20, 20 s between them
# (full jitter: half that on average): a restart or network blip of ~10-30 s is ridden out, and a
# store that stays down fails the request within about 1.5 minutes (as MLflow's writes do, see
# tasks.tracking). AWS_RETRY_MODE / AWS_MAX_ATTEMPTS, when set, win.
S3_RETRIES = {"mode": "standard", "max_attempts": 8}


def retry_config() -> dict[str, Any]:
    """botocore `Config` keywords for podium's S3 retries, unless the environment sets its own."""
    if os.environ.get("AWS_RETRY_MODE") or os.environ.get("AWS_MAX_ATTEMPTS"):
        return {}
    return {"retries": dict(S3_RETRIES)}


_S3_CACHE: dict[tuple[Any, ...], fsspec.AbstractFileSystem] = {}
_S3_LOCK = threading.Lock()


def s3_filesystem(settings: S3Settings | None = None) -> fsspec.AbstractFileSystem:
    """The s3fs filesystem for these settings (one per process, settings and credential source).

    Directory listings are not cached: Ray workers, validation tasks and the
    promoter write the same prefixes from different processes.
    """
    import s3fs

    s = settings or s3_settings()
    key = (s.endpoint_url, s.region, s.style, os.getpid(), _credential_fingerprint(), repr(retry_config()))
    with _S3_LOCK:
        fs = _S3_CACHE.get(key)
        if fs is None:
            fs = s3fs.S3FileSystem(
                endpoint_url=s.endpoint_url,
                client_kwargs={"region_name": s.region} if s.region else {},
                config_kwargs={"s3": {"addressing_style": s.style}, **retry_config()},
                use_listings_cache=False,
                skip_instance_cache=True,
            )
            _S3_CACHE[key] = fs
    return fs


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


# ---------------------------------------------------------------------------------------------
# Transfers of one object in concurrent parts, under pyarrow's stream interface.


def _run(fs: fsspec.AbstractFileSystem, coro: Any) -> concurrent.futures.Future:
    """Schedule a coroutine on s3fs's event loop thread; the caller is never that thread."""
    return asyncio.run_coroutine_threadsafe(coro, fs.loop)


class MultipartWriter(io.RawIOBase):
    """Write one S3 object; parts are uploaded concurrently (up to `concurrency`) while the caller writes.

    A file smaller than one part is a single PUT. The object appears only when
    `close` completes the upload; a writer dropped without `close` (an error
    while copying) aborts it, so a partial object is never visible. A part is
    whatever was written once `part_size` bytes are pending (pyarrow writes in
    64 MiB chunks: one chunk, one part, no copy); the threshold doubles every
    2000 parts to stay under S3's 10,000-part limit.
    """

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, part_size: int, concurrency: int):
        super().__init__()
        self._fs, self._path = fs, path
        self._bucket, self._key, _ = fs.split_path(path)
        self._part_size, self._concurrency = part_size, concurrency
        self._pending: list[Any] = []
        self._pending_bytes = 0
        self._written = 0
        self._upload_id: str | None = None
        self._parts: list[concurrent.futures.Future] = []

    def writable(self) -> bool:
        """Always: this is a write stream."""
        return True

    def tell(self) -> int:
        """Bytes written so far."""
        return self._written

    def write(self, data: Any) -> int:
        """Keep `data`; once a part's worth is pending, upload it in the background."""
        if self.closed:
            raise ValueError("write to a closed MultipartWriter")
        n = memoryview(data).nbytes
        self._pending.append(data if isinstance(data, bytes) else bytes(data))  # bytes are immutable: no copy
        self._pending_bytes += n
        self._written += n
        if self._pending_bytes >= self._part_size << (len(self._parts) // 2000):
            self._start_part(self._take_pending())
        return n

    def _take_pending(self) -> bytes:
        body = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending, self._pending_bytes = [], 0
        return body

    def _start_part(self, body: bytes) -> None:
        if self._upload_id is None:
            self._upload_id = self._fs.call_s3("create_multipart_upload", Bucket=self._bucket,
                                               Key=self._key)["UploadId"]
        pending = [f for f in self._parts if not f.done()]
        if len(pending) >= self._concurrency:
            concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
        for f in self._parts:  # a failed part stops the upload now, not at close
            if f.done() and f.exception() is not None:
                raise f.exception()
        self._parts.append(_run(self._fs, self._fs._call_s3(
            "upload_part", Bucket=self._bucket, Key=self._key, UploadId=self._upload_id,
            PartNumber=len(self._parts) + 1, Body=body)))

    def close(self) -> None:
        """Upload what is left and complete the object (or abort the upload on any error)."""
        if self.closed:
            return
        try:
            if self._upload_id is None:
                self._fs.call_s3("put_object", Bucket=self._bucket, Key=self._key, Body=self._take_pending())
            else:
                if self._pending:
                    self._start_part(self._take_pending())
                parts = [{"PartNumber": i, "ETag": f.result()["ETag"]} for i, f in enumerate(self._parts, 1)]
                self._fs.call_s3("complete_multipart_upload", Bucket=self._bucket, Key=self._key,
                                 UploadId=self._upload_id, MultipartUpload={"Parts": parts})
        except BaseException:
            self._abort()
            raise
        finally:
            self._pending = []
            super().close()
            self._fs.invalidate_cache(self._path)

    def _abort(self) -> None:
        for f in self._parts:
            f.cancel()
        if self._upload_id is not None:
            try:
                self._fs.call_s3("abort_multipart_upload", Bucket=self._bucket, Key=self._key,
                                 UploadId=self._upload_id)
            except Exception:  # best effort: the store's lifecycle rules reap what is left
                pass
            self._upload_id = None

    def __del__(self) -> None:
        if not self.closed:  # never complete an upload nobody closed: that would publish a partial file
            self._abort()
            self._pending = []
            super().close()


class RangeReader(io.RawIOBase):
    """Read one S3 object front to back; the next ranges are fetched concurrently while the caller reads.

    Every range asks for the ETag seen when the reader opened (If-Match), so a
    file replaced while it is read fails instead of mixing two versions. A read
    that takes a whole range gets the downloaded bytes as they are (no copy).
    """

    ATTEMPTS = 3

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, size: int, etag: str | None,
                 part_size: int, concurrency: int):
        super().__init__()
        self._fs, self._path, self._size, self._etag = fs, path, size, etag
        self._bucket, self._key, _ = fs.split_path(path)
        self._ranges = deque((start, min(start + part_size, size)) for start in range(0, size, part_size))
        self._concurrency = concurrency
        self._inflight: deque[concurrent.futures.Future] = deque()
        self._chunk = b""
        self._offset = 0  # into _chunk
        self._pos = 0

    def readable(self) -> bool:
        """Always: this is a read stream."""
        return True

    def tell(self) -> int:
        """Bytes read so far."""
        return self._pos

    def size(self) -> int:
        """The object's size."""
        return self._size

    async def _get(self, start: int, end: int) -> bytes:
        kw = {"IfMatch": self._etag} if self._etag else {}
        for attempt in range(1, self.ATTEMPTS + 1):
            resp = await self._fs._call_s3("get_object", Bucket=self._bucket, Key=self._key,
                                           Range=f"bytes={start}-{end - 1}", **kw)
            try:
                data = await resp["Body"].read()
            except (OSError, asyncio.TimeoutError):
                if attempt == self.ATTEMPTS:
                    raise
                continue
            finally:
                resp["Body"].close()
            if len(data) == end - start:
                return data
        raise OSError(f"s3://{self._path}: short read of bytes {start}-{end - 1}")

    def _fill(self) -> None:
        while self._ranges and len(self._inflight) < self._concurrency:
            self._inflight.append(_run(self._fs, self._get(*self._ranges.popleft())))

    def read(self, size: int = -1) -> bytes:
        """Up to `size` bytes (all that is left if negative); b'' at the end."""
        want = self._size - self._pos if size is None or size < 0 else min(size, self._size - self._pos)
        out = []
        while want > 0:
            if self._offset == len(self._chunk):
                self._fill()
                self._chunk, self._offset = self._inflight.popleft().result(), 0
                self._fill()
            take = min(want, len(self._chunk) - self._offset)
            whole = self._offset == 0 and take == len(self._chunk)
            out.append(self._chunk if whole else self._chunk[self._offset:self._offset + take])
            self._offset += take
            want -= take
            self._pos += take
        return out[0] if len(out) == 1 else b"".join(out)

    def readall(self) -> bytes:
        """Everything that is left."""
        return self.read(-1)

    def close(self) -> None:
        """Stop fetching ahead."""
        for f in self._inflight:
            f.cancel()
        self._inflight.clear()
        self._chunk, self._offset = b"", 0
        super().close()


def open_range_reader(fs: fsspec.AbstractFileSystem, path: str, size: int | None = None,
                      etag: str | None = None) -> RangeReader:
    """A concurrent front-to-back reader of an S3 object (raises FileNotFoundError if there is none).

    Pass `size` and `etag` from a listing to spare a HEAD request.
    """
    s = s3_settings()
    if size is None:
        info = fs.info(path)
        if info.get("type") != "file":
            raise FileNotFoundError(f"s3://{path} is not a file")
        size, etag = int(info.get("size") or 0), info.get("ETag")
    return RangeReader(fs, path, size, etag, s.part_size_mb * MiB, s.concurrency)


class S3Handler(pafs.FSSpecHandler):
    """pyarrow's fsspec handler with concurrent part transfers for streams (what `copy_files` uses).

    Ray Train persists and downloads checkpoints with `pyarrow.fs.copy_files`,
    which reads input streams and writes output streams in 64 MiB chunks: here
    those chunks become concurrent multipart uploads and ranged GETs. Random
    access (`open_input_file`, used by Parquet readers) stays with s3fs.
    """

    def __init__(self, fs: fsspec.AbstractFileSystem, part_size: int = 64 * MiB, concurrency: int = 4):
        super().__init__(fs)
        self.part_size, self.concurrency = part_size, concurrency
        self._listed: dict[str, tuple[int, str | None]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_listed": {}}  # what one process listed means nothing to another

    def create_dir(self, path: str, recursive: bool) -> None:
        """Nothing to do: S3 has no folders. (s3fs's mkdir would create a missing bucket; podium never does.)"""

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        """One LIST request per path answers file, folder or nothing (s3fs would HEAD, then LIST for a folder)."""
        return [self._info(path) for path in paths]

    def _remember(self, path: str, size: int, etag: str | None) -> None:
        if len(self._listed) > 10_000:  # listed but never opened (a Parquet scan): forget, it is only a shortcut
            self._listed.clear()
        self._listed[path.strip("/")] = (size, etag)

    def _info(self, path: str) -> pafs.FileInfo:
        bucket, key, _ = self.fs.split_path(path)
        key = key.rstrip("/")
        if not key:
            return super().get_file_info([path])[0]
        try:
            page = self.fs.call_s3("list_objects_v2", Bucket=bucket, Prefix=key, Delimiter="/", MaxKeys=1000)
        except PermissionError:  # may read objects but not list them: ask the way s3fs does
            return super().get_file_info([path])[0]
        except FileNotFoundError:  # no such bucket
            return pafs.FileInfo(path, pafs.FileType.NotFound)
        for obj in page.get("Contents", []):
            if obj["Key"] == key:
                self._remember(f"{bucket}/{key}", int(obj["Size"]), obj.get("ETag"))
                return pafs.FileInfo(path, pafs.FileType.File, size=int(obj["Size"]), mtime=obj.get("LastModified"))
        if any(p["Prefix"] == f"{key}/" for p in page.get("CommonPrefixes", [])):
            return pafs.FileInfo(path, pafs.FileType.Directory)
        if page.get("IsTruncated"):  # more siblings sharing the name's prefix than one page holds
            return super().get_file_info([path])[0]
        return pafs.FileInfo(path, pafs.FileType.NotFound)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        """One listing of the tree; the sizes and ETags it gives spare the HEAD of each stream opened next."""
        base = selector.base_dir.strip("/")
        found = self.fs.find(base, maxdepth=None if selector.recursive else 1, withdirs=True, detail=True)
        entries = {path: info for path, info in found.items() if path.strip("/") != base}
        if not entries:  # an empty folder, a file, or nothing: pyarrow tells these apart
            kind = self.get_file_info([base])[0].type
            if kind == pafs.FileType.File:
                raise NotADirectoryError(base)
            if kind == pafs.FileType.NotFound and not selector.allow_not_found:
                raise FileNotFoundError(base)
            return []
        for path, info in entries.items():
            if info.get("type") == "file":
                self._remember(path, int(info.get("size") or 0), info.get("ETag"))
        return [self._create_file_info(path, info) for path, info in entries.items()]

    def open_input_stream(self, path: str) -> pa.NativeFile:
        """A prefetching sequential reader (If-Match pins it to the listed ETag, so a stale listing fails safe)."""
        known = self._listed.pop(path.strip("/"), None)
        if known is None:
            info = self.fs.info(path)
            if info.get("type") != "file":
                raise FileNotFoundError(path)
            known = (int(info.get("size") or 0), info.get("ETag"))
        reader = RangeReader(self.fs, path, known[0], known[1], self.part_size, self.concurrency)
        return pa.PythonFile(reader, mode="r")

    def open_output_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        """A parallel multipart writer."""
        return pa.PythonFile(MultipartWriter(self.fs, path, self.part_size, self.concurrency), mode="w")


# ---------------------------------------------------------------------------------------------
# Preflight: is a location usable? Fast, one attempt, a message that says what to fix.


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
        ConnectionError as BotoConnectionError,
        HTTPClientError,
        NoCredentialsError,
        PartialCredentialsError,
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


def _check_s3(location: str, write: bool) -> None:
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


def check_location(uri: str, *, write: bool) -> str:
    """Prove a location is usable before anything runs; returns it normalized.

    With `write`, a probe object is written and removed (nothing is left; a
    missing S3 bucket is reported, never created). Without, the location must
    exist (FileNotFoundError otherwise). Raises StorageError naming the
    location and what to fix: unreachable endpoint, rejected or missing
    credentials, missing bucket, no permission.
    """
    location = normalize_location(uri)
    if is_s3(location):
        _check_s3(location, write)
        return location
    fs, path = fsspec_filesystem(location)
    if not write:
        if not fs.exists(path):
            raise FileNotFoundError(f"{location}: no such file or directory")
        return location
    probe = join(path, f".podium-write-probe-{uuid.uuid4().hex}")
    try:
        if not is_remote(location):
            fs.makedirs(path, exist_ok=True)
        fs.pipe_file(probe, b"ok")
        fs.rm_file(probe)
    except Exception as exc:
        raise StorageError(location, f"not writable ({type(exc).__name__}: {exc})") from None
    return location
