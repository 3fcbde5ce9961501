"""`podium run` plans first (a bad input is refused before anything starts), then starts Ray in a background thread,
while its main thread loads Prefect, MLflow and torch: the thread must load nothing but Ray's own modules and what
was loaded before it started, and the flow must take the warm-up it submitted instead of starting another."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from podium.training import cluster

pytestmark = pytest.mark.integration

# Runs in a fresh interpreter: the state of a `podium run` process, then its start-up (podium.cli.run._prepare).
PROBE = r"""
import importlib.abc, json, os, sys, threading, time

loaded_by_thread, ray_loaded_by_main = [], []

class Recorder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if threading.current_thread().name == "podium-ray-start":
            loaded_by_thread.append(name)
        elif threading.current_thread() is threading.main_thread() and name.startswith("ray."):
            ray_loaded_by_main.append((name, time.monotonic()))
        return None

from podium.training import cluster

before = set()
original_start = cluster.EarlyStart.start
def start(self):
    before.update(m.split(".")[0] for m in sys.modules)
    sys.meta_path.insert(0, Recorder())
    original_start(self)
cluster.EarlyStart.start = start

import ray
from podium.cli import run as commands
from podium.cli.main import build_parser
from podium.cli.options import config_from_args
from podium.settings import PodiumSettings
from podium.training.resources import warm_up_of
from podium.tasks.train import connect_ray

args = build_parser().parse_args(["run", "--epochs", "1", "--num-workers", "1", "--concurrency", "1",
                                  "--train-data", sys.argv[1], "--val-data", sys.argv[2],
                                  "--storage", sys.argv[3] + "/storage", "--serving", sys.argv[3] + "/serving"])
settings = PodiumSettings()
config = config_from_args(args, settings)
clock = commands.StartupClock()
commands._library_variables()
plan = commands._plan(config, settings, clock, [])  # first, as `podium run` does: nothing has started yet
commands._quiet_libraries(settings.home_dir / "logs" / "podium.log")
servers = commands._start_servers(config, settings, "run")
commands._prepare(config, settings, clock, servers)
# what the main thread loaded of `ray` while the Ray thread was starting it
ray_meanwhile = sorted({n for n, t in ray_loaded_by_main if t < servers.ray.ended})
assert ray.is_initialized()
handed = cluster._started is not None and cluster._started.warm_up == warm_up_of(plan.config)
submitted = []
original_prewarm = cluster.prewarm_validation_workers
cluster.prewarm_validation_workers = lambda *a, **k: submitted.append(a) or original_prewarm(*a, **k)
connect_ray(plan)
# a Ray of podium's own passes its variables through the raylet's environment, not a job runtime_env (which
# would keep Ray's prestarted workers from ever running the job's work), and leaves this process's as it was
job_env = dict(ray.get_runtime_context().runtime_env)
worker_env = ray.get(ray.remote(lambda: os.environ.get(cluster.POLL_INTERVAL_ENV)).remote())
# a preload thread runs as far below this process as Ray's workers run (they nice() themselves at start);
# this process, its main thread, keeps its priority
from podium.imports import Preload
own = lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
nice = {"main_before": own()}
probe = Preload("podium-preload-probe", lambda: nice.update(preload=own()))
probe.start(); probe.wait()
nice.update(worker=ray.get(ray.remote(lambda: os.getpriority(os.PRIO_PROCESS, 0)).remote()), main_after=own())
# only what was loaded (a failed optional import is no risk), by top-level package
new = sorted({m.split(".")[0] for m in loaded_by_thread if m in sys.modules} - before - {"ray"})
# once training and validation are done, the flow releases the Ray that start_early started (and only that)
cluster.release_ray()
cluster.await_release()
released = not ray.is_initialized()
ray.init(address="local", num_cpus=1, include_dashboard=False)  # someone else's: a test's, a notebook's
cluster.release_ray()
cluster.await_release()
print(json.dumps({"new": [m for m in new if not m.startswith("_cython")], "handed": handed,
                  "prewarmed_again": len(submitted), "phases": sorted(clock.phases), "released": released,
                  "ray_meanwhile": ray_meanwhile,
                  "kept_others": ray.is_initialized(), "job_env": job_env, "worker_env": worker_env,
                  "poll": os.environ[cluster.POLL_INTERVAL_ENV], "pythonpath": os.environ.get("PYTHONPATH"),
                  "nice": nice}))
ray.shutdown()
"""


def test_ray_starts_in_the_background_loading_only_ray_and_is_released_when_done(prefect_api, dataset, tmp_path):
    env = {**os.environ, "PODIUM_HOME": str(tmp_path / "home"), "PREFECT_API_URL": prefect_api,
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-c", PROBE, dataset[0], dataset[1], str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # a package first loaded by the Ray thread could be initialised by both threads at once: add it to
    # podium.training.cluster.RAY_LAZY_IMPORTS
    assert out["new"] == [], out["new"]
    # nor may the main thread load other parts of `ray` meanwhile (the plan, which may import the user's code and
    # Ray Train with it, came before Ray's start)
    assert out["ray_meanwhile"] == [], out["ray_meanwhile"]
    assert out["handed"] and out["prewarmed_again"] == 0
    assert {"demo_data", "plan", "mlflow_check", "ray", "prefect_server"} <= set(out["phases"])
    assert out["released"] and out["kept_others"]
    assert out["job_env"] == {} and out["worker_env"] == out["poll"]
    assert out["pythonpath"] == env.get("PYTHONPATH")
    nice = out["nice"]
    assert nice["main_after"] == nice["main_before"] < nice["worker"], nice
    assert nice["preload"] == (nice["worker"] if sys.platform.startswith("linux") else nice["main_before"]), nice


# A local Ray whose GCS is frozen (SIGSTOP) before the shutdown: the driver's first shutdown step, closing its GCS
# subscribers, is a gRPC call with no deadline that it then never gets answered (as happened once at a test
# process's end, with the GCS running).
FROZEN_GCS = r"""
import json, os, signal, sys, time
import psutil, ray
from ray._private import worker as ray_worker
from podium.training.cluster import shut_down_ray

ray.init(address="local", num_cpus=1, include_dashboard=False)
node = ray_worker._global_node
pids = [info.process.pid for infos in node.all_processes.values() for info in infos]
gcs = node.all_processes["gcs_server"][0].process.pid
os.kill(gcs, signal.SIGSTOP)
start = time.monotonic()
ended = shut_down_ray(wait_s=float(sys.argv[1]))
left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
print(json.dumps({"s": time.monotonic() - start, "ended": ended, "initialized": ray.is_initialized(), "left": left}))
"""


def test_a_shutdown_whose_gcs_never_answers_ends_with_ray_s_processes_killed(tmp_path):
    env = {**os.environ}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-c", FROZEN_GCS, "3"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ended"] and 3 <= out["s"] < 3 + cluster.SHUTDOWN_WAIT_S and not out["initialized"] and out["left"] == [], out
