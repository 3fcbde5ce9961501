"""Training on a core of its own, pinned from inside the process that trains.

`CoreSplit` is used as `with split:` around one way of running the job. Until training starts every
process has every core (start-up runs on the whole machine, as it does for a user). The Ray Train worker
moves itself onto the training core when it is constructed; from then on, while it lives,
`benchmarks.guard.Monitor` moves every other process of the benchmark (Ray's GCS and raylet, the other
workers, the Prefect server, `podium run`, the harness itself) onto the other cores, and gives them every
core back once training is over. How the train worker pins itself:

- `env()` sets `RAY_RUNTIME_ENV_HOOK` for the way's process. Ray applies that hook to the runtime env of
  every `ray.init` (ray/_private/worker.py `_maybe_modify_runtime_env`), podium's included, and the hook
  adds `worker_process_setup_hook = benchmarks.pinning.setup_worker` (chaining a hook the way set itself).
- In every worker process of the job, `setup_worker` arranges that Ray Train's worker actor class
  (`RayTrainWorker`, ray 2.60's V2 worker group) pins its process when it is constructed: every thread in
  /proc/self/task moves to the training core (threads started later inherit it), and one line
  {pid, t, threads} is appended to `$BENCH_PIN_LOG`.

So whichever process Ray picks for the train worker, a fresh one or an idle one it reuses (podium prewarms
validation workers), is pinned the moment it becomes one. Matching process titles from outside, as this
module did before, missed reused workers for a long time and could match another session's Ray Train worker.
`benchmarks.guard.Monitor` verifies the result from outside while the way runs. Benchmark-only code; Ray
itself does not pin CPUs and neither podium nor the loops know about this.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import time
from typing import Any

HOOK_ENV = "RAY_RUNTIME_ENV_HOOK"
CPUS_ENV = "BENCH_TRAIN_CPUS"
LOG_ENV = "BENCH_PIN_LOG"
CHAINED_ENV = "BENCH_CHAINED_SETUP_HOOK"
TARGET = "ray.train.v2._internal.execution.worker_group.worker"


class CoreSplit:
    """Training worker on the first usable core, everything else on the others (see the module docstring).

    With fewer than two usable cores, or `enabled=False`, it does nothing."""

    def __init__(self, enabled: bool = True):
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.enabled = enabled and len(cpus) >= 2
        self.all = set(cpus)
        self.train = set(cpus[:1])
        self.other = set(cpus[1:]) if self.enabled else set(cpus)

    def describe(self) -> str:
        """How the cores were shared, for BENCHMARKS.md."""
        if not self.enabled:
            return "no pinning"
        return (f"while a Ray Train worker runs, it has core {sorted(self.train)} and everything else core(s) "
                f"{sorted(self.other)}; before and after training, every process has every core")

    def env(self, pin_log: str) -> dict[str, str]:
        """Environment variables for a way's process: the Ray hook and where pins are recorded."""
        if not self.enabled:
            return {}
        return {HOOK_ENV: "benchmarks.pinning.runtime_env_hook", CPUS_ENV: ",".join(map(str, sorted(self.train))),
                LOG_ENV: pin_log}

    def __enter__(self) -> CoreSplit:
        if self.enabled:  # the whole machine until training starts (the monitor splits it then)
            set_process_affinity(self.all)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            set_process_affinity(self.all)


def set_process_affinity(cpus: set[int], pid: int | str = "self") -> int:
    """Move every thread of process `pid` (default: this one) to `cpus` (os.sched_setaffinity(pid, ...) moves
    only one thread); threads started later inherit it. Returns the number of threads seen; a process or
    thread that ended meanwhile is skipped."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tids:
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # the thread ended meanwhile
            pass
    return len(tids)


def read_pins(pin_log: str) -> list[dict[str, Any]]:
    """Every pin record of a way ({pid, t, threads, cpus})."""
    if not os.path.exists(pin_log):
        return []
    with open(pin_log) as f:
        return [json.loads(line) for line in f if line.strip()]


# ---------------------------------------------------------------- inside Ray (driver and workers)

def runtime_env_hook(runtime_env: dict[str, Any] | None) -> dict[str, Any]:
    """RAY_RUNTIME_ENV_HOOK: add the setup hook below to the job's runtime env, keeping one already set."""
    env = dict(runtime_env or {})
    previous = env.get("worker_process_setup_hook")
    if previous is not None and not isinstance(previous, str):
        return env  # a callable hook cannot be chained by name: leave it, the way will show as not pinned
    if previous:
        env["env_vars"] = {**env.get("env_vars", {}), CHAINED_ENV: previous}
    env["worker_process_setup_hook"] = "benchmarks.pinning.setup_worker"
    return env


def setup_worker() -> None:
    """Ray worker_process_setup_hook: run the chained hook, then pin Ray Train workers on construction."""
    chained = os.environ.get(CHAINED_ENV)
    if chained:
        module, _, name = chained.rpartition(".")
        getattr(importlib.import_module(module), name)()
    if not os.environ.get(CPUS_ENV):
        return
    if TARGET in sys.modules:
        _patch(sys.modules[TARGET])
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


def pin_this_process() -> None:
    """Move every thread of this process to $BENCH_TRAIN_CPUS and record it in $BENCH_PIN_LOG."""
    cpus = {int(c) for c in os.environ[CPUS_ENV].split(",")}
    threads = set_process_affinity(cpus)
    log = os.environ.get(LOG_ENV)
    if log:
        record = {"pid": os.getpid(), "t": time.time(), "threads": threads, "cpus": sorted(cpus)}
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)


def _patch(module: Any) -> None:
    cls = module.RayTrainWorker
    original = cls.__init__
    if getattr(original, "_bench_pinning", False):
        return

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        pin_this_process()
        original(self, *args, **kwargs)

    __init__._bench_pinning = True  # type: ignore[attr-defined]
    cls.__init__ = __init__


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Wraps RayTrainWorker.__init__ once its module has run (in the controller too: harmless, no actor
    is constructed there)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader

        class _Loader(importlib.abc.Loader):
            def create_module(self, s: Any) -> Any:
                return loader.create_module(s)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)
                _patch(module)

        spec.loader = _Loader()
        return spec
