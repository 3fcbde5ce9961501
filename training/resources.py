"""What a run asks of Ray, from its configuration alone: the logical CPUs of a local Ray, the import paths its
workers need, and the validation warm-up. Light (the configuration and Ray core), so that `podium run` can
start Ray before it loads Prefect, MLflow, pyarrow's datasets or the preflight (podium.cli.commands)."""

from __future__ import annotations

from podium.config import BUILTIN_LOOP, PipelineConfig
from podium.training import cluster


def required_cpus(config: PipelineConfig) -> float:
    """Logical CPUs a local Ray needs: every training worker, Ray Data's reading (data_cpus), and the
    validation concurrency, each validation with the CPUs its own Ray work takes (inner_cpus).

    Each gets CPUs of its own, so none ever waits on another's: training never stalls because
    validations hold every CPU Ray Data could read with."""
    s, v = config.scaling, config.validation
    return s.num_workers * s.cpus_per_worker + s.data_cpus + v.concurrency * (v.num_cpus + v.inner_cpus)


def worker_import_paths(config: PipelineConfig) -> list[str]:
    """The code Ray's workers run: the train loop and the validation function."""
    return [config.training.train_loop or BUILTIN_LOOP, config.validation.fn]


def warm_up_of(config: PipelineConfig) -> cluster.WarmUp:
    """The validation warm-up this configuration asks for."""
    v = config.validation
    return cluster.WarmUp(fn=v.fn, count=v.concurrency, num_cpus=v.num_cpus, num_gpus=v.num_gpus,
                          resources=tuple(sorted(v.resources.items())))


def start_ray_early(config: PipelineConfig) -> cluster.EarlyStart:
    """Start Ray and the validation warm-up in a background thread, for the flow's connect-ray to find later
    (see cluster.start_early). Needs only the configuration: `podium run` calls it before its preflight,
    which then runs while Ray starts (a preflight that fails ends the command, and Ray with it)."""
    return cluster.start_early(required_cpus(config), worker_import_paths(config), warm_up_of(config))
