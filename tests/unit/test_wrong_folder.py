"""`history`, `lineage` and `rollback` run where nothing was promoted (the wrong folder, a PODIUM_HOME unset or
another): one sentence saying where podium looked and how to point it elsewhere, exit 2, nothing created."""

from __future__ import annotations

import pytest

from podium.cli.main import main


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A project whose home serves model `cancer`, and a folder beside it where podium runs without PODIUM_HOME."""
    served = tmp_path / "project" / ".podium" / "serving" / "cancer"
    served.mkdir(parents=True)
    (served / "CURRENT").write_text('{"version": "v000001"}')
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path / "other")
    monkeypatch.delenv("PODIUM_HOME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


@pytest.mark.parametrize("argv, then", [(["history"], ""), (["history", "--json"], ""),
                                        (["rollback"], ", nothing to roll back"),
                                        (["lineage", "v000001"], ", so no version v000001 there")])
def test_a_read_from_the_wrong_folder_says_where_it_looked_and_how_to_look_elsewhere(elsewhere, capsys, argv, then):
    assert main(argv) == 2
    err = capsys.readouterr().err
    home = elsewhere / "other" / ".podium"
    assert err.startswith(f"podium: nothing has been promoted to '{home}/serving/podium' (no such location; the "
                          f"serving location of model 'podium' in podium's home {home}, PODIUM_HOME is not set: "
                          f"./.podium of this folder){then}"), err
    assert "Run podium from the project folder, set PODIUM_HOME to its .podium folder, or give --serving" in err
    assert list((elsewhere / "other").iterdir()) == [], "a read creates nothing"


def test_the_hint_names_the_models_this_home_serves(elsewhere, monkeypatch, capsys):
    monkeypatch.setenv("PODIUM_HOME", str(elsewhere / "project" / ".podium"))
    assert main(["history"]) == 2  # model 'podium' is not served there; 'cancer' is
    err = capsys.readouterr().err
    assert "in podium's home" in err and ", PODIUM_HOME)" in err, err
    assert "this home serves model(s) cancer (--model NAME)" in err, err


def test_a_dataset_lookup_without_a_store_creates_none(elsewhere, capsys):
    assert main(["lineage", "3f2a91c0"]) == 2
    err = capsys.readouterr().err
    assert f"no MLflow store at sqlite:///{elsewhere / 'other' / '.podium' / 'mlflow.db'}" in err, err
    assert list((elsewhere / "other").iterdir()) == []
