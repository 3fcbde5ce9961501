"""A flow run's clean stop on SIGINT (Ctrl-C) or SIGTERM, whoever runs it: `podium run` and `podium promote` in
their own process, or a Prefect worker (a deployment's flow run), which has no command around it.

A signal does not interrupt whatever the flow's thread is doing (an MLflow write half done, a promotion between its
copy and its switch): it sets the run's `StopRequest` that the flow reads where it can stop cleanly (`check`: it
raises podium.errors' RunStopped, or ClusterLost once the Ray cluster is gone). Then running validations get a grace
period to finish and record their verdicts; the others stay pending for the resume; training is aborted through Ray
Train's controller; the MLflow run is marked KILLED and the flow run ends Cancelled. A second signal stops the
process at once (as a resume would after a kill: the run resumes just the same).

A command that runs the flow hands it its own signal handling (`attach_command`, from podium.cli.signals): the
flow's handler takes the signals over for the run's body, acts on a signal the command kept at start-up, and gives
them back to the command's handler once the body ended. The flows never import the command; the command attaches.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import NoReturn, Protocol

from podium.core.exits import EXIT_UNREACHABLE, exit_for_signal
from podium.errors import ClusterLost, RunStopped
from podium.progress import say

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP_GRACE_S = 30.0  # how long running validations may take to finish once a stop is asked for


class StopRequest:
    """Whether, and by which signal, this process was asked to stop its run; or whether its Ray cluster
    was lost (`lost`)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signum: int | None = None
        self.lost: str | None = None

    @property
    def requested(self) -> bool:
        """A stop was asked for."""
        return self._event.is_set()

    def request(self, signum: int) -> None:
        """Ask for a stop (the signal handler; also usable from code)."""
        if self.signum is None:
            self.signum = signum
        self._event.set()

    def lose(self, reason: str) -> None:
        """The run's Ray cluster is gone (podium.training.head): the flow ends the run at its next check."""
        self.lost = reason
        self._event.set()

    def check(self) -> None:
        """Raise ClusterLost if the cluster is gone, RunStopped if a stop was asked for: called where the
        flow can stop cleanly."""
        if self.lost is not None:
            raise ClusterLost(self.lost)
        if self.signum is not None:
            raise RunStopped(self.signum)

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for a stop request; True if there is one."""
        return self._event.wait(timeout)


STOP = StopRequest()  # one per process: signals are (a new one for each flow run: `stop_on_signals`)

LOST_EXIT = EXIT_UNREACHABLE  # as for a tracking server that stopped answering: the run resumes when it is run again

exit_code = exit_for_signal  # the shell's convention: 128 + the signal's number (130 SIGINT, 143 SIGTERM)

Handler = Callable[[int, FrameType | None], object]


class CommandSignals(Protocol):
    """What a command that runs the flow in its own process (podium.cli.signals) lends the flow run's handler."""

    def run_starts(self) -> int | None:
        """The run's own handler has the signals now: the command's start-up watchdog stands down. Returns a signal
        the command kept at start-up (its exception swallowed where it landed), for the run to act on; None if none."""

    def run_ended(self) -> Handler:
        """The run's body ended: the command's handler, to put back in place of the run's (a signal from now on is
        kept for the command to say, not raised)."""


_COMMAND: list[CommandSignals | None] = [None]  # the command running the flow in this process, if any


def attach_command(command: CommandSignals) -> None:
    """The flow runs of this process are a command's (`podium run`, `podium promote`): `stop_on_signals` hands the
    signals back to it after the run's body."""
    _COMMAND[0] = command


def detach_command() -> None:
    """No command runs the flows of this process from now on (its signal state ended with it)."""
    _COMMAND[0] = None


def exit_at_once(message: str, code: int) -> NoReturn:
    """End the process now, after `message` on stderr and the logs: for a run whose Ray cluster is gone,
    where Prefect's engine would wait for the training thread (blocked in Ray) until Ray ends the process."""
    logger.warning("exiting with code %d: %s", code, message)
    sys.stderr.write(f"podium: {message}\n")
    sys.stderr.flush()
    sys.stdout.flush()
    logging.shutdown()
    os._exit(code)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """While the flow runs: SIGINT and SIGTERM ask for a clean stop (a second one exits at once).

    Installed from inside the flow, in the main thread: Prefect's engine installs a SIGTERM handler of
    its own when the flow starts (a crash), which this one replaces for the flow's body. Elsewhere
    (a flow run in a thread) signals are left as they are."""
    global STOP
    STOP = StopRequest()  # a new request for each flow run in this process
    if threading.current_thread() is not threading.main_thread():
        yield STOP
        return

    # The handler only records the request: it runs between two bytecodes of the main thread, which may hold a lock
    # that logging needs (a Queue's, inside Prefect's log handler: logging from the handler hung the process there).
    # A thread of its own says it.
    ended = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        if STOP.requested:  # the second signal: stop at once, as a kill would (the run still resumes)
            os.write(2, f"\npodium: {signal.Signals(signum).name} again: stopping at once\n".encode())
            os._exit(exit_code(signum))
        STOP.request(signum)

    def say_stopping(request: StopRequest) -> None:
        while not request.wait(0.5):
            if ended.is_set():
                return
        if request.signum is not None:
            say("%s: stopping cleanly (the record being written and the validations running finish first, and a "
                "promotion that switched CURRENT completes; %s again to stop at once)",
                signal.Signals(request.signum).name, "Ctrl-C" if request.signum == signal.SIGINT else "SIGTERM")

    threading.Thread(target=say_stopping, args=(STOP,), name="podium-stop-said", daemon=True).start()
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    command = _COMMAND[0]  # a command's run (podium run, podium promote): its own handler takes over after it
    for sig in SIGNALS:
        signal.signal(sig, handler)
    kept = command.run_starts() if command is not None else None  # its clean stop may take long (STOP_GRACE_S)
    if kept is not None:  # taken as the run started, before this handler, and swallowed where it landed
        handler(kept, None)
    try:
        yield STOP
    finally:
        ended.set()
        # A command's handler, not Prefect's engine's (`previous`): the engine still records the flow run's end, and
        # its handler would crash a run that ended (Completed, after its switch) on a SIGTERM meanwhile. The engine
        # puts back the command's handler it found when the flow started, which is the same.
        after = command.run_ended() if command is not None else None
        for sig, old in previous.items():
            signal.signal(sig, after if after is not None and old is not signal.SIG_IGN else old)
