"""Orchestration state: the validations of a run's checkpoints, at most `concurrency` at once."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Collection
from concurrent.futures import wait
from dataclasses import replace
from typing import cast

from prefect.futures import PrefectConcurrentFuture

from podium.config import ConfigError
from podium.core.events import ValidationRequest
from podium.core.failures import plain_text
from podium.core.policy import unknown_policy_metrics
from podium.core.records import FAILED, PENDING, SKIPPED, VALIDATED, CheckpointRecord
from podium.flows.naming import context, whole
from podium.progress import say
from podium.tasks.plan import RunPlan
from podium.tasks.retention import keep_best_checkpoints
from podium.tasks.tracking import record_checkpoints_task
from podium.tasks.train import missed_checkpoints
from podium.tasks.validate import ReportArguments, report_arguments, validation_task
from podium.tasks.verdicts import carry_out_before, carry_out_failure, carry_out_result
from podium.tracking.client import TrackingRun, TrackingUnavailable
from podium.training.validation_call import (
    ValidationStopped,
    accept_validations,
    cancel_validations,
    refuse_new_validations,
)

logger = logging.getLogger(__name__)


class PolicyCannotBeMet(ConfigError):
    """The promotion policy names a metric the validation function does not return: known at its first result."""


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

    Checkpoints are told apart by their URI, never by step: two checkpoints of one
    run can carry the same step (a loop that restarts its epoch count).
    """

    def __init__(self, plan: RunPlan, tracking: TrackingRun):
        self.plan, self.tracking = plan, tracking
        self.concurrency = plan.config.validation.concurrency
        self.pending: deque[tuple[CheckpointRecord, ReportArguments | None]] = deque()
        self.running: dict[str, tuple[CheckpointRecord, PrefectConcurrentFuture]] = {}
        self.done: dict[str, CheckpointRecord] = {}
        self.unrecorded: dict[str, CheckpointRecord] = {}  # validated, but the verdict could not be written
        self.stopped: dict[str, CheckpointRecord] = {}  # its validation ended with a stop: pending for the resume
        self.check_stop: Callable[[], None] = lambda: None  # raises where the run is asked to stop (flows.stop)
        self.failure_shown = False  # the user's traceback of a failed validation is shown once
        self.stopping: Callable[[], bool] = lambda: False  # a stop was asked for: a failure now is no verdict
        self.policy_checked = False  # the policy's metric names were checked on the function's first result
        accept_validations()  # an earlier run in this process may have stopped

    def add(self, record: CheckpointRecord, request: ValidationRequest | None = None) -> None:
        """Queue a checkpoint as its report asked (`request`; None: validate with validation.kwargs).

        One that already has a verdict (a resumed run) is not validated again; one whose training
        metrics are not finite is failed at once; one whose report said `validation=False` is recorded
        as skipped; one whose report left a required argument of the validation function unfilled is
        failed at once, naming it."""
        key = record.uri
        if key in self.done or key in self.running or any(r.uri == key for r, _ in self.pending):
            return
        verdict, settled = carry_out_before(self.plan, self.tracking, record, request)
        if verdict.validate:
            self.pending.append((record, report_arguments(self.plan, request)))
        else:
            self.done[key] = settled
        self.pump()

    def catch_up(self, seen: set[str]) -> list[CheckpointRecord]:
        """Queue the checkpoints Ray Train persisted for this run that this flow was never told about
        (adding their names to `seen`); records are created only where missing."""
        events = missed_checkpoints(self.plan, seen)
        seen.update(e.checkpoint_name for e in events if e.checkpoint_name)
        records = record_checkpoints_task(context(self.tracking), events) if events else []
        for record in records:
            logger.info("checkpoint step %d found in storage (%s)", record.step, record.status)
            self.add(record)
        return records

    def pump(self, start: bool = True) -> None:
        """Collect finished validations and (unless `start` is false) start queued ones up to the
        concurrency. Raises TrackingUnavailable if a verdict could not be written."""
        unreachable: TrackingUnavailable | None = None
        for key, (record, future) in list(self.running.items()):
            if not future.wrapped_future.done():
                continue
            del self.running[key]
            try:
                try:
                    self.done[key] = carry_out_result(self.plan, future.result())
                except TrackingUnavailable:
                    raise  # validated, but the verdict could not be written
                except BaseException as exc:  # the validation failed after its retries, or was stopped
                    stopped = self.stopping() or isinstance(exc, ValidationStopped)
                    verdict, settled = carry_out_failure(self.plan, self.tracking, record, exc, stopped)
                    if not verdict.to_record:
                        logger.info("validation of step %d ended with the stop (%s): it stays pending", record.step,
                                    type(exc).__name__)
                        self.stopped[key] = record
                        continue
                    self.done[key] = settled
                    self._say_failure(record, exc, verdict.reason or "")
            except TrackingUnavailable as exc:
                unreachable = unreachable or exc
                self.unrecorded[key] = record
            if key in self.done:
                self._check_policy_on_first_result(record, self.done[key])
        if unreachable is not None:
            logger.warning("%s; %d checkpoint(s) stay pending: %s", unreachable, len(self.unrecorded),
                           sorted(r.step for r in self.unrecorded.values()))
            raise unreachable
        while start and self.pending and len(self.running) < self.concurrency:
            record, arguments = self.pending.popleft()
            future = validation_task(self.plan, record).submit(context(self.plan), context(self.tracking), whole(record),
                                                              arguments)
            self.running[record.uri] = (record, cast(PrefectConcurrentFuture, future))  # the flow's thread pool

    def _check_policy_on_first_result(self, announced: CheckpointRecord, done: CheckpointRecord) -> None:
        """On the first result of the validation function (metrics it returned): every metric the promotion policy
        names (promotion.metric, thresholds, guards) must be among them or the checkpoint's training metrics, or
        the policy can never be met. Raises PolicyCannotBeMet, naming the missing ones and what the function
        returns; the flow stops the run (`podium run` exits 2). The built-in validation's names were checked
        before training (podium.tasks.plan); this is the same rule on what a function of your own returns."""
        returned = sorted(k for k, v in done.metrics.items() if k not in announced.metrics or announced.metrics[k] != v)
        if self.policy_checked or not returned:  # checked already; or the function raised: no result yet
            return
        self.policy_checked = True
        p, fn = self.plan.config.promotion, self.plan.config.validation.fn
        training = sorted(set(announced.metrics) - set(returned))
        reported = f"validation.fn {fn!r} returns {returned}" + (f", and training reports {training}" if training else "")
        errors = unknown_policy_metrics(p.metric, p.thresholds, p.guards, {*returned, *training}, reported)
        if errors:
            raise PolicyCannotBeMet(
                f"the promotion policy names metric(s) the validation does not return (its first result, step "
                f"{done.step}): training stopped; correct the names and run the same command again (it resumes):\n  "
                + "\n  ".join(errors))

    def _say_failure(self, record: CheckpointRecord, exc: BaseException, reason: str) -> None:
        """On the terminal: the first failure of the validation function with the user's own frames, the
        later ones in one line each (every reason is in MLflow, every full trace in the log file)."""
        text = getattr(exc, "podium_traceback", None)
        if text and not self.failure_shown:
            self.failure_shown = True
            say("validation of step %d failed (marked failed, never promoted); %s raised:\n%s", record.step,
                self.plan.config.validation.fn, text)
        else:
            say("validation of step %d failed (marked failed, never promoted): %s", record.step,
                plain_text(reason).splitlines()[0][:300] if reason.strip() else reason)

    @property
    def validated(self) -> int:
        """How many checkpoints have a verdict (validated, failed or skipped)."""
        return len(self.done)

    def records(self) -> list[CheckpointRecord]:
        """Every checkpoint this queue knows, as it stands now: with its verdict, or pending (queued, running, or
        left pending by a write or a stop)."""
        waiting = [*(r for r, _ in self.pending), *(r for r, _ in self.running.values()),
                   *self.unrecorded.values(), *self.stopped.values()]
        return [*self.done.values(), *(replace(r, status=PENDING) for r in waiting)]

    def keep_best(self, needed: Collection[str] = ()) -> None:
        """checkpoints.keep: delete from storage the checkpoints it keeps no more, as verdicts arrive (never one
        awaiting a verdict, nor one in `needed`); their records stay, marked deleted."""
        if self.plan.config.checkpoints.keep is None:
            return  # keep all: nothing to compute on each pass of the flow's loop
        for record in keep_best_checkpoints(self.plan, self.tracking, self.records(), needed):
            self.done[record.uri] = record

    @property
    def last_step(self) -> int:
        """The largest step of the checkpoints this queue knows (0 if none)."""
        return max((r.step for r in [*self.done.values(), *(r for r, _ in self.pending),
                                     *(r for r, _ in self.running.values())]), default=0)

    def finish(self, poll_s: float = 0.1) -> list[CheckpointRecord]:
        """Wait for every queued and running validation; returns all records by step."""
        while self.pending or self.running:
            self.pump()
            self.check_stop()
            if self.running:
                wait([f.wrapped_future for _, f in self.running.values()], timeout=poll_s, return_when="FIRST_COMPLETED")
        return sorted(self.done.values(), key=lambda r: (r.step, r.uri))

    def tally(self) -> str:
        """The verdicts so far in words, for the progress line."""
        counts = {status: sum(r.status == status for r in self.done.values())
                  for status in (VALIDATED, FAILED, SKIPPED)}
        words = [f"{counts[VALIDATED]} validated", f"{counts[FAILED]} failed"]
        if counts[SKIPPED]:
            words.append(f"{counts[SKIPPED]} not validated (the loop said validation=False)")
        return ", ".join(words)

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

    def stop(self, grace_s: float, poll_s: float = 0.1) -> list[CheckpointRecord]:
        """The run is stopping: start nothing more; validations already running get `grace_s` seconds
        to finish and record their verdicts, then are cancelled. A validation that did not finish is
        no verdict: its checkpoint stays pending (never marked failed for the stop) and is validated
        when the run resumes. Returns the records left pending."""

        left = [record for record, _ in self.pending] + list(self.stopped.values())
        self.pending.clear()
        refuse_new_validations()  # a retry of a validation that fails now would start a new one
        deadline = time.monotonic() + grace_s
        cancelled = False
        while self.running:
            if not cancelled and time.monotonic() >= deadline:
                cancelled = True
                n = cancel_validations()
                logger.info("stopping: %d validation(s) still running after %g s cancelled", n, grace_s)
            if time.monotonic() >= deadline + 15:  # cancelled, and still not back (Ray itself may be gone)
                left += [record for record, _ in self.running.values()]
                logger.warning("stopping: %d validation(s) did not end after being cancelled", len(self.running))
                self.running.clear()
                break
            for key, (record, future) in list(self.running.items()):
                if not future.wrapped_future.done():
                    continue
                del self.running[key]
                try:
                    self.done[key] = future.result()
                except BaseException as exc:  # stopped, or failed while the run stops (Ray may be going too):
                    # not a verdict to keep; the resume validates it again, and a real failure fails again
                    logger.info("step %d stays pending: %s: %s", record.step, type(exc).__name__, exc)
                    left.append(record)
            if self.running:
                wait([f.wrapped_future for _, f in self.running.values()], timeout=poll_s,
                     return_when="FIRST_COMPLETED")
        return sorted(left, key=lambda r: (r.step, r.uri))

    def leave_all(self) -> list[CheckpointRecord]:
        """The run's Ray cluster is gone: nothing more starts or is awaited (no call reaches Ray), and every
        checkpoint without a verdict stays pending for the resume. Returns those records."""
        left = [record for record, _ in self.pending] + [record for record, _ in self.running.values()]
        left += list(self.stopped.values())
        self.pending.clear()
        self.running.clear()
        return sorted(left, key=lambda r: (r.step, r.uri))

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
