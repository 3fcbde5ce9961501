"""Faults injected for real: a training worker process killed, the flow process killed."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient
from prefect_queries import task_runs

from podium.serving.layout import read_history
from podium.tracking.client import TAG_CHECKPOINT, TAG_STATUS

pytestmark = pytest.mark.integration


def _user_config(run_name, dataset, locations, loop_extra=None, validate_extra=None, epochs=4):
    return {
        "run_name": run_name, "storage": locations["storage"], "serving": locations["serving"],
        "data": {"train": dataset[0], "val": dataset[1]},
        "training": {"train_loop": "podium_user_code:train_func",
                     "train_loop_config": {"epochs": epochs, **(loop_extra or {})}},
        "validation": {"fn": "podium_user_code:validate_fn", "kwargs": validate_extra or {}},
        "promotion": {"metric": "score", "mode": "max"},
    }


def _models_by_checkpoint(tracking_uri):
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("podium")
    if exp is None:  # the run has not reached MLflow yet
        return {}
    models = client.search_logged_models([exp.experiment_id], max_results=1000)
    by = collections.defaultdict(list)
    for m in models:
        by[m.tags[TAG_CHECKPOINT]].append(m)
    return by


def test_training_worker_killed_restarts_from_latest_checkpoint(pipeline, dataset, locations, tmp_path):
    calls = tmp_path / "validations.log"
    cfg = _user_config("worker-dies", dataset, locations,
                       loop_extra={"die_at_epoch": 2, "die_marker": str(tmp_path / "died")},
                       validate_extra={"calls_log": str(calls)})
    summary = pipeline(cfg, locations["tracking_uri"])
    assert (tmp_path / "died").exists(), "the worker process was killed"
    assert [r.step for r in summary.checkpoints] == [0, 1, 2, 3], "no persisted checkpoint lost, none repeated"
    assert all(r.status == "validated" for r in summary.checkpoints)
    # every checkpoint validated exactly once (promotion checks the copy by its hashes), recorded once
    assert sorted(int(x) for x in calls.read_text().split()) == [0, 1, 2, 3]
    by = _models_by_checkpoint(locations["tracking_uri"])
    assert sorted(len(v) for v in by.values()) == [1, 1, 1, 1]
    runs = task_runs("worker-dies", expect_at_least=8)
    assert sorted(r.name for r in runs if r.name.startswith("validate-step-")) == \
        [f"validate-step-{s}" for s in range(4)]
    assert summary.promotion.promoted is not None


def _podium(args, env):
    return subprocess.Popen([sys.executable, "-m", "podium.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_flow_process_killed_then_rerun_finishes_without_duplicates(prefect_api, dataset, locations, tmp_path):
    calls = tmp_path / "validations.log"
    config = _user_config("flow-dies", dataset, locations, epochs=6,
                          validate_extra={"calls_log": str(calls), "sleep_s": 3})
    config["validation"]["concurrency"] = 1
    (tmp_path / "podium.json").write_text(json.dumps(config))
    env = {**os.environ, "PODIUM_HOME": str(tmp_path / "home"), "PREFECT_API_URL": prefect_api,
           "MLFLOW_TRACKING_URI": locations["tracking_uri"],
           # the user's own module is importable, as it would be for a user running podium
           "PYTHONPATH": os.pathsep.join(filter(None, [os.path.dirname(__file__), os.environ.get("PYTHONPATH")]))}
    env.pop("RAY_ADDRESS", None)

    proc = _podium(["run", "--json", "--config", str(tmp_path / "podium.json")], env)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # kill once a verdict is in and more checkpoints wait for one
        by = _models_by_checkpoint(locations["tracking_uri"])
        statuses = [m[0].tags.get(TAG_STATUS) for m in by.values()]
        if statuses.count("validated") >= 1 and statuses.count("pending") >= 1:
            break
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {name: m[0].tags.get(TAG_STATUS) for name, m in _models_by_checkpoint(locations["tracking_uri"]).items()}
    validated_before = {name for name, status in before.items() if status == "validated"}
    time.sleep(2)  # let the killed run's Ray processes go (they share the driver's fate)

    proc = _podium(["run", "--json", "--config", str(tmp_path / "podium.json")], env)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])

    by = _models_by_checkpoint(locations["tracking_uri"])
    assert all(len(v) == 1 for v in by.values()), "no MLflow record duplicated"
    assert len(by) == 6 and [c["step"] for c in result["checkpoints"]] == list(range(6))
    assert all(c["status"] == "validated" for c in result["checkpoints"])
    counts = collections.Counter(int(x) for x in calls.read_text().split())
    for name in validated_before:  # a verdict already recorded is never asked for again
        step = int(by[name][0].tags["podium.step"])
        assert counts[step] == 1, f"step {step} validated {counts[step]} times"
    assert set(counts) == set(range(6))
    assert result["promoted"] is not None and len(read_history(locations["serving"])) == 1
