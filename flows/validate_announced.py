"""Validate one checkpoint persisted outside a podium flow: record it in MLflow, validate it on Ray.

A training job of its own (a Ray job with podium's `CheckpointAnnouncer` and a
`PrefectEventSink`) announces each checkpoint as a `podium.checkpoint.persisted`
event; the checkpoint-validation deployment turns each event into one run of
this flow, with the checkpoint's URI and step as parameters. The record and the
verdict are the same as those of a checkpoint validated inside the pipeline.
"""

from __future__ import annotations

import math

from prefect import flow
from prefect.concurrency.sync import concurrency

from podium.config import PipelineConfig
from podium.core.events import CheckpointEvent, ValidationRequest
from podium.core.records import CheckpointRecord
from podium.core.verdict import ValidationOutcome
from podium.tasks.plan import plan_run_task
from podium.tasks.report import say
from podium.tasks.tracking import open_tracking_run_task, record_checkpoint_task
from podium.tasks.train import connect_ray_task
from podium.tasks.validate import validation_task, verdict_after_validation, verdict_before_validation
from podium.tracking.client import TrackingUnavailable
from podium.tracking.records import record_verdict

# A global concurrency limit of 1 (created by `python -m podium.deployments deploy|serve`): finding or
# creating an MLflow run and a checkpoint's record is search-then-create, so two validations of the
# same run starting together would otherwise both create them.
RECORD_LOCK = "podium-checkpoint-records"


@flow(name="validate-announced-checkpoint", flow_run_name="{run_name}-validate-step-{step}", log_prints=False)
def validate_announced_checkpoint(
    config: PipelineConfig,
    run_name: str,
    checkpoint_uri: str,
    checkpoint_name: str,
    step: int,
    metrics: dict[str, float | None] | None = None,
    epoch: int | None = None,
    tracking_uri: str | None = None,
    validation_requested: bool | None = None,
) -> CheckpointRecord:
    """Record a checkpoint of run `run_name` in MLflow (idempotent) and validate it with `config`'s
    validation settings, unless it already has a verdict: the verdict is decided as in the pipeline
    (`podium.core.verdict`), `validation_requested=False` (the report's `validation=False`) records it
    as skipped. A validation that fails after its retries marks the checkpoint failed (with the reason)
    and fails this flow run; one whose verdict could not be written (tracking server unreachable) fails
    the flow run and leaves the checkpoint pending."""
    config = PipelineConfig.model_validate({**config.model_dump(), "run_name": run_name})
    plan = plan_run_task(config)
    # Prefect's event JSON turns NaN and infinities into null: a null training metric was not finite
    numbers = {k: math.nan if v is None else v for k, v in (metrics or {}).items()}
    event = CheckpointEvent(run_name=run_name, step=step, metrics=numbers, checkpoint_uri=checkpoint_uri,
                            checkpoint_name=checkpoint_name, epoch=epoch)
    with concurrency(RECORD_LOCK, occupy=1, strict=False):
        tracking = open_tracking_run_task(tracking_uri, config.experiment, run_name,
                                          config.model_dump(mode="json"))
        record = record_checkpoint_task(tracking, event)
    request = None if validation_requested is None else ValidationRequest(requested=validation_requested, stated=True)
    verdict = verdict_before_validation(plan, record, request)
    if verdict.unchanged:
        say("checkpoint step %d of %s is already %s: not validated again", step, run_name, record.status)
        return record
    if not verdict.validate:
        record = record_verdict(tracking, record, verdict)
        say("checkpoint step %d of %s %s: %s", step, run_name, record.status, verdict.reason)
        return record
    connect_ray_task(plan)
    try:
        record = validation_task(plan, record)(plan, tracking, record)
    except TrackingUnavailable:
        raise  # validated, but the verdict could not be written: it stays pending, to be validated again
    except Exception as exc:
        record_verdict(tracking, record, verdict_after_validation(plan, record, ValidationOutcome.raised(exc)))
        raise
    say("checkpoint step %d of %s %s: %s", step, run_name, record.status, record.failure or record.metrics)
    return record
