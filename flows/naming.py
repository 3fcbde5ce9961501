"""What a flow run of podium's looks like in Prefect, whoever starts it: its name (`<run name>-run` for a
training run, `<run name>-promote` for a promotion, the run name's `{date}` filled for the run's scheduled
start), podium's own lines in its log, and a `config` parameter that names only some settings merged over
the deployment's own.

`podium run` names its flow run the same way (`podium.cli.run`) and sets the log level itself; a deployment's
run (a schedule, a worker, `prefect deployment run`) gets both from here."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TypeVar, cast

from prefect.runtime import deployment, flow_run
from prefect.utilities.annotations import opaque, quote

from podium import prefect_api
from podium.config import PipelineConfig, merge
from podium.settings import PodiumSettings

T = TypeVar("T")


def context(value: T) -> T:
    """A task input that is context, not data the task waits for (the run's plan, its MLflow run): Prefect draws an
    edge in the run's graph from the task that returned an input to each task it is passed to, and the MLflow run
    opened once and passed to every task drew a fan of edges from `open-tracking-run`. `quote` passes the value
    as it is, and Prefect draws no edge for it (prefect.utilities.annotations.quote)."""
    return cast(T, quote(value))


def whole(value: T) -> T:
    """A task's result passed on as one thing: Prefect draws the edge from the task that returned it, not one from
    each task whose result shares a piece of it (it links the strings and dicts inside a result to that result's
    task, by identity: the run name and a checkpoint's URI inside the promotion outcome drew edges from
    `open-tracking-run` and the last validation). `opaque` resolves the value without looking inside it."""
    return cast(T, opaque(value))


def _started_at() -> datetime:
    return flow_run.scheduled_start_time or datetime.now(timezone.utc)


def run_config(config: PipelineConfig) -> PipelineConfig:
    """The config a podium flow run works with: `config` with the deployment's own config under it, and the run
    name's `{date}` filled for the run's scheduled start.

    A run of a deployment started with a `config` that names only some settings (`--param config='{"run_name":
    "night-3"}'`) keeps the deployment's for the rest: Prefect replaces a parameter whole; the settings a run
    names win. Without a deployment, `config` as is. The flow's name and its body each ask (the same answer: the
    deployment's parameters and the run's scheduled start do not change)."""
    defaults = prefect_api.deployment_parameter("config")
    given = prefect_api.flow_run_parameter("config")  # what the run was started with, before validation
    if isinstance(defaults, dict) and isinstance(given, dict):
        config = PipelineConfig.model_validate(merge(defaults, given))
    return config.at(_started_at())


def flow_run_namer(suffix: str) -> Callable[[], str]:
    """A `flow_run_name` callable for a flow whose `config` parameter is a PipelineConfig (Prefect validates the
    parameters before it names the run)."""

    def name() -> str:
        config: PipelineConfig = flow_run.parameters["config"]
        try:
            config = run_config(config)
        except ValueError:  # invalid once merged: the flow's body fails with it; the name keeps the run's own
            pass
        return f"{config.at(_started_at()).run_name}-{suffix}"

    return name


def podium_logs_at_info() -> None:
    """podium's INFO records (progress, verdicts, the promotion decision) pass its logger, and a deployment's run
    writes them to the project's log file (`<PODIUM_HOME>/logs/podium.log`) as `podium run` does. Prefect's
    PREFECT_LOGGING_EXTRA_LOGGERS gives the `podium` logger the API handler but not a level, and the root's
    WARNING would drop them before they reach the flow run's log; a worker's flow run has no file handler."""
    podium_logger = logging.getLogger("podium")
    if podium_logger.level == logging.NOTSET:
        podium_logger.setLevel(logging.INFO)
    if deployment.id is None:
        return  # `podium run` (its own file handler), or a flow called in a test or a notebook
    log_file = os.path.abspath(PodiumSettings().home_dir / "logs" / "podium.log")
    handlers = [*logging.getLogger().handlers, *podium_logger.handlers]
    if any(isinstance(h, logging.FileHandler) and h.baseFilename == log_file for h in handlers):
        return  # `podium run`'s own, on the root logger
    try:
        os.makedirs(os.path.dirname(log_file), exist_ok=True)
        handler = logging.FileHandler(log_file)
    except OSError as exc:  # the Prefect log has the lines anyway
        podium_logger.warning("cannot write podium's log file %s: %s", log_file, exc)
        return
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    podium_logger.addHandler(handler)
