"""The whole pipeline against real components: Ray Train, a Prefect server, MLflow, the serving folder."""

from __future__ import annotations

import logging
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from mlflow.tracking import MlflowClient
from prefect_queries import artifact_keys, checkpoint_events, task_runs

from podium import load_promoted_model
from podium.errors import ConfigError, UnfinishedRun
from podium.serving.layout import read_current, read_history
from podium.tracking.client import TAG_CHECKPOINT, TAG_CONFIG_PREFIX
from podium.training.data import load_arrays

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


def test_every_checkpoint_validated_recorded_once_best_promoted_and_the_same_name_resumes(pipeline, dataset,
                                                                                         locations, caplog):
    """One run of 6 epochs on 2 workers (DDP) checked whole; then the same run name with 8 epochs continues it
    from its latest checkpoint, in the same MLflow run, validating only the new checkpoints."""
    summary = pipeline(_config("e2e", dataset, locations, training={"epochs": 6}), locations["tracking_uri"])
    records = summary.checkpoints
    assert len(records) == 6, "one checkpoint per epoch"
    assert all(r.status == "validated" for r in records)

    # exactly one MLflow LoggedModel per checkpoint, with validation metrics merged onto it
    models = _logged_models(locations["tracking_uri"], summary.tracking.run_id)
    names = [m.tags[TAG_CHECKPOINT] for m in models]
    assert sorted(names) == sorted(set(names)) and len(names) == 6
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

    # serving: CURRENT names a complete version; it loads and predicts as recorded
    current = read_current(locations["serving"])
    assert current.version == promoted.version == "v000001"
    model = load_promoted_model(locations["serving"])
    x, y = load_arrays(dataset[1], "label", [f"f{i:02d}" for i in range(16)])
    with torch.no_grad():
        acc = (model(torch.from_numpy(x)).argmax(1).numpy() == y).mean()
    assert acc == pytest.approx(best.metrics["val_accuracy"], abs=1e-6)
    assert acc > 0.5

    # MLflow registry: the champion alias points at a version of the best checkpoint's LoggedModel, which
    # holds the served MLflow model; the served copy is named by a tag
    client = MlflowClient(locations["tracking_uri"], registry_uri=locations["tracking_uri"])
    mv = client.get_model_version_by_alias("podium", "champion")
    assert str(mv.version) == promoted.mlflow_version and mv.run_id == summary.tracking.run_id
    assert mv.tags["podium.served_uri"] == promoted.uri and mv.source.endswith(f"{best.model_id}/artifacts")

    # Prefect: every validation task run recorded and named after its step; events; artifacts
    runs = task_runs("e2e", expect_at_least=6 + 6)
    validate_runs = sorted(r.name for r in runs if r.name.startswith("validate-step-"))
    assert validate_runs == sorted(f"validate-step-{r.step}" for r in records)
    assert all(r.state.is_completed() for r in runs)
    events = checkpoint_events("e2e", expect=6)
    assert sorted(int(e.resource["podium.step"]) for e in events) == [r.step for r in records]
    assert {"e2e-checkpoints", "e2e-promotion", "e2e-chart", "e2e-progress"} <= artifact_keys("e2e")

    # the same run name again, 8 epochs: it resumes
    first = summary
    with caplog.at_level(logging.INFO, logger="podium.progress"):
        second = pipeline(_config("e2e", dataset, locations, training={"epochs": 8}), locations["tracking_uri"],
                          name_suffix="-again")
    steps_first = [r.step for r in first.checkpoints]
    steps_second = [r.step for r in second.checkpoints]
    assert steps_second[:6] == steps_first and len(steps_second) == 8, "continued from the latest checkpoint"
    assert second.tracking.run_id == first.tracking.run_id, "same MLflow run"
    assert len(_logged_models(locations["tracking_uri"], second.tracking.run_id)) == 8, "none recorded twice"
    # only the two new checkpoints were validated by the second flow run
    runs = task_runs("e2e-again", expect_at_least=2)
    assert sorted(r.name for r in runs if r.name.startswith("validate-step-")) == \
        sorted(f"validate-step-{s}" for s in steps_second[6:])
    assert np.isfinite([r.metrics["val_loss"] for r in second.checkpoints]).all()
    # the changed epochs took effect, were said, and the MLflow run records the value in effect
    assert "training.epochs = 8 (was 6): takes effect" in caplog.text
    run = client.get_run(second.tracking.run_id)
    assert (run.data.params["training.epochs"], run.data.tags[TAG_CONFIG_PREFIX + "training.epochs"]) == ("6", "8")

    # a start that would change the model's shape is refused before anything trains or is recorded
    narrower = _config("e2e", dataset, locations, data={"feature_columns": ["f00", "f01", "f02"]})
    with pytest.raises(ConfigError, match=r"data.feature_columns = \["):
        pipeline(narrower, locations["tracking_uri"], name_suffix="-narrower")
    assert client.get_run(second.tracking.run_id).info.status == "FINISHED"
    assert len(_logged_models(locations["tracking_uri"], second.tracking.run_id)) == 8


def test_a_diverging_run_never_replaces_the_champion(pipeline, dataset, locations, tmp_path):
    """(A worse run refused by the gate: test_fair_gate's night 3 in-process, test_promotion_policy's gate-2
    through the command; the reason's wording: tests/unit/test_selection.py.)"""
    one = {"num_workers": 1}  # the gate is under test, not the training: one worker each run
    first = pipeline(_config("gate-a", dataset, locations, training={"epochs": 2}, scaling=one),
                     locations["tracking_uri"])
    assert first.promotion.promoted is not None

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
    with pytest.raises(UnfinishedRun, match="run gate-nan failed: every validation failed") as failed:
        pipeline(diverging, locations["tracking_uri"])  # its flow run ends Failed: nothing could be validated
    third = failed.value.result.summary
    assert third.checkpoints and all(r.status == "failed" for r in third.checkpoints)
    assert all("training metric(s) not finite" in r.failure and "loss = nan" in r.failure for r in third.checkpoints)
    assert third.promotion.promoted is None and "was validated successfully" in third.promotion.reason
    assert read_current(locations["serving"]).version == first.promotion.promoted.version
    assert len(read_history(locations["serving"])) == 1


def test_user_loop_with_plain_ray_train_apis(pipeline, locations, dataset, tmp_path):
    paths_log = tmp_path / "validated-paths.txt"
    cfg = _config("byo", dataset, locations, scaling={"num_workers": 1},  # DDP: the e2e test above
                  training={"train_loop": "podium_user_code:train_func", "train_loop_config": {"epochs": 4}},
                  validation={"fn": "podium_user_code:validate_fn",
                              "kwargs": {"fail_epoch": 1, "hang_epoch": 2, "paths_log": str(paths_log)},
                              "retries": 1, "retry_delay_s": 0.1, "timeout_s": 12},
                  promotion={"metric": "score", "mode": "max", "verify": "revalidate"})
    del cfg["training"]["epochs"]  # the built-in loop's setting: the user's loop has its own, in train_loop_config
    summary = pipeline(cfg, locations["tracking_uri"])
    by_epoch = {r.step: r for r in summary.checkpoints}  # the user's loop reports 'epoch': podium's step
    assert sorted(by_epoch) == [0, 1, 2, 3]
    # epoch 1's validation always fails: marked failed with the reason, never promoted, training unaffected
    assert by_epoch[1].status == "failed" and "validation data unavailable" in by_epoch[1].failure
    # epoch 2's validation hangs: cancelled at the timeout, each attempt, then marked failed
    assert by_epoch[2].status == "failed" and "longer than 12 s" in by_epoch[2].failure
    assert all(by_epoch[s].status == "validated" for s in (0, 3))
    best = max((by_epoch[s] for s in (0, 3)), key=lambda r: (r.metrics["score"], r.step))
    assert summary.promotion.promoted.step == best.step
    assert math.isfinite(summary.promotion.promoted.value)
    # the promoted copy is the user's own checkpoint format, byte for byte, and gave back its score
    # when the user's validation ran on it (verify = "revalidate")
    current = read_current(locations["serving"])
    assert set(current.manifest["files"]) == {"state.pt"}
    assert current.uri in paths_log.read_text().split()
    # the failed validation was retried once: two attempts, then a final failure
    runs = task_runs("byo", expect_at_least=8)
    for step in (1, 2):
        failed = [r for r in runs if r.name == f"validate-step-{step}"]
        assert len(failed) == 1 and failed[0].state.is_failed() and failed[0].run_count == 2


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
