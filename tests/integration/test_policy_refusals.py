"""A policy that cannot be met is refused as early as it can be known, through the `podium` command.

Before anything starts (no server, no Ray, no training): a threshold on a metric the built-in validation does not report (a typo),
`keep = true` and `keep = "2"` in a TOML config, a bad integer flag, `promotion.confidence` with a validation
function that cannot give per-row values.

One Ray Train start: a run with a threshold on a metric the user's validation function does not return, which
only its first result can tell: that result stops training, exit 2, naming the metric and listing what the function
returns. (An early stop that leaves no checkpoint folder that nothing names, and its resume that trains on:
test_cli_process's `beta` run, with checkpoints.keep, and its resume.)
"""

from __future__ import annotations

import json
import os

import pytest
from helpers.commands import podium, podium_in_process
from podium_nightly_code import FEATURES, write_data

pytestmark = pytest.mark.integration


def _one_sentence(proc) -> str:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "usage:" not in proc.stderr, \
        f"exit {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stderr


def test_a_policy_or_a_value_that_cannot_be_right_is_refused_before_anything_starts(
        cli_env, dataset, tmp_path):
    data = ["--train-data", dataset[0], "--val-data", dataset[1], "--storage", str(tmp_path / "storage"),
            "--serving", str(tmp_path / "serving"), "--num-workers", "1"]

    # a threshold on a metric the built-in validation does not report (it trained, then FAILED every night)
    typo = tmp_path / "typo.toml"
    typo.write_text("[promotion.thresholds.val_acuracy]\nmin = 0.9\n")
    err = _one_sentence(podium(["run", "--run-name", "typo", "--config", str(typo), *data], cli_env, check=False))
    assert ("promotion.thresholds.val_acuracy: no such metric; the built-in loop and validation report "
            "['accuracy', 'loss', 'val_accuracy', 'val_loss']") in err, err
    assert not (tmp_path / "storage" / "typo").exists()  # nothing trained

    # typed fields take no value of another type (keep = true was 1, and deleted checkpoints); the second in this
    # process (its sentence is what differs)
    for value, expected, command in (
            ("true", "checkpoints.keep = True: expected a whole number, got a boolean", podium),
            ('"2"', "checkpoints.keep = '2': expected a whole number, got a string", podium_in_process)):
        keep = tmp_path / "keep.toml"
        keep.write_text(f"[checkpoints]\nkeep = {value}\n")
        err = _one_sentence(command(["run", "--run-name", "keep", "--config", str(keep), *data], cli_env, check=False))
        assert expected in err, err

    # a bad integer flag: one sentence, not argparse's usage block
    err = _one_sentence(podium(["run", "--epochs", "x", *data], cli_env, check=False))
    assert err.startswith("podium: --epochs = 'x': expected a whole number") and err.count("\n") == 1, err

    # a confidence gate the validation function cannot serve (no per_row argument) is refused, not silently skipped
    cli_env["PYTHONPATH"] = os.path.dirname(__file__)
    write_data(str(tmp_path / "train.parquet"), 100, 0.0, seed=1)
    write_data(str(tmp_path / "val.parquet"), 200, 0.35, seed=2)
    config = tmp_path / "confidence.json"
    config.write_text(json.dumps(_config("conf", tmp_path, {"epochs": 2, "angle_deg": 0.0},
                                         {"confidence": 0.95}, fn="podium_user_code:validate_fn")))
    err = _one_sentence(podium_in_process(["run", "--config", str(config)], cli_env, check=False))  # as the typo's
    assert ("promotion.confidence = 0.95 needs per-row values, and validation.fn = 'podium_user_code:validate_fn' "
            "takes no per_row argument") in err, err
    assert not (tmp_path / "storage" / "conf").exists()
    # each was refused before anything started: no home folder, where the command's and Ray's logs would be
    assert not (tmp_path / "home").exists(), sorted(str(p) for p in (tmp_path / "home").rglob("*"))


def _config(name: str, tmp_path, loop: dict, promotion: dict, fn: str = "podium_nightly_code:validate_fn",
            **training) -> dict:
    return {"run_name": name, "storage": str(tmp_path / "storage"), "serving": str(tmp_path / "serving"),
            "data": {"train": str(tmp_path / "train.parquet"), "val": str(tmp_path / "val.parquet"),
                     "feature_columns": list(FEATURES)},
            "training": {"train_loop": "policy_code:slow_train_func", "train_loop_config": loop, **training},
            "scaling": {"num_workers": 1}, "checkpoints": {"keep": 1},
            "validation": {"fn": fn, "concurrency": 1},
            "promotion": {"metric": "accuracy", "mode": "max", "verify": "hashes", **promotion}}


def test_a_threshold_on_a_metric_the_validation_function_lacks_stops_training_at_its_first_result(cli_env, tmp_path):
    from podium.training.raytrain import persisted_checkpoints

    cli_env["PYTHONPATH"] = os.path.dirname(__file__)  # the loop's module, as a user's own code
    write_data(str(tmp_path / "train.parquet"), 100, 0.0, seed=1)
    write_data(str(tmp_path / "val.parquet"), 200, 0.35, seed=2)
    config = tmp_path / "lacks.json"
    config.write_text(json.dumps(_config("lacks", tmp_path, {"epochs": 6, "angle_deg": 0.0, "epoch_s": 2.0},
                                         {"thresholds": {"acuracy": {"min": 0.5}}})))
    err = _one_sentence(podium(["run", "--config", str(config)], cli_env, check=False))
    assert "promotion.thresholds.acuracy: no such metric; validation.fn 'podium_nightly_code:validate_fn' returns " \
           "['accuracy', 'loss'], and training reports ['epoch']" in err, err
    assert "training stopped" in err
    steps = [e.step for e in persisted_checkpoints(str(tmp_path / "storage"), "lacks")]
    assert steps and max(steps) < 5, steps  # stopped well before its sixth epoch
