"""The training task: a Ray Train TorchTrainer run that announces every checkpoint as it is persisted."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import ray
from prefect import task
from prefect.cache_policies import NO_CACHE

from podium.core.events import CheckpointEvent, EventSink
from podium.core.failures import user_frames
from podium.errors import NoCheckpointReported, UserCodeError
from podium.imports import resolve_callable
from podium.storage.locations import fsspec_filesystem, is_remote, join, normalize_location
from podium.tasks.plan import BUILTIN_LOOP, RunPlan
from podium.training import cluster, ingest
from podium.training.resources import required_cpus, warm_up_of, worker_import_paths
from podium.training.stats import compute_data_stats

# podium.training.raytrain (Ray Train, ray.data, pandas) is imported where it is used: `podium run` calls
# podium.training.resources.start_ray_early and then loads other libraries while Ray starts in a background thread,
# and no part of `ray` beyond its core may load meanwhile (see cluster.start_early).


def check_resources(plan: RunPlan) -> None:
    """Fail before training if the Ray cluster cannot ever fit a training worker group with its data
    reading (data_cpus), or one validation."""

    cfg = plan.config
    total = ray.cluster_resources()
    need_train = {"CPU": cfg.scaling.num_workers * cfg.scaling.cpus_per_worker + cfg.scaling.data_cpus,
                  "GPU": cfg.scaling.num_workers if cfg.scaling.use_gpu else 0}
    need_val = {"CPU": cfg.validation.num_cpus, "GPU": cfg.validation.num_gpus, **cfg.validation.resources}
    for what, need in (("scaling", need_train), ("validation", need_val)):
        for res, amount in need.items():
            if amount and total.get(res, 0) < amount:
                raise ValueError(f"{what} asks for {amount:g} {res} but the Ray cluster has "
                                 f"{total.get(res, 0):g} {res} in all")
    inner = cfg.validation.concurrency * (cfg.validation.num_cpus + cfg.validation.inner_cpus)
    if cfg.validation.inner_cpus and total.get("CPU", 0) < need_train["CPU"] + inner:
        # a validation whose own Ray work waits on CPUs held by training and the other validations
        # would hang until its timeout
        raise ValueError(f"validation.inner_cpus = {cfg.validation.inner_cpus:g}: training ({need_train['CPU']:g}) "
                         f"and {cfg.validation.concurrency} validations with their own Ray work ({inner:g}) need "
                         f"{need_train['CPU'] + inner:g} CPU at once, the Ray cluster has {total.get('CPU', 0):g}")


logger = logging.getLogger(__name__)


def loop_config_with_feature_stats(plan: RunPlan) -> dict[str, Any]:
    """The loop config, with the training data's feature statistics when the built-in loop standardises:
    saved with the run, computed once (one streaming pass, `load_or_compute_stats`), not in every worker."""
    config = dict(plan.loop_config)
    if plan.train_loop != BUILTIN_LOOP or not config.get("standardize") or config.get("feature_stats"):
        return config
    config["feature_stats"] = load_or_compute_stats(plan)
    return config


def stats_location(plan: RunPlan) -> str:
    """Where a run's feature statistics are saved: beside its run lock, `<storage>/.podium-runs/<run>.feature-stats.json`."""
    return join(plan.storage, ".podium-runs", f"{plan.run_name}.feature-stats.json")


def load_or_compute_stats(plan: RunPlan) -> dict[str, Any]:
    """The training data's statistics saved with this run, or, the first time, one streaming pass over
    it whose result is saved. A resumed run keeps the numbers its checkpoints were trained with."""

    uri = stats_location(plan)
    fs, path = fsspec_filesystem(uri)
    try:
        doc: dict[str, Any] = json.loads(fs.cat_file(path))
        logger.info("feature statistics of run %s: saved with the run (%s)", plan.run_name, uri)
        return doc
    except FileNotFoundError:
        pass
    started = time.monotonic()
    stats = compute_data_stats(plan.loop_config["train_data"], list(plan.loop_config["feature_columns"]),
                               data_cpus=plan.config.scaling.data_cpus)
    if not is_remote(uri):
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(path, json.dumps(stats.to_dict()).encode())
    logger.info("feature statistics of run %s: %d rows in one pass, %.1f s; saved to %s", plan.run_name, stats.rows,
                time.monotonic() - started, uri)
    return stats.to_dict()


def trainer_datasets(plan: RunPlan, loop_config: dict[str, Any]) -> dict[str, Any] | None:
    """The TorchTrainer's datasets: the built-in loop's training data, or, for a loop of your own that asked
    (data.ray_datasets), `train` and `val`."""
    cfg = plan.config
    if plan.train_loop == BUILTIN_LOOP:
        return ingest.builtin_datasets(loop_config, cfg.scaling.data_cpus)
    if cfg.data.ray_datasets:
        return ingest.user_datasets(normalize_location(cfg.data.train), normalize_location(cfg.data.val),
                                    cfg.scaling.data_cpus)
    return None


class EarlyStopSwitch:
    """Between the flow, which asks training to stop early, and the training task, which ends: whether the stop
    took effect. Training that ended on its own first (its last epoch done) was not stopped early, whatever the
    flow asked, and the run must not say it was."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked = self._ended = self.too_late = False

    def ask(self) -> bool:
        """The flow stops training early: False if training has already ended on its own (nothing to stop)."""
        with self._lock:
            if self._ended:
                return False
            self._asked = True
            return True

    @property
    def asked(self) -> bool:
        """The flow asked training to stop early (Ray Train's error for the abort is the end it asked for)."""
        return self._asked

    def ended_on_its_own(self) -> None:
        """Training trained every epoch: a stop asked for before it ended came too late (`too_late`)."""
        with self._lock:
            self._ended, self.too_late = True, self._asked


def train(plan: RunPlan, sink: EventSink, step_base: int = 0, fitting: threading.Event | None = None,
          stopped_early: EarlyStopSwitch | None = None) -> float:
    """Train to completion (or resume the run of the same name), announcing each report to `sink`;
    `step_base` is the run's last recorded step (see raytrain.CheckpointAnnouncer). `fitting` is set once
    this process's own part of the start is done (the data's statistics, the datasets' plan) and Ray Train
    starts: from then on this thread waits on Ray. `stopped_early` is set by the flow before it aborts
    training because the validations stopped improving: Ray Train's error for that abort is the end it asked for.

    Returns the time training ended (epoch seconds)."""
    from podium.training import raytrain

    cfg = plan.config
    loop_config = loop_config_with_feature_stats(plan)
    datasets = trainer_datasets(plan, loop_config)
    logger.info("run %s: starting Ray Train (%s)", cfg.run_name,
                "data through Ray Data: " + ", ".join(sorted(datasets)) if datasets else "no datasets")
    if fitting is not None:
        fitting.set()
    try:
        _fit(plan, sink, step_base, loop_config, datasets)
    except Exception as exc:
        if stopped_early is not None and stopped_early.asked:
            logger.info("run %s: training stopped early (Ray Train aborted: %s)", cfg.run_name, type(exc).__name__)
            return time.time()
        failures = raytrain.user_failures(exc)
        if not failures:
            raise
        logger.error("run %s: the training loop %s raised (the full trace)", cfg.run_name, plan.train_loop,
                     exc_info=True)
        rank, _, text = failures[0]
        others = f"; {len(failures) - 1} other rank(s) failed too" if len(failures) > 1 else ""
        raise UserCodeError(f"the training loop {plan.train_loop} (rank {rank}{others})", user_frames(text)) from None
    if stopped_early is not None:
        stopped_early.ended_on_its_own()
    return time.time()


def _fit(plan: RunPlan, sink: EventSink, step_base: int, loop_config: dict[str, Any],
         datasets: dict[str, Any] | None) -> None:
    from podium.training import raytrain

    cfg = plan.config
    raytrain.fit(
        train_loop=resolve_callable(plan.train_loop, "training.train_loop"),
        loop_config=loop_config,
        loop_datasets=cfg.training.loop_datasets,
        run_name=cfg.run_name,
        storage=plan.storage,
        num_workers=cfg.scaling.num_workers,
        use_gpu=cfg.scaling.use_gpu,
        cpus_per_worker=cfg.scaling.cpus_per_worker,
        # the flow's own queue gets the controller's handle: a clean stop aborts training through it
        callbacks=[raytrain.CheckpointAnnouncer(cfg.run_name, [sink], step_base, storage=plan.storage,
                                                announce_controller=isinstance(sink, raytrain.RayQueueSink))],
        max_failures=cfg.scaling.max_failures,
        datasets=datasets,
        data_cpus=cfg.scaling.data_cpus,
    )


@task(name="train-model", cache_policy=NO_CACHE)
def train_model(plan: RunPlan, sink: EventSink, step_base: int = 0, fitting: threading.Event | None = None,
                stopped_early: EarlyStopSwitch | None = None) -> float:
    """Run distributed training on Ray Train; checkpoints are announced while it runs."""
    return train(plan, sink, step_base, fitting, stopped_early)


def require_checkpoints(plan: RunPlan, checkpoints: int, reports: int) -> None:
    """Fail the run when its loop never reported a checkpoint, saying how to report one."""
    if checkpoints:
        return
    said = f"reported metrics {reports} time(s)" if reports else "never called ray.train.report"
    raise NoCheckpointReported(
        f"run {plan.run_name!r}: the training loop {plan.train_loop} {said} but never with a checkpoint, so "
        "there is nothing to validate or promote. Report one from rank 0, e.g. save the model into a "
        "temporary folder d, then ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d)) "
        "(README: Bring your own loop)")


PREWARM_WAIT_S = 15.0


def connect_ray(plan: RunPlan) -> None:
    """Connect to the Ray cluster (RAY_ADDRESS) or start a local one sized for training plus validation,
    and warm up the validation workers before training starts (or take what `start_ray_early` started)."""

    warm_up = warm_up_of(plan.config)
    warm = cluster.take_started(warm_up)
    cluster.ensure_ray(required_cpus(plan.config), worker_import_paths(plan.config))
    check_resources(plan)
    if warm is None:
        warm = cluster.prewarm_validation_workers(warm_up.fn, warm_up.count, num_cpus=warm_up.num_cpus,
                                                  num_gpus=warm_up.num_gpus, resources=dict(warm_up.resources))
    # wait for them (a few seconds), so that the warm-up does not compete with the start of training
    # for CPU where the two share a machine; a cluster still scaling up is not waited for longer
    began = time.time()
    ready, _ = ray.wait(warm, num_returns=len(warm), timeout=PREWARM_WAIT_S)
    waited = time.time() - began
    if waited >= 0.01 or len(ready) < len(warm):
        logger.info("validation warm-up: waited %.2f s for it, %d of %d worker(s) ready", waited, len(ready), len(warm))
        return
    try:  # each warm-up returns when its import ended: how much slack the start of training had
        logger.info("validation warm-up: ready %.2f s before training could start", time.time() - max(ray.get(ready)))
    except Exception as exc:  # a validation module that does not import: its first validation says so
        logger.info("validation warm-up failed: %s", type(exc).__name__)


def missed_checkpoints(plan: RunPlan, seen: set[str]) -> list[CheckpointEvent]:
    """Checkpoints Ray Train persisted for this run that were never announced to this process."""
    from podium.training import raytrain

    return [e for e in raytrain.persisted_checkpoints(plan.storage, plan.run_name) if e.checkpoint_name not in seen]


@task(name="connect-ray", cache_policy=NO_CACHE)
def connect_ray_task(plan: RunPlan) -> None:
    """Connect to Ray and check the cluster can hold the training workers and a validation task."""
    connect_ray(plan)
