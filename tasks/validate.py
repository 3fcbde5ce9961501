"""Validation of one checkpoint: a Ray task with its own resources, metrics merged onto the MLflow record."""

from __future__ import annotations

import logging
from collections import deque
from concurrent.futures import wait
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture

from tasks.plan import RunPlan
from tasks.selection import PENDING, CheckpointRecord
from tasks.tracking import (
    TrackingRun,
    TrackingUnavailable,
    mark_failed,
    merge_validation,
    record_checkpoints_task,
)
from tasks.train import missed_checkpoints
from training import raytrain

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


class ValidationQueue:
    """Validation task runs for announced checkpoints, at most `concurrency` at once.

    The flow adds records as they are announced and calls `pump` while training
    runs; a validation that fails after its retries marks its checkpoint failed
    in MLflow (with the reason) and never stops training.

    A verdict that could not be written (the tracking server stayed unreachable
    through the client's retries) is no verdict: the checkpoint stays pending in
    MLflow, is never marked failed for it, and is validated again when the run
    resumes. `pump` raises that `TrackingUnavailable` once every finished
    validation has been collected.
    """

    def __init__(self, plan: RunPlan, tracking: TrackingRun):
        self.plan, self.tracking = plan, tracking
        self.concurrency = plan.config.validation.concurrency
        self.pending: deque[CheckpointRecord] = deque()
        self.running: dict[int, tuple[CheckpointRecord, PrefectFuture]] = {}
        self.done: dict[int, CheckpointRecord] = {}
        self.unrecorded: dict[int, CheckpointRecord] = {}  # validated, but the verdict could not be written

    def add(self, record: CheckpointRecord) -> None:
        """Queue a checkpoint; one already validated or failed (a resumed run) is not validated again."""
        if record.step in self.done or record.step in self.running or any(r.step == record.step for r in self.pending):
            return
        if record.status != PENDING:
            self.done[record.step] = record
        else:
            self.pending.append(record)
        self.pump()

    def catch_up(self, seen: set[str]) -> list[CheckpointRecord]:
        """Queue the checkpoints Ray Train persisted for this run that this flow was never told about
        (adding their names to `seen`); records are created only where missing."""
        events = missed_checkpoints(self.plan, seen)
        seen.update(e.checkpoint_name for e in events)
        records = record_checkpoints_task(self.tracking, events) if events else []
        for record in records:
            logger.info("checkpoint step %d found in storage (%s)", record.step, record.status)
            self.add(record)
        return records

    def pump(self, start: bool = True) -> None:
        """Collect finished validations and (unless `start` is false) start queued ones up to the
        concurrency. Raises TrackingUnavailable if a verdict could not be written."""
        unreachable: TrackingUnavailable | None = None
        for step, (record, future) in list(self.running.items()):
            if not future.wrapped_future.done():
                continue
            del self.running[step]
            try:
                try:
                    self.done[step] = future.result()
                except TrackingUnavailable:
                    raise  # validated, but the verdict could not be written
                except BaseException as exc:  # the validation failed after its retries
                    reason = f"{type(exc).__name__}: {exc}"
                    logger.warning("validation of step %d failed: %s", step, reason)
                    self.done[step] = mark_failed(self.tracking, record, reason)
            except TrackingUnavailable as exc:
                unreachable = unreachable or exc
                self.unrecorded[step] = record
        if unreachable is not None:
            logger.warning("%s; %d checkpoint(s) stay pending: %s", unreachable, len(self.unrecorded),
                           sorted(self.unrecorded))
            raise unreachable
        while start and self.pending and len(self.running) < self.concurrency:
            record = self.pending.popleft()
            self.running[record.step] = (record, validation_task(self.plan, record).submit(
                self.plan, self.tracking, record))

    @property
    def validated(self) -> int:
        """How many checkpoints have a verdict (validated or failed)."""
        return len(self.done)

    def finish(self, poll_s: float = 0.1) -> list[CheckpointRecord]:
        """Wait for every queued and running validation; returns all records by step."""
        while self.pending or self.running:
            self.pump()
            if self.running:
                wait([f.wrapped_future for _, f in self.running.values()], timeout=poll_s, return_when="FIRST_COMPLETED")
        return [self.done[s] for s in sorted(self.done)]

    def abandon(self, poll_s: float = 0.1) -> None:
        """The run is failing: start nothing more, wait for the validations already running and
        record their verdicts where the tracking server answers (the rest stay pending)."""
        self.pending.clear()
        while self.running:
            try:
                self.pump(start=False)
            except TrackingUnavailable:
                pass  # already logged; those checkpoints are validated again when the run resumes
            if self.running:
                wait([f.wrapped_future for _, f in self.running.values()], timeout=poll_s,
                     return_when="FIRST_COMPLETED")

    def wind_down(self, validate_queued: bool) -> None:
        """The run is failing. With `validate_queued` (the tracking server answers), every queued
        checkpoint still gets its verdict; otherwise, or once the server stops answering, only the
        running validations are awaited."""
        if validate_queued:
            try:
                self.finish()
                return
            except TrackingUnavailable:
                pass
        self.abandon()
