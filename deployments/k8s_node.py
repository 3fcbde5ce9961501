"""The Ray head of a night's RayJob as its pod's first process (`podium k8s ray-head`), so that the pod's stop
reaches the night's driver.

Kubernetes stops a pod (deleted, evicted, its node drained) with SIGTERM to each container's first process, then
SIGKILL once terminationGracePeriodSeconds are over. KubeRay's head runs `ray start --head --block` in
`/bin/bash -lc`, where the SIGTERM ends Ray and with it the driver of the night, `podium run`, which Ray's job
supervisor runs as a child of the head's Ray: the run dies with the node, saying nothing, its MLflow run and flow
run left RUNNING. Here the head's first process is podium's (the head group's template has KubeRay's annotation
`ray.io/overwrite-container-cmd: "true"`, so that KubeRay keeps the container's command instead of wrapping it:
ray-operator/controllers/ray/common/pod.go, BuildPod). It starts the `ray start` command KubeRay generated, which
KubeRay hands it in KUBERAY_GEN_RAY_START_CMD (setContainerEnvVars), and on SIGTERM:

1. stops every job still running through the dashboard's job API (POST /api/jobs/<id>/stop, what
   `JobSubmissionClient.stop_job` sends): Ray's job supervisor sends the driver, `podium run`, SIGTERM, and
   SIGKILL only RAY_JOB_STOP_WAIT_TIME_S later, so that podium ends the night as its own stop does (MLflow run
   KILLED, flow run Cancelled, nothing promoted, exit 143);
2. waits for those jobs to end (at most that wait and a margin), says how each ended, with the last lines of its log;
3. `ray stop`, and exits 143.

The grace periods nest, each outer one longer than the one inside it: the pod's terminationGracePeriodSeconds
(HEAD_STOP_GRACE_S) > RAY_JOB_STOP_WAIT_TIME_S (JOB_STOP_WAIT_S) > podium's own stop budget (STOP_GRACE_S).
"""

from __future__ import annotations

import json
import logging
import os
import resource
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType, SimpleNamespace
from typing import Any, Protocol

from podium.core.exits import EXIT_REFUSED, exit_for_signal

logger = logging.getLogger(__name__)

START_COMMAND_ENV = "KUBERAY_GEN_RAY_START_CMD"  # KubeRay's generated `ray start`, in every Ray container
OVERWRITE_COMMAND_ANNOTATION = "ray.io/overwrite-container-cmd"  # KubeRay keeps the container's command
HEAD_STOP_GRACE_S = 120  # the head pod's terminationGracePeriodSeconds
JOB_STOP_WAIT_S = 90  # RAY_JOB_STOP_WAIT_TIME_S of the head's Ray: the driver's SIGTERM to SIGKILL
JOB_STOP_WAIT_ENV = "RAY_JOB_STOP_WAIT_TIME_S"
OPEN_FILES = 65536  # what KubeRay's generated command asks for (`ulimit -n ${RAY_START_ULIMIT_OPEN_FILES:-65536}`)
DASHBOARD_PORT = 8265  # the head's dashboard: Ray's job API (the submitter's `ray job submit`, the stop here)
LOG_TAIL_LINES = 10
ENDED = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})  # ray.job_submission.JobStatus's terminal values


class JobClient(Protocol):
    """What the head uses of Ray's job API (DashboardJobs; a fake in the unit tests)."""

    def list_jobs(self) -> list[Any]: ...

    def stop_job(self, job_id: str) -> bool: ...

    def get_job_status(self, job_id: str) -> Any: ...

    def get_job_logs(self, job_id: str) -> str: ...


def ray_start_args(env: dict[str, str]) -> list[str]:
    """KubeRay's generated `ray start --head ... --block`, as arguments; ValueError, in one sentence, where the
    environment has no such command (the pod was not made by KubeRay, or not for a head)."""
    command = env.get(START_COMMAND_ENV, "").strip()
    if not command:
        raise ValueError(f"{START_COMMAND_ENV} is not set: `podium k8s ray-head` is the command of a RayJob's head "
                         "container, where KubeRay puts its generated `ray start` in that variable")
    args = shlex.split(command)
    if args[:3] != ["ray", "start", "--head"]:
        raise ValueError(f"{START_COMMAND_ENV} = {command!r}: expected a head's `ray start --head ...`")
    if "--block" not in args:  # KubeRay adds it (setMissingRayStartParams); without it `ray start` returns at once
        args.append("--block")
    return args


def dashboard_url(args: list[str]) -> str:
    """The head's job API, on this pod: the dashboard's port of the `ray start` arguments, else Ray's default."""
    port = str(DASHBOARD_PORT)
    for i, arg in enumerate(args):
        if arg.startswith("--dashboard-port="):
            port = arg.split("=", 1)[1]
        elif arg == "--dashboard-port" and i + 1 < len(args):
            port = args[i + 1]
    return f"http://127.0.0.1:{port}"


def job_stop_wait_s(env: dict[str, str]) -> float:
    """How long Ray's job supervisor waits between a stopped driver's SIGTERM and its SIGKILL (Ray's default 3 s
    where the pod does not set it)."""
    try:
        return float(env.get(JOB_STOP_WAIT_ENV, "3"))
    except ValueError:
        return 3.0


@dataclass
class StoppedJob:
    """One job the head stopped, and how it ended (its status; `None`: not ended within the wait)."""

    submission_id: str
    status: str | None
    log_tail: list[str]
    last_seen: str = ""  # the last status the job API gave, or why it gave none (a job not ended)


def _status(value: Any) -> str:
    return str(getattr(value, "value", value)).upper()


def stop_running_jobs(client: JobClient, wait_s: float, poll_s: float = 0.5,
                      clock: Callable[[], float] = time.monotonic,
                      sleep: Callable[[float], None] = time.sleep) -> list[StoppedJob]:
    """Ask Ray to stop every submitted job that has not ended (its driver gets SIGTERM), wait up to `wait_s` for
    them to end, and return how each ended with the last lines of its log. Jobs without a submission id (a driver
    connected from elsewhere) are not Ray's to stop."""
    running = [job.submission_id for job in client.list_jobs()
               if getattr(job, "submission_id", None) and _status(job.status) not in ENDED]
    for job_id in running:
        try:
            client.stop_job(job_id)
        except Exception as exc:  # a job that ended meanwhile: Ray answers with an error
            logger.warning("podium k8s ray-head: could not stop job %s: %s", job_id, exc)
    deadline = clock() + wait_s
    statuses: dict[str, str | None] = dict.fromkeys(running)
    seen: dict[str, str] = dict.fromkeys(running, "")
    while True:
        for job_id in running:
            if statuses[job_id] is None:
                try:
                    status = _status(client.get_job_status(job_id))
                except Exception as exc:  # the job API did not answer: said with the job's end
                    status, seen[job_id] = "", f"{type(exc).__name__}: {exc}"
                else:
                    seen[job_id] = status
                if status in ENDED:
                    statuses[job_id] = status
        if all(s is not None for s in statuses.values()) or clock() >= deadline:
            break
        sleep(poll_s)
    stopped = []
    for job_id in running:
        try:
            tail = client.get_job_logs(job_id).splitlines()[-LOG_TAIL_LINES:]
        except Exception as exc:
            tail = [f"(its log could not be read: {type(exc).__name__}: {exc})"]
        stopped.append(StoppedJob(job_id, statuses[job_id], tail, seen[job_id]))
    return stopped


def head_says(line: str) -> None:
    """One line on the pod's log (`kubectl logs`): this process is the container's first, its output is the log."""
    print(f"podium k8s ray-head: {line}", flush=True)


def _raise_open_files() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = OPEN_FILES if hard == resource.RLIM_INFINITY else min(OPEN_FILES, hard)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


class DashboardJobs:
    """The head's job API over HTTP: the requests ray.job_submission.JobSubmissionClient makes (GET /api/jobs/,
    POST /api/jobs/<id>/stop, GET /api/jobs/<id>, GET /api/jobs/<id>/logs), without importing Ray into the `podium`
    command (its parser loads this module)."""

    def __init__(self, url: str, timeout_s: float = 10.0):
        self.url, self.timeout_s = url.rstrip("/"), timeout_s

    def _call(self, method: str, path: str) -> Any:
        request = urllib.request.Request(f"{self.url}{path}", method=method)
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            return json.loads(response.read().decode() or "null")

    def list_jobs(self) -> list[Any]:
        return [SimpleNamespace(**job) for job in self._call("GET", "/api/jobs/")]

    def stop_job(self, job_id: str) -> bool:
        return bool(self._call("POST", f"/api/jobs/{job_id}/stop").get("stopped"))

    def get_job_status(self, job_id: str) -> Any:
        return self._call("GET", f"/api/jobs/{job_id}")["status"]

    def get_job_logs(self, job_id: str) -> str:
        return str(self._call("GET", f"/api/jobs/{job_id}/logs").get("logs", ""))


def _job_client(url: str) -> JobClient | None:
    client = DashboardJobs(url)
    try:
        client._call("GET", "/api/version")
    except (OSError, ValueError) as exc:  # the dashboard not (yet, or any more) up: there is no job to stop
        head_says(f"the job API at {url} does not answer ({type(exc).__name__}): no job to stop")
        return None
    return client


def _ray_stop(env: dict[str, str]) -> None:
    try:
        subprocess.run(["ray", "stop"], env=env, timeout=60, check=False, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        head_says(f"`ray stop` did not end ({exc})")


def stop_node(url: str, env: dict[str, str], node: subprocess.Popen[bytes],
              client_of: Callable[[str], JobClient | None] = _job_client) -> None:
    """The head's stop: its jobs stopped and waited for, then Ray."""
    client = client_of(url)
    if client is not None:
        wait_s = job_stop_wait_s(env) + 10.0  # Ray's SIGKILL comes at the wait's end: a margin to see it
        try:
            stopped = stop_running_jobs(client, wait_s)
        except Exception as exc:
            head_says(f"the jobs could not be listed ({type(exc).__name__}: {exc})")
            stopped = []
        for job in stopped:
            head_says(f"job {job.submission_id}: {job.status or f'not ended within {wait_s:.0f} s (last seen: {job.last_seen})'}")
            for line in job.log_tail:
                head_says(f"  {line}")
        if not stopped:
            head_says("no job was running")
    head_says("stopping Ray")
    _ray_stop(env)
    try:
        node.wait(timeout=30)
    except subprocess.TimeoutExpired:
        node.kill()


def run_head(argv_env: dict[str, str] | None = None) -> int:
    """`podium k8s ray-head`: KubeRay's `ray start` as this process's child, and the pod's SIGTERM carried to the
    night's jobs before Ray stops. Its exit: Ray's where Ray ended by itself, 143 after a SIGTERM, 2 where there is
    no `ray start` to run."""
    env = dict(os.environ if argv_env is None else argv_env)
    try:
        args = ray_start_args(env)
    except ValueError as exc:
        print(f"podium: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    asked = threading.Event()
    got: list[int] = []

    def handler(signum: int, _frame: FrameType | None) -> None:
        if not got:
            got.append(signum)
        asked.set()

    for sig in (signal.SIGTERM, signal.SIGINT):  # as the container's first process, no default action is taken
        signal.signal(sig, handler)
    try:
        _raise_open_files()
    except (OSError, ValueError) as exc:
        head_says(f"open files not raised to {OPEN_FILES} ({exc})")
    head_says(shlex.join(args))
    node = subprocess.Popen(args, env=env)  # the signals stay with this process: Ray gets them from `ray stop`
    while not asked.is_set():
        if node.poll() is not None:
            head_says(f"Ray ended by itself (exit {node.returncode})")
            return node.returncode if node.returncode >= 0 else 128 - node.returncode
        asked.wait(1.0)
    name = signal.Signals(got[0]).name
    head_says(f"{name}: stopping the running jobs first (their drivers get SIGTERM)")
    stop_node(dashboard_url(args), env, node)
    return exit_for_signal(got[0])
