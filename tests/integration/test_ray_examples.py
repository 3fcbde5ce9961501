"""Ray's own examples and guides, run under podium by import path with no edits.

- `ray.train.examples.pytorch.torch_linear_example:train_func`, with its own defaults;
- the async-validation guide's loop and `validate_fn(checkpoint, config)` (Ray 2.60's form), on a
  small synthetic image dataset, with a Ray Dataset in each report's fn_kwargs;
- the checkpoint guide's loop, run twice under one run name;
- a loop of every form of `validation=`, whose training worker process is SIGKILLed once (the restart).

Each: every checkpoint validated exactly once, with its own arguments, and the best promoted.

Five trainings, the floor for these loops: each distinct loop is trained once, and the checkpoint guide's twice,
as its test is about its second start under the same run name (a loop that reports only `{"loss"}` and does
not resume: its checkpoints numbered on from the first start's, none validated again). The restart of the
loop of every form of `validation=` is a worker-group restart inside its one training.
"""

from __future__ import annotations

import collections
import json
import logging
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.prefect_queries import task_runs
from mlflow.tracking import MlflowClient
from ray_guide_code import synthetic_images

from podium.tasks.evidence import read_champion
from podium.tracking.client import TAG_CHECKPOINT

pytestmark = pytest.mark.integration


def _config(run_name: str, locations: dict, train_loop: str, fn: str, calls: Path, **sections) -> dict:
    """podium's defaults (two training workers): the guides' loops are written for DDP (`model.module`)."""
    config = {"run_name": run_name, "storage": locations["storage"], "serving": locations["serving"],
              "training": {"train_loop": train_loop},
              "validation": {"fn": fn, "kwargs": {"calls_log": str(calls)}, "concurrency": 1},
              "promotion": {"metric": "score", "mode": "max", "verify": "hashes"}}
    for key, value in sections.items():
        config[key] = {**config.get(key, {}), **value}
    return config


def _calls(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _validated_once_each(records, calls: list[dict]) -> dict[str, dict]:
    """Every recorded checkpoint was validated exactly once: the calls by checkpoint folder name."""
    names = [os.path.basename(c["checkpoint"].rstrip("/")) for c in calls]
    assert sorted(names) == sorted({os.path.basename(r.uri.rstrip("/")) for r in records if r.status == "validated"})
    assert len(names) == len(set(names)), "a checkpoint was validated twice"
    return {name: call for name, call in zip(names, calls)}


def _best(records, metric: str, mode: str = "max"):
    """The best validated checkpoint as podium documents the rule: ties go to the later step."""
    validated = [r for r in records if r.status == "validated"]
    sign = 1.0 if mode == "max" else -1.0
    return max(validated, key=lambda r: (sign * r.metrics[metric], r.step))


def test_torch_linear_example_with_its_own_defaults(pipeline, locations, tmp_path):
    calls = tmp_path / "calls.jsonl"
    config = _config("ray-linear", locations, "ray.train.examples.pytorch.torch_linear_example:train_func",
                     "ray_example_checks:validate_linear", calls, promotion={"metric": "val_loss", "mode": "min"})
    summary = pipeline(config, locations["tracking_uri"])
    records = summary.checkpoints
    # its defaults: 3 epochs, one checkpoint each; no step in its metrics, so steps are the reports' indices.
    # validate_linear loads each into nn.Linear(1, 1): the loop built a 1-wide model, its own default
    assert [(r.step, r.status) for r in records] == [(1, "validated"), (2, "validated"), (3, "validated")]
    _validated_once_each(records, _calls(calls))
    assert summary.promotion.promoted.step == _best(records, "val_loss", "min").step


@pytest.fixture
def image_data(tmp_path) -> str:
    """A small synthetic image dataset in Parquet, images as Ray's tensor column."""
    from ray.data.extensions import ArrowTensorArray

    images, labels = synthetic_images(96, seed=2)
    path = str(tmp_path / "val-images.parquet")
    pq.write_table(pa.table({"image": ArrowTensorArray.from_numpy(images), "label": labels}), path)
    return path


def test_async_validation_guide_with_a_dataset_in_each_reports_fn_kwargs(pipeline, locations, tmp_path, image_data):
    calls = tmp_path / "calls.jsonl"
    config = _config("ray-async-guide", locations, "ray_guide_code:train_func", "ray_guide_code:validate_fn", calls,
                     training={"train_loop_config": {"epochs": 2}, "loop_datasets": {"validation_dataset": image_data}},
                     # the function reads a Ray Dataset: its read tasks get a CPU of their own
                     validation={"inner_cpus": 1})
    summary = pipeline(config, locations["tracking_uri"])
    records = summary.checkpoints
    assert [r.status for r in records] == ["validated"] * 2
    by_name = _validated_once_each(records, _calls(calls))
    for r in records:  # each validation got its own report's fn_kwargs, merged over validation.kwargs
        call = by_name[os.path.basename(r.uri.rstrip("/"))]
        assert call["epoch"] == r.metrics["epoch"] and call["train_run_name"] == "ray-async-guide"
        assert "Dataset" in call["dataset"]
        assert 0.0 <= r.metrics["score"] <= 1.0
    assert summary.promotion.promoted.step == _best(records, "score").step
    # the dataset never reached MLflow's params (nor Prefect's: the flow's parameter is the config, locations)
    params = MlflowClient(locations["tracking_uri"]).get_run(summary.tracking.run_id).data.params
    assert params["training.loop_datasets.validation_dataset"] == image_data
    assert not any("Dataset(" in v or "MaterializedDataset" in v for v in params.values())


def test_checkpoint_guide_loop_run_twice_under_one_name(pipeline, locations, tmp_path):
    calls = tmp_path / "calls.jsonl"
    config = _config("ray-ckpt-guide", locations, "ray_guide_code:checkpoint_guide_train_func",
                     "ray_example_checks:validate_guide_checkpoint", calls,
                     training={"train_loop_config": {"num_epochs": 2}})
    first = pipeline(config, locations["tracking_uri"])
    assert [r.step for r in first.checkpoints] == [1, 2]
    assert first.promotion.promoted is not None
    # the loop reports only {"loss"} and does not resume: the same run again trains 2 more checkpoints,
    # numbered on from the first attempt's instead of 1, 2 again
    second = pipeline(config, locations["tracking_uri"], "-again")
    records = second.checkpoints
    assert [(r.step, r.status) for r in records] == [(s, "validated") for s in range(1, 5)]
    assert len({r.uri for r in records}) == 4
    _validated_once_each(records, _calls(calls))
    assert read_champion(locations["serving"]).step == _best(records, "score").step


def test_every_form_of_validation_and_a_restart(pipeline, locations, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="podium.progress")
    calls = tmp_path / "calls.jsonl"
    config = _config("ray-forms", locations, "ray_example_checks:every_form_of_validation",
                     "ray_example_checks:validate_tagged", calls,
                     training={"train_loop_config": {"die_marker": str(tmp_path / "died")}})
    summary = pipeline(config, locations["tracking_uri"])
    records = summary.checkpoints
    assert [r.step for r in records] == sorted({r.step for r in records}) and len(records) == 4
    statuses = [r.status for r in records]
    assert statuses == ["validated", "skipped", "validated", "validated"]
    assert records[1].note == "not validated: the loop reported validation=False"
    by_name = _validated_once_each(records, _calls(calls))
    tags = [by_name[os.path.basename(r.uri.rstrip("/"))]["tag"] for r in records if r.status == "validated"]
    assert tags == ["default", "default", "from-report"]  # fn_kwargs only where the report sent them
    assert summary.promotion.promoted.step == records[3].step
    said = [r.getMessage() for r in caplog.records if r.name == "podium.progress"]
    restarts = [m for m in said if m.startswith("training restarted its workers (1 of at most 2): rank")]
    assert len(restarts) == 1 and "\x1b[" not in restarts[0]
    # across the restart every checkpoint recorded once in MLflow, and one validation task run per verdict
    client = MlflowClient(locations["tracking_uri"])
    models = client.search_logged_models([client.get_experiment_by_name("podium").experiment_id], max_results=100)
    assert sorted(collections.Counter(m.tags[TAG_CHECKPOINT] for m in models).values()) == [1, 1, 1, 1]
    validated = [r.step for r in records if r.status == "validated"]
    runs = task_runs("ray-forms", expect_at_least=len(validated) + 1)
    assert sorted(r.name for r in runs if r.name.startswith("validate-step-")) == \
        sorted(f"validate-step-{s}" for s in validated)

