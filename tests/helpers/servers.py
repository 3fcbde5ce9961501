"""Helpers for tests that start servers of their own (Prefect, MLflow) as processes."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from podium.settings import count_start

BIN = Path(sys.executable).parent


def wait_http_ok(url: str, proc: subprocess.Popen, log: Path, timeout_s: float, poll_s: float = 1.0) -> None:
    """Wait until `url` answers 200; fail with the server's log if it exits or takes longer than `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:4]} exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(poll_s)
    raise RuntimeError(f"{url} not healthy after {timeout_s:g} s:\n{log.read_text()[-3000:]}")


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def model_server(model_uri: str, env: dict[str, str], log: Path, timeout_s: float = 300) -> Iterator[str]:
    """A real `mlflow models serve -m <model_uri> --env-manager local` process; yields its base URL.

    It runs uvicorn from PATH: the test interpreter's bin folder goes first."""
    port = free_port()
    bin_dir = str(Path(sys.executable).parent)
    proc = subprocess.Popen(
        [str(Path(bin_dir) / "mlflow"), "models", "serve", "-m", model_uri, "--env-manager", "local",
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        env={**env, "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"},
        stdout=log.open("wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    count_start("mlflow_server")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(f"{url}/ping", proc, log, timeout_s=timeout_s)
        yield url
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


class MlflowServer:
    """`mlflow server` in a process group of its own, on a fixed port and SQLite file across restarts."""

    def __init__(self, root: Path, template_db: Path | None = None, artifacts: str | None = None):
        """`artifacts`: where the server keeps the artifacts it proxies (a folder under `root` unless given: a
        URI of an object store, reached with the credentials this process's environment holds)."""
        root.mkdir(parents=True, exist_ok=True)
        self.artifacts = artifacts or str(root / "artifacts")
        self.root, self.port = root, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.db = root / "mlflow.db"
        if template_db is not None:
            shutil.copy(template_db, self.db)  # schema already migrated: the server starts in seconds
        self.log = root / "server.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 180) -> None:
        """Start (or restart) the server and wait until /health answers."""
        self.proc = subprocess.Popen(
            [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
             "--backend-store-uri", f"sqlite:///{self.db}", "--artifacts-destination", self.artifacts],
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}, stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        count_start("mlflow_server")
        wait_http_ok(f"{self.url}/health", self.proc, self.log, timeout_s, poll_s=0.2)

    def signal(self, sig: int) -> None:
        """Send a signal to the server's whole process group (the CLI and its uvicorn worker)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL the server (its port refuses connections until it is started again)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.proc = None

    def requests(self, method: str, path: str) -> int:
        """How many requests for an exact path the server handled (its access log), whatever it answered."""
        return self.log.read_text(errors="replace").count(f'"{method} {path} HTTP/1.1"')


@contextlib.contextmanager
def small_tmpfs(folder: Path, size: str = "4m") -> Iterator[Path]:
    """A tmpfs of `size` mounted on `folder` (made here): a filesystem that fills up for real. Skips the test where
    it cannot be mounted (that needs root); unmounted after."""
    import pytest

    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root: the disk-full test cannot run as this user")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill_filesystem(folder: Path, leave_bytes: int) -> Path:
    """Fill the filesystem of `folder` until about `leave_bytes` are free; returns the filler file."""
    st = os.statvfs(folder)
    filler = Path(folder) / "filler.bin"
    with open(filler, "wb") as f:
        left = max(st.f_bavail * st.f_frsize - leave_bytes, 0)
        while left > 0:
            try:
                left -= f.write(b"\0" * min(left, 1 << 24))
            except OSError:  # full a little early: that is the point
                break
    return filler


class RayHead:
    """`ray start --head` on a fixed port (a cluster of its own, as a remote one would be), token auth off.

    Its own temp dir: `ray start` records its address in `<temp dir>/ray_current_cluster`, and in
    /tmp/ray/ that file would send any bare `ray.init()` on this machine (another test's, Ray Data's
    auto-init) to this head, or, once it is killed, to a dead address. Its processes are told apart by that
    dir, which each names in its command line."""

    def __init__(self, tmp_path, env, num_cpus: int = 5):
        # one machine on loopback, never drained: without Ray Train's preemption watcher, as podium's own local Ray
        self.port, self.env = free_port(), {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0", **env, "RAY_AUTH_MODE": "disabled"}
        self.num_cpus = num_cpus
        self.log = tmp_path / "ray-head.log"
        self.temp = tempfile.mkdtemp(prefix="rh-", dir="/tmp")  # Ray's socket paths must stay short

    def start(self) -> None:
        subprocess.run([os.path.join(os.path.dirname(sys.executable), "ray"), "start", "--head", "--port",
                        str(self.port), "--num-cpus", str(self.num_cpus), "--include-dashboard", "false", "--disable-usage-stats",
                        "--temp-dir", self.temp],
                       env=self.env, stdout=self.log.open("ab"), stderr=subprocess.STDOUT, check=True, timeout=120)

    def processes(self, name: str = "") -> list[int]:
        """The pids of this head's processes, or of those named `name`: every process whose command line
        names the head's temp dir, except this test's own process and a `podium` command (a driver, not
        part of the head). Told apart by what runs, never by a path: a clone or a virtualenv in a folder
        named `podium` puts that word in every Ray worker's command line."""
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            driver = " -m podium" in cmd or os.path.basename(cmd.split(" ", 1)[0]) == "podium"
            if self.temp in cmd and name in cmd and int(pid) != os.getpid() and not driver:
                found.append(int(pid))
        return found

    def kill(self, name: str = "") -> None:
        for pid in self.processes(name):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        """Every process of the head gone, its temp dir removed. Never `ray stop`: it would stop every Ray on
        this machine. A raylet may start a worker while its siblings die: kill until none is left."""
        deadline = time.monotonic() + 30
        while self.processes() and time.monotonic() < deadline:
            self.kill()
            time.sleep(0.2)
        shutil.rmtree(self.temp, ignore_errors=True)

    def driver_env(self) -> dict[str, str]:
        """What a `podium` process needs to run on this head, as a user's would on their team's cluster."""
        return {"RAY_ADDRESS": f"127.0.0.1:{self.port}", "RAY_AUTH_MODE": "disabled"}

    def metrics_urls(self) -> list[str]:
        """Each live node's Prometheus export (its metrics agent's `/metrics`), as `ray.nodes()` names its port;
        asked by a driver of its own, so that the test's process never joins this head."""
        ask = ("import json, ray; ray.init(logging_level='ERROR'); print(json.dumps([[n['NodeManagerAddress'], "
               "n['MetricsExportPort']] for n in ray.nodes() if n['Alive']]))")
        done = subprocess.run([sys.executable, "-c", ask], env={**self.env, **self.driver_env()}, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, f"ray.nodes() failed:\n{done.stderr[-2000:]}"
        return [f"http://{host}:{port}/metrics" for host, port in json.loads(done.stdout.strip().splitlines()[-1])]
