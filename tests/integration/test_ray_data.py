"""Training data through Ray Data, for real: a local Ray, Ray Train workers, the whole pipeline.

Three trainings:
- `raytrain.fit` of a loop that writes down the rows the built-in loop's batches hold, on two datasets
  (`cache = never` and `always`): each row read once per epoch, in all, across the workers;
- the module's one run of the whole pipeline with the built-in loop (`built_in_run`): its validations hold
  every validation CPU while training reads its next epoch through Ray Data, and the first one kills a training
  worker; it carries "validations do not stall training" and "a restarted worker group resumes mid-epoch";
- the module's run of a user's own loop given Ray Datasets (`users_loop_run`): it carries "split across the
  workers" and "validations that fail, hang or return no dict are failed, and the best of the others promoted".
The validation workers' own pool and the statistics pass train nothing.

The helper functions below run inside Ray workers (this folder is on their path).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import time
import types
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


PER_EPOCH, EPOCHS = steps_per_epoch(12000, 2, 8), 2  # 12000 rows, 2 workers, batches of 8: 750 steps an epoch
FINAL_STEP = PER_EPOCH * EPOCHS


def kill_a_training_worker_once_then_hold(checkpoint: ray.train.Checkpoint, val_data: str, label_column: str,
                                          feature_columns: list[str], step: int, marker: str, run_dir: str,
                                          starts_log: str, wait_s: float = 840.0) -> dict[str, float]:
    """The built-in validation, started only once training has written its last checkpoint: meanwhile this task
    holds its CPU, as a long validation would. The first time, it also SIGKILLs one of this Ray's training workers
    (a child of the raylet that started this worker, never anyone else's) while training runs. Each call writes
    down, as it starts, whether training had finished."""
    import psutil

    final = os.path.join(run_dir, f"checkpoint_{FINAL_STEP:08d}")
    with open(starts_log, "a") as f:
        f.write(json.dumps({"step": step, "training_finished": os.path.exists(final)}) + "\n")
    if not os.path.exists(marker):
        raylet = psutil.Process(os.getppid())
        workers = [p for p in raylet.children() if "RayTrainWorker" in " ".join(p.cmdline())]
        Path(marker).write_text(json.dumps({"step": step, "killed": [p.pid for p in workers[:1]],
                                            "training_finished": os.path.exists(final)}))
        if workers:
            os.kill(workers[0].pid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while not os.path.exists(final):
        if time.monotonic() > deadline:
            raise TimeoutError("training did not go on while the validations held their CPUs")
        time.sleep(0.5)
    return validate_checkpoint(checkpoint, val_data, label_column, feature_columns)


@pytest.fixture(scope="module")
def built_in_run(module_pipeline, dataset, tmp_path_factory, mlflow_template_db):
    """The module's one training of the whole pipeline with the built-in loop: 2 epochs read from Parquet each
    epoch (`cache = never`), batches of 8, a checkpoint every 200 steps (most of them mid-epoch). Its validations
    hold both validation CPUs until training has written its last checkpoint, and the first one SIGKILLs a
    training worker while training runs: the restarted worker group resumes from a mid-epoch checkpoint and
    reads the next epoch through Ray Data while the validations hold their CPUs. Two tests check it."""
    import ray

    root = tmp_path_factory.mktemp("built-in")
    shutil.copy(mlflow_template_db, root / "mlflow.db")
    locations = {"storage": str(root / "storage"), "serving": str(root / "serving"),
                 "tracking_uri": f"sqlite:///{root / 'mlflow.db'}"}
    marker, starts = root / "killed.json", root / "starts.jsonl"
    cfg = _config("held-resume-mid", dataset, locations,
                  training={"epochs": EPOCHS, "batch_size": 8, "checkpoint_every_steps": 200, "cache": "never"},
                  validation={"fn": "test_ray_data:kill_a_training_worker_once_then_hold", "timeout_s": 900,
                              "retries": 0,
                              "kwargs": {"marker": str(marker), "starts_log": str(starts),
                                         "run_dir": os.path.join(locations["storage"], "held-resume-mid")}})
    cpus = ray.cluster_resources()["CPU"]
    summary = module_pipeline(cfg, locations["tracking_uri"])
    return types.SimpleNamespace(summary=summary, cpus=cpus, killed=json.loads(marker.read_text()),
                                 starts=[json.loads(line) for line in starts.read_text().splitlines()])


def test_validations_holding_every_cpu_of_theirs_do_not_stall_training(built_in_run):
    # 2 workers + 1 CPU for Ray Data + 2 validations: the local Ray has exactly these 5 CPUs. The validations
    # hold both validation CPUs until training has written its last checkpoint; training needs Ray Data to read
    # the second epoch (and the restarted workers their epoch) meanwhile. Without CPUs of its own for Ray Data,
    # that read would wait for the validations, and they for it.
    assert built_in_run.cpus == 5
    held = [s for s in built_in_run.starts if not s["training_finished"]]
    assert len(held) >= 2, f"both validation CPUs must be held while training runs: {built_in_run.starts}"
    summary = built_in_run.summary
    assert [r.status for r in summary.checkpoints] == ["validated"] * len(summary.checkpoints)
    assert summary.checkpoints[-1].step == FINAL_STEP and summary.promotion.promoted is not None


def test_a_restarted_worker_group_resumes_mid_epoch_at_the_right_step(built_in_run):
    killed, summary = built_in_run.killed, built_in_run.summary
    assert killed["killed"] and not killed["training_finished"], "the kill must land while training runs"

    steps = [r.step for r in summary.checkpoints]
    # resumed from a checkpoint in the middle of an epoch: the rest of that epoch, then the next ones; had
    # the epoch started over, the steps would run past epochs x steps-per-epoch
    assert steps == [*range(200, FINAL_STEP, 200), FINAL_STEP]
    assert all(r.status == "validated" for r in summary.checkpoints)
    last = summary.checkpoints[-1]
    assert last.metrics["epoch"] == EPOCHS and last.metrics["step"] == FINAL_STEP
    for r in summary.checkpoints[:-1]:  # a mid-epoch checkpoint counts the epochs completed before it
        assert r.metrics["epoch"] == r.step // PER_EPOCH


@pytest.fixture(scope="module")
def users_loop_run(module_pipeline, dataset, tmp_path_factory, mlflow_template_db):
    """The module's run of a user's own loop and validation function, written only against plain Ray Train APIs
    (podium_user_code): Ray's data-ingest pattern on the Ray Datasets podium gives it (`data.ray_datasets`), 4
    epochs on 2 workers; its validation fails at epoch 1 (retried once), hangs at epoch 2 (timed out, each
    attempt) and returns nothing at epoch 0; promoted with `verify = "revalidate"`. Two tests check it."""
    root = tmp_path_factory.mktemp("users-loop")
    shutil.copy(mlflow_template_db, root / "mlflow.db")
    locations = {"storage": str(root / "storage"), "serving": str(root / "serving"),
                 "tracking_uri": f"sqlite:///{root / 'mlflow.db'}"}
    paths_log = root / "validated-paths.txt"
    cfg = _config("byo", dataset, locations, data={"ray_datasets": True},
                  training={"train_loop": "podium_user_code:train_func_with_datasets",
                            "train_loop_config": {"epochs": 4}},
                  validation={"fn": "podium_user_code:validate_softmax",
                              "kwargs": {"fail_epoch": 1, "hang_epoch": 2, "none_epoch": 0, "paths_log": str(paths_log)},
                              "retries": 1, "retry_delay_s": 0.1, "timeout_s": 12},
                  promotion={"metric": "accuracy", "mode": "max", "verify": "revalidate"})
    summary = module_pipeline(cfg, locations["tracking_uri"])
    return types.SimpleNamespace(summary=summary, locations=locations, paths_log=paths_log)


def test_a_users_loop_gets_ray_datasets_split_across_workers(users_loop_run):
    summary = users_loop_run.summary
    assert [r.step for r in summary.checkpoints] == [0, 1, 2, 3]  # the user's loop reports 'epoch': podium's step
    for r in summary.checkpoints:
        # each of the 2 workers read half of the 12000 training rows and of the 3000 validation rows, each epoch
        assert (r.metrics["train_rows"], r.metrics["val_rows"]) == (6000, 1500), r.metrics
    validated = [r for r in summary.checkpoints if r.status == "validated"]
    assert validated and all(r.metrics["accuracy"] > 0.5 for r in validated)


def test_user_loop_with_plain_ray_train_apis(users_loop_run):
    """A user's validations that fail, hang or return no dict are each failed with the reason (retried first),
    training goes on, and the best of the others is promoted in the user's own checkpoint format."""
    from helpers.prefect_queries import task_runs

    from podium.serving.layout import read_current

    summary = users_loop_run.summary
    by_epoch = {r.step: r for r in summary.checkpoints}
    # epoch 1's validation always fails: marked failed with the reason, never promoted, training unaffected
    assert by_epoch[1].status == "failed" and "validation data unavailable" in by_epoch[1].failure
    # epoch 2's validation hangs: cancelled at the timeout, each attempt, then marked failed
    assert by_epoch[2].status == "failed" and "longer than 12 s" in by_epoch[2].failure
    # epoch 0's validation returns None (a function that forgot its `return`): failed, saying what it returned
    assert by_epoch[0].status == "failed" and "returned NoneType, expected a dict" in by_epoch[0].failure
    assert by_epoch[3].status == "validated"
    assert summary.promotion.promoted.step == 3  # the only one validated
    assert math.isfinite(summary.promotion.promoted.value)
    # the promoted copy is the user's own checkpoint format, byte for byte, and gave back its score
    # when the user's validation ran on it (verify = "revalidate")
    current = read_current(users_loop_run.locations["serving"])
    assert set(current.manifest["files"]) == {"softmax.pt"}
    assert current.uri in users_loop_run.paths_log.read_text().split()
    # the failed validation was retried once: two attempts, then a final failure
    runs = task_runs("byo", expect_at_least=8)
    for step in (1, 2):
        failed = [r for r in runs if r.name == f"validate-step-{step}"]
        assert len(failed) == 1 and failed[0].state.is_failed() and failed[0].run_count == 2
