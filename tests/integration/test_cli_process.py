"""The `podium` command as a user runs it, in its own process, against the test's Prefect server."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def podium(args, env, check=True):
    proc = subprocess.run([sys.executable, "-m", "podium.cli", *args], env=env, capture_output=True, text=True,
                          timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"podium {args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-4000:]}")
    return proc


@pytest.fixture
def cli_env(prefect_api, tmp_path):
    env = dict(os.environ)
    env.update({"PODIUM_HOME": str(tmp_path / "home"), "PREFECT_API_URL": prefect_api,
                "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"})
    env.pop("RAY_ADDRESS", None)
    return env


def test_run_status_promote_json(cli_env, dataset, tmp_path):
    common = ["--run-name", "cli", "--train-data", dataset[0], "--val-data", dataset[1],
              "--storage", str(tmp_path / "storage"), "--serving", str(tmp_path / "serving")]
    out = json.loads(podium(["run", "--json", "--epochs", "2", *common], cli_env).stdout.strip().splitlines()[-1])
    assert {"run_name", "mlflow_run_id", "tracking_uri", "checkpoints", "promoted"} <= set(out)
    assert out["run_name"] == "cli" and out["tracking_uri"] == cli_env["MLFLOW_TRACKING_URI"]
    assert [c["status"] for c in out["checkpoints"]] == ["validated", "validated"]
    assert all({"step", "uri", "status", "metrics"} <= set(c) for c in out["checkpoints"])
    best = min(out["checkpoints"], key=lambda c: c["metrics"]["val_loss"])
    assert out["promoted"]["step"] == best["step"] and out["promoted"]["metric"] == "val_loss"
    assert out["promoted"]["value"] == pytest.approx(best["metrics"]["val_loss"])

    status = json.loads(podium(["status", "--json", *common], cli_env).stdout)
    assert status["mlflow_run_id"] == out["mlflow_run_id"]
    assert [c["step"] for c in status["checkpoints"]] == [c["step"] for c in out["checkpoints"]]
    assert status["promoted"]["version"] == out["promoted"]["version"]

    again = json.loads(podium(["promote", "--json", *common], cli_env).stdout.strip().splitlines()[-1])
    assert again["promoted"] is None and "already the champion" in again["promotion_reason"]


def test_bad_input_rejected_before_anything_is_created(cli_env, dataset, tmp_path):
    proc = podium(["run", "--train-data", str(tmp_path / "missing.parquet"), "--val-data", dataset[1],
                   "--storage", str(tmp_path / "storage"), "--serving", str(tmp_path / "serving")],
                  cli_env, check=False)
    assert proc.returncode == 2
    assert "data.train" in proc.stderr and "missing.parquet" in proc.stderr
    assert not (tmp_path / "storage").exists() and not (tmp_path / "serving").exists()
