"""The podium command's parsing and config building; nothing here starts a server or trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import podium.commands as commands
import podium.services
from podium.cli import OPTIONS, CliError, build_parser, config_from_args, main
from podium.settings import PodiumSettings


def config_for(argv: list[str], home: Path):
    return config_from_args(build_parser().parse_args(argv), PodiumSettings(home=home))


def test_flags_become_the_nested_config(tmp_path):
    config = config_for(["run", "--run-name", "exp-1", "--epochs", "3", "--learning-rate", "0.5",
                         "--num-workers", "4", "--use-gpu", "--feature-columns", "a, b,,c",
                         "--validate-kwargs", '{"k": 1}', "--concurrency", "3", "--metric", "val_accuracy",
                         "--mode", "max", "--min-delta", "0.01", "--always-promote", "--no-verify"], tmp_path)
    assert config.run_name == "exp-1"
    assert (config.training.epochs, config.training.learning_rate) == (3, 0.5)
    assert (config.scaling.num_workers, config.scaling.use_gpu) == (4, True)
    assert config.data.feature_columns == ["a", "b", "c"]
    assert (config.validation.kwargs, config.validation.concurrency) == ({"k": 1}, 3)
    p = config.promotion
    assert (p.metric, p.mode, p.min_delta, p.always, p.verify) == ("val_accuracy", "max", 0.01, True, "hashes")


def test_verify_modes_and_the_old_bool(tmp_path):
    assert config_for(["run", "--verify", "revalidate"], tmp_path).promotion.verify == "revalidate"
    from podium.config import ConfigError, build_config
    assert build_config({"promotion": {"verify": True}}).promotion.verify == "revalidate"
    assert build_config({"promotion": {"verify": False}}).promotion.verify == "hashes"
    with pytest.raises(ConfigError, match="verify"):
        build_config({"promotion": {"verify": "sometimes"}})


def test_unset_flags_keep_defaults_and_locations_come_from_home(tmp_path):
    config = config_for(["run"], tmp_path)
    assert (config.training.epochs, config.scaling.use_gpu, config.promotion.verify) == (5, False, "load")
    assert config.storage == str(tmp_path / "storage") and config.serving == str(tmp_path / "serving" / "podium")
    assert config.data.train == str(tmp_path / "data" / "train.parquet")
    assert (config.model, config.experiment, config.promotion.registered_model) == ("podium",) * 3
    assert config.training.standardize is True


def test_a_model_name_scopes_experiment_registered_model_and_serving(tmp_path):
    config = config_for(["run", "--model", "churn", "--no-standardize"], tmp_path)
    assert (config.model, config.experiment, config.promotion.registered_model) == ("churn",) * 3
    assert config.serving == str(tmp_path / "serving" / "churn") and config.training.standardize is False
    named = config_for(["run", "--model", "churn", "--experiment", "e", "--registered-model", "r"], tmp_path)
    assert (named.experiment, named.promotion.registered_model) == ("e", "r")
    with pytest.raises(CliError, match="model = '../up'"):
        config_for(["run", "--model", "../up"], tmp_path)


def test_flags_override_the_config_file(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"training": {"epochs": 7, "batch_size": 16}, "serving": "/srv/models"}))
    config = config_for(["run", "--config", str(path), "--epochs", "2"], tmp_path)
    assert (config.training.epochs, config.training.batch_size, config.serving) == (2, 16, "/srv/models")


def test_invalid_flag_value_is_a_cli_error_naming_the_field(tmp_path):
    with pytest.raises(CliError, match="promotion.mode = 'up'"):
        config_for(["run", "--mode", "up"], tmp_path)


def test_run_help_mentions_every_option(capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["run", "--help"])
    assert exit_.value.code == 0
    shown = capsys.readouterr().out
    assert [flag for flag, *_ in OPTIONS if flag not in shown] == []


def test_invalid_run_fails_before_any_server_starts(tmp_path, monkeypatch, capsys):
    def no_server(*args, **kwargs):
        raise AssertionError("a server was started for an invalid configuration")

    monkeypatch.setenv("PODIUM_HOME", str(tmp_path))
    # routes library logs to a file under home and edits the root logger: not what this test is about
    monkeypatch.setattr(commands, "_quiet_libraries", lambda log_file: None)
    monkeypatch.setattr(podium.services, "ensure_prefect_server", no_server)
    monkeypatch.setattr(podium.services, "prepare_mlflow", no_server)

    assert main(["run", "--epochs", "0", "--quiet"]) == 2
    assert "training.epochs = 0" in capsys.readouterr().err
