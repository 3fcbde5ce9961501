"""How the `podium` command fails: the errors it prints without a traceback, and their exit codes."""

from __future__ import annotations

from podium.errors import EXIT_FAILED, EXIT_REFUSED, EXIT_UNREACHABLE, RayClusterUnreachable, RayStartFailed
from podium.storage.errors import ConditionalWritesIgnored


class CliError(Exception):
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
    """The command's error for a failure podium knows wherever it was first met (one sentence, its documented exit
    code), or None for any other exception: a command maps what it can say better itself, and `podium.cli.main`
    maps the rest of these.

    - Ray did not start on this machine, twice (RayStartFailed): exit 3, as a server that did not answer; the same
      command runs again.
    - The cluster at RAY_ADDRESS does not answer (RayClusterUnreachable): refused, exit 2; nothing ran.
    - A store that ignores conditional writes (ConditionalWritesIgnored), where a command met it past its preflight
      (a rollback, an approval): refused, exit 2.
    """
    if isinstance(exc, RayStartFailed):
        return ServerUnreachable(str(exc))
    if isinstance(exc, (RayClusterUnreachable, ConditionalWritesIgnored)):
        return Refused(str(exc))
    return None
