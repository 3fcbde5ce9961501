"""Training data through Ray Data, for real: a local Ray, Ray Train workers, the whole pipeline.

The helper functions below run inside Ray workers (this folder is on their path).
"""

from __future__ import annotations

import glob
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray.train

from podium.training import raytrain
from podium.training.ingest import builtin_datasets, steps_per_epoch
from podium.training.loop import minibatches
from podium.training.validate import validate_checkpoint

pytestmark = pytest.mark.integration


def worker_process(checkpoint: ray.train.Checkpoint) -> dict[str, Any]:
    """A validation function that reports which process ran it."""
    return {"pid": os.getpid()}


def record_rows_per_epoch(config: dict[str, Any]) -> None:
    """A train loop that iterates the built-in loop's batches of each of its datasets and writes down which rows
    it saw."""
    rank = ray.train.get_context().get_world_rank()
    for name in config["datasets"]:
        shard = ray.train.get_dataset_shard(name)
        for epoch in range(config["epochs"]):
            ids = [int(v) for xb, _ in minibatches(shard, config, epoch, rank) for v in xb[:, 0].tolist()]
            batches = -(-len(ids) // config["batch_size"])
            Path(config["out"], f"{name}-rank{rank}-epoch{epoch}.json").write_text(
                json.dumps({"ids": ids, "batches": batches}))


def test_validations_run_in_worker_processes_ray_data_never_uses(ray_cluster, tmp_path):
    """Ray reuses idle worker processes. Without a pool of their own, the prewarmed validation workers
    would run Ray Data's read tasks and the validations would then run in processes holding Ray Data's
    memory (and, under a CPU split, a Ray Train worker could land in one)."""
    from podium.training.cluster import prewarm_validation_workers
    from podium.training.validation_call import validate_remote

    fn = "test_ray_data:worker_process"
    ray.get(prewarm_validation_workers(fn, 2, num_cpus=1, num_gpus=0, resources={}))
    data = ray.data.range(64, override_num_blocks=16).map_batches(
        lambda b: {"pid": np.full(len(b["id"]), os.getpid())}, num_cpus=0.25)
    data_pids = {int(p) for p in data.to_pandas()["pid"]}
    validation_pids = {int(validate_remote(fn, str(tmp_path), {}, {}, num_cpus=1, num_gpus=0, resources={},
                                           timeout_s=120).metrics["pid"]) for _ in range(4)}
    assert validation_pids and not validation_pids & data_pids


def test_each_row_is_read_once_per_epoch_in_all_across_the_workers(ray_cluster, tmp_path):
    """The built-in loop's data read each epoch (`cache = never`) and read once, kept in the object store
    (`always`): two datasets of one training, each checked alone."""
    for i, (start, stop) in enumerate([(0, 400), (400, 401), (401, 1001)]):  # three files, one of a single row
        ids = np.arange(start, stop)
        (tmp_path / "data").mkdir(exist_ok=True)
        pq.write_table(pa.table({"id": ids.astype(np.float64), "label": ids % 3}), tmp_path / "data" / f"{i}.parquet",
                       row_group_size=150)
    out = tmp_path / "seen"
    out.mkdir()
    config = {"train_data": str(tmp_path / "data"), "feature_columns": ["id"], "label_column": "label", "seed": 3,
              "shuffle": "local", "shuffle_window_rows": 64, "batch_size": 16, "epochs": 2, "out": str(out)}
    caches = {"never": "train", "always": "cached"}  # the cache setting, and the name of its dataset
    datasets = {name: builtin_datasets({**config, "cache": cache}, data_cpus=1)["train"]
                for cache, name in caches.items()}
    raytrain.fit(train_loop=record_rows_per_epoch, loop_config={**config, "datasets": list(datasets)},
                 run_name="rows-once", storage=str(tmp_path / "storage"), num_workers=2, use_gpu=False,
                 cpus_per_worker=1, callbacks=[], datasets=datasets, data_cpus=1)

    for cache, name in caches.items():
        orders = {}
        for epoch in range(2):
            seen = [json.loads((out / f"{name}-rank{r}-epoch{epoch}.json").read_text()) for r in range(2)]
            ids = seen[0]["ids"] + seen[1]["ids"]
            assert len(ids) == len(set(ids)) == 1000, \
                f"cache {cache}: every row once per epoch, in all (one of 1001 left out: equal split)"
            assert len(seen[0]["ids"]) == len(seen[1]["ids"]) == 500, cache
            assert seen[0]["batches"] == seen[1]["batches"] == steps_per_epoch(1001, 2, 16), cache
            orders[epoch] = seen[0]["ids"]
        assert orders[0] != orders[1], f"cache {cache}: a new order each epoch"


def test_statistics_pass_as_a_ray_data_job_equals_the_whole_table(ray_cluster, tmp_path):
    from podium.training.stats import compute_data_stats

    rng = np.random.default_rng(5)
    parts = []
    for i, n in enumerate((3000, 1, 2500)):
        t = pa.table({"a": rng.normal(1e4, 3.0, n), "b": rng.integers(0, 5, n).astype(np.int16),
                      "label": np.zeros(n, dtype=np.int64)})
        pq.write_table(t, tmp_path / f"{i}.parquet", row_group_size=700)
        parts.append(t)
    stats = compute_data_stats(str(tmp_path), ["a", "b"], data_cpus=1, in_process_bytes=0)  # force the Ray Data job
    whole = pa.concat_tables(parts)
    assert stats.rows == 5501
    for i, name in enumerate(["a", "b"]):
        values = whole.column(name).to_numpy().astype(np.float64)
        assert stats.mean[i] == pytest.approx(values.mean(), rel=1e-12)
        assert stats.std[i] == pytest.approx(values.std(), rel=1e-9)
        assert (stats.min[i], stats.max[i]) == (values.min(), values.max())


# ---------------------------------------------------------------------------------------------
# The whole pipeline


def _config(run_name: str, dataset: tuple[str, str], locations: dict[str, str], **over: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {"run_name": run_name, "storage": locations["storage"], "serving": locations["serving"],
                           "data": {"train": dataset[0], "val": dataset[1]}, "validation": {"concurrency": 2}}
    for key, value in over.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    return cfg


def validate_once_training_is_done(checkpoint: ray.train.Checkpoint, val_data: str, label_column: str,
                                   feature_columns: list[str], run_dir: str, checkpoints: int,
                                   wait_s: float = 300.0) -> dict[str, float]:
    """The built-in validation, started only once `checkpoints` checkpoints exist: meanwhile this task holds
    its CPU, as a long validation would."""
    deadline = time.monotonic() + wait_s
    while len(glob.glob(os.path.join(run_dir, "checkpoint_*"))) < checkpoints:
        if time.monotonic() > deadline:
            raise TimeoutError("training did not go on while the validations held their CPUs")
        time.sleep(0.5)
    return validate_checkpoint(checkpoint, val_data, label_column, feature_columns)


def test_validations_holding_every_cpu_of_theirs_do_not_stall_training(pipeline, dataset, locations):
    # 2 workers + 1 CPU for Ray Data + 2 validations: the local Ray has exactly these 5 CPUs. The first two
    # checkpoints' validations hold both validation CPUs until training has written all four; training
    # needs Ray Data to read epochs 3 and 4 meanwhile. Without CPUs of its own for Ray Data, that read
    # would wait for the validations, and they for it.
    import ray

    assert ray.cluster_resources()["CPU"] == 5
    run_dir = os.path.join(locations["storage"], "held")
    cfg = _config("held", dataset, locations, training={"epochs": 4, "cache": "never"},  # read each epoch
                  validation={"fn": "test_ray_data:validate_once_training_is_done", "timeout_s": 600, "retries": 0,
                              "kwargs": {"run_dir": run_dir, "checkpoints": 4}})
    summary = pipeline(cfg, locations["tracking_uri"])
    assert [r.status for r in summary.checkpoints] == ["validated"] * 4
    assert summary.promotion.promoted is not None


def kill_a_training_worker_once(checkpoint: ray.train.Checkpoint, val_data: str, label_column: str,
                                feature_columns: list[str], step: int, marker: str, run_dir: str,
                                final_step: int) -> dict[str, float]:
    """The built-in validation; the first time, it also SIGKILLs one of this Ray's training workers
    (a child of the raylet that started this worker, never anyone else's) while training runs."""
    import psutil

    if not os.path.exists(marker):
        raylet = psutil.Process(os.getppid())
        workers = [p for p in raylet.children() if "RayTrainWorker" in " ".join(p.cmdline())]
        finished = os.path.exists(os.path.join(run_dir, f"checkpoint_{final_step:08d}"))
        Path(marker).write_text(json.dumps({"step": step, "killed": [p.pid for p in workers[:1]],
                                            "training_finished": finished}))
        if workers:
            os.kill(workers[0].pid, signal.SIGKILL)
    return validate_checkpoint(checkpoint, val_data, label_column, feature_columns)


def test_a_restarted_worker_group_resumes_mid_epoch_at_the_right_step(pipeline, dataset, locations, tmp_path):
    # 12000 rows, 2 workers, batches of 8: 750 steps an epoch; a checkpoint every 200 steps, most of them mid-epoch
    per_epoch, epochs = steps_per_epoch(12000, 2, 8), 2
    marker = tmp_path / "killed.json"
    run_dir = os.path.join(locations["storage"], "resume-mid")
    cfg = _config("resume-mid", dataset, locations,
                  training={"epochs": epochs, "batch_size": 8, "checkpoint_every_steps": 200},
                  validation={"fn": "test_ray_data:kill_a_training_worker_once", "retries": 0,
                              "kwargs": {"marker": str(marker), "run_dir": run_dir,
                                         "final_step": per_epoch * epochs}})
    summary = pipeline(cfg, locations["tracking_uri"])
    killed = json.loads(marker.read_text())
    assert killed["killed"] and not killed["training_finished"], "the kill must land while training runs"

    steps = [r.step for r in summary.checkpoints]
    # resumed from a checkpoint in the middle of an epoch: the rest of that epoch, then the next ones; had
    # the epoch started over, the steps would run past epochs x steps-per-epoch
    assert steps == [*range(200, per_epoch * epochs, 200), per_epoch * epochs]
    assert all(r.status == "validated" for r in summary.checkpoints)
    last = summary.checkpoints[-1]
    assert last.metrics["epoch"] == epochs and last.metrics["step"] == per_epoch * epochs
    for r in summary.checkpoints[:-1]:  # a mid-epoch checkpoint counts the epochs completed before it
        assert r.metrics["epoch"] == r.step // per_epoch


def test_a_users_loop_gets_ray_datasets_split_across_workers(pipeline, dataset, locations):
    cfg = _config("byo-datasets", dataset, locations, data={"ray_datasets": True},
                  training={"train_loop": "podium_user_code:train_func_with_datasets"},
                  validation={"fn": "podium_user_code:validate_softmax"},
                  promotion={"metric": "accuracy", "mode": "max"})
    summary = pipeline(cfg, locations["tracking_uri"])
    assert [r.status for r in summary.checkpoints] == ["validated", "validated"]
    for r in summary.checkpoints:
        # each of the 2 workers read half of the 12000 training rows and of the 3000 validation rows
        assert (r.metrics["train_rows"], r.metrics["val_rows"]) == (6000, 1500)
        assert r.metrics["accuracy"] > 0.5
    assert summary.promotion.promoted is not None
