"""Validation of one checkpoint: a Ray task with its own resources, metrics merged onto the MLflow record."""

from __future__ import annotations

import logging
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from podium.selection import CheckpointRecord, judge_training, judge_validation
from podium.tasks.plan import RunPlan
from podium.tracking.client import TrackingRun, TrackingUnavailable
from podium.tracking.records import mark_failed, merge_validation
from podium.training import raytrain
from podium.training.events import ValidationResult

logger = logging.getLogger(__name__)


def validate(plan: RunPlan, record: CheckpointRecord, uri: str | None = None) -> ValidationResult:
    """Run the configured validation function on a checkpoint (by default the record's) on Ray."""
    v = plan.config.validation
    kwargs = {**plan.validate_kwargs, "step": record.step}
    return raytrain.validate_remote(v.fn, uri or record.uri, kwargs, num_cpus=v.num_cpus,
                                    num_gpus=v.num_gpus, resources=v.resources, timeout_s=v.timeout_s)


def validate_and_record(plan: RunPlan, tracking: TrackingRun, record: CheckpointRecord) -> CheckpointRecord:
    """Validate a checkpoint and record the verdict with the exact metrics: validated, or failed with the
    reason when a value is not a finite number or the promotion metric is missing (a decision, not an
    error: it is not retried)."""
    result = validate(plan, record)
    failure = judge_validation(result.metrics, result.non_numeric, record.metrics, plan.config.promotion.metric)
    if failure is not None:
        logger.warning("checkpoint step %d failed validation: %s", record.step, failure)
        return mark_failed(tracking, record, failure, result.metrics)
    return merge_validation(tracking, record, result.metrics)


def fail_if_diverged(tracking: TrackingRun, record: CheckpointRecord) -> CheckpointRecord | None:
    """A pending checkpoint whose training metrics are not finite is failed without being validated
    (its weights have diverged); returns the failed record, or None if the checkpoint is to be validated."""
    failure = judge_training(record.metrics, record.step)
    if failure is None:
        return None
    logger.warning("checkpoint step %d: %s", record.step, failure)
    return mark_failed(tracking, record, failure)


@task(name="validate-checkpoint", cache_policy=NO_CACHE)
def validate_checkpoint(plan: RunPlan, tracking: TrackingRun, record: CheckpointRecord) -> CheckpointRecord:
    """Validate one checkpoint on Ray and record its metrics in MLflow (retried per the config)."""
    return validate_and_record(plan, tracking, record)


def retry_unless_tracking_down(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect retry condition: a validation that raised is retried, one whose metrics could not be
    written is not (MLflow's client has already retried the write for its whole window, and running
    the validation again would not bring the server back)."""
    return not isinstance(state.data, TrackingUnavailable)


def validation_task(plan: RunPlan, record: CheckpointRecord):
    """The validation task for one checkpoint, named after its step, with the configured retries."""
    v = plan.config.validation
    return validate_checkpoint.with_options(
        task_run_name=f"validate-step-{record.step}", retries=v.retries, retry_delay_seconds=v.retry_delay_s,
        retry_condition_fn=retry_unless_tracking_down,
    )
