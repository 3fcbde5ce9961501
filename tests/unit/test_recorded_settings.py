"""`podium promote` of a run on its own recorded settings (`podium.cli.recorded`): the params a run recorded read
back as its configuration, the command's --config keys and flags laid over them, and what the command says."""

from __future__ import annotations

import argparse
import json

import pytest

from podium.cli.options import Parser, add_run_options
from podium.cli.recorded import COMMAND_OWN, loose_value, merge_settings, read_recorded, with_run_settings
from podium.config import build_config, load_config
from podium.settings import PodiumSettings
from podium.tracking.runs import flatten_params

RUN = {"run_name": "nightly", "model": "churn", "storage": "/data/ckpt", "serving": "/srv/churn-own",
       "data": {"train": "/data/train.parquet", "val": "/data/val.parquet", "feature_columns": ["f0", "f1"]},
       "training": {"train_loop": "mypkg.train:loop", "train_loop_config": {"epochs": 2}},
       "validation": {"fn": "mypkg.validate:fn", "kwargs": {"calls_log": "/tmp/calls", "limit": 3, "api_key": "s3"}},
       "promotion": {"metric": "accuracy", "mode": "max", "min_delta": 0.01, "model_class": "mypkg.model:Net",
                     "thresholds": {"val.acc": {"min": 0.5}}, "guards": {"loss": {"max_increase": 0.1}},
                     "confidence": 0.95, "alias": "canary", "always": True, "approval": "required",
                     "shadow": {"requests": 50}}}


def recorded(run: dict = RUN) -> dict[str, str]:
    """What `open_tracking_run` logs as the run's params."""
    return flatten_params(build_config(run).model_dump(mode="json"))


def args_of(*argv: str) -> argparse.Namespace:
    parser = Parser(prog="podium promote")
    add_run_options(parser)
    return parser.parse_args(list(argv))


def test_a_run_s_params_read_back_as_its_settings_without_the_command_s_own():
    tree, unreadable = read_recorded(recorded())
    assert tree is not None
    p = tree["promotion"]
    assert (p["metric"], p["mode"], p["min_delta"], p["confidence"]) == ("accuracy", "max", 0.01, 0.95)
    assert p["model_class"] == "mypkg.model:Net" and p["model_loader"] is None and p["approval"] == "required"
    assert p["thresholds"] == {"val.acc": {"min": 0.5}} and p["guards"] == {"loss": {"max_increase": 0.1}}
    assert p["shadow"]["requests"] == 50 and p["allow_files"] is False
    assert tree["data"]["feature_columns"] == ["f0", "f1"] and tree["storage"] == "/data/ckpt"
    assert tree["validation"]["kwargs"] == {"calls_log": "/tmp/calls", "limit": 3}  # the key's secret is not kept
    assert unreadable == ["validation.kwargs.api_key"]
    for path in COMMAND_OWN:  # which run, where it serves, under which names, whether it forces: the command's
        head, _, leaf = path.rpartition(".")
        assert leaf not in (tree.get(head, {}) if head else tree), path
    assert "train_loop_config" not in tree["training"]  # only training reads it


def test_every_setting_a_promotion_reads_comes_back_as_it_was():
    tree, _ = read_recorded(recorded())
    assert tree is not None
    again = build_config({**tree, "run_name": "nightly", "model": "churn"})
    original = build_config(RUN)
    assert again.promotion.model_dump(exclude={"alias", "always"}) == original.promotion.model_dump(
        exclude={"alias", "always"})
    assert again.data == original.data and again.training.train_loop == original.training.train_loop


def test_params_that_do_not_say_how_a_run_was_configured_are_not_settings():
    assert read_recorded({}) == (None, [])
    assert read_recorded({"lr": "0.1", "epochs": "3"}) == (None, [])  # a run podium did not make


@pytest.mark.parametrize("text, value", [("True", True), ("None", None), ("3", 3), ("0.5", 0.5), ('["a"]', ["a"]),
                                         ("/tmp/x", "/tmp/x")])
def test_a_free_form_value_comes_back_as_what_its_text_says(text, value):
    assert loose_value(text) == value


def test_the_command_s_settings_lie_over_the_run_s_and_a_table_it_names_replaces_the_run_s():
    tree, _ = read_recorded(recorded())
    assert tree is not None
    merged, changed = merge_settings(tree, {"promotion": {"mode": "min", "thresholds": {"loss": {"max": 1.0}}},
                                            "data": {"val": "/data/val-new.parquet"}})
    assert merged["promotion"]["mode"] == "min" and merged["promotion"]["metric"] == "accuracy"
    assert merged["promotion"]["thresholds"] == {"loss": {"max": 1.0}}  # not beside the run's val.acc
    assert merged["promotion"]["guards"] == {"loss": {"max_increase": 0.1}}  # the run's, not named by the command
    assert changed == {"promotion.mode": "max", "promotion.thresholds": {"val.acc": {"min": 0.5}},
                       "data.val": "/data/val.parquet"}
    same, unchanged = merge_settings(tree, {"promotion": {"metric": "accuracy"}})
    assert unchanged == {} and same["promotion"]["metric"] == "accuracy"  # stated again is not overridden


def test_the_promotion_uses_the_run_s_settings_with_a_flag_over_them_and_says_which(tmp_path, monkeypatch):
    monkeypatch.setenv("PODIUM_HOME", str(tmp_path / "home"))
    settings = PodiumSettings()
    args = args_of("--run-name", "nightly", "--model", "churn", "--mode", "min")
    command = load_config(None, {"run_name": "nightly", "model": "churn", "promotion": {"mode": "min"}}, settings)
    config, report = with_run_settings(args, command, settings, recorded())
    p = config.promotion
    assert (p.metric, p.mode, p.model_class, p.approval) == ("accuracy", "min", "mypkg.model:Net", "required")
    assert (p.alias, p.always, p.registered_model) == ("champion", False, "churn")  # the command's own
    assert config.serving == str(tmp_path / "home" / "serving" / "churn") and config.storage == "/data/ckpt"
    assert report.from_run and report.overridden == {"promotion.mode": {"run": "max", "used": "min", "by": "--mode"}}
    line = report.line()
    assert line.startswith("using run nightly's settings: metric accuracy (min), min_delta 0.01, thresholds "
                           '{"val.acc": {"min": 0.5}}, guards {"loss": {"max_increase": 0.1}}, confidence 0.95, '
                           "model class mypkg.model:Net, approval required, validation mypkg.validate:fn"), line
    assert "; overridden here: promotion.mode = 'min' (--mode; the run's: 'max')" in line
    assert line.endswith("; not readable from its record, this command's used: validation.kwargs.api_key")
    unreadable = {**recorded(), "promotion.mode": "sideways"}  # not of its field's type: the command's, said so
    config, report = with_run_settings(args, command, settings, unreadable)
    assert config.promotion.mode == "min" and "promotion.mode" in report.unreadable
    assert json.loads(json.dumps(report.to_dict()))["used"]["promotion.model_class"] == "mypkg.model:Net"


def test_a_config_file_s_keys_override_too_and_are_named(tmp_path, monkeypatch):
    monkeypatch.setenv("PODIUM_HOME", str(tmp_path / "home"))
    settings = PodiumSettings()
    path = tmp_path / "promote.json"
    path.write_text(json.dumps({"model": "churn", "promotion": {"metric": "loss", "mode": "min"}}))
    args = args_of("--config", str(path), "--run-name", "nightly")
    command = load_config(str(path), {"run_name": "nightly"}, settings)
    config, report = with_run_settings(args, command, settings, recorded())
    assert (config.promotion.metric, config.promotion.mode) == ("loss", "min")
    assert report.overridden["promotion.metric"] == {"run": "accuracy", "used": "loss", "by": f"--config {path}"}


def test_a_run_without_recorded_settings_or_with_ones_no_longer_valid_keeps_the_command_s(tmp_path, monkeypatch):
    monkeypatch.setenv("PODIUM_HOME", str(tmp_path / "home"))
    settings = PodiumSettings()
    args = args_of("--run-name", "old")
    command = load_config(None, {"run_name": "old"}, settings)
    config, report = with_run_settings(args, command, settings, {"epochs": "3"})
    assert config is command and not report.from_run
    assert report.line() == ("run old: its settings are not recorded in MLflow (a run from before podium recorded "
                             "them, or one podium did not make): promoting with this command's settings: metric "
                             "val_loss (min)")
    stale = {**recorded(), "promotion.min_delta": "-1"}  # a value this podium no longer takes
    config, report = with_run_settings(args, command, settings, stale)
    assert config is command and not report.from_run
    assert report.why_not.startswith("its recorded settings do not make a valid configuration now (promotion.min_delta")


def test_promote_hands_on_when_it_checked_the_tracking_store_so_the_command_does_not_check_it_again(
        tmp_path, monkeypatch):
    from podium.cli.recorded import promote_settings
    from podium.services import prepare_mlflow

    monkeypatch.setenv("PODIUM_HOME", str(tmp_path / "home"))
    settings = PodiumSettings()
    command = load_config(None, {"run_name": "nightly", "model": "churn"}, settings)
    config, checked = promote_settings(args_of("--run-name", "nightly"), command, settings)
    assert config is command and checked is None  # no store yet: nothing was checked, the command checks it
    prepare_mlflow(settings.resolved_tracking_uri())
    config, checked = promote_settings(args_of("--run-name", "nightly"), command, settings)  # no such run in it
    assert config is command and checked is not None and checked[0] <= checked[1]  # checked once, and when


def test_a_run_recorded_with_a_model_class_is_promoted_with_a_loader_or_without_a_class(tmp_path, monkeypatch):
    """How the champion loads is one setting of two fields: a command that names a loader replaces the run's class
    (the plan would refuse a loader that takes no class beside a class), and `--model-class ""` clears it."""
    monkeypatch.setenv("PODIUM_HOME", str(tmp_path / "home"))
    settings = PodiumSettings()
    for argv, loader in ((["--model-loader", "mypkg.load:fn"], "mypkg.load:fn"), (["--model-class", ""], None)):
        args = args_of("--run-name", "nightly", "--model", "churn", *argv)
        command = load_config(None, {"run_name": "nightly", "model": "churn",
                                     "promotion": {"model_loader": loader} if loader else {"model_class": ""}},
                              settings)
        config, report = with_run_settings(args, command, settings, recorded())
        assert report.from_run, report.why_not
        assert (config.promotion.model_loader, config.promotion.model_class) == (loader, None), argv
        assert report.overridden["promotion.model_class"] == {"run": "mypkg.model:Net", "used": None, "by": argv[0]}
        assert config.promotion.metric == "accuracy"  # the rest is still the run's
