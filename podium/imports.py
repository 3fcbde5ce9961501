"""Resolve 'package.module:function' import paths with errors that say what went wrong; load modules
ahead of the code that needs them, in a background thread."""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from podium.errors import PodiumError

logger = logging.getLogger(__name__)


class ImportPathError(PodiumError, ValueError):
    """An import path that does not resolve to a callable."""


def resolve_callable(path: str, field: str = "import path") -> Callable[..., Any]:
    """Import `package.module:function` and return the callable, or raise ImportPathError naming `field`."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ImportPathError(f"{field} = {path!r}: expected 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportPathError(f"{field} = {path!r}: cannot import module {module_name!r} ({exc})") from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise ImportPathError(f"{field} = {path!r}: module {module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise ImportPathError(f"{field} = {path!r}: {attr!r} is a {type(obj).__name__}, expected a function")
    return obj


# Ray's worker processes (the train workers, Ray Data's coordinator, the validations) call nice() with this
# increment when they start (its `worker_niceness`: 15 unless RAY_worker_niceness says otherwise), so they
# run 15 steps below the process that started Ray
RAY_WORKER_NICENESS = 15


def yield_to_ray_workers() -> None:
    """Lower the calling thread's CPU priority as far as Ray lowers its workers' (Linux, where a nice value
    belongs to one thread; elsewhere nothing). For background work of this process while Ray trains: at the
    process's priority it would win every contended CPU from Ray's workers (a Ray Data coordinator starting
    the next epoch, a validation), and the training that waits on them would wait on it. A thread cannot
    raise its priority again without privileges: only threads that do nothing else call this."""
    if not sys.platform.startswith("linux"):
        return  # macOS's setpriority(PRIO_PROCESS) applies to the whole process, not the thread
    tid = threading.get_native_id()
    try:
        increment = int(os.environ.get("RAY_worker_niceness", RAY_WORKER_NICENESS))
        if increment > 0:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + increment))
    except (OSError, ValueError):  # not permitted, or a malformed variable: run at the current priority
        logger.debug("could not lower thread %d's CPU priority", tid, exc_info=True)


class Preload:
    """Modules imported in a background thread, once per process, while the process mostly waits (a run
    in training), so that the code that needs them later does not wait for their import. That code calls
    `wait` before it imports them itself: no module is loaded from two threads at once. The thread runs at
    the priority of Ray's workers (`yield_to_ray_workers`): the import is not what training waits for."""

    def __init__(self, name: str, load: Callable[[], None]):
        self.name, self.load = name, load
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        yield_to_ray_workers()
        try:
            self.load()
        except Exception:  # loaded again, and said, by the code that needs them
            logger.debug("preloading %s failed", self.name, exc_info=True)

    def start(self) -> None:
        """Start the import (once; later calls do nothing)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def wait(self) -> None:
        """Until the import is done (at once if it never started)."""
        if self._thread is not None:
            self._thread.join()
