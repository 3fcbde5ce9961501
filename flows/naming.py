"""What a flow run of podium's looks like in Prefect, whoever starts it: its name (`<run name>-run` for a
training run, `<run name>-promote` for a promotion, the run name's `{date}` filled for the run's scheduled
start) and podium's own lines in its log.

`podium run` names its flow run the same way (`podium.cli.run`) and sets the log level itself; a deployment's
run (a schedule, a worker, `prefect deployment run`) gets both from here."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timezone

from prefect.runtime import flow_run

from podium.config import PipelineConfig, expand_run_name


def flow_run_namer(suffix: str) -> Callable[[], str]:
    """A `flow_run_name` callable for a flow whose `config` parameter is a PipelineConfig (or its dict)."""

    def name() -> str:
        config = flow_run.parameters.get("config")
        raw = config.get("run_name") if isinstance(config, dict) else getattr(config, "run_name", None)
        template = raw or PipelineConfig.model_fields["run_name"].default
        return f"{expand_run_name(template, flow_run.scheduled_start_time or datetime.now(timezone.utc))}-{suffix}"

    return name


def podium_logs_at_info() -> None:
    """podium's INFO records (progress, verdicts, the promotion decision) pass its logger. Prefect's
    PREFECT_LOGGING_EXTRA_LOGGERS gives the `podium` logger the API handler but not a level, and the root's
    WARNING would drop them before they reach the flow run's log."""
    podium_logger = logging.getLogger("podium")
    if podium_logger.level == logging.NOTSET:
        podium_logger.setLevel(logging.INFO)
