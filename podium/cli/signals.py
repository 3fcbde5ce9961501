"""The command's signal handling, process-wide, for its whole life: SIGINT (Ctrl-C) and SIGTERM at start-up, and
once its run's body ended. During the run's body the flow run's own handler has them (podium.flows.stop, which a
Prefect worker's flow run uses alone); the command lends it its state (`attach_command`) and takes the signals back
after it.

- start-up (`stop_before_the_run`): a signal raises (KeyboardInterrupt, SystemExit(143)) so that the command's
  `finally`s run, and is kept, because its exception can be swallowed where it lands: the command then stops before
  its run (`stop_if_signalled`), or its run as soon as the run's handler is installed. A command that has not ended
  `START_UP_STOP_S` after the signal ends at once (`_Watchdog`).
- after the run's body: a signal is recorded on the run's request and the command finishes saying what it did, with
  the exit code of its outcome (a second one ends it at once).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from types import FrameType
from typing import Any, Literal

from podium.core.exits import exit_for_signal
from podium.flows import stop as flow_stop
from podium.flows.stop import SIGNALS

logger = logging.getLogger(__name__)

START_UP_STOP_S = 30.0  # how long a command may take to end after a start-up signal before it ends at once

# The command's phase, as its one handler reads it: "start-up" until its run's own handler is installed (a signal
# raises), "run" (the flow run's handler has the signals: podium.flows.stop.stop_on_signals), "after-run" (the run's
# body ended: a signal is kept for the command to say); "" where no command runs (a call from Python, once it ended)
Phase = Literal["", "start-up", "run", "after-run"]

_BEFORE_RUN: list[int] = []  # signals taken by the handler of `stop_before_the_run`, in this process
_PHASE: list[Phase] = [""]


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
        os._exit(exit_for_signal(signum))


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
    """The command's handler of SIGINT and SIGTERM for its whole life, outside its run's body (where the flow run's
    handler has them): at start-up, an exception (`_before_the_run`); once the run's body ended (its point of no
    return passed or not, its outcome decided), the signal is recorded on the run's request and the command finishes
    saying what it did, with the exit code of its outcome (a second signal ends it at once)."""
    if _PHASE[0] != "after-run":
        _before_the_run(signum, frame)
        return
    if flow_stop.STOP.requested:
        os.write(2, f"\npodium: {signal.Signals(signum).name} again: stopping at once\n".encode())
        os._exit(exit_for_signal(signum))
    flow_stop.STOP.request(signum)


def _before_the_run(signum: int, frame: FrameType | None) -> None:
    _BEFORE_RUN.append(signum)
    _WATCHDOG.arm(signum)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    sys.exit(exit_for_signal(signum))  # the exit a shell reports for a signal, after the exit handlers and `finally`s


class _LentToTheRun:
    """The command's state as the flow run's handler uses it (podium.flows.stop.CommandSignals)."""

    def run_starts(self) -> int | None:
        _PHASE[0] = "run"
        stand_down()  # the run's handler has the signal now: its clean stop may take long (STOP_GRACE_S)
        kept = _BEFORE_RUN[0] if _BEFORE_RUN else None
        _BEFORE_RUN.clear()
        return kept

    def run_ended(self) -> Callable[[int, FrameType | None], None]:
        _PHASE[0] = "after-run"
        return _command_handler


def stop_before_the_run(on_stuck: Callable[[], object] | None = None, stuck_after_s: float = START_UP_STOP_S) -> None:
    """The handler of a command's start-up, before its run's own (podium.flows.stop.stop_on_signals): SIGINT raises
    KeyboardInterrupt and SIGTERM SystemExit(143), so that the command's `finally`s run (a server still starting is
    stopped) and it exits 128 + the signal. Each signal is also kept, because the exception can be swallowed where it
    lands (Python ignores one raised in a `__del__` or a weakref callback; some code catches everything): the command
    then stops before its run starts (`stop_if_signalled`), or its run as soon as the run's own handler is installed,
    instead of going on as if nothing had been asked. A command that still has not ended `stuck_after_s` after the
    signal (swallowed where it landed, then blocked) ends at once, after `on_stuck` (_Watchdog)."""
    global _WATCHDOG
    _BEFORE_RUN.clear()
    stand_down()
    _WATCHDOG = _Watchdog(on_stuck, stuck_after_s)
    _PHASE[0] = "start-up"
    flow_stop.attach_command(_LentToTheRun())
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
    flow_stop.detach_command()


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
