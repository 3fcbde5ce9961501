"""A checkpoint's verdict carried out, the same way for the pipeline's validation queue
(`podium.flows.validation`) and the flow that validates an announced checkpoint
(`podium.flows.validate_announced`): decided before its validation and after it (`podium.core.verdict`,
through `podium.tasks.validate`), written onto its MLflow record, a failure announced as news.

    before:   carry_out_before(...)    kept, failed, skipped: recorded and announced now; else validate
    validate: the validation task      (podium.tasks.validate: validated and recorded in the task)
    after:    carry_out_result(...)    the task's record: a failure announced
              carry_out_failure(...)   the task raised: failed (recorded, announced), or pending after a stop
"""

from __future__ import annotations

import logging

from podium.core.events import ValidationRequest
from podium.core.records import FAILED, CheckpointRecord
from podium.core.verdict import ValidationOutcome, Verdict
from podium.tasks.news import announce_failed_validation
from podium.tasks.plan import RunPlan
from podium.tasks.validate import verdict_after_validation, verdict_before_validation
from podium.tracking.client import TrackingRun
from podium.tracking.records import record_verdict

logger = logging.getLogger(__name__)


def _record(plan: RunPlan, tracking: TrackingRun, record: CheckpointRecord, verdict: Verdict) -> CheckpointRecord:
    """Write a decided verdict (nothing when it is not new) and announce a failure."""
    done = record_verdict(tracking, record, verdict)
    if verdict.to_record and verdict.status == FAILED:
        announce_failed_validation(plan, done)
    return done


def carry_out_before(plan: RunPlan, tracking: TrackingRun, record: CheckpointRecord,
                     request: ValidationRequest | None = None) -> tuple[Verdict, CheckpointRecord]:
    """A checkpoint as it is announced: its verdict, and its record as it stands. A verdict that needs no
    validation (kept, failed at once, skipped) is carried out now; with `verdict.validate` the caller
    starts the validation task."""
    verdict = verdict_before_validation(plan, record, request)
    if verdict.validate:
        return verdict, record
    if verdict.to_record:
        log = logger.warning if verdict.status == FAILED else logger.info
        log("checkpoint step %d %s: %s", record.step, verdict.status, verdict.reason)
    return verdict, _record(plan, tracking, record, verdict)


def carry_out_result(plan: RunPlan, validated: CheckpointRecord) -> CheckpointRecord:
    """The record a validation task returned (its verdict written by the task): a failure (the function
    returned no metric, or one that is not a number) is announced."""
    if validated.status == FAILED:
        announce_failed_validation(plan, validated)
    return validated


def carry_out_failure(plan: RunPlan, tracking: TrackingRun, record: CheckpointRecord, exc: BaseException,
                      stopped: bool = False) -> tuple[Verdict, CheckpointRecord]:
    """A validation task that raised after its retries: failed, with the error (recorded, announced); or,
    `stopped` (the run was asked to stop), no verdict: the record stays pending, to be validated on resume."""
    verdict = verdict_after_validation(plan, record, ValidationOutcome.raised(exc, stopped))
    if verdict.to_record:
        logger.warning("validation of step %d (%s) failed: %s", record.step, record.uri, verdict.reason)
    return verdict, _record(plan, tracking, record, verdict)
