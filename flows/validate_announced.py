"""Validate one checkpoint persisted outside a podium flow: record it in MLflow, validate it on Ray.

A training job of its own (a Ray job with podium's `CheckpointAnnouncer` and a
`PrefectEventSink`) announces each checkpoint as a `podium.checkpoint.persisted`
event; the checkpoint-validation deployment turns each event into one run of
this flow, with the event's payload (`CheckpointPayload`) as its `checkpoint` parameter. The record and the
verdict are the same as those of a checkpoint validated inside the pipeline.
"""

from __future__ import annotations

from prefect import flow
from prefect.concurrency.sync import concurrency
from prefect.runtime import flow_run

from podium.config import PipelineConfig
from podium.core.events import CheckpointPayload
from podium.core.records import CheckpointRecord
from podium.flows.naming import context
from podium.progress import say
from podium.tasks.plan import plan_run_task
from podium.tasks.tracking import open_tracking_run_task, record_checkpoint_task
from podium.tasks.train import connect_ray_task
from podium.tasks.validate import validation_task
from podium.tasks.verdicts import carry_out_before, carry_out_failure, carry_out_result
from podium.tracking.client import TrackingUnavailable

# A global concurrency limit of 1 (created by `python -m podium.deployments deploy|serve`): finding or
# creating an MLflow run and a checkpoint's record is search-then-create, so two validations of the
# same run starting together would otherwise both create them.
RECORD_LOCK = "podium-checkpoint-records"


def flow_run_name() -> str:
    """`<run name>-validate-step-<step>`, from the announced checkpoint (a dict when the run came from a deployment's
    trigger, a CheckpointPayload when the flow was called)."""
    checkpoint = flow_run.parameters["checkpoint"]
    fields = checkpoint if isinstance(checkpoint, dict) else vars(checkpoint)
    return f"{fields['run_name']}-validate-step-{fields['step']}"


@flow(name="validate-announced-checkpoint", flow_run_name=flow_run_name, log_prints=False)
def validate_announced_checkpoint(
    config: PipelineConfig,
    checkpoint: CheckpointPayload,
    tracking_uri: str | None = None,
) -> CheckpointRecord:
    """Record an announced checkpoint (the payload of its `podium.checkpoint.persisted` event) in MLflow under
    its run (idempotent) and validate it with `config`'s validation settings, unless it already has a verdict:
    the verdict is decided and carried out as in the pipeline (`podium.tasks.verdicts`);
    `validation_requested=False` (the report's `validation=False`) records it as skipped. A validation that
    fails after its retries marks the checkpoint failed (with the reason) and fails this flow run; one whose
    verdict could not be written (tracking server unreachable) fails the flow run and leaves the checkpoint
    pending."""
    event = checkpoint.event()
    if not event.has_checkpoint:
        raise ValueError(f"the announcement of step {event.step} of run {event.run_name!r} names no checkpoint "
                         "(checkpoint_uri is empty): expected the URI of a persisted checkpoint")
    run_name, step = event.run_name, event.step
    config = PipelineConfig.model_validate({**config.model_dump(), "run_name": run_name})
    plan = plan_run_task(config)
    with concurrency(RECORD_LOCK, occupy=1, strict=False):
        tracking = open_tracking_run_task(tracking_uri, config.experiment, run_name,
                                          config.model_dump(mode="json"))
        record = record_checkpoint_task(context(tracking), event)
    verdict, record = carry_out_before(plan, tracking, record, event.validation)
    if verdict.unchanged:
        say("checkpoint step %d of %s is already %s: not validated again", step, run_name, record.status)
        return record
    if not verdict.validate:
        say("checkpoint step %d of %s %s: %s", step, run_name, record.status, verdict.reason)
        return record
    connect_ray_task(context(plan))
    try:
        record = carry_out_result(plan, validation_task(plan, record)(context(plan), context(tracking), record))
    except TrackingUnavailable:
        raise  # validated, but the verdict could not be written: it stays pending, to be validated again
    except Exception as exc:
        carry_out_failure(plan, tracking, record, exc)
        raise
    say("checkpoint step %d of %s %s: %s", step, run_name, record.status, record.failure or record.metrics)
    return record
