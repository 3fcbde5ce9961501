"""The embedded defaults: a local Prefect server process, the MLflow SQLite store, and the MLflow UI on it.

A local Prefect server is started detached, so the UI stays up after the command ends; the
next command finds it again through home/prefect/server.json. That file is a claim, not a
fact: before a server is reused or stopped, its process (pid and start time) and its API (the
port answers, and it is the server of this home's database) are checked. A file that fails
the check is stale: it is replaced, and the process it names is never signalled.

Why one module of this size: the Prefect server, the MLflow store and the MLflow UI are the embedded
defaults as one unit (started, checked and stopped together by the commands), sharing the process and
port handling.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from podium.core.redaction import redact_uri
from podium.errors import ServiceError
from podium.settings import count_start

logger = logging.getLogger(__name__)


PORT_ATTEMPTS = 3  # starts of the local Prefect server, each on a port found free, before podium gives up


class PortTaken(ServiceError):
    """The port a local server was started on was taken by another process first."""


def _prefect_auth_headers() -> dict[str, str]:
    """The Authorization header Prefect's own client sends when PREFECT_API_AUTH_STRING is set (the server's
    basic auth); none otherwise."""
    auth = os.environ.get("PREFECT_API_AUTH_STRING")
    return {"Authorization": f"Basic {base64.b64encode(auth.encode()).decode()}"} if auth else {}


def _get_json(url: str, timeout: float = 2.0) -> Any:
    """The JSON a Prefect API URL answers with (authenticated as Prefect's client is), or None if it does
    not answer 200."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=_prefect_auth_headers()),
                                    timeout=timeout) as r:
            return json.loads(r.read()) if r.status == 200 else None
    except (urllib.error.URLError, OSError, ValueError):
        return None


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


def prefect_health(api_url: str, timeout: float) -> str:
    """One GET of a Prefect API's /health: "up"; "slow" (no answer within `timeout`: a server that may only
    be busy); "gone" (the connection refused or cut, or an error answer: no server there)."""
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout) as r:
            return "up" if r.status == 200 else "gone"
    except TimeoutError:
        return "slow"
    except urllib.error.URLError as exc:
        return "slow" if isinstance(exc.reason, TimeoutError) else "gone"
    except (OSError, ValueError):
        return "gone"


def _healthy(api_url: str, timeout: float = 2.0) -> bool:
    return prefect_health(api_url, timeout) == "up"


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _any_free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _free_port(preferred: int) -> int:
    return preferred if _port_free(preferred) else _any_free_port()


def process_start_time(pid: int) -> str | None:
    """When the process `pid` started (an opaque string), or None if no live process has that pid.

    A pid alone does not name a process: once it exits, the number can be given to another.
    The pid and its start time together do."""
    if Path("/proc/self/stat").exists():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        fields = stat.rsplit(")", 1)[1].split()  # the command name, in parentheses, may hold spaces
        return None if fields[0] in ("Z", "X") else fields[19]  # field 3 is the state, 22 the start time
    try:  # no /proc (macOS)
        out = subprocess.run(["ps", "-o", "lstart=", "-p", str(pid)], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _prefect_env(prefect_home: Path, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PREFECT_API_URL", None)
    url = f"http://127.0.0.1:{port}/api"
    env.update({
        "PREFECT_HOME": str(prefect_home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        # the UI reads its API from /ui-settings, which defaults to port 4200 whatever port the
        # server listens on: a server on another port would show another server's runs
        "PREFECT_SERVER_API_HOST": "127.0.0.1",
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_SERVER_UI_API_URL": url,
        # the UI's static copy goes under home, not into site-packages
        "PREFECT_SERVER_UI_STATIC_DIRECTORY": str(prefect_home / "ui_static"),
        # task-run states and events reach the database through batching services that flush
        # every 5 s by default. Shorter flush intervals make records visible sooner but cost an
        # idle server ~28% of a core (measured: 0.29 vs 0.01 CPU-s/s), so only the batches grow.
        "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "100",
        "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_READ_BATCH_SIZE": "100",
        "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_BATCH_SIZE": "100",
    })
    return env


@contextlib.contextmanager
def _starting(prefect_home: Path) -> Iterator[None]:
    """One podium command at a time checks, starts or stops this home's server."""
    prefect_home.mkdir(parents=True, exist_ok=True)
    with open(prefect_home / "server.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _read_state(state_file: Path) -> dict[str, Any] | None:
    try:
        state = json.loads(state_file.read_text())
    except (OSError, ValueError):
        return None
    keys = {"pid": int, "started": str, "port": int, "api_url": str}
    if not isinstance(state, dict) or not all(isinstance(state.get(k), t) for k, t in keys.items()):
        return None  # unreadable, or written by an older podium that recorded no start time
    return state


def _ours(state: dict[str, Any] | None) -> bool:
    """The recorded process is still the one podium started (same pid, same start time)."""
    return state is not None and process_start_time(state["pid"]) == state["started"]


def _serves_home(api_url: str, prefect_home: Path) -> bool:
    """The API at `api_url` is the server whose home (and so database) is `prefect_home`."""
    settings = _get_json(f"{api_url.rstrip('/')}/admin/settings", timeout=5.0)
    return isinstance(settings, dict) and settings.get("home") == str(prefect_home)


def _reuse(state_file: Path, prefect_home: Path, timeout_s: float) -> str | None:
    """The recorded server's API URL if it is verified; None (file removed) if the file is stale."""
    state = _read_state(state_file)
    if state is None or not _ours(state):
        if state_file.exists():
            logger.info("%s names no running server of podium's: replaced", state_file)
            state_file.unlink()
        return None
    url = state["api_url"]
    deadline = time.monotonic() + min(timeout_s, 30.0)
    while not _healthy(url) and time.monotonic() < deadline and _ours(state):
        time.sleep(0.5)
    if _healthy(url) and _serves_home(url, prefect_home):
        return url
    if not _ours(state):  # it exited while we waited
        state_file.unlink(missing_ok=True)
        return None
    raise ServiceError(f"the local Prefect server (pid {state['pid']}) does not answer as this home's server at "
                       f"{url}; stop it with `podium server stop`, then try again")


def running_prefect_server(home: Path, timeout_s: float = 10.0) -> str | None:
    """The API URL of this home's Prefect server if it is running (none is started), else None."""
    prefect_home = home.resolve() / "prefect"
    if not (prefect_home / "server.json").exists():
        return None
    with _starting(prefect_home):
        return _reuse(prefect_home / "server.json", prefect_home, timeout_s)


def ensure_prefect_server(home: Path, port: int = 4200, api_url: str | None = None,
                          timeout_s: float = 120.0, env: dict[str, str] | None = None) -> str:
    """The Prefect API URL to use: the configured one (checked), this home's running server, or a new one.

    A server started here listens on `port` if it is free, else on a free port, and its UI reads
    its own API. It gets this process's environment plus `env` (for example
    PREFECT_API_DATABASE_CONNECTION_URL to keep its state in PostgreSQL)."""
    if api_url:
        if not _healthy(api_url, timeout=5.0):
            raise ServiceError(f"PREFECT_API_URL = {api_url!r}: the Prefect server does not answer at /health")
        return api_url
    prefect_home = home.resolve() / "prefect"
    state_file = prefect_home / "server.json"
    with _starting(prefect_home), _starter():
        reused = _reuse(state_file, prefect_home, timeout_s)
        if reused:
            return reused
        # a port found free can be taken by another process before the server binds it (another
        # project's podium starting at the same moment): then the server starts again on another port
        for attempt in range(PORT_ATTEMPTS):
            try:
                chosen = _free_port(port) if attempt == 0 else _any_free_port()
                return _start_prefect_server(prefect_home, chosen, timeout_s, env or {})
            except PortTaken as exc:
                logger.warning("%s: starting the Prefect server on another port", exc)
        raise ServiceError(f"the local Prefect server lost its port {PORT_ATTEMPTS} times in a row; see "
                           f"{prefect_home / 'server.log'}")


def _start_prefect_server(prefect_home: Path, port: int, timeout_s: float, env: dict[str, str]) -> str:
    """Start a server on `port`; raises PortTaken where another process has the port."""
    url = f"http://127.0.0.1:{port}/api"
    log_path = prefect_home / "server.log"
    prefect_home.mkdir(parents=True, exist_ok=True)
    logged_before = log_path.stat().st_size if log_path.exists() else 0
    me = threading.get_ident()
    with _launch_lock:
        if me in _abandoned:
            raise ServiceError("the command is ending: the local Prefect server is not started")
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                env={**_prefect_env(prefect_home, port), **env}, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # outlives this command, so the UI stays up
            )
        count_start("prefect_server")
        _launching[me] = proc
    try:
        return _await_started(proc, prefect_home, port, url, log_path, logged_before, timeout_s)
    except BaseException:  # Ctrl-C in this thread, or a start that failed: no server left that nothing names
        _terminate_group(proc.pid)
        raise
    finally:
        with _launch_lock:
            _launching[me] = None


def _await_started(proc: subprocess.Popen, prefect_home: Path, port: int, url: str, log_path: Path,
                   logged_before: int, timeout_s: float) -> str:
    """Wait until the server just started answers as this home's, then record it (server.json)."""
    started = process_start_time(proc.pid)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log_path, "rb") as f:
                f.seek(logged_before)
                if b"already in use" in f.read():  # prefect's own check, or uvicorn's bind
                    raise PortTaken(f"port {port} was taken before the Prefect server could bind it")
            raise ServiceError(f"the local Prefect server exited with code {proc.returncode}; see {log_path}")
        if _healthy(url):
            if not _serves_home(url, prefect_home):  # another server took the port first
                raise PortTaken(f"port {port} answers as another Prefect server")
            (prefect_home / "server.json").write_text(json.dumps(
                {"pid": proc.pid, "started": started, "port": port, "api_url": url, "home": str(prefect_home)}))
            _started_here.add(prefect_home)
            return url
        time.sleep(0.1)  # a refused connection costs nothing; the flow waits for this answer
    raise ServiceError(f"the local Prefect server did not become healthy in {timeout_s:g} s; see {log_path}")


# the homes whose Prefect server this process started (a command that is refused stops it again)
_started_here: set[Path] = set()
# the threads in `ensure_prefect_server` now, each with the server it is starting (None before its start and once
# it is recorded in server.json), and those of them whose start was abandoned
_launch_lock = threading.Lock()
_launching: dict[int, subprocess.Popen | None] = {}
_abandoned: set[int] = set()


@contextlib.contextmanager
def _starter() -> Iterator[None]:
    """This thread checks or starts a server meanwhile (what `abandon_starts` stops)."""
    me = threading.get_ident()
    with _launch_lock:
        _launching[me] = None
        # a start begun now is not one `abandon_starts` stopped: thread idents are reused once a thread ends, and
        # an ident left marked would refuse every later start of a thread that happens to get it
        _abandoned.discard(me)
    try:
        yield
    finally:
        with _launch_lock:
            _launching.pop(me, None)
            _abandoned.discard(me)


def abandon_starts() -> None:
    """The command is ending (Ctrl-C before its run started, any early exit): a Prefect server that another
    thread of it is still starting is stopped now, and that thread starts none after this. Without it, the
    server (a session of its own, so that it outlives the command) would run on with no server.json naming it:
    `podium server stop` could not find it, and the next command would start a second one on the same database.
    A server already recorded stays, as after any run."""
    with _launch_lock:
        for ident, proc in _launching.items():
            _abandoned.add(ident)
            if proc is not None:
                _terminate_group(proc.pid)


def started_here(home: Path) -> bool:
    """Whether this process started the local Prefect server of `home` (rather than finding it running)."""
    return home.resolve() / "prefect" in _started_here


def _terminate_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)


def stop_prefect_server(home: Path, timeout_s: float = 30.0) -> bool:
    """Stop the local Prefect server podium started, if it is still the one recorded; True if one was stopped.

    A state file whose process is gone (or whose pid now names another process) is removed, and
    nothing is signalled."""
    prefect_home = home.resolve() / "prefect"
    state_file = prefect_home / "server.json"
    if not state_file.exists():
        return False
    with _starting(prefect_home):
        state = _read_state(state_file)
        ours = _ours(state)
        if state is not None and ours:
            _terminate_group(state["pid"])
            deadline = time.monotonic() + timeout_s
            while _ours(state) and time.monotonic() < deadline:
                time.sleep(0.2)
        state_file.unlink(missing_ok=True)
        _started_here.discard(prefect_home)
        return ours


def ui_url(api_url: str) -> str:
    """The Prefect UI base URL for an API URL (http://host:port/api -> http://host:port)."""
    return api_url.rstrip("/").removesuffix("/api")


_SQLITE_HEADER = b"SQLite format 3\x00"


def check_mlflow(tracking_uri: str, wait_s: float = 60.0) -> None:
    """Check a tracking URI before training starts, without loading MLflow (about a second) or opening its
    store: the flow opens the store while training runs (podium.flows.pipeline). Raises ServiceError naming
    what is wrong.

    - `sqlite:///path`: its folder is created, and must be writable; a file already there must be a SQLite
      database. (The flow's process creates a new store, before any other opens it: see prepare_mlflow.)
    - `http(s)://`: the server must answer (any HTTP answer: what it says is for the flow's requests). A
      server that refuses connections is waited for up to `wait_s`, as MLflow's retries would wait for a
      write (podium.tracking.client.HTTP_RETRY_DEFAULTS).
    - any other scheme (a database, Databricks): the store is opened here (prepare_mlflow).
    """
    if tracking_uri.startswith("sqlite:///"):
        _check_sqlite_store(Path(tracking_uri.removeprefix("sqlite:///")), tracking_uri)
    elif tracking_uri.startswith(("http://", "https://")):
        _check_tracking_server(tracking_uri, wait_s)
    else:
        prepare_mlflow(tracking_uri)


def _check_sqlite_store(path: Path, tracking_uri: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ServiceError(f"MLflow tracking URI {tracking_uri!r} is not usable: cannot create its folder "
                           f"{path.parent}: {exc.strerror or exc}") from None
    if path.is_dir():
        raise ServiceError(f"MLflow tracking URI {tracking_uri!r} is not usable: {path} is a folder, "
                           "expected a SQLite database file (or nothing, for a new store)")
    if path.exists():
        try:
            with open(path, "rb") as f:
                header = f.read(len(_SQLITE_HEADER))
        except OSError as exc:
            raise ServiceError(f"MLflow tracking URI {tracking_uri!r} is not usable: cannot read {path}: "
                               f"{exc.strerror or exc}") from None
        if header and header != _SQLITE_HEADER:
            raise ServiceError(f"MLflow tracking URI {tracking_uri!r} is not usable: {path} is not a SQLite "
                               "database")
        writable = os.access(path, os.W_OK)
    else:
        writable = os.access(path.parent, os.W_OK)
    if not writable:
        raise ServiceError(f"MLflow tracking URI {tracking_uri!r} is not usable: "
                           f"{path if path.exists() else path.parent} is not writable")


def _check_tracking_server(tracking_uri: str, wait_s: float) -> None:
    url = f"{tracking_uri.rstrip('/')}/health"
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            with urllib.request.urlopen(url, timeout=20):
                return
        except urllib.error.HTTPError:
            return  # an answer: the server is there
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if time.monotonic() >= deadline:
                raise ServiceError(f"MLflow tracking server {redact_uri(tracking_uri)} is not reachable: "
                                   f"{reason} (tried for {wait_s:.0f} s)") from None
            if not said:
                logger.warning("MLflow tracking server %s does not answer (%s): waiting up to %.0f s",
                               redact_uri(tracking_uri), reason, wait_s)
                said = True
            time.sleep(min(2.0, max(deadline - time.monotonic(), 0.0)))
        except ValueError as exc:  # not a URL urllib can open
            raise ServiceError(f"MLflow tracking URI {redact_uri(tracking_uri)} is not usable: {exc}") from None


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


def start_mlflow_ui(tracking_uri: str, artifacts: str, log_path: Path, port: int = 5000,
                    timeout_s: float = 120.0) -> tuple[subprocess.Popen[bytes], str]:
    """Start `mlflow ui` on a tracking store (on `port` if free, else a free port); returns it and its URL.

    The process belongs to the caller (`podium ui` stops it on Ctrl-C)."""
    port = _free_port(port)
    url = f"http://127.0.0.1:{port}"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", tracking_uri,
             "--registry-store-uri", tracking_uri, "--artifacts-destination", artifacts,
             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            # a UI to read runs needs no job runners (MLflow's GenAI jobs): without them it starts 6 processes
            # fewer and spends ~35 CPU-seconds less starting (measured: 45 against 9 CPU-s in its first 30 s)
            env={"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ},
            start_new_session=True)  # its own group: `mlflow ui` runs the web server as a child of its own
    count_start("mlflow_server")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServiceError(f"the MLflow UI exited with code {proc.returncode}; see {log_path}")
        if _healthy(url):
            return proc, url
        time.sleep(0.5)
    stop_process(proc)
    raise ServiceError(f"the MLflow UI did not answer in {timeout_s:g} s; see {log_path}")


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    """Stop a server this process started in a session of its own, with its children."""
    if proc.poll() is None:
        _terminate_group(proc.pid)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
