"""The training task: a Ray Train TorchTrainer run that announces every checkpoint as it is persisted."""

from __future__ import annotations

import logging
import time
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from podium.imports import resolve_callable
from podium.tasks.plan import BUILTIN_LOOP, RunPlan
from podium.training import raytrain, validation_call
from podium.training.events import CheckpointEvent, EventSink


def required_cpus(plan: RunPlan) -> float:
    """Logical CPUs a local Ray needs: every training worker plus the validation concurrency, each
    validation with the CPUs its own Ray work takes (inner_cpus), so none ever waits on another's."""
    cfg = plan.config
    return (cfg.scaling.num_workers * cfg.scaling.cpus_per_worker
            + cfg.validation.concurrency * (cfg.validation.num_cpus + cfg.validation.inner_cpus))


def check_resources(plan: RunPlan) -> None:
    """Fail before training if the Ray cluster cannot ever fit a training worker group or one validation."""
    import ray

    cfg = plan.config
    total = ray.cluster_resources()
    need_train = {"CPU": cfg.scaling.num_workers * cfg.scaling.cpus_per_worker,
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
    """The loop config, with the training data's feature statistics when the built-in loop standardises.

    Computed here, once per training, in one streaming pass: not in every worker, and not in the
    preflight (which `podium promote` runs too)."""
    config = dict(plan.loop_config)
    if plan.train_loop != BUILTIN_LOOP or not config.get("standardize") or config.get("feature_stats"):
        return config
    from podium.training.data import open_dataset
    from podium.training.preprocessing import compute_feature_stats

    start = time.monotonic()
    stats = compute_feature_stats(open_dataset(config["train_data"]), list(config["feature_columns"]))
    logger.info("feature statistics of %d training rows in %.1f s", stats.count, time.monotonic() - start)
    config["feature_stats"] = stats.to_dict()
    return config


def train(plan: RunPlan, sink: EventSink, step_base: int = 0) -> float:
    """Train to completion (or resume the run of the same name), announcing each report to `sink`;
    `step_base` is the run's last recorded step (see raytrain.CheckpointAnnouncer).

    Returns the time training ended (epoch seconds)."""
    cfg = plan.config
    raytrain.fit(
        train_loop=resolve_callable(plan.train_loop, "training.train_loop"),
        loop_config=loop_config_with_feature_stats(plan),
        loop_datasets=cfg.training.loop_datasets,
        run_name=cfg.run_name,
        storage=plan.storage,
        num_workers=cfg.scaling.num_workers,
        use_gpu=cfg.scaling.use_gpu,
        cpus_per_worker=cfg.scaling.cpus_per_worker,
        callbacks=[raytrain.CheckpointAnnouncer(cfg.run_name, [sink], step_base)],
        max_failures=cfg.scaling.max_failures,
    )
    return time.time()


@task(name="train-model", cache_policy=NO_CACHE)
def train_model(plan: RunPlan, sink: EventSink, step_base: int = 0) -> float:
    """Run distributed training on Ray Train; checkpoints are announced while it runs."""
    return train(plan, sink, step_base)


class NoCheckpointReported(RuntimeError):
    """Training ended and the run has no checkpoint: nothing to validate or promote."""


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
    and warm up the validation workers before training starts."""
    import ray

    raytrain.ensure_ray(required_cpus(plan), [plan.train_loop, plan.config.validation.fn])
    check_resources(plan)
    v = plan.config.validation
    warm = validation_call.prewarm_validation_workers(v.fn, v.concurrency, num_cpus=v.num_cpus, num_gpus=v.num_gpus,
                                               resources=v.resources)
    # wait for them (a few seconds), so that the warm-up does not compete with the start of training
    # for CPU where the two share a machine; a cluster still scaling up is not waited for longer
    ray.wait(warm, num_returns=len(warm), timeout=PREWARM_WAIT_S)


def missed_checkpoints(plan: RunPlan, seen: set[str]) -> list[CheckpointEvent]:
    """Checkpoints Ray Train persisted for this run that were never announced to this process."""
    return [e for e in raytrain.persisted_checkpoints(plan.storage, plan.run_name) if e.checkpoint_name not in seen]


@task(name="connect-ray", cache_policy=NO_CACHE)
def connect_ray_task(plan: RunPlan) -> None:
    """Connect to Ray and check the cluster can hold the training workers and a validation task."""
    connect_ray(plan)
