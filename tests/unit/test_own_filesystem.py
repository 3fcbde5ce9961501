"""A filesystem of the user's own as storage (a `[storage]` table): the configuration's checks, and podium's reads
and writes through it (podium.storage.backends.userfs), on a folder of this machine; no Ray, no server."""

from __future__ import annotations

import logging
import os

import pyarrow.fs as pafs
import pytest

from podium.config import PipelineConfig, build_config, parse_userfs_location
from podium.errors import ConfigError
from podium.storage.documents import read_json, write_json
from podium.storage.errors import StorageError
from podium.storage.lease import location_lock
from podium.storage.locations import arrow_filesystem, fsspec_filesystem, join, persisted_uri
from podium.storage.preflight import check_location
from podium.tasks.plan import check_writable


def own_storage(root, path: str = "checkpoints", factory: str = "podium_filesystems:subtree") -> str:
    """The storage location of a `[storage]` table over `root`."""
    table = {"path": path, "filesystem": factory, "filesystem_kwargs": {"root": str(root)} if root else {}}
    return build_config({"storage": table}).storage


def config_error(storage) -> str:
    with pytest.raises(ConfigError) as err:
        build_config({"storage": storage})
    return str(err.value)


def test_a_storage_table_becomes_one_location_that_names_its_function_kwargs_and_path(tmp_path):
    location = own_storage(tmp_path)
    assert location.startswith("userfs://podium_filesystems:subtree;") and location.endswith("/checkpoints")
    assert parse_userfs_location(location) == ("podium_filesystems:subtree", {"root": str(tmp_path)}, "checkpoints")
    # what Prefect parameters and records carry validates again as the same location
    config = build_config({"storage": {"path": "ck", "filesystem": "podium_filesystems:subtree"}})
    assert config.storage == "userfs://podium_filesystems:subtree/ck"
    assert PipelineConfig.model_validate(config.model_dump()).storage == config.storage


def test_a_storage_string_is_unchanged():
    assert build_config({"storage": "/mnt/shared/storage"}).storage == "/mnt/shared/storage"
    assert build_config({"storage": "s3://bucket/prefix"}).storage == "s3://bucket/prefix"


def test_a_storage_table_is_checked_field_by_field():
    assert "storage.filesystem: Field required" in config_error({"path": "ck"})
    assert "storage.path: Field required" in config_error({"filesystem": "a.b:c"})
    assert "storage.filesystem = 'make_fs': expected 'package.module:function'" in config_error(
        {"path": "ck", "filesystem": "make_fs"})
    assert "storage.endpoint = 'http://x': Extra inputs are not permitted" in config_error(
        {"path": "ck", "filesystem": "a.b:c", "endpoint": "http://x"})
    assert "storage.path = '': String should have at least 1 character" in config_error(
        {"path": "", "filesystem": "a.b:c"})
    assert "storage = 3: expected a path or URI (a string), or a table { path, filesystem }, got a whole number" \
        in config_error(3)


def test_filesystem_kwargs_are_json_values_without_credentials():
    message = config_error({"path": "ck", "filesystem": "a.b:c",
                            "filesystem_kwargs": {"endpoint": "http://minio:9000", "secret_key": "s3cr3t"}})
    assert "storage.filesystem_kwargs" in message and "secret_key: credentials are not accepted" in message
    assert "s3cr3t" not in message
    assert "expected JSON values" in config_error({"path": "ck", "filesystem": "a.b:c",
                                                    "filesystem_kwargs": {"ratio": float("nan")}})


def test_a_function_that_returns_no_pyarrow_filesystem_is_refused_naming_what_it_returned():
    with pytest.raises(StorageError) as err:
        check_location(own_storage(None, factory="podium_filesystems:not_a_filesystem"), write=True)
    assert "storage.filesystem = 'podium_filesystems:not_a_filesystem' returned a str: expected a " \
           "pyarrow.fs.FileSystem" in str(err.value)


@pytest.mark.parametrize(("factory", "words"), [
    ("podium_filesystems:unreachable", "raised ConnectionError: no endpoint at http://127.0.0.1:9"),
    ("podium_filesystems:no_such_function", "module 'podium_filesystems' has no attribute 'no_such_function'"),
    ("no_such_module.fs:make_fs", "cannot import module 'no_such_module.fs'"),
])
def test_a_function_that_cannot_be_called_is_refused_before_anything_starts(factory, words):
    with pytest.raises(ConfigError) as err:
        check_writable(own_storage(None, factory=factory), "storage")
    assert f"storage.filesystem = '{factory}'" in str(err.value) and words in str(err.value)


def test_reads_and_writes_go_through_the_function_s_filesystem(tmp_path):
    location = check_location(own_storage(tmp_path), write=True)
    assert (tmp_path / "checkpoints").is_dir() and os.listdir(tmp_path / "checkpoints") == []  # the probe is gone
    write_json(join(location, ".podium-runs", "nightly.json"), {"announced": ["checkpoint_000000"]})
    write_json(join(location, ".podium-runs", "nightly.json"), {"announced": ["checkpoint_000001"]})
    assert read_json(join(location, ".podium-runs", "nightly.json"), OSError) == {"announced": ["checkpoint_000001"]}
    assert os.listdir(tmp_path / "checkpoints" / ".podium-runs") == ["nightly.json"]  # written whole, then moved
    fs, path = fsspec_filesystem(join(location, ".podium-runs"))
    assert path == "checkpoints/.podium-runs" and fs.ls(path, detail=False) == ["checkpoints/.podium-runs/nightly.json"]
    # Ray Train's storage_filesystem is the function's own, built once per process and kwargs
    arrow, arrow_path = arrow_filesystem(location)
    assert isinstance(arrow, pafs.SubTreeFileSystem) and arrow_path == "checkpoints"
    assert arrow_filesystem(join(location, "run"))[0] is arrow


def test_a_checkpoint_ray_persisted_is_named_under_the_storage_location(tmp_path):
    location = own_storage(tmp_path)
    fs, path = arrow_filesystem(location)
    assert persisted_uri(fs, f"{path}/run/checkpoint_000000", location, "run/checkpoint_000000") == \
        f"{location}/run/checkpoint_000000"
    # every store's checkpoints are named so; without the location (a job of your own), from Ray's filesystem
    assert persisted_uri(pafs.LocalFileSystem(), f"{tmp_path}/run/checkpoint_000000", str(tmp_path),
                         "run/checkpoint_000000") == f"{tmp_path}/run/checkpoint_000000"
    assert persisted_uri(pafs.LocalFileSystem(), f"{tmp_path}/run/checkpoint_000000") == \
        f"{tmp_path}/run/checkpoint_000000"


def test_a_run_s_lock_on_a_filesystem_of_your_own_is_none_and_says_so(tmp_path, caplog):
    location = own_storage(tmp_path)
    with caplog.at_level(logging.WARNING, logger="podium.storage.lease"):
        with location_lock(join(location, ".podium-runs"), "nightly.lock", 1.0, "run nightly"):
            pass
    assert "no lock on this store (run nightly)" in caplog.text
