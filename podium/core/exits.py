"""podium's exit codes, defined once: what a command's exit status says (docs/commands.md, "Exit codes").

The table that maps podium's errors to these codes is `podium.cli.errors`; every other module names a code from
here, never a number of its own.
"""

from __future__ import annotations

import signal

EXIT_OK = 0  # the work finished
EXIT_FAILED = 1  # the run reached its end without doing its work
EXIT_REFUSED = 2  # refused, or bad input: nothing started
EXIT_UNREACHABLE = 3  # a server podium records to stopped answering, or the Ray cluster was lost: the run resumes
EXIT_NOT_RECORDED = 4  # the work finished, but the Prefect server did not record its end
EXIT_SIGINT = 128 + signal.SIGINT  # 130: stopped by SIGINT (Ctrl-C) before the point of no return
EXIT_SIGTERM = 128 + signal.SIGTERM  # 143: stopped by SIGTERM (a scheduler, a pod's stop) before the point of no return


def exit_for_signal(signum: int) -> int:
    """The shell's convention for a command ended by a signal: 128 + its number (130 SIGINT, 143 SIGTERM)."""
    return 128 + signum
