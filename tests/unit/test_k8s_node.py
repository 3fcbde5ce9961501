"""`podium k8s ray-head` (podium.deployments.k8s_node): KubeRay's generated `ray start` read from its variable,
the job API found on the head, and the pod's stop carried to the running jobs before Ray stops (a fake job client
here; the real head, its job and the driver's stop in tests/integration/test_k8s_podman.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from podium.deployments.k8s_node import (
    dashboard_url,
    job_stop_wait_s,
    ray_start_args,
    stop_running_jobs,
)

# what KubeRay 1.7's generateRayStartCommand puts in KUBERAY_GEN_RAY_START_CMD for the rendered head (flags sorted,
# `--block` added by setMissingRayStartParams; ray-operator/controllers/ray/common/pod.go)
GENERATED = ("ray start --head  --block  --dashboard-agent-listen-port=52365  --dashboard-host=0.0.0.0  "
             "--memory=3221225472  --metrics-export-port=8080  --num-cpus=2 ")


def test_the_generated_ray_start_is_run_as_kuberay_wrote_it():
    args = ray_start_args({"KUBERAY_GEN_RAY_START_CMD": GENERATED})
    assert args[:4] == ["ray", "start", "--head", "--block"] and "--num-cpus=2" in args
    assert dashboard_url(args) == "http://127.0.0.1:8265"
    assert dashboard_url([*args, "--dashboard-port=9000"]) == "http://127.0.0.1:9000"
    # without --block `ray start` returns at once and the pod would end: it is added
    assert "--block" in ray_start_args({"KUBERAY_GEN_RAY_START_CMD": "ray start --head --num-cpus=1"})


@pytest.mark.parametrize("value, says", [(None, "is not set"), ("ray start --address=head:6379", "--head"),
                                         ("sleep 1", "--head")])
def test_a_pod_kuberay_did_not_make_a_head_of_is_refused_in_one_sentence(value, says):
    env = {} if value is None else {"KUBERAY_GEN_RAY_START_CMD": value}
    with pytest.raises(ValueError, match=says):
        ray_start_args(env)


def test_rays_wait_before_sigkill_is_read_from_the_pods_environment():
    assert job_stop_wait_s({"RAY_JOB_STOP_WAIT_TIME_S": "90"}) == 90
    assert job_stop_wait_s({}) == 3  # Ray's default


class FakeJobs:
    """Ray's job API as the head sees it: a running night, a finished one, a driver connected from elsewhere."""

    def __init__(self, ends_after_polls: int | None):
        self.jobs = {"night": "RUNNING", "yesterday": "SUCCEEDED"}
        self.stopped: list[str] = []
        self.polls = 0
        self.ends_after_polls = ends_after_polls

    def list_jobs(self):
        return [SimpleNamespace(submission_id=k, status=SimpleNamespace(value=v)) for k, v in self.jobs.items()] + [
            SimpleNamespace(submission_id=None, status=SimpleNamespace(value="RUNNING"))]

    def stop_job(self, job_id):
        self.stopped.append(job_id)
        return True

    def get_job_status(self, job_id):
        self.polls += 1
        if self.ends_after_polls is not None and self.polls >= self.ends_after_polls:
            self.jobs[job_id] = "STOPPED"
        return SimpleNamespace(value=self.jobs[job_id])

    def get_job_logs(self, job_id):
        return "epoch 1\ncheckpoint step 4\npodium: stopped by SIGTERM; --run-name (x) to resume\n"


def test_the_running_jobs_are_stopped_and_waited_for_with_their_last_lines():
    jobs = FakeJobs(ends_after_polls=3)
    now = [0.0]
    stopped = stop_running_jobs(jobs, wait_s=100, poll_s=1, clock=lambda: now[0],
                                sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert jobs.stopped == ["night"]  # the finished night and the driver without a submission id are left alone
    (night,) = stopped
    assert (night.submission_id, night.status) == ("night", "STOPPED") and now[0] == 2
    assert night.log_tail[-1].startswith("podium: stopped by SIGTERM")


def test_a_job_that_does_not_end_is_waited_for_no_longer_than_rays_sigkill():
    jobs = FakeJobs(ends_after_polls=None)
    now = [0.0]
    (night,) = stop_running_jobs(jobs, wait_s=10, poll_s=1, clock=lambda: now[0],
                                 sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert night.status is None and now[0] == 10


def test_the_head_process_stops_ray_on_sigterm_and_exits_143(tmp_path: Path):
    """The real `podium k8s ray-head` process with a stand-in `ray` (its `start` blocks, its `stop` ends it) and no
    job API: a SIGTERM ends it, Ray stopped, exit 143."""
    fake = tmp_path / "ray"
    fake.write_text(f"#!{sys.executable}\n"
                    "import os, signal, sys, time, pathlib\n"
                    f"pid = pathlib.Path({str(tmp_path / 'pid')!r})\n"
                    "if sys.argv[1] == 'stop':\n"
                    "    os.kill(int(pid.read_text()), signal.SIGTERM); sys.exit(0)\n"
                    "pid.write_text(str(os.getpid())); time.sleep(60)\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}",
           "KUBERAY_GEN_RAY_START_CMD": "ray start --head --block --dashboard-port=1", "RAY_JOB_STOP_WAIT_TIME_S": "0"}
    head = subprocess.Popen([sys.executable, "-c", "import sys; from podium.cli.main import main; "
                             "sys.exit(main(['k8s', 'ray-head']))"], env=env, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (tmp_path / "pid").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    head.send_signal(signal.SIGTERM)
    out, _ = head.communicate(timeout=60)
    assert head.returncode == 143, out
    assert "SIGTERM: stopping the running jobs first" in out and "stopping Ray" in out, out


def test_the_job_api_is_called_as_rays_job_submission_client_calls_it():
    """DashboardJobs against a stand-in dashboard answering the paths and bodies of Ray 2.60's job API
    (ray/dashboard/modules/job/sdk.py: list_jobs, stop_job, get_job_status, get_job_logs)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from podium.deployments.k8s_node import DashboardJobs

    calls: list[tuple[str, str]] = []
    status = ["RUNNING"]

    class Dashboard(BaseHTTPRequestHandler):
        def _json(self, body) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            calls.append(("GET", self.path))
            job = {"type": "SUBMISSION", "job_id": "02000000", "submission_id": "night", "status": status[0]}
            self._json({"/api/jobs/": [job], "/api/jobs/night": job,
                        "/api/jobs/night/logs": {"logs": "a\npodium: stopped by SIGTERM\n"}}[self.path])

        def do_POST(self) -> None:
            calls.append(("POST", self.path))
            status[0] = "STOPPED"
            self._json({"stopped": True})

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Dashboard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        (night,) = stop_running_jobs(DashboardJobs(f"http://127.0.0.1:{server.server_address[1]}"), wait_s=10)
    finally:
        server.shutdown()
    assert (night.submission_id, night.status, night.log_tail[-1]) == ("night", "STOPPED", "podium: stopped by SIGTERM")
    assert calls[:3] == [("GET", "/api/jobs/"), ("POST", "/api/jobs/night/stop"), ("GET", "/api/jobs/night")]
