"""Ray's Lightning and Transformers guides, as a user copies them, run through the `podium` command.

Each with a validation function of the user's: every checkpoint the framework's `RayTrainReportCallback`
reports is validated (Lightning's passes `validation=False` to every report unless told otherwise), the best
is promoted, and the loader shipped with podium turns its checkpoint into the served MLflow model, which
`mlflow.pyfunc.load_model("models:/<model>@champion")` loads and answers with.

Two trainings, one per guide (two distinct loops: neither can carry the other's checks).
"""

from __future__ import annotations

import json
import os

import pytest
from helpers.commands import podium

pytestmark = pytest.mark.integration

HERE = os.path.dirname(__file__)


def _run(args: list[str], env: dict, tmp_path, name: str) -> dict:
    env = {**env, "PYTHONPATH": HERE}  # the guide's module, as a user's own code
    proc = podium(["run", "--json", "--run-name", name, "--model", name, "--num-workers", "1",
                   "--metric", "val_loss", "--mode", "min", "--verify", "load",
                   "--storage", str(tmp_path / "storage"), "--serving", str(tmp_path / "serving"), *args], env)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check_every_checkpoint_validated_and_the_best_served(out: dict, env: dict, val_rows, label: str,
                                                          monkeypatch) -> None:
    import mlflow

    checkpoints = out["checkpoints"]
    assert len(checkpoints) >= 2 and [c["status"] for c in checkpoints] == ["validated"] * len(checkpoints), checkpoints
    best = min(checkpoints, key=lambda c: (c["metrics"]["val_loss"], -c["step"]))
    assert out["promoted"]["step"] == best["step"] and out["promoted"]["served_as"] == "mlflow-model", out["promoted"]
    # through the environment, as a user sets it (mlflow.set_tracking_uri would outlive this test in this process)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
    served = mlflow.pyfunc.load_model(f"models:/{out['model']}@champion")
    predictions = served.predict(val_rows)
    labels = list(predictions[label] if hasattr(predictions, "columns") else predictions)
    assert len(labels) == len(val_rows) and set(labels) <= set(val_rows[label])
    accuracy = sum(int(p == t) for p, t in zip(labels, val_rows[label])) / len(val_rows)
    # the served model is the promoted checkpoint: its accuracy on these rows is the one its validation measured
    assert accuracy == pytest.approx(best["metrics"]["val_accuracy"], abs=1e-6), (accuracy, best)


def test_lightning_guide_loop_every_checkpoint_validated_and_the_best_served(cli_env, dataset, tmp_path, monkeypatch):
    import pandas as pd

    train, val = dataset
    out = _run(["--train-loop", "framework_code:lightning_train_func", "--validate-fn", "framework_code:validate_lightning",
                "--loop-config", "epochs=3", "--train-data", train, "--val-data", val,
                "--model-loader", "podium.training.loaders:lightning", "--model-class", "framework_code:TabularClassifier"],
               cli_env, tmp_path, "lightning-guide")
    val_rows = pd.read_parquet(val)
    _check_every_checkpoint_validated_and_the_best_served(out, cli_env, val_rows, "label", monkeypatch)


def test_transformers_trainer_loop_every_checkpoint_validated_and_the_best_served(cli_env, tmp_path, monkeypatch):
    from framework_code import token_rows

    train, val = str(tmp_path / "train.parquet"), str(tmp_path / "val.parquet")
    token_rows(2000, seed=1).to_parquet(train)
    val_rows = token_rows(500, seed=2)
    val_rows.to_parquet(val)
    out = _run(["--train-loop", "framework_code:transformers_train_func",
                "--validate-fn", "framework_code:validate_transformers", "--loop-config", "epochs=2",
                "--train-data", train, "--val-data", val, "--label-column", "label",
                "--model-loader", "podium.training.loaders:transformers"],
               cli_env, tmp_path, "transformers-guide")
    _check_every_checkpoint_validated_and_the_best_served(out, cli_env, val_rows, "label", monkeypatch)
