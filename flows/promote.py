"""Promotion alone, on a run that has already trained and validated."""

from __future__ import annotations

from datetime import datetime, timezone

from prefect import flow
from prefect.runtime import flow_run

from flows.pipeline import RunSummary
from tasks.plan import plan_run_task
from tasks.promote import promote_best_checkpoint_task
from tasks.report import publish_reports
from tasks.tracking import find_tracking_run_task, list_records
from training.config import PipelineConfig


@flow(name="promote-best-checkpoint", log_prints=False)
def promote_run(config: PipelineConfig, tracking_uri: str | None = None,
                mlflow_ui: str | None = None) -> RunSummary:
    """Promote the best validated checkpoint of an existing run if it beats the champion."""
    config = config.at(flow_run.scheduled_start_time or datetime.now(timezone.utc))  # fills {date} for nightly runs
    plan = plan_run_task(config)
    tracking = find_tracking_run_task(tracking_uri, config.experiment, config.run_name)
    outcome = promote_best_checkpoint_task(plan, tracking)
    records = list_records(tracking)
    publish_reports(config.run_name, tracking, records, outcome, config.promotion.metric, config.promotion.mode,
                    tracking.run_url(mlflow_ui) if mlflow_ui else None)
    return RunSummary(run_name=config.run_name, tracking=tracking, checkpoints=records, promotion=outcome,
                      flow_run_id=str(flow_run.id))
