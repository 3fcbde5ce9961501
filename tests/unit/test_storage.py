"""Locations and S3 settings: pure logic, no server (the S3 server tests are in tests/integration/test_s3.py)."""

from __future__ import annotations

import pickle

import pyarrow.fs as pafs
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

from podium.storage.backends.s3 import describe_s3_error
from podium.storage.backends.s3_client import S3_SETTING_ENV, S3Settings, StorageError, s3_environment, s3_filesystem, s3_settings
from podium.storage.backends.s3_transfer import S3Handler
from podium.storage.locations import arrow_filesystem, normalize_location, uri_of
from podium.storage.preflight import check_location

SECRET = "unit-test-secret-never-shown"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in S3_SETTING_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "unit-test-key-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)


def test_endpoint_and_region_follow_the_standard_variables_and_podium_wins(monkeypatch):
    assert s3_settings().endpoint_url is None and s3_settings().style == "auto"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://generic:9000")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert (s3_settings().endpoint_url, s3_settings().region) == ("http://generic:9000", "eu-west-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://s3-only:9000")
    monkeypatch.setenv("AWS_REGION", "eu-central-1")
    assert (s3_settings().endpoint_url, s3_settings().region) == ("http://s3-only:9000", "eu-central-1")
    monkeypatch.setenv("PODIUM_S3_ENDPOINT_URL", "http://minio:9000")
    monkeypatch.setenv("PODIUM_S3_REGION", "local")
    settings = s3_settings()
    assert (settings.endpoint_url, settings.region) == ("http://minio:9000", "local")
    assert settings.style == "path", "a custom endpoint (MinIO, Ceph) gets path-style addressing by default"
    monkeypatch.setenv("PODIUM_S3_ADDRESSING_STYLE", "virtual")
    assert s3_settings().style == "virtual"


def test_settings_forwarded_to_workers_hold_no_credentials(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://minio:9000")
    monkeypatch.setenv("PODIUM_S3_ADDRESSING_STYLE", "path")
    env = s3_environment()
    assert env == {"AWS_ENDPOINT_URL": "http://minio:9000", "PODIUM_S3_ADDRESSING_STYLE": "path"}
    assert SECRET not in env.values()


def test_invalid_setting_names_the_variable_and_value(monkeypatch):
    monkeypatch.setenv("PODIUM_S3_ADDRESSING_STYLE", "sideways")
    with pytest.raises(StorageError, match="PODIUM_S3_ADDRESSING_STYLE = 'sideways'"):
        s3_settings()


def test_locations_are_normalized_and_never_carry_credentials(tmp_path):
    assert normalize_location("s3://bucket/prefix/") == "s3://bucket/prefix"
    assert normalize_location(str(tmp_path / "x" / "..")) == str(tmp_path)
    with pytest.raises(StorageError) as err:
        normalize_location(f"s3://AKIAKEY:{SECRET}@bucket/prefix")
    assert SECRET not in str(err.value) and "AKIAKEY" not in str(err.value)
    assert "credentials in the URI are refused" in str(err.value)
    with pytest.raises(StorageError, match="no query or fragment"):
        normalize_location("s3://bucket/prefix?endpoint_override=http://x")


def test_s3_filesystem_is_configured_from_settings_and_renewed_when_credentials_change(monkeypatch):
    monkeypatch.setenv("PODIUM_S3_ENDPOINT_URL", "http://minio:9000")
    monkeypatch.setenv("PODIUM_S3_REGION", "local")
    for name in ("AWS_RETRY_MODE", "AWS_MAX_ATTEMPTS"):
        monkeypatch.delenv(name, raising=False)
    fs = s3_filesystem()
    assert fs.endpoint_url == "http://minio:9000"
    assert fs.client_kwargs == {"region_name": "local"}
    assert fs.config_kwargs == {"s3": {"addressing_style": "path"}, "retries": {"mode": "standard", "max_attempts": 8}}
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")  # the user's own retry settings win (botocore reads them)
    assert "retries" not in s3_filesystem().config_kwargs
    monkeypatch.delenv("AWS_MAX_ATTEMPTS")
    assert s3_filesystem() is fs, "one client per process and settings"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "rotated-" + SECRET)
    assert s3_filesystem() is not fs, "new credentials in the environment: a new client"
    # credentials are never handed to s3fs, so they are in nothing it pickles (Ray ships filesystems to workers)
    assert SECRET not in repr(fs.storage_options) and SECRET.encode() not in pickle.dumps(fs)


def test_arrow_filesystem_for_s3_moves_streams_in_parts_and_round_trips_the_uri(monkeypatch):
    monkeypatch.setenv("PODIUM_S3_PART_SIZE_MB", "8")
    monkeypatch.setenv("PODIUM_S3_CONCURRENCY", "3")
    fs, path = arrow_filesystem("s3://bucket/runs/")
    assert isinstance(fs, pafs.PyFileSystem) and isinstance(fs.handler, S3Handler)
    assert path == "bucket/runs"
    assert (fs.handler.part_size, fs.handler.concurrency) == (8 << 20, 3)
    assert uri_of(fs, f"{path}/run/checkpoint_00000001") == "s3://bucket/runs/run/checkpoint_00000001"
    shipped = pickle.loads(pickle.dumps(fs))  # what Ray does with RunConfig(storage_filesystem=...)
    assert isinstance(shipped.handler, S3Handler) and shipped.handler.part_size == 8 << 20
    assert SECRET.encode() not in pickle.dumps(fs)


def _client_error(code: str, status: int, operation: str = "ListObjectsV2") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "server says no"},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, operation)


@pytest.mark.parametrize("exc, action, expected", [
    (_client_error("InvalidAccessKeyId", 403), "list", "rejected the credentials (InvalidAccessKeyId)"),
    (_client_error("SignatureDoesNotMatch", 403), "write", "rejected the credentials (SignatureDoesNotMatch)"),
    (_client_error("NoSuchBucket", 404), "list", "bucket 'bucket' does not exist at http://minio:9000"),
    (_client_error("AccessDenied", 403, "PutObject"), "write", "access denied writing (s3:PutObject)"),
    (_client_error("AccessDenied", 403), "list", "access denied listing (s3:ListBucket)"),
    (EndpointConnectionError(endpoint_url="http://minio:9000"), "list",
     "cannot reach the S3 endpoint http://minio:9000"),
    (NoCredentialsError(), "list", "no AWS credentials found"),
    (_client_error("SlowDown", 503), "write", "write failed at http://minio:9000: SlowDown server says no"),
])
def test_s3_errors_say_what_to_fix(monkeypatch, exc, action, expected):
    monkeypatch.setenv("PODIUM_S3_ENDPOINT_URL", "http://minio:9000")
    reason = describe_s3_error(exc, "s3://bucket/prefix", action, S3Settings())
    assert expected in reason
    assert SECRET not in reason


def test_storage_error_survives_pickling_and_hides_user_info():
    err = StorageError(f"s3://key:{SECRET}@bucket/x", "not writable")
    assert str(err) == "s3://***@bucket/x: not writable"
    again = pickle.loads(pickle.dumps(err))
    assert (again.location, again.reason, str(again)) == (err.location, err.reason, str(err))


def test_local_locations_are_checked_too(tmp_path):
    assert check_location(str(tmp_path / "new" / "storage"), write=True) == str(tmp_path / "new" / "storage")
    assert list((tmp_path / "new" / "storage").iterdir()) == [], "the probe is gone"
    with pytest.raises(FileNotFoundError):
        check_location(str(tmp_path / "missing.parquet"), write=False)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(StorageError, match="not writable"):
        check_location(str(blocker / "serving"), write=True)


def test_the_kind_of_store_is_named_by_its_backend_and_a_local_path_by_none():
    from podium.storage.backends import store_of

    assert [store_of(u) for u in ("s3://b/x", "s3a://b/x", "gs://b/x", "gcs://b/x", "az://c/x", "abfss://c@a/x")] == \
        ["s3", "s3", "gcs", "gcs", "azure", "azure"]
    assert store_of("/data/x") is None and store_of("file:///data/x") is None and store_of("relative/x") is None
    assert store_of("hdfs://nn/x") == "hdfs"  # no backend claims it: named as written
