"""Validation of one checkpoint: a Ray task with its own resources, metrics merged onto the MLflow record."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from podium.core.events import ValidationRequest, ValidationResult
from podium.core.records import FAILED, PENDING, CheckpointRecord
from podium.core.verdict import ValidationOutcome, Verdict, decide_verdict
from podium.errors import TrackingUnavailable
from podium.imports import resolve_callable
from podium.tasks.plan import RunPlan
from podium.tracking.client import TrackingRun
from podium.tracking.records import record_verdict
from podium.training import validation_call

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


def argument_names(plan: RunPlan, request: ValidationRequest | None) -> tuple[str, ...]:
    """The names of the user's arguments for a checkpoint's validation: validation.kwargs, with the
    report's fn_kwargs over them (as Ray merges them)."""
    return tuple({**plan.config.validation.kwargs, **(request.fn_kwargs if request else {})})


def unfilled_arguments(plan: RunPlan, names: tuple[str, ...]) -> list[str]:
    """Required parameters of the validation function that neither podium nor the user's arguments
    (`names`) fill (checked before the task starts: it would fail with a TypeError)."""
    fn = resolve_callable(plan.config.validation.fn, "validation.fn")
    return validation_call.missing_arguments(fn, [*plan.validate_kwargs, "step", "per_row", *names])


def verdict_before_validation(plan: RunPlan, record: CheckpointRecord,
                              request: ValidationRequest | None = None) -> Verdict:
    """The verdict on a checkpoint as it is announced (`podium.core.verdict.decide_verdict`): kept, failed,
    skipped, or to be validated (`verdict.validate`)."""
    names = argument_names(plan, request)
    asked = record.status == PENDING and (request is None or request.requested)
    return decide_verdict(step=record.step, metric=plan.policy.metric, status=record.status,
                          training=record.metrics, request=request, validation_fn=plan.config.validation.fn,
                          missing_arguments=unfilled_arguments(plan, names) if asked else (), given_arguments=names)


def verdict_after_validation(plan: RunPlan, record: CheckpointRecord, outcome: ValidationOutcome) -> Verdict:
    """The verdict on a checkpoint once its validation has ended (`podium.core.verdict.decide_verdict`)."""
    return decide_verdict(step=record.step, metric=plan.policy.metric, training=record.metrics,
                          outcome=outcome)


def validate(plan: RunPlan, record: CheckpointRecord, uri: str | None = None,
             arguments: ReportArguments | None = None, per_row: bool = False) -> ValidationResult:
    """Run the configured validation function on a checkpoint (by default the record's) on Ray, with the
    arguments its report sent (else validation.kwargs); `per_row` asks it for per-row values too."""
    v = plan.config.validation
    facts = {**plan.validate_kwargs, "step": record.step, "per_row": per_row}
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
    verdict = verdict_after_validation(plan, record, ValidationOutcome(result.metrics, result.non_numeric))
    if verdict.status == FAILED:
        logger.warning("checkpoint step %d failed validation: %s", record.step, verdict.reason)
    return record_verdict(tracking, record, verdict, None if arguments else plan.data.get("val"))


@task(name="validate-and-record", cache_policy=NO_CACHE)
def validate_and_record_task(plan: RunPlan, tracking: TrackingRun, record: CheckpointRecord,
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
    return validate_and_record_task.with_options(
        task_run_name=f"validate-step-{record.step}", retries=v.retries, retry_delay_seconds=v.retry_delay_s,
        retry_condition_fn=retry_unless_tracking_down,
    )
