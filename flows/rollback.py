"""`podium rollback` as a flow run: serving goes back one champion along its history (or to a named version), the
MLflow alias follows, and the Prefect UI shows it beside the runs that promoted."""

from __future__ import annotations

from prefect import flow
from prefect.runtime import flow_run
from prefect.states import Completed

from podium.flows.naming import podium_logs_at_info
from podium.tasks.news import announce_rollback_task
from podium.tasks.rollback import RollbackOutcome, roll_back_task


@flow(name="rollback", flow_run_name="{registered_model}-rollback", log_prints=False)
def rollback(serving: str, tracking_uri: str, registered_model: str, alias: str, model: str,
             to_version: str | None = None, reason: str | None = None) -> RollbackOutcome:
    """Restore the previous champion at `serving` (or `to_version`), atomically, and move `alias` of
    `registered_model` with it; the version left is withdrawn. Announced as `podium.serving.rolled-back`.

    Returns the outcome, its `flow_run_id` this flow run's; the flow run ends Completed, its message what serves
    now. A rollback the history does not allow raises `podium.errors.ServingError`, and the flow run ends Failed."""
    podium_logs_at_info()
    outcome = roll_back_task(serving, tracking_uri, registered_model, alias, to_version, reason)
    if outcome.switched:
        announce_rollback_task(model, registered_model, outcome, reason)
    outcome = outcome.model_copy(update={"flow_run_id": str(flow_run.id) if flow_run.id else None})
    alias_now = f"@{alias} -> version {outcome.mlflow_version}" if outcome.mlflow_version else f"@{alias} not moved"
    said = (f"{serving}: {outcome.from_version} -> {outcome.to_version}" if outcome.switched
            else f"{serving}: {outcome.to_version} is already current") + f"; {alias_now}"
    return Completed(message=said, data=outcome)  # type: ignore[return-value]
