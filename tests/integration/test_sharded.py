"""A model sharded across 2 workers (FSDP2, `torch.distributed.checkpoint`) through the `podium` command: every
checkpoint holds both ranks' shards, is validated in one process, and the best is consolidated and served.
One training, its test's."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
import torch
from helpers.commands import podium

pytestmark = pytest.mark.integration


def test_a_two_worker_dcp_checkpoint_is_validated_consolidated_and_served(cli_env, dataset, tmp_path,
                                                                           monkeypatch):
    import mlflow.pyfunc
    from helpers.served_checks import check_served_champion
    from sharded_code import ShardedClassifier

    from podium.training.loaders import sharded

    cli_env["PYTHONPATH"] = os.path.dirname(__file__)  # the loop's module, as a user's own code
    storage, serving = tmp_path / "storage", tmp_path / "serving"
    proc = podium(["run", "--json", "--run-name", "dcp", "--model", "sharded",
                   "--train-loop", "sharded_code:train_func", "--validate-fn", "sharded_code:validate_fn",
                   "--loop-config", "epochs=3", "--num-workers", "2",
                   "--model-loader", "podium.training.loaders:sharded", "--model-class", "sharded_code:ShardedClassifier",
                   "--metric", "val_loss", "--mode", "min", "--train-data", dataset[0], "--val-data", dataset[1],
                   "--storage", str(storage), "--serving", str(serving)], cli_env)
    out = json.loads(proc.stdout.strip().splitlines()[-1])

    checkpoints = out["checkpoints"]
    assert [c["status"] for c in checkpoints] == ["validated"] * 3, checkpoints
    for c in checkpoints:  # Ray merged both ranks' folders into one checkpoint folder
        assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(os.listdir(c["uri"])), c["uri"]
        assert 0.0 < c["metrics"]["val_accuracy"] <= 1.0 and c["metrics"]["val_loss"] > 0
    best = min(checkpoints, key=lambda c: (c["metrics"]["val_loss"], -c["step"]))
    assert out["promoted"]["step"] == best["step"] and out["champion"]["checkpoint"] == best["uri"]
    assert out["promoted"]["served_as"] == "mlflow-model"

    # the model served is the checkpoint consolidated into the user's class: the same classes, row for row
    rows = pd.read_parquet(dataset[1]).head(200)
    features = [f"f{i:02d}" for i in range(16)]
    consolidated = sharded(best["uri"], model_class=ShardedClassifier)
    with torch.no_grad():
        expected = consolidated(torch.tensor(rows[features].to_numpy("float32"))).argmax(1).numpy()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", cli_env["MLFLOW_TRACKING_URI"])
    served = mlflow.pyfunc.load_model("models:/sharded@champion").predict(rows)
    assert len(set(expected.tolist())) > 1 and (np.asarray(served) == expected).all()
    # and the number the validation function recorded is the consolidated model's
    val = pd.read_parquet(dataset[1])
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(consolidated(torch.tensor(val[features].to_numpy("float32"))),
                                                 torch.tensor(val["label"].to_numpy()))
    assert loss.item() == pytest.approx(best["metrics"]["val_loss"], rel=1e-5)
    check_served_champion(cli_env["MLFLOW_TRACKING_URI"], "sharded", str(serving), dataset[1], tmp_path, cli_env,
                          monkeypatch, serve=False)
