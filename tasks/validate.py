"""Validation of one checkpoint: a Ray task with its own resources, metrics merged onto the MLflow record."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from podium.imports import resolve_callable
from podium.selection import CheckpointRecord, judge_training, judge_validation
from podium.tasks.plan import RunPlan
from podium.tracking.client import TrackingRun, TrackingUnavailable
from podium.tracking.records import mark_failed, merge_validation
from podium.training import validation_call
from podium.training.events import ValidationRequest, ValidationResult

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReportArguments:
    """A checkpoint's validation as its report asked: the user's arguments (validation.kwargs with the
    report's fn_kwargs over them, as Ray merges them), kept in Ray's object store, and its timeout."""

    ref: Any  # a Ray ObjectRef to the arguments dict: never the arguments themselves (a dataset)
    names: tuple[str, ...]
    timeout_s: float | None = None


def report_arguments(plan: RunPlan, request: ValidationRequest | None) -> ReportArguments | None:
    """The arguments a report sent for its checkpoint's validation, put in Ray's object store once;
    None when it sent none (validation.kwargs are then used as they are)."""
    if request is None or (not request.fn_kwargs and request.timeout_s is None):
        return None
    user = {**plan.config.validation.kwargs, **request.fn_kwargs}
    return ReportArguments(validation_call.keep_arguments(user), tuple(user), request.timeout_s)


def unfilled_arguments(plan: RunPlan, arguments: ReportArguments | None) -> list[str]:
    """Required parameters of the validation function that neither podium, validation.kwargs nor the
    report's fn_kwargs fill (checked before the task starts: it would fail with a TypeError)."""
    fn = resolve_callable(plan.config.validation.fn, "validation.fn")
    user = arguments.names if arguments else tuple(plan.config.validation.kwargs)
    return validation_call.missing_arguments(fn, [*plan.validate_kwargs, "step", *user])


def validate(plan: RunPlan, record: CheckpointRecord, uri: str | None = None,
             arguments: ReportArguments | None = None) -> ValidationResult:
    """Run the configured validation function on a checkpoint (by default the record's) on Ray, with the
    arguments its report sent (else validation.kwargs)."""
    v = plan.config.validation
    facts = {**plan.validate_kwargs, "step": record.step}
    user = arguments.ref if arguments else dict(v.kwargs)
    timeout_s = arguments.timeout_s if arguments and arguments.timeout_s else v.timeout_s
    return validation_call.validate_remote(v.fn, uri or record.uri, facts, user, num_cpus=v.num_cpus,
                                           num_gpus=v.num_gpus, resources=v.resources, timeout_s=timeout_s)


def validate_and_record(plan: RunPlan, tracking: TrackingRun, record: CheckpointRecord,
                        arguments: ReportArguments | None = None) -> CheckpointRecord:
    """Validate a checkpoint and record the verdict with the exact metrics: validated, or failed with the
    reason when a value is not a finite number or the promotion metric is missing (a decision, not an
    error: it is not retried). Validated metrics name the data they were measured on: data.val, by
    digest, unless the report sent arguments of its own (which may name other data: unknown then)."""
    result = validate(plan, record, arguments=arguments)
    failure = judge_validation(result.metrics, result.non_numeric, record.metrics, plan.config.promotion.metric)
    if failure is not None:
        logger.warning("checkpoint step %d failed validation: %s", record.step, failure)
        return mark_failed(tracking, record, failure, result.metrics)
    return merge_validation(tracking, record, result.metrics, None if arguments else plan.data.get("val"))


def fail_if_diverged(tracking: TrackingRun, record: CheckpointRecord) -> CheckpointRecord | None:
    """A pending checkpoint whose training metrics are not finite is failed without being validated
    (its weights have diverged); returns the failed record, or None if the checkpoint is to be validated."""
    failure = judge_training(record.metrics, record.step)
    if failure is None:
        return None
    logger.warning("checkpoint step %d: %s", record.step, failure)
    return mark_failed(tracking, record, failure)


@task(name="validate-checkpoint", cache_policy=NO_CACHE)
def validate_checkpoint(plan: RunPlan, tracking: TrackingRun, record: CheckpointRecord,
                        arguments: ReportArguments | None = None) -> CheckpointRecord:
    """Validate one checkpoint on Ray and record its metrics in MLflow (retried per the config)."""
    return validate_and_record(plan, tracking, record, arguments)


def retry_unless_tracking_down(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect retry condition: a validation that raised is retried, one whose metrics could not be
    written is not (MLflow's client has already retried the write for its whole window, and running
    the validation again would not bring the server back), nor one stopped because the run stops."""
    return not isinstance(state.data, (TrackingUnavailable, validation_call.ValidationStopped))


def validation_task(plan: RunPlan, record: CheckpointRecord):
    """The validation task for one checkpoint, named after its step, with the configured retries."""
    v = plan.config.validation
    return validate_checkpoint.with_options(
        task_run_name=f"validate-step-{record.step}", retries=v.retries, retry_delay_seconds=v.retry_delay_s,
        retry_condition_fn=retry_unless_tracking_down,
    )
