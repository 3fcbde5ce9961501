"""The S3 adapter: settings, the s3fs client podium shares, retries, error codes.

This is the only module that knows s3fs's internals (its event loop, `_call_s3`). Everything
else calls `s3_call` (blocking), `s3_call_async` (a coroutine on s3fs's loop), `s3_submit`
(schedule a coroutine there from another thread) or `s3_run` (run one and wait).

S3 and S3-compatible stores (MinIO, Ceph, moto) go through s3fs. The endpoint, region and
addressing style come from `S3Settings` (environment variables); credentials come only from
the standard AWS chain (environment, profile, instance role): podium never takes, stores or
prints them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import fsspec
from fsspec.asyn import sync
from pydantic import AliasChoices, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from podium.storage.errors import StorageError

S3_SCHEMES = ("s3", "s3a")


MiB = 1 << 20


# environment variables whose values decide which credentials the AWS chain finds (only hashed, never kept)
CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                  "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN")


CREDENTIALS_HINT = ("the standard AWS credential chain: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                    "AWS_PROFILE, or an instance role")



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


def is_s3_filesystem(fs: fsspec.AbstractFileSystem) -> bool:
    """True for an s3fs filesystem."""
    return "s3" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def s3_call(fs: fsspec.AbstractFileSystem, method: str, **kwargs: Any) -> dict[str, Any]:
    """One S3 API call (botocore method name and arguments), blocking, with podium's retries."""
    return fs.call_s3(method, **kwargs)


def s3_call_async(fs: fsspec.AbstractFileSystem, method: str, **kwargs: Any) -> Awaitable[dict[str, Any]]:
    """The same call as a coroutine, to be awaited on s3fs's event loop (inside `s3_run` / `s3_submit`)."""
    return fs._call_s3(method, **kwargs)


def s3_submit(fs: fsspec.AbstractFileSystem, coro: Awaitable[Any]) -> concurrent.futures.Future:
    """Schedule a coroutine on s3fs's event loop thread; the caller is never that thread."""
    return asyncio.run_coroutine_threadsafe(coro, fs.loop)  # type: ignore[arg-type]


def s3_run(fs: fsspec.AbstractFileSystem, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
    """Run the coroutine function `fn(*args, **kwargs)` on s3fs's event loop and wait for its result."""
    return sync(fs.loop, fn, *args, **kwargs)


def split_object_path(fs: fsspec.AbstractFileSystem, path: str) -> tuple[str, str]:
    """(bucket, key) of a 'bucket/key' path."""
    bucket, key, _ = fs.split_path(path)
    return bucket, key
