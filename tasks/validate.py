"""Validation of one checkpoint: a Ray task with its own resources, metrics merged onto the MLflow record."""

from __future__ import annotations

import logging
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from podium.selection import CheckpointRecord
from podium.tasks.plan import RunPlan
from podium.tracking.client import TrackingRun, TrackingUnavailable
from podium.tracking.records import merge_validation
from podium.training import raytrain

logger = logging.getLogger(__name__)


def validate(plan: RunPlan, record: CheckpointRecord, uri: str | None = None) -> dict[str, float]:
    """Run the configured validation function on a checkpoint (by default the record's) on Ray."""
    v = plan.config.validation
    kwargs = {**plan.validate_kwargs, "step": record.step}
    return raytrain.validate_remote(v.fn, uri or record.uri, kwargs, num_cpus=v.num_cpus,
                                    num_gpus=v.num_gpus, resources=v.resources, timeout_s=v.timeout_s)


def validate_and_record(plan: RunPlan, tracking: TrackingRun, record: CheckpointRecord) -> CheckpointRecord:
    """Validate a checkpoint and merge its metrics onto its MLflow record."""
    return merge_validation(tracking, record, validate(plan, record))


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
