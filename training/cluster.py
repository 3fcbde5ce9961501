"""Starting (or joining) the Ray cluster and warming up the validation workers: Ray core only.

Kept apart from raytrain.py, which loads Ray Train (and with it ray.data and pandas), so that the
`podium` command can start Ray in a background thread while its main thread loads the other libraries
(`start_early`). Nothing here imports torch, Prefect or MLflow.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import importlib
import importlib.machinery
import importlib.util
import logging
import math
import os
import signal
import socket
import threading
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import ray
from ray._private import worker as ray_worker
from ray._private.node import Node
from ray._private.services import canonicalize_bootstrap_address

from podium.errors import RayClusterUnreachable, RayStartFailed
from podium.imports import resolve_callable
from podium.storage.backends import worker_environment

logger = logging.getLogger(__name__)

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

# A local Ray's start has two waits (ray 2.60, ray._private.node.Node): for the GCS to write its port and answer
# (RAY_gcs_server_port_wait_time_s, 30 s by default), then a fixed 30 s for the raylet to register with it ("The
# current node timed out during startup"). On a loaded machine (a first run after boot, other servers starting
# beside it) either can pass, and a second start succeeds. podium starts once more after stopping what the first
# left, the GCS wait widened to GCS_WAIT_RETRY_S unless the user set it; then says what to do.
GCS_WAIT_ENV = "RAY_gcs_server_port_wait_time_s"
GCS_WAIT_RETRY_S = 90
START_ATTEMPTS = 2
# How long a cluster named by RAY_ADDRESS may refuse connections before podium says it does not answer: Ray's own
# window for a driver joining (RAY_gcs_server_port_wait_time_s where set, else about RAY_NUM_REDIS_GET_RETRIES
# one-second tries), which ray.init would otherwise spend on each of many slow attempts (minutes)
DEFAULT_JOIN_WAIT_S = 20.0
WHAT_TO_DO_DOC = "docs/when-things-go-wrong.md#ray-does-not-start"

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


# The signals a command handles for its whole life (podium.cli.signals): a library call that starts or stops Ray must
# leave their handlers as it found them.
KEPT_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if ctypes.util.find_library("c") else None
_SIGACTION_BYTES = 512  # more than any libc's `struct sigaction` (152 bytes on glibc x86-64): kept opaque, as read


@contextlib.contextmanager
def signal_handlers_kept() -> Iterator[None]:
    """Around a call that starts or stops Ray: SIGINT's and SIGTERM's handlers afterwards are those before it.

    Why a guard, not a re-install after each call: Ray replaces them at two levels. `ray.init` in the main thread
    sets a Python-level SIGTERM handler (`sys.exit`), which `signal.signal` puts back. But `ray.shutdown` (its core
    worker's log shutdown, ray 2.60) resets the kernel's disposition of SIGTERM to SIG_DFL behind Python's back:
    `signal.getsignal` still names podium's handler while the process dies of the signal (seen in /proc/PID/status
    SigCgt), and `podium run` shuts its local Ray down in a background thread (`release_ray`), where
    `signal.signal` cannot be called. So the kernel's disposition, as read before the call, is written back after it
    with sigaction(2), which any thread may call; in the main thread the Python-level handlers are put back too."""
    python_level = {sig: signal.getsignal(sig) for sig in KEPT_SIGNALS}
    kernel_level: dict[int, ctypes.Array[ctypes.c_char]] = {}
    if _libc is not None:
        for sig in (s for s in KEPT_SIGNALS if callable(python_level[s])):  # Python's trampoline: its to restore
            saved = ctypes.create_string_buffer(_SIGACTION_BYTES)
            if _libc.sigaction(int(sig), None, saved) == 0:
                kernel_level[sig] = saved
    try:
        yield
    finally:
        for signum, saved in kernel_level.items():
            if callable(signal.getsignal(signum)):  # a Python handler, whose trampoline the saved disposition is
                _libc.sigaction(int(signum), saved, None)  # type: ignore[union-attr]
        if threading.current_thread() is threading.main_thread():
            for sig, handler in python_level.items():
                if handler is not None and signal.getsignal(sig) is not handler:
                    signal.signal(sig, handler)


def ensure_ray(num_cpus: float | None = None, import_paths: list[str] | None = None) -> None:
    """Connect to RAY_ADDRESS if set, else start a local Ray of podium's own (never a `ray start` cluster that
    happens to run on this machine) with at least `num_cpus` logical CPUs.

    On a small machine the logical CPU count may exceed the cores: training and
    validation then share cores, which is the user's stated resource split.
    User code named by `import_paths` is made importable on the workers.
    Raises RayClusterUnreachable for a RAY_ADDRESS that does not answer, RayStartFailed for a local Ray that
    did not start (it is tried twice), each naming what to do.
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
        address = os.environ["RAY_ADDRESS"]
        _check_cluster_answers(address)
        try:
            with signal_handlers_kept():
                ray.init(logging_level=logging.WARNING, log_to_driver=False, runtime_env=runtime_env)
        except ConnectionError as exc:  # answered the probe, then went away: said as a cluster that does not answer
            failure = f"{type(exc).__name__}: {_first_line(exc)}"
        else:
            return
        raise RayClusterUnreachable(_unreachable_message(address, failure))
    cpus = max(os.cpu_count() or 1, math.ceil(num_cpus or 0))
    # A Ray of podium's own is this process's child, and its workers inherit the raylet's environment: the
    # poll interval (set above) and the user's code roots reach them from there, not through a job
    # runtime_env. Ray prestarts worker processes (one per CPU) before any job exists, with no runtime env;
    # a job that sets one can never use them, and starts a new process for each of its first tasks and
    # actors (Ray Train's controller, its workers, podium's queue) while training waits on them.
    with _start_environment(roots):
        _start_local_ray(cpus)


def _start_local_ray(cpus: int) -> None:
    """`ray.init` of a local Ray, tried START_ATTEMPTS times (see GCS_WAIT_ENV): what a failed attempt left
    running is stopped before the next. Raises RayStartFailed, saying what to do, once every attempt failed."""
    failures: list[str] = []
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            with _gcs_wait(widened=attempt > 1), signal_handlers_kept():
                # "local": a Ray of podium's own. With no address, ray.init joins the cluster that `ray start` last
                # recorded on this machine (/tmp/ray/ray_current_cluster) if it runs: someone else's, and refused
                # anyway with num_cpus ("When connecting to an existing cluster, num_cpus ... must not be provided")
                ray.init(address="local", num_cpus=cpus, include_dashboard=False, logging_level=logging.WARNING,
                         log_to_driver=False)
            return
        except Exception as exc:  # Ray raises a bare Exception, RuntimeError or TimeoutError for a start that failed
            logger.warning("Ray's local start failed (attempt %d of %d)", attempt, START_ATTEMPTS, exc_info=True)
            failures.append(f"{_first_line(exc)}{_logs_of(exc)}")
            stopped = _stop_failed_start(exc)
            if attempt < START_ATTEMPTS:
                logger.warning("stopped what that start left (%s); starting Ray again", ", ".join(stopped) or "nothing")
    # raised here, not in the handler: no exception of Ray's as its context (podium.outages reads a chain of
    # timeouts as a server that stopped answering)
    raise RayStartFailed(
        f"Ray did not start on this machine ({START_ATTEMPTS} attempts; the last: {failures[-1]}): on a loaded "
        "machine Ray's processes can miss its start-up waits; run the same command again once the machine is "
        "quieter, or start Ray yourself (`ray start --head`) and set RAY_ADDRESS (or --ray-address) to its "
        f"address ({WHAT_TO_DO_DOC})")


@contextlib.contextmanager
def _gcs_wait(widened: bool) -> Iterator[None]:
    """While the block runs: Ray's GCS wait widened to GCS_WAIT_RETRY_S (a retry), unless the user set it."""
    if not widened or os.environ.get(GCS_WAIT_ENV):
        yield
        return
    os.environ[GCS_WAIT_ENV] = str(GCS_WAIT_RETRY_S)
    try:
        yield
    finally:
        os.environ.pop(GCS_WAIT_ENV, None)


def _first_line(exc: BaseException) -> str:
    """The first line of an exception's message (Ray's can hold pages of its processes' logs)."""
    text = str(exc).strip().splitlines()
    return text[0].rstrip(".") if text else type(exc).__name__


def _failed_node(exc: BaseException) -> Any:
    """The `ray._private.node.Node` whose start raised `exc`, found in its traceback: ray.init keeps no reference
    to a node whose constructor raised, and that node holds the processes it started (`all_processes`)."""
    tb: types.TracebackType | None = exc.__traceback__
    found = None
    while tb is not None:
        candidate = tb.tb_frame.f_locals.get("self")
        if isinstance(candidate, Node):
            found = candidate
        tb = tb.tb_next
    return found


def _logs_of(exc: BaseException) -> str:
    """"; Ray's logs: <folder>" of the failed start, where it got as far as making one."""
    logs = getattr(_failed_node(exc), "_logs_dir", None)
    return f"; Ray's logs: {logs}" if logs else ""


def _stop_failed_start(exc: BaseException) -> list[str]:
    """Stop the processes a failed `ray.init` left (its GCS, raylet, log monitor...); returns what was stopped.

    They would otherwise run on beside the next attempt, competing with it for the CPU it lacked, until this
    process exits (they share its fate)."""
    if ray.is_initialized() or ray_worker._global_node is not None:  # failed after the node started
        with signal_handlers_kept():
            ray.shutdown()
        return ["the connected node"]
    node = _failed_node(exc)
    if node is None:
        return []
    stopped = [f"{kind} (pid {info.process.pid})" for kind, infos in node.all_processes.items() for info in infos
               if info.process.poll() is None]
    try:
        node.kill_all_processes(check_alive=False, allow_graceful=True, wait=True)
    except Exception:  # a process that would not go: the next attempt starts anyway, and this process's exit ends it
        logger.warning("could not stop every process of the failed Ray start", exc_info=True)
    return stopped


def _join_wait_s() -> float:
    """How long a cluster named by RAY_ADDRESS may refuse connections (see DEFAULT_JOIN_WAIT_S)."""
    try:
        return max(1.0, float(os.environ.get(GCS_WAIT_ENV, DEFAULT_JOIN_WAIT_S)))
    except ValueError:
        return DEFAULT_JOIN_WAIT_S


def _check_cluster_answers(address: str) -> None:
    """Raise RayClusterUnreachable unless the GCS at `address` (host:port, as `ray start` prints it) accepts a
    connection within `_join_wait_s()`. Other forms (ray://, auto) are left to Ray."""
    if "://" in address:  # Ray Client (ray://): its own connection, with its own errors
        return
    try:
        canonical = canonicalize_bootstrap_address(address)
    except Exception:  # not host:port, or an `auto` that finds no cluster: ray.init says so in its own terms
        return
    if not canonical:
        return
    host, _, port = canonical.rpartition(":")
    wait_s = _join_wait_s()
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=min(5.0, wait_s)):
                return
        except OSError as exc:
            if time.monotonic() >= deadline:
                failure = f"{exc.strerror or type(exc).__name__} for {wait_s:.0f} s"
                break
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    raise RayClusterUnreachable(_unreachable_message(address, failure))


def _unreachable_message(address: str, failure: str) -> str:
    """What to tell someone whose RAY_ADDRESS does not answer."""
    return (f"RAY_ADDRESS = {address!r}: the Ray cluster there does not answer ({failure}): start it "
            "(`ray start --head` prints its address), point RAY_ADDRESS (or --ray-address) at one that runs, or "
            f"unset it for a local Ray of podium's own ({WHAT_TO_DO_DOC})")


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
        """Until Ray is up and the warm-up submitted (or that failed). Ray that did not start, or a cluster that
        does not answer, is raised here (RayStartFailed, RayClusterUnreachable): the command ends before its
        flow run starts. Any other error is handed to connect-ray, as before."""
        self._done.wait()
        if _started is not None and isinstance(_started.error, (RayStartFailed, RayClusterUnreachable)):
            raise _started.error


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
    _release = threading.Thread(target=shut_down_ray, name="podium-ray-release")  # not a daemon: joined at exit
    _release.start()


SHUTDOWN_WAIT_S = 30.0  # ray.shutdown's own work takes 1-3 s: past this it is hung (shut_down_ray)


def shut_down_ray(wait_s: float = SHUTDOWN_WAIT_S) -> bool:
    """`ray.shutdown()`, bounded. Its first step closes the driver's GCS subscribers with a blocking gRPC call
    that has no deadline, and that call can go unanswered (ray-project/ray#44836, #45044; seen here once in a
    test process's session of half an hour): the process then never exits. The shutdown runs in a daemon
    thread; if it has not ended in `wait_s`, the processes of a local Ray this process started (its GCS first
    among them) are killed, which ends the call (about 15 s later: gRPC's own reconnection attempts), and the
    shutdown finishes; it is waited for SHUTDOWN_WAIT_S more. A cluster joined through an address
    has no process of this one's to kill: its shutdown is left to end or not, in its daemon thread. Returns
    whether the shutdown ended."""
    node = ray_worker._global_node  # read before: ray.shutdown forgets it
    ended = threading.Event()

    def shut_down() -> None:
        try:
            with signal_handlers_kept():
                ray.shutdown()
        finally:
            ended.set()

    threading.Thread(target=shut_down, name="podium-ray-shutdown", daemon=True).start()
    if ended.wait(wait_s) or node is None or not node.all_processes:  # ended, or no process of this one's
        return ended.is_set()
    logger.warning("ray.shutdown() has not ended after %.0f s (a GCS call left unanswered): killing the local "
                   "Ray's processes", wait_s)
    node.kill_all_processes(check_alive=False, allow_graceful=False)
    return ended.wait(SHUTDOWN_WAIT_S)


def await_release() -> None:
    """Until a shutdown begun by `release_ray` has ended."""
    global _release
    if _release is not None:
        _release.join()
        _release = None
