"""The suite's count of what it costs (`podium.settings.count_start`)."""

from __future__ import annotations

import pytest

from podium.settings import count_start


def test_each_start_appends_one_line_to_the_cost_log(tmp_path, monkeypatch):
    log = tmp_path / "costs.log"
    monkeypatch.setenv("PODIUM_COST_LOG", str(log))
    count_start("ray_train")
    count_start("podium")
    lines = [line.split() for line in log.read_text().splitlines()]
    assert [line[0] for line in lines] == ["ray_train", "podium"]
    assert {line[2] for line in lines} == {"tests/unit/test_costs.py"}  # the test that caused it
    with pytest.raises(ValueError, match="expected one of"):
        count_start("a training")


def test_without_a_cost_log_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("PODIUM_COST_LOG", raising=False)
    monkeypatch.chdir(tmp_path)
    count_start("podium")
    assert list(tmp_path.iterdir()) == []
