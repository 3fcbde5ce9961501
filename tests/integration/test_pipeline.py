"""The whole pipeline against real components: Ray Train, a Prefect server, MLflow, the serving folder.

Three Ray Train starts:

- `e2e` (module-scoped): a run of 6 epochs of the built-in loop on 2 workers (DDP), in-process. Carries the
  records, validation overlapping training, the promoted best and what serves, the registry, Prefect's task runs,
  events and artifacts (test_every_checkpoint_validated_recorded_once_and_the_best_promoted); a start that would
  change the model's shape, refused before it trains (no training); and the champion that a diverging run promotes
  against.
- test_a_diverging_run_never_replaces_the_champion: a run whose training diverges, through the `podium` process,
  to e2e's serving location: every validation failed, so the command prints its summary and exits 1, its flow run
  Failed and its MLflow run FAILED, and the champion stays.
- test_a_fresh_run_that_cannot_open_its_mlflow_run_stops_the_training_it_started.

(A user's loop whose validations fail, hang, and return no dict: test_ray_data's `users_loop_run`, which also
carries its Ray Datasets. A run resumed by its name, and what a resume changes: test_cli_process's
`beta_resumed`, through the command.)
"""

from __future__ import annotations

import json
import os
import shutil
import types

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from helpers.prefect_queries import artifact_keys, checkpoint_events, task_runs
from mlflow.tracking import MlflowClient

from podium.errors import ConfigError
from podium.serving.layout import read_current, read_history, read_version
from podium.tracking.client import TAG_CHECKPOINT
from podium.training.data import load_arrays
from podium.training.promoted import load_version

pytestmark = pytest.mark.integration


def _config(run_name, dataset, locations, **over):
    cfg = {
        "run_name": run_name,
        "storage": locations["storage"],
        "serving": locations["serving"],
        "data": {"train": dataset[0], "val": dataset[1]},
        "training": {"epochs": 4},
        "validation": {"concurrency": 2},
    }
    for key, value in over.items():
        cfg.setdefault(key, {}).update(value) if isinstance(value, dict) else cfg.__setitem__(key, value)
    return cfg


def _logged_models(tracking_uri, run_id):
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("podium")
    return [m for m in client.search_logged_models([exp.experiment_id], max_results=1000)
            if m.source_run_id == run_id]


@pytest.fixture(scope="module")
def e2e(module_pipeline, dataset, tmp_path_factory, mlflow_template_db):
    """The module's shared training: a run of 6 epochs on 2 workers (DDP). Each test below checks one behaviour of
    it, or runs against its serving location."""
    root = tmp_path_factory.mktemp("e2e")
    shutil.copy(mlflow_template_db, root / "mlflow.db")
    locations = {"storage": str(root / "storage"), "serving": str(root / "serving"),
                 "tracking_uri": f"sqlite:///{root / 'mlflow.db'}"}
    first = module_pipeline(_config("e2e", dataset, locations, training={"epochs": 6}), locations["tracking_uri"])
    return types.SimpleNamespace(first=first, locations=locations)


def test_every_checkpoint_validated_recorded_once_and_the_best_promoted(e2e, dataset, tmp_path):
    """The first run, of 6 epochs on 2 workers, checked whole: records, validation overlapping training, the
    promoted best, what serves, the registry, Prefect's task runs, events and artifacts."""
    summary, locations = e2e.first, e2e.locations
    records = summary.checkpoints
    assert len(records) == 6, "one checkpoint per epoch"
    assert all(r.status == "validated" for r in records)

    # exactly one MLflow LoggedModel per checkpoint, with validation metrics merged onto it
    models = _logged_models(locations["tracking_uri"], summary.tracking.run_id)
    names = [m.tags[TAG_CHECKPOINT] for m in models]
    assert sorted(names) == sorted(os.path.basename(r.uri) for r in records) and len(names) == 6
    for m in models:
        keys = {x.key for x in m.metrics}
        assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= keys
        assert str(m.status) in ("READY", "LoggedModelStatus.READY")

    # validation overlapped training: a verdict arrived before training ended
    assert min(r.validated_at for r in records) < summary.training_ended_at

    # the promoted checkpoint is the best by val_loss (lower is better)
    best = min(records, key=lambda r: (r.metrics["val_loss"], -r.step))  # ties: the later step
    promoted = summary.promotion.promoted
    assert promoted is not None and promoted.step == best.step
    assert promoted.value == pytest.approx(best.metrics["val_loss"])

    # serving: the run switched to a complete version; it loads and predicts as recorded
    assert promoted.version == "v000001" and read_history(locations["serving"])[0]["version"] == "v000001"
    assert read_current(locations["serving"]).version == "v000001"
    model = load_version(read_version(locations["serving"], promoted.version))
    x, y = load_arrays(dataset[1], "label", [f"f{i:02d}" for i in range(16)])
    with torch.no_grad():
        acc = (model(torch.from_numpy(x)).argmax(1).numpy() == y).mean()
    assert acc == pytest.approx(best.metrics["val_accuracy"], abs=1e-6)
    assert acc > 0.5

    # MLflow registry: the first version is a version of the best checkpoint's LoggedModel, which holds the
    # served MLflow model; the served copy is named by a tag; the champion alias follows what serves now
    client = MlflowClient(locations["tracking_uri"], registry_uri=locations["tracking_uri"])
    mv = client.get_model_version("podium", promoted.mlflow_version)
    assert mv.run_id == summary.tracking.run_id
    assert mv.tags["podium.served_uri"] == promoted.uri and f"{best.model_id}/artifacts/served/{promoted.version}-" in mv.source
    champion = client.get_model_version_by_alias("podium", "champion")
    assert champion.tags["podium.served_uri"] == read_current(locations["serving"]).uri

    # Prefect: every validation task run recorded and named after its step; events; artifacts
    runs = task_runs("e2e", expect_at_least=6 + 6)
    validate_runs = sorted(r.name for r in runs if r.name.startswith("validate-step-"))
    assert validate_runs == sorted(f"validate-step-{r.step}" for r in records)
    assert all(r.state.is_completed() for r in runs)
    events = checkpoint_events("e2e", expect=6)
    steps = [int(e.resource["podium.step"]) for e in events]
    assert sorted(steps) == sorted(r.step for r in records), "one event per checkpoint"
    assert {"e2e-checkpoints", "e2e-promotion", "e2e-chart", "e2e-progress"} <= artifact_keys("e2e")
    # MLflow: the run holds the report and the same chart as a PNG, under the names the docs give
    chart = client.download_artifacts(summary.tracking.run_id, "podium/val_loss_per_checkpoint.png", str(tmp_path))
    with open(chart, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(chart) > 10_000


def test_a_start_that_would_change_the_model_s_shape_is_refused_before_anything_trains(e2e, pipeline, dataset):
    locations = e2e.locations
    narrower = _config("e2e", dataset, locations, data={"feature_columns": ["f00", "f01", "f02"]})
    with pytest.raises(ConfigError, match=r"data.feature_columns = \["):
        pipeline(narrower, locations["tracking_uri"], name_suffix="-narrower")
    client = MlflowClient(locations["tracking_uri"])
    assert client.get_run(e2e.first.tracking.run_id).info.status == "FINISHED"
    assert len(_logged_models(locations["tracking_uri"], e2e.first.tracking.run_id)) == 6


def test_a_diverging_run_never_replaces_the_champion(e2e, pipeline, dataset, tmp_path, prefect_api, shared_ray):
    """A run whose training diverges, promoting to the serving location of the module's run: its champion stays.
    Through the `podium` process, where a run whose every validation failed prints its summary (the JSON a
    scheduler keeps), says why on stderr and exits 1, so nobody reads it as a success; its flow run ends Failed
    and its MLflow run FAILED, each saying why. (A worse run refused by the gate: test_fair_gate's night 3
    in-process, test_promotion_policy's gate-2 through the command; the reason's wording:
    tests/unit/test_selection.py; a validation function that returns no dict: the user loop's test below.)"""
    from helpers.commands import podium
    from helpers.prefect_queries import flow_run_state

    locations = e2e.locations
    before, history = read_current(locations["serving"]), read_history(locations["serving"])
    assert before is not None
    one = {"num_workers": 1}  # the gate is under test, not the training: one worker

    # one NaN in a training feature: refused before training, unless allowed; then training diverges (loss NaN),
    # every checkpoint is failed with the reason, and the working champion stays
    table = pq.read_table(dataset[0])
    column = table.column("f03").to_numpy().copy()
    column[17] = np.nan
    nan_train = str(tmp_path / "nan-train.parquet")
    pq.write_table(table.set_column(table.schema.get_field_index("f03"), "f03", [column]), nan_train)
    diverging = _config("gate-nan", dataset, locations, data={"train": nan_train}, training={"epochs": 1},
                        scaling=one)
    with pytest.raises(ConfigError, match="data.train: feature column 'f03' has 1 NaN, infinite or null value"):
        pipeline(diverging, locations["tracking_uri"])
    diverging["data"]["allow"] = ["non_finite_features"]
    (tmp_path / "gate-nan.json").write_text(json.dumps(diverging))
    env = {**os.environ, "PODIUM_HOME": str(tmp_path / "home"), "PREFECT_API_URL": prefect_api,
           "MLFLOW_TRACKING_URI": locations["tracking_uri"], **shared_ray.driver_env()}
    proc = podium(["run", "--json", "--config", str(tmp_path / "gate-nan.json")], env, check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])  # the summary, printed before the exit
    assert out["checkpoints"] and all(c["status"] == "failed" for c in out["checkpoints"])
    assert all("training metric(s) not finite" in c["failure"] and "loss = nan" in c["failure"]
               for c in out["checkpoints"]), out["checkpoints"]
    assert out["promoted"] is None and "was validated successfully" in out["promotion_reason"]
    n = len(out["checkpoints"])
    assert f"podium: run 'gate-nan' failed: every validation failed ({n} of {n} checkpoint(s) failed" in proc.stderr
    state = flow_run_state(run_id=out["prefect_ui"].rsplit("/", 1)[-1])
    assert state.is_failed() and state.message.startswith("run gate-nan failed: every validation failed"), state
    assert MlflowClient(locations["tracking_uri"]).get_run(out["mlflow_run_id"]).info.status == "FAILED"
    assert read_current(locations["serving"]).version == before.version
    assert len(read_history(locations["serving"])) == len(history)


def test_a_fresh_run_that_cannot_open_its_mlflow_run_stops_the_training_it_started(pipeline, dataset, locations):
    """A fresh run starts training first and opens its MLflow run while training starts (MLflow's import and
    store are off the start-up path). An MLflow run that cannot be opened (its experiment was deleted in the
    UI) stops that training and fails the run saying what to do."""
    client = MlflowClient(locations["tracking_uri"])
    client.delete_experiment(client.create_experiment("podium"))
    with pytest.raises(LookupError, match=r"MLflow experiment 'podium' \(id \d+\) was deleted at .*: restore it"):
        pipeline(_config("no-experiment", dataset, locations, training={"epochs": 50}, scaling={"num_workers": 1}),
                 locations["tracking_uri"])
    runs = task_runs("no-experiment", 3)
    training = [r for r in runs if r.name.startswith("train-model")]
    assert len(training) == 1 and training[0].state.is_final() and not training[0].state.is_completed(), \
        [(r.name, r.state) for r in runs]  # stopped, not left to train its 50 epochs
