"""The training task: a Ray Train TorchTrainer run that announces every checkpoint as it is persisted."""

from __future__ import annotations

import time

from prefect import task
from prefect.cache_policies import NO_CACHE

from podium.imports import resolve_callable
from podium.tasks.plan import RunPlan
from podium.training import cluster
from podium.training.events import CheckpointEvent, EventSink

# podium.training.raytrain (Ray Train, ray.data, pandas) is imported where it is used: `podium run` calls
# start_ray_early and then loads other libraries while Ray starts in a background thread, and no part of
# `ray` beyond its core may load meanwhile (see cluster.start_early).


def required_cpus(plan: RunPlan) -> float:
    """Logical CPUs a local Ray needs: every training worker plus the validation concurrency."""
    cfg = plan.config
    return (cfg.scaling.num_workers * cfg.scaling.cpus_per_worker
            + cfg.validation.concurrency * cfg.validation.num_cpus)


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


def train(plan: RunPlan, sink: EventSink) -> float:
    """Train to completion (or resume the run of the same name), announcing each report to `sink`.

    Returns the time training ended (epoch seconds)."""
    from podium.training import raytrain

    cfg = plan.config
    raytrain.fit(
        train_loop=resolve_callable(plan.train_loop, "training.train_loop"),
        loop_config=plan.loop_config,
        run_name=cfg.run_name,
        storage=plan.storage,
        num_workers=cfg.scaling.num_workers,
        use_gpu=cfg.scaling.use_gpu,
        cpus_per_worker=cfg.scaling.cpus_per_worker,
        callbacks=[raytrain.CheckpointAnnouncer(cfg.run_name, [sink])],
        max_failures=cfg.scaling.max_failures,
    )
    return time.time()


@task(name="train-model", cache_policy=NO_CACHE)
def train_model(plan: RunPlan, sink: EventSink) -> float:
    """Run distributed training on Ray Train; checkpoints are announced while it runs."""
    return train(plan, sink)


PREWARM_WAIT_S = 15.0


def warm_up_of(plan: RunPlan) -> cluster.WarmUp:
    """The validation warm-up this plan asks for."""
    v = plan.config.validation
    return cluster.WarmUp(fn=v.fn, count=v.concurrency, num_cpus=v.num_cpus, num_gpus=v.num_gpus,
                          resources=tuple(sorted(v.resources.items())))


def start_ray_early(plan: RunPlan) -> cluster.EarlyStart:
    """Start Ray and the validation warm-up in a background thread, for `connect_ray` to find later
    (the `podium run` command does, while it loads the rest; see cluster.start_early)."""
    return cluster.start_early(required_cpus(plan), [plan.train_loop, plan.config.validation.fn], warm_up_of(plan))


def connect_ray(plan: RunPlan) -> None:
    """Connect to the Ray cluster (RAY_ADDRESS) or start a local one sized for training plus validation,
    and warm up the validation workers before training starts (or take what `start_ray_early` started)."""
    import ray

    warm_up = warm_up_of(plan)
    warm = cluster.take_started(warm_up)
    cluster.ensure_ray(required_cpus(plan), [plan.train_loop, plan.config.validation.fn])
    check_resources(plan)
    if warm is None:
        warm = cluster.prewarm_validation_workers(warm_up.fn, warm_up.count, num_cpus=warm_up.num_cpus,
                                                  num_gpus=warm_up.num_gpus, resources=dict(warm_up.resources))
    # wait for them (a few seconds), so that the warm-up does not compete with the start of training
    # for CPU where the two share a machine; a cluster still scaling up is not waited for longer
    ray.wait(warm, num_returns=len(warm), timeout=PREWARM_WAIT_S)


def missed_checkpoints(plan: RunPlan, seen: set[str]) -> list[CheckpointEvent]:
    """Checkpoints Ray Train persisted for this run that were never announced to this process."""
    from podium.training import raytrain

    return [e for e in raytrain.persisted_checkpoints(plan.storage, plan.run_name) if e.checkpoint_name not in seen]


@task(name="connect-ray", cache_policy=NO_CACHE)
def connect_ray_task(plan: RunPlan) -> None:
    """Connect to Ray and check the cluster can hold the training workers and a validation task."""
    connect_ray(plan)
