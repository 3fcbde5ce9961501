"""Starting (or joining) the Ray cluster and warming up the validation workers: Ray core only.

Kept apart from raytrain.py, which loads Ray Train (and with it ray.data and pandas), so that the
`podium` command can start Ray in a background thread while its main thread loads the other libraries
(`start_early`). Nothing here imports torch, Prefect or MLflow.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import logging
import math
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import ray

from podium.imports import resolve_callable
from podium.storage.backends import worker_environment

# Ray Train's controller polls workers every 2 s by default; a report (and so a
# checkpoint announcement) waits for the next poll. podium polls more often
# unless the user set the variable themselves.
POLL_INTERVAL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
DEFAULT_POLL_INTERVAL_S = "0.25"

# Ray Train starts a preemption watcher for each run (an actor, in a worker process of its own, polling the
# nodes' drain state every 5 s) so that a cloud node's reclaim notice is seen. A local Ray of podium's own is
# this one machine, never drained: it starts without the watcher, unless the user set the variable.
PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"

# Validation tasks (and their warm-up) run in worker processes of their own. Ray pools idle workers by
# runtime env, and a task's env_vars are merged onto the job's (every other field is inherited), so this one
# variable gives validation a pool apart: a prewarmed validation worker is never taken for a Ray Train
# worker or a Ray Data task, and a validation never runs in a process that held Ray Data's blocks (its
# memory is its own, and data reads never share its process's CPU time).
VALIDATION_RUNTIME_ENV: dict[str, Any] = {"env_vars": {"PODIUM_WORKER_POOL": "validation"}}

# Third-party packages that `ray.init` and the first task submission import lazily (ray 2.60; measured by
# tests/integration/test_startup.py). `start_early` imports them in the calling thread first: a package
# initialised by two threads at once can fail with "deadlock detected by _ModuleLock" (CPython 3.11), and
# the main thread goes on importing MLflow and torch while Ray starts.
RAY_LAZY_IMPORTS = ("aiohttp", "aiohttp.web", "click", "cloudpickle", "email.policy", "email.headerregistry",
                    "ctypes.util", "gettext", "optparse", "netrc", "numpy", "pyarrow", "pydantic", "anyio",
                    "starlette", "zoneinfo", "sysconfig", "colorsys",
                    # with Ray's dashboard dependencies installed (ray[default], ray[serve]: podium's serve extra)
                    "aiohttp_cors", "colorful", "grpc", "grpc_reflection", "opencensus")


def _top_level_spec(import_path: str) -> importlib.machinery.ModuleSpec | None:
    """Where the top-level package or module of an import path lives, found without running any of it."""
    top = import_path.partition(":")[0].split(".")[0]
    try:
        return importlib.util.find_spec(top)
    except (ImportError, ValueError):  # not importable: the preflight says so, naming the field
        return None


def _user_code(import_paths: list[str]) -> list[tuple[str, str | None]]:
    """(root, upload) for each of the user's own packages or modules named: the folder that must be on a
    worker's path, and the package folder or module file a remote cluster gets (None for a namespace package).
    Modules installed in site-packages, and podium (installed beside Ray), are left out. Nothing is imported:
    `start_early` calls this from its thread, before the preflight has imported the user's code."""
    found: list[tuple[str, str | None]] = []
    for path in import_paths:
        spec = _top_level_spec(path)
        if spec is None or spec.name == "podium":
            continue
        if spec.submodule_search_locations:  # a package's folder (a namespace package may have several)
            places = [(os.path.dirname(p), p if spec.origin else None) for p in spec.submodule_search_locations]
        elif spec.origin:  # a single-file module
            places = [(os.path.dirname(spec.origin), spec.origin)]
        else:
            continue
        for root, upload in places:
            entry = (os.path.abspath(root), upload)
            if "site-packages" not in root and "dist-packages" not in root and entry not in found:
                found.append(entry)
    return found


def code_roots(import_paths: list[str]) -> list[str]:
    """Folders that must be on a Ray worker's path for these import paths to resolve there.

    Modules installed in site-packages are found anyway; a user's own module (a
    script folder, a test tree) is not, because Ray workers do not inherit the
    driver's sys.path.
    """
    return list(dict.fromkeys(root for root, _ in _user_code(import_paths)))


def ensure_ray(num_cpus: float | None = None, import_paths: list[str] | None = None) -> None:
    """Connect to RAY_ADDRESS if set, else start a local Ray of podium's own (never a `ray start` cluster that
    happens to run on this machine) with at least `num_cpus` logical CPUs.

    On a small machine the logical CPU count may exceed the cores: training and
    validation then share cores, which is the user's stated resource split.
    User code named by `import_paths` is made importable on the workers.
    """
    os.environ.setdefault(POLL_INTERVAL_ENV, DEFAULT_POLL_INTERVAL_S)
    await_release()  # a Ray being shut down (release_ray) is not one to use: start anew once it is gone
    if ray.is_initialized():
        return
    user_code = _user_code(import_paths or [])
    roots = list(dict.fromkeys(root for root, _ in user_code))
    if os.environ.get("RAY_ADDRESS"):
        # a remote cluster gets the user's packages uploaded with the job
        py_modules = [upload for _, upload in user_code if upload]
        # each store's endpoint/region settings go along (never credentials: each node has its own)
        runtime_env: dict[str, Any] = {"env_vars": {POLL_INTERVAL_ENV: os.environ[POLL_INTERVAL_ENV], **worker_environment()}}
        if py_modules:
            runtime_env["py_modules"] = sorted(set(py_modules))
        ray.init(logging_level=logging.WARNING, log_to_driver=False, runtime_env=runtime_env)
        return
    cpus = max(os.cpu_count() or 1, math.ceil(num_cpus or 0))
    # A Ray of podium's own is this process's child, and its workers inherit the raylet's environment: the
    # poll interval (set above) and the user's code roots reach them from there, not through a job
    # runtime_env. Ray prestarts worker processes (one per CPU) before any job exists, with no runtime env;
    # a job that sets one can never use them, and starts a new process for each of its first tasks and
    # actors (Ray Train's controller, its workers, podium's queue) while training waits on them.
    with _start_environment(roots):
        # "local": a Ray of podium's own. With no address, ray.init joins the cluster that `ray start` last
        # recorded on this machine (/tmp/ray/ray_current_cluster) if it runs: someone else's, and refused
        # anyway with num_cpus ("When connecting to an existing cluster, num_cpus ... must not be provided")
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, logging_level=logging.WARNING,
                 log_to_driver=False)


@contextlib.contextmanager
def _start_environment(roots: list[str]) -> Iterator[None]:
    """While the block starts a local Ray (its processes inherit this environment), then restored: `roots` put
    before PYTHONPATH, and Ray Train's preemption watcher off unless the user set it. Only these variables are
    touched: other threads (the Prefect server's start) read the environment meanwhile."""
    updates = {PREEMPTION_WATCHER_ENV: os.environ.get(PREEMPTION_WATCHER_ENV, "0")}
    if roots:
        before = filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))
        updates["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*roots, *before]))
    saved = {name: os.environ.get(name) for name in updates}
    os.environ.update(updates)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _warm_up(fn_path: str, hold_s: float) -> float:
    """Import the validation function in this worker; returns when that ended (time.time())."""
    resolve_callable(fn_path, "validation.fn")  # imports torch and the user's module in this worker
    ready = time.time()
    time.sleep(hold_s)  # overlap with the other warm-ups so each lands in its own worker process
    return ready


def prewarm_validation_workers(fn_path: str, count: int, *, num_cpus: float, num_gpus: float,
                               resources: dict[str, float]) -> list[ray.ObjectRef]:
    """Start `count` worker processes with the validation function imported; returns their refs.

    A validation task needs its own worker process; a cold one spends seconds
    starting Python and importing torch, which would delay the first checkpoints'
    verdicts. Ray keeps idle workers for reuse. The caller waits for the refs
    before training starts (tasks.train.connect_ray), so the warm-up does not
    compete with the start of training for CPU.
    """
    task = ray.remote(_warm_up).options(num_cpus=num_cpus, num_gpus=num_gpus, resources=resources or None,
                                        name="podium-validate-warmup", max_retries=0,
                                        runtime_env=VALIDATION_RUNTIME_ENV)
    # several warm-ups hold their worker a moment, so that each lands in a process of its own; a single
    # one returns at once, freeing its CPU for the first validation
    hold_s = 0.5 if count > 1 else 0.0
    return [task.remote(fn_path, hold_s) for _ in range(count)]


# ---------------------------------------------------------------- starting early, in a thread

@dataclass(frozen=True)
class WarmUp:
    """What the validation warm-up is for: the function and the resources of its tasks."""

    fn: str
    count: int
    num_cpus: float
    num_gpus: float
    resources: tuple[tuple[str, float], ...] = ()


@dataclass
class _Started:
    warm_up: WarmUp
    refs: list[ray.ObjectRef]
    error: BaseException | None


_started: _Started | None = None
_started_here = False  # this process started a local Ray for one command (start_early): release_ray may end it
_release: threading.Thread | None = None


class _NotFromMainThread(logging.Filter):
    """Drops Ray's warning that it set no SIGTERM handler from a thread: start_early sets the same one."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


def _fits(warm_up: WarmUp) -> bool:
    total = ray.cluster_resources()
    need = {"CPU": warm_up.num_cpus, "GPU": warm_up.num_gpus, **dict(warm_up.resources)}
    return all(not amount or total.get(res, 0) >= amount for res, amount in need.items())


class EarlyStart(threading.Thread):
    """`ensure_ray` and the validation warm-up's submission, in a daemon thread. `wait()` for it before the
    flow starts; `started` and `ended` (time.monotonic()) say when it ran.

    The thread never ends: Ray starts its GCS and raylet with PR_SET_PDEATHSIG (ray._private.services
    `fate_share`), which the kernel ties to the *thread* that started them, so they would be killed the moment
    this thread returned. It parks instead, and goes with the process (ray.shutdown at exit stops them)."""

    def __init__(self, num_cpus: float, import_paths: list[str], warm_up: WarmUp):
        super().__init__(name="podium-ray-start", daemon=True)
        self.args = (num_cpus, import_paths, warm_up)
        self.started = time.monotonic()
        self.ended: float | None = None
        self._done = threading.Event()

    def run(self) -> None:
        """Start Ray, submit the warm-up, hand both (or the error) to `take_started`, then park."""
        global _started, _started_here
        num_cpus, import_paths, warm_up = self.args
        try:
            was_up = ray.is_initialized()
            ensure_ray(num_cpus, import_paths)
            _started_here = not was_up and not os.environ.get("RAY_ADDRESS")
            refs = []
            if _fits(warm_up):  # else connect-ray reports what is missing, as without an early start
                refs = prewarm_validation_workers(warm_up.fn, warm_up.count, num_cpus=warm_up.num_cpus,
                                                  num_gpus=warm_up.num_gpus, resources=dict(warm_up.resources))
            _started = _Started(warm_up, refs, None)
        except BaseException as exc:  # handed to connect-ray, which raises it inside the flow as before
            _started = _Started(warm_up, [], exc)
        finally:
            self.ended = time.monotonic()
            self._done.set()
        threading.Event().wait()

    def wait(self) -> None:
        """Until Ray is up and the warm-up submitted (or that failed)."""
        self._done.wait()


def start_early(num_cpus: float, import_paths: list[str], warm_up: WarmUp) -> EarlyStart:
    """Start (or join) Ray and submit the validation warm-up in a background thread; returns the thread.

    Call from the main thread once the configuration is checked, with a SIGTERM handler that exits through
    Python's exit handlers installed (ray.init installs one only from the main thread; `podium run` installs its
    own). What the thread got (the warm-up's refs, or its error) is handed to the next `take_started` with the
    same warm-up, which the flow's connect-ray task calls. Until `wait()` returns, the caller must not import
    Ray Train or other parts of `ray` (the thread is importing parts of `ray` meanwhile); other libraries are fine.
    """
    for name in RAY_LAZY_IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional dependency Ray would do without as well
            pass
    logging.getLogger("ray._private.worker").addFilter(_NotFromMainThread())
    thread = EarlyStart(num_cpus, import_paths, warm_up)
    thread.start()
    return thread


def take_started(warm_up: WarmUp) -> list[ray.ObjectRef] | None:
    """The warm-up refs of an early start for this warm-up, once (raising its error); None if there was none."""
    global _started
    started, _started = _started, None
    if started is None or started.warm_up != warm_up or (started.error is None and not ray.is_initialized()):
        return None
    if started.error is not None:
        raise started.error
    return started.refs


def release_ray() -> None:
    """Shut down, in a background thread, the local Ray that `start_early` started for this command, once
    the run needs it no more (training ended and every validation has its verdict): what is left (promotion,
    reports) overlaps the shutdown, 1-3 s of stopping Ray's processes that would otherwise come after it,
    and the cores and memory are free for it sooner. A cluster joined through RAY_ADDRESS, or a Ray that
    this process did not start through `start_early` (a test's, a notebook's), is left as it is. A later
    `ensure_ray` waits for the shutdown and starts a new one; the process waits for it before it exits."""
    global _started_here, _release
    if not _started_here or not ray.is_initialized():
        return
    _started_here = False
    _release = threading.Thread(target=ray.shutdown, name="podium-ray-release")  # not a daemon: joined at exit
    _release.start()


def await_release() -> None:
    """Until a shutdown begun by `release_ray` has ended."""
    global _release
    if _release is not None:
        _release.join()
        _release = None
