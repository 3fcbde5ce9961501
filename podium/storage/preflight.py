"""Preflight: is a location usable? Fast, one attempt, a message that says what to fix."""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import urlparse

from podium.storage.locations import fsspec_filesystem, is_remote, is_s3, join, normalize_location, split_s3
from podium.storage.s3 import CREDENTIALS_HINT, S3Settings, StorageError, s3_settings

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
