"""The plan's checks that read no data come before `before_data` (where `podium run` writes the demo data): a
refusal of the settings writes nothing; one of the data itself comes after it."""

from __future__ import annotations

from pathlib import Path

import pytest

from podium.config import build_config
from podium.errors import ConfigError
from podium.tasks.plan import plan_run


def _plan(tmp_path: Path, demo_data: tuple[str, str], **sections) -> list[str]:
    config = build_config({"storage": str(tmp_path / "storage"), "serving": str(tmp_path / "serving"),
                           "data": {"train": demo_data[0], "val": demo_data[1], **sections.pop("data", {})},
                           **sections})
    called: list[str] = []
    with pytest.raises(ConfigError):
        plan_run(config, before_data=lambda: called.append("before_data"))
    return called


def test_settings_are_refused_before_the_data_is_written(tmp_path, demo_data):
    assert _plan(tmp_path, demo_data, promotion={"metric": "val_losss"}) == []
    assert _plan(tmp_path, demo_data, storage="userfs://no_such_module:make_fs/checkpoints") == []
    assert _plan(tmp_path, demo_data, validation={"fn": "no_such_module:validate"}) == []


def test_data_is_refused_after_it(tmp_path, demo_data):
    assert _plan(tmp_path, demo_data, data={"label_column": "no_label"}) == ["before_data"]


def test_the_storage_filesystem_is_named_when_it_does_not_import(tmp_path, demo_data):
    config = build_config({"storage": "userfs://no_such_module:make_fs/checkpoints", "serving": str(tmp_path / "s"),
                           "data": {"train": demo_data[0], "val": demo_data[1]}})
    with pytest.raises(ConfigError, match="storage.filesystem = 'no_such_module:make_fs': cannot import module"):
        plan_run(config)
