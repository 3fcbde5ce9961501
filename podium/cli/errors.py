"""How the `podium` command fails: the errors it prints without a traceback, and their exit codes.

`EXIT_CODES` is the one table from podium's errors to the codes of `podium.core.exits`: a command lets a
`PodiumError` rise, and `podium.cli.main` prints its sentence and exits with the table's code. A command
translates an error itself only where its own context changes the code or adds to the sentence.
"""

from __future__ import annotations

from podium import errors
from podium.errors import EXIT_FAILED, EXIT_REFUSED, EXIT_UNREACHABLE, PodiumError
from podium.storage.errors import ConditionalWritesIgnored, StorageError

# podium's errors and their exit codes, the most specific first (the first class an error is an instance of wins)
EXIT_CODES: tuple[tuple[type[PodiumError], int], ...] = (
    (errors.RayStartFailed, EXIT_UNREACHABLE),  # Ray did not start on this machine, twice: the same command runs again
    (errors.RayClusterUnreachable, EXIT_REFUSED),  # the cluster at RAY_ADDRESS does not answer: nothing ran
    (errors.TrackingUnavailable, EXIT_UNREACHABLE),  # MLflow stopped answering: the run resumes
    (errors.ServiceError, EXIT_REFUSED),  # a server the command needs did not start or answer: nothing started
    (ConditionalWritesIgnored, EXIT_REFUSED),  # a store no lock can be built on
    (StorageError, EXIT_REFUSED),  # a location that cannot be used (a file where a folder is expected, no access)
    (errors.ConfigError, EXIT_REFUSED),
    (errors.RunInProgress, EXIT_REFUSED),
    (errors.ServingError, EXIT_REFUSED),
    (errors.HistoryError, EXIT_REFUSED),
    (errors.AliasTaken, EXIT_REFUSED),
    (errors.NotFound, EXIT_REFUSED),  # a run (or its experiment, or a run awaiting approval) that does not exist
    (errors.NotAnswered, EXIT_REFUSED),  # a run awaiting approval that can no longer take a decision
    (errors.EndNotRecorded, errors.EXIT_NOT_RECORDED),
    (errors.UnfinishedRun, EXIT_FAILED),
    (errors.NoCheckpointReported, EXIT_FAILED),
    (errors.UserCodeError, EXIT_FAILED),
)


def exit_code_of(exc: BaseException) -> int | None:
    """The exit code `EXIT_CODES` gives `exc` (a `CliError` carries its own), or None for an error podium does not
    know."""
    if isinstance(exc, CliError):
        return exc.exit_code
    return next((code for kind, code in EXIT_CODES if isinstance(exc, kind)), None)


class CliError(PodiumError):
    """A user error: printed without a traceback, exit code 2."""

    exit_code = EXIT_REFUSED


class Refused(CliError):
    """The command refused to start its work (a bad input, a run of the same name in progress, a store it
    cannot use): printed without a traceback, exit code 2, and a server the command started for it is stopped
    again, so that nothing it started outlives it."""


class ServerUnreachable(CliError):
    """A server podium records to stopped answering during a run: printed without a traceback, exit
    code 3. The run can be resumed."""

    exit_code = EXIT_UNREACHABLE


class RunFailed(CliError):
    """The run ended without anything to promote for a reason podium can state (its loop never
    reported a checkpoint): printed without a traceback, exit code 1."""

    exit_code = EXIT_FAILED


def tracking_outage_message(exc: Exception, run_name: str, command: str) -> str:
    """What to tell someone whose run stopped because the MLflow tracking server did not answer."""
    return (f"{exc}.\n"
            f"  The run {run_name!r} stopped. What MLflow already recorded is kept, and so are the checkpoints "
            "in storage.\n"
            f"  Once the server answers again, run the same `podium {command}` (same --run-name): it resumes, "
            "and checkpoints that already have a verdict are not validated again.")


def known_failure(exc: BaseException) -> CliError | None:
    """The command's error for a failure podium knows wherever it was first met (one sentence, the exit code
    `EXIT_CODES` gives it), or None for any other exception: `podium.cli.main` prints these without a traceback."""
    code = exit_code_of(exc)
    if code is None:
        return None
    failure = CliError(str(exc))
    failure.exit_code = code
    return failure
