"""Orchestration state: the validations of a run's checkpoints, at most `concurrency` at once."""

from __future__ import annotations

import logging
from collections import deque
from concurrent.futures import wait
from typing import cast

from prefect.futures import PrefectConcurrentFuture

from podium.selection import PENDING, CheckpointRecord
from podium.tasks.plan import RunPlan
from podium.tasks.tracking import record_checkpoints_task
from podium.tasks.train import missed_checkpoints
from podium.tasks.validate import fail_if_diverged, validation_task
from podium.tracking.client import TrackingRun, TrackingUnavailable
from podium.tracking.records import mark_failed

logger = logging.getLogger(__name__)

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
        self.running: dict[int, tuple[CheckpointRecord, PrefectConcurrentFuture]] = {}
        self.done: dict[int, CheckpointRecord] = {}
        self.unrecorded: dict[int, CheckpointRecord] = {}  # validated, but the verdict could not be written

    def add(self, record: CheckpointRecord) -> None:
        """Queue a checkpoint; one already validated or failed (a resumed run) is not validated again, and
        one whose training metrics are not finite is failed at once."""
        if record.step in self.done or record.step in self.running or any(r.step == record.step for r in self.pending):
            return
        if record.status != PENDING:
            self.done[record.step] = record
        elif (failed := fail_if_diverged(self.tracking, record)) is not None:
            self.done[record.step] = failed
        else:
            self.pending.append(record)
        self.pump()

    def catch_up(self, seen: set[str]) -> list[CheckpointRecord]:
        """Queue the checkpoints Ray Train persisted for this run that this flow was never told about
        (adding their names to `seen`); records are created only where missing."""
        events = missed_checkpoints(self.plan, seen)
        seen.update(e.checkpoint_name for e in events if e.checkpoint_name)
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
            future = validation_task(self.plan, record).submit(self.plan, self.tracking, record)
            self.running[record.step] = (record, cast(PrefectConcurrentFuture, future))  # the flow's thread pool

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
