"""Promotion alone, on a run that has already trained and validated."""

from __future__ import annotations

from datetime import datetime, timezone

from prefect import flow
from prefect.runtime import flow_run

from podium import prefect_api
from podium.config import PipelineConfig
from podium.flows.naming import flow_run_namer, podium_logs_at_info, with_deployment_defaults
from podium.flows.summary import RunSummary, hand_off, summarize_run
from podium.tasks.plan import plan_run_task
from podium.tasks.promote import promote_best_checkpoint_task
from podium.tasks.tracking import find_tracking_run_task


@flow(name="promote-run", flow_run_name=flow_run_namer("promote"), log_prints=False)
def promote_run(config: PipelineConfig, tracking_uri: str | None = None,
                mlflow_ui: str | None = None) -> RunSummary:
    """Promote the best validated checkpoint of an existing run if it beats the champion."""
    podium_logs_at_info()
    config = with_deployment_defaults(config)
    config = config.at(flow_run.scheduled_start_time or datetime.now(timezone.utc))  # fills {date} for nightly runs
    with prefect_api.watching():  # Prefect mirrors the promotion and is not on its critical path
        plan = plan_run_task(config)
        tracking = find_tracking_run_task(tracking_uri, config.experiment, config.run_name)
        outcome = promote_best_checkpoint_task(plan, tracking)
        return hand_off(summarize_run(config, tracking, outcome, mlflow_ui))
