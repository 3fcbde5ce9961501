"""The embedded defaults: a local Prefect server process and the MLflow SQLite store.

A local Prefect server is started detached, so the UI stays up after the command
ends; the next command finds it again through home/prefect/server.json.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class ServiceError(RuntimeError):
    """A server podium needs is unreachable or would not start."""


class Background:
    """`fn(*args)` running in a daemon thread from now on; `result()` waits for it and returns its value or
    raises its error. Daemon: a command that fails meanwhile exits without waiting for it.

    `started` and `ended` (time.monotonic()) say when it ran, for the start-up timings."""

    def __init__(self, fn: Callable[..., Any], *args: Any, name: str):
        self._value: Any = None
        self._error: BaseException | None = None
        self.started = time.monotonic()
        self.ended: float | None = None
        self._thread = threading.Thread(target=self._run, args=(fn, args), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            self._value = fn(*args)
        except BaseException as exc:  # re-raised in the caller's thread by result()
            self._error = exc
        finally:
            self.ended = time.monotonic()

    def result(self) -> Any:
        """Wait for the function; its value, or its exception raised here."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


def _healthy(api_url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _free_port(preferred: int) -> int:
    if _port_free(preferred):
        return preferred
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prefect_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PREFECT_API_URL", None)
    env.update({
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        # the UI's static copy goes under home, not into site-packages
        "PREFECT_SERVER_UI_STATIC_DIRECTORY": str(home / "ui_static"),
        # task-run states and events reach the database through batching services that flush
        # every 5 s by default. Shorter flush intervals make records visible sooner but cost an
        # idle server ~28% of a core (measured: 0.29 vs 0.01 CPU-s/s), so only the batches grow.
        "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "100",
        "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_READ_BATCH_SIZE": "100",
        "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_BATCH_SIZE": "100",
    })
    return env


def ensure_prefect_server(home: Path, port: int = 4200, api_url: str | None = None,
                          timeout_s: float = 120.0, env: dict[str, str] | None = None) -> str:
    """The Prefect API URL to use: the configured one (checked), a running local one, or a new local one.

    A server started here gets this process's environment plus `env` (for example
    PREFECT_API_DATABASE_CONNECTION_URL to keep its state in PostgreSQL)."""
    if api_url:
        if not _healthy(api_url, timeout=5.0):
            raise ServiceError(f"PREFECT_API_URL = {api_url!r}: the Prefect server does not answer at /health")
        return api_url
    state_file = home / "prefect" / "server.json"
    if state_file.exists():
        state = json.loads(state_file.read_text())
        if _healthy(state["api_url"]):
            return state["api_url"]
    (home / "prefect").mkdir(parents=True, exist_ok=True)
    port = _free_port(port)
    url = f"http://127.0.0.1:{port}/api"
    log = open(home / "prefect" / "server.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env={**_prefect_env(home / "prefect"), **(env or {})}, stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # outlives this command, so the UI stays up
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServiceError(f"the local Prefect server exited with code {proc.returncode}; "
                               f"see {home / 'prefect' / 'server.log'}")
        if _healthy(url):
            state_file.write_text(json.dumps({"pid": proc.pid, "api_url": url}))
            return url
        time.sleep(0.5)
    proc.kill()
    raise ServiceError(f"the local Prefect server did not become healthy in {timeout_s:g} s; "
                       f"see {home / 'prefect' / 'server.log'}")


def stop_prefect_server(home: Path) -> bool:
    """Stop the local Prefect server podium started, if any."""
    state_file = home / "prefect" / "server.json"
    if not state_file.exists():
        return False
    pid = json.loads(state_file.read_text())["pid"]
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    state_file.unlink()
    return True


def ui_url(api_url: str) -> str:
    """The Prefect UI base URL for an API URL (http://host:port/api -> http://host:port)."""
    return api_url.rstrip("/").removesuffix("/api")


def prepare_mlflow(tracking_uri: str) -> None:
    """Create the MLflow store once, before any worker process opens it.

    Several processes opening a brand-new SQLite store at once race on its schema
    migrations and can leave it broken; one process going first avoids that.
    """
    if tracking_uri.startswith("sqlite:///"):
        Path(tracking_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient(tracking_uri=tracking_uri).search_experiments(max_results=1)
    except Exception as exc:
        raise ServiceError(f"MLflow tracking URI {tracking_uri!r} is not usable: {exc}") from None
