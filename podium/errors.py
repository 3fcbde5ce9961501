"""podium's errors: what a run, a promotion or a rollback raises that a caller can act on.

The one public module of them (as Ray Train's `ray/train/v2/api/exceptions.py`): the `podium` command maps
these to its sentences and exit codes (`podium.cli.errors`), and code that calls podium's flows or functions
from Python catches them here. Each message is one sentence that names what was wrong and what was expected.

- `PodiumError`: the base of them all
- `ConfigError`: invalid configuration or input, found before anything runs (a bad path, column, import path)
- `RunInProgress`: another process runs a run of the same name
- `ServiceError`: a server podium needs (Prefect) is unreachable or would not start
- `RayStartFailed`: a local Ray of podium's own did not start, twice (a loaded machine: Ray's start-up waits passed)
- `RayClusterUnreachable`: the Ray cluster at RAY_ADDRESS did not answer
- `TrackingUnavailable`: the MLflow tracking server did not answer through all of MLflow's retries
- `ServingError`: the serving location is missing, inconsistent, or a copy failed verification
- `HistoryError`: a rollback the serving history does not allow
- `AliasTaken`: a registered model's alias belongs to another serving location
- `NotFound`: what a command names does not exist (a run, its MLflow experiment, a run awaiting approval)
- `NotAnswered`: a run awaiting approval could not take a decision (no longer paused, its pause timed out)
- `UserCodeError`: the user's training loop raised (their exception and their own frames)
- `NoCheckpointReported`: training ended and the run has no checkpoint
- `RunStopped`: a run asked to stop (SIGINT, SIGTERM), raised where its flow can stop cleanly
- `ClusterLost`: the Ray cluster a run depends on is gone, raised where its flow can end the run without Ray
- `RunEnded`: a run that reached its end, raised; it holds the run's result, as do:
- `UnfinishedRun`: a run reached its end without doing its work; it holds the run's result
- `EndNotRecorded`: a run reached its end, and the Prefect server did not answer to record it; it holds the result

Imports nothing of podium but `podium.core`: every layer may raise them.
"""

from __future__ import annotations

import signal
from typing import Any

# What a command's exit code says: defined once, in podium.core.exits (re-exported here for callers of podium's API)
from podium.core.exits import EXIT_FAILED, EXIT_NOT_RECORDED, EXIT_OK, EXIT_REFUSED, EXIT_UNREACHABLE  # noqa: F401
from podium.core.redaction import redact_uri


class PodiumError(Exception):
    """The base of podium's errors."""


class ConfigError(PodiumError, ValueError):
    """Invalid configuration: names the field, the value and what was expected."""


class RunInProgress(PodiumError, RuntimeError):
    """Another process is running a run of the same name right now."""


class ServiceError(PodiumError, RuntimeError):
    """A server podium needs is unreachable or would not start."""


class RayStartFailed(ServiceError):
    """A local Ray of podium's own did not start, on its first attempt nor on a second one (what the first left
    was stopped before it): on a loaded machine, Ray's start-up waits can pass before its processes answer."""


class RayClusterUnreachable(ServiceError):
    """The Ray cluster named by RAY_ADDRESS (or --ray-address) did not answer: nothing was started on it."""


class TrackingUnavailable(PodiumError, RuntimeError):
    """The tracking server did not answer, through all of MLflow's HTTP retries.

    Nothing was recorded by the call that raised it; the run can be resumed once the
    server answers again."""

    def __init__(self, tracking_uri: str, action: str, reason: str, waited_s: float):
        self.tracking_uri, self.action, self.reason, self.waited_s = tracking_uri, action, reason, waited_s
        super().__init__(f"MLflow tracking server {redact_uri(tracking_uri)} unreachable while "
                         f"{action}: gave up after {waited_s:.0f} s of retries ({reason})")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.tracking_uri, self.action, self.reason, self.waited_s))


class ServingError(PodiumError, RuntimeError):
    """The serving location is missing, inconsistent, or a copy failed verification."""


class HistoryError(PodiumError, ValueError):
    """A rollback the history does not allow: nothing earlier to go back to, or an unknown version."""


class AliasTaken(PodiumError, ValueError):
    """An alias of the registered model belongs to another serving location."""


class NotFound(PodiumError, LookupError):
    """What a command names does not exist: a run, its MLflow experiment (or one deleted), a flow run awaiting
    approval. Says what was searched, and what there is instead where it can."""


class NotAnswered(PodiumError, RuntimeError):
    """A run awaiting approval could not take a decision: its flow run is no longer paused, or its pause timed out."""


class UserCodeError(PodiumError, RuntimeError):
    """The user's training loop raised: their exception and their own frames, said once.

    `where` names the code (and the rank); `traceback_text` holds the user's frames only (the full Ray
    trace is in the log file)."""

    def __init__(self, where: str, traceback_text: str):
        self.where, self.traceback_text = where, traceback_text
        super().__init__(f"{where} raised:\n{traceback_text}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.where, self.traceback_text))


class NoCheckpointReported(PodiumError, RuntimeError):
    """Training ended and the run has no checkpoint: nothing to validate or promote."""


class RunStopped(PodiumError):
    """The run was asked to stop (a signal): raised where the flow can stop cleanly (podium.flows.stop)."""

    def __init__(self, signum: int, message: str | None = None):
        self.signum = signum
        super().__init__(message or f"stopped by {signal.Signals(signum).name}")


class ClusterLost(PodiumError):
    """The Ray cluster the run depends on is gone (its head stopped answering): raised where the flow can
    end the run without Ray. The run resumes once the cluster is back."""


class RunEnded(PodiumError, RuntimeError):
    """A run that reached its end, raised rather than returned; `result` is what it did (a
    `podium.flows.summary.RunResult`: every checkpoint's record and reason, the promotion's outcome, the
    shortfall)."""

    def __init__(self, message: str, result: Any):
        super().__init__(message)
        self.result = result

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.result))


class UnfinishedRun(RunEnded):
    """A run that reached its end without doing its work (none of its checkpoints could be validated, or its
    candidate's approval could not be asked for): its flow run ended Failed, and calling the flow raises this."""


class EndNotRecorded(RunEnded):
    """A run reached its end (its work done, or not: `result.shortfall`), and the Prefect server did not answer to
    record the flow run's end. Prefect's engine, failing to record the end in turn, raises its own error with this
    one as its context (`podium.flows.summary.result_of` finds it)."""
