"""Orchestration state: a clean stop on SIGINT (Ctrl-C) or SIGTERM.

A signal does not interrupt whatever the flow's thread is doing (an MLflow write half done, a
promotion between its copy and its switch): it sets a request that the flow reads where it can
stop cleanly (`check`). Then running validations get a grace period to finish and record their
verdicts; the others stay pending for the resume; training is aborted through Ray Train's
controller; the MLflow run is marked KILLED and the flow run ends Cancelled. A second signal stops
the process at once (as a resume would after a kill: the run resumes just the same).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, NoReturn

from podium.core.exits import EXIT_UNREACHABLE, exit_for_signal
from podium.errors import PodiumError
from podium.progress import say

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP_GRACE_S = 30.0  # how long running validations may take to finish once a stop is asked for


class RunStopped(PodiumError):
    """The run was asked to stop (a signal): raised where the flow can stop cleanly."""

    def __init__(self, signum: int, message: str | None = None):
        self.signum = signum
        super().__init__(message or f"stopped by {signal.Signals(signum).name}")


class ClusterLost(PodiumError):
    """The Ray cluster the run depends on is gone (its head stopped answering): raised where the flow can
    end the run without Ray. The run resumes once the cluster is back."""


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


STOP = StopRequest()  # one per process: signals are


LOST_EXIT = EXIT_UNREACHABLE  # as for a tracking server that stopped answering: the run resumes when it is run again


def exit_at_once(message: str, code: int) -> NoReturn:
    """End the process now, after `message` on stderr and the logs: for a run whose Ray cluster is gone,
    where Prefect's engine would wait for the training thread (blocked in Ray) until Ray ends the process."""
    logger.warning("exiting with code %d: %s", code, message)
    sys.stderr.write(f"podium: {message}\n")
    sys.stderr.flush()
    sys.stdout.flush()
    logging.shutdown()
    os._exit(code)


exit_code = exit_for_signal  # the shell's convention: 128 + the signal's number (130 SIGINT, 143 SIGTERM)


_BEFORE_RUN: list[int] = []  # signals taken by the handler of `stop_before_the_run`, in this process
# the command's phase, as its one handler (`_command_handler`) reads it: "start-up" (until its run's own handler is
# installed), "run" (`stop_on_signals`), "after-run" (the run's body ended: the command says what it did); "" where
# no command installed it (a deployment's flow run, a call from Python)
_PHASE: list[str] = [""]
START_UP_STOP_S = 30.0  # how long a command may take to end after a start-up signal before it ends at once


class _Watchdog:
    """After a start-up signal, ends the command at once if it has not ended within `after_s` (and its run's own
    handler did not take the signal over): the signal's exception can land inside library code that swallows it and
    then waits forever (a lock the interrupted code held), or the exit handlers can hang on a half-started library.
    `on_stuck` runs first, bounded (a server still starting is stopped); then the command's one line, the threads'
    stacks to the log, and the signal's exit code."""

    def __init__(self, on_stuck: Callable[[], object] | None = None, after_s: float = START_UP_STOP_S) -> None:
        self.on_stuck = on_stuck
        self.after_s = after_s
        self.armed: threading.Thread | None = None
        self.stand_down = threading.Event()

    def arm(self, signum: int) -> None:
        if self.armed is None:
            self.armed = threading.Thread(target=self._end_if_stuck, args=(signum,), name="podium-stop-watchdog",
                                          daemon=True)
            self.armed.start()

    def _end_if_stuck(self, signum: int) -> None:
        if self.stand_down.wait(self.after_s):
            return
        if self.on_stuck is not None:
            cleanup = threading.Thread(target=self.on_stuck, name="podium-stop-cleanup", daemon=True)
            cleanup.start()
            cleanup.join(10.0)
        name = signal.Signals(signum).name
        os.write(2, f"podium: stopped by {name} (the command had not ended {self.after_s:.0f} s after the signal: "
                    "it ended at once; nothing was promoted)\n".encode())
        stacks = threading.Thread(target=_log_stacks, args=(name,), name="podium-stop-stacks", daemon=True)
        stacks.start()
        stacks.join(2.0)  # logging may be what the command is stuck on
        os._exit(exit_code(signum))


def _log_stacks(name: str) -> None:
    if not logger.hasHandlers():  # Python's last resort would print them on the terminal, after the command's line
        return
    frames = sys._current_frames()
    for thread in threading.enumerate():
        frame = frames.get(thread.ident or -1)
        if frame is not None:
            logger.warning("stuck after %s: thread %s at\n%s", name, thread.name,
                           "".join(traceback.format_stack(frame)))


_WATCHDOG = _Watchdog()


def _command_handler(signum: int, frame: FrameType | None) -> None:
    """The command's handler of SIGINT and SIGTERM for its whole life, outside its run's body (where `stop_on_signals`
    has its own): at start-up, an exception (`_before_the_run`); once the run's body ended (its point of no return
    passed or not, its outcome decided), the signal is recorded on the run's request and the command finishes saying
    what it did, with the exit code of its outcome (a second signal ends it at once)."""
    if _PHASE[0] != "after-run":
        _before_the_run(signum, frame)
        return
    if STOP.requested:
        os.write(2, f"\npodium: {signal.Signals(signum).name} again: stopping at once\n".encode())
        os._exit(exit_code(signum))
    STOP.request(signum)


def _before_the_run(signum: int, frame: FrameType | None) -> None:
    _BEFORE_RUN.append(signum)
    _WATCHDOG.arm(signum)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    sys.exit(exit_code(signum))  # the exit a shell reports for a signal, after the exit handlers and `finally`s ran


def stop_before_the_run(on_stuck: Callable[[], object] | None = None, stuck_after_s: float = START_UP_STOP_S) -> None:
    """The handler of a command's start-up, before its run's own (`stop_on_signals`): SIGINT raises KeyboardInterrupt
    and SIGTERM SystemExit(143), so that the command's `finally`s run (a server still starting is stopped) and it
    exits 128 + the signal. Each signal is also kept, because the exception can be swallowed where it lands (Python
    ignores one raised in a `__del__` or a weakref callback; some code catches everything): the command then stops
    before its run starts (`stop_if_signalled`), or its run as soon as the run's own handler is installed, instead of
    going on as if nothing had been asked. A command that still has not ended `stuck_after_s` after the signal
    (swallowed where it landed, then blocked) ends at once, after `on_stuck` (_Watchdog)."""
    global _WATCHDOG
    _BEFORE_RUN.clear()
    stand_down()
    _WATCHDOG = _Watchdog(on_stuck, stuck_after_s)
    _PHASE[0] = "start-up"
    for sig in SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:  # a signal ignored by whoever started the command stays so
            signal.signal(sig, _command_handler)
    if not isinstance(sys.unraisablehook, _QuietOnKeptSignals):
        sys.unraisablehook = _QuietOnKeptSignals(sys.unraisablehook)


def stand_down() -> None:
    """The start-up signal's watchdog (`stop_before_the_run`) ends nothing from now on: the command ended, in a
    process that goes on (a call of `podium.cli.main` from Python)."""
    _WATCHDOG.stand_down.set()


def end_command() -> None:
    """The command's signal state ends with it, in a process that goes on to run flows of its own (a test process): its
    watchdog stands down, and neither a start-up signal it kept nor its phase reaches the next flow run."""
    stand_down()
    _BEFORE_RUN.clear()
    _PHASE[0] = ""


class _QuietOnKeptSignals:
    """sys.unraisablehook that leaves out the exception of a signal `stop_before_the_run` kept, where Python ignored it
    (a traceback under 'Exception ignored in ...', of a signal the command still acts on); others go to `previous`."""

    def __init__(self, previous: Callable[[Any], object]):
        self.previous = previous

    def __call__(self, unraisable: Any) -> None:
        if _BEFORE_RUN and isinstance(unraisable.exc_value, KeyboardInterrupt | SystemExit):
            return
        self.previous(unraisable)


def start_up_signal() -> int | None:
    """The signal `stop_before_the_run`'s handler took, not yet handed to a run (`stop_on_signals`); None if none."""
    return _BEFORE_RUN[0] if _BEFORE_RUN else None


def stop_if_signalled() -> None:
    """Where a command is about to start its run: raise again for a signal `stop_before_the_run` took, if its exception
    was swallowed where it landed."""
    if _BEFORE_RUN:
        _before_the_run(_BEFORE_RUN[0], None)


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
    command = _PHASE[0] != ""  # a command's run (podium run, podium promote): its own handler takes over after it
    _PHASE[0] = "run" if command else ""
    for sig in SIGNALS:
        signal.signal(sig, handler)
    stand_down()  # the run's handler has the signal now: its clean stop may take long (STOP_GRACE_S)
    if _BEFORE_RUN:  # taken as the run started, before this handler, and swallowed where it landed
        handler(_BEFORE_RUN[0], None)
        _BEFORE_RUN.clear()
    try:
        yield STOP
    finally:
        ended.set()
        # A command's handler, not Prefect's engine's (`previous`): the engine still records the flow run's end, and
        # its handler would crash a run that ended (Completed, after its switch) on a SIGTERM meanwhile. The engine
        # puts back the command's handler it found when the flow started, which is the same.
        if command:
            _PHASE[0] = "after-run"
        for sig, old in previous.items():
            signal.signal(sig, _command_handler if command and old is not signal.SIG_IGN else old)
