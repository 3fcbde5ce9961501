"""The local Prefect server's saved state is a claim, checked before it is reused or stopped.

The "servers" here are a `sleep` process (for pid and start time) and a tiny HTTP server that
answers like a Prefect API; no Prefect server starts.
"""

from __future__ import annotations

import base64
import http.server
import json
import subprocess
import threading
from pathlib import Path

import pytest

from podium.errors import ServiceError
from podium.services import _reuse, check_mlflow, process_start_time, stop_prefect_server


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def _fake_api(home: str, auth: str | None = None):
    """An HTTP server that answers /api/health and /api/admin/settings as the server of `home`; with `auth`
    ("user:password"), it answers /api/admin/settings only to that basic auth, as Prefect's server does."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            settings = self.path.endswith("/admin/settings")
            if settings and auth and self.headers.get("Authorization") != f"Basic {base64.b64encode(auth.encode()).decode()}":
                self.send_response(401)
                self.end_headers()
                return
            body = json.dumps({"home": home} if settings else True).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _state(home: Path, pid: int, started: str | None, port: int) -> Path:
    prefect_home = home.resolve() / "prefect"
    prefect_home.mkdir(parents=True, exist_ok=True)
    state = prefect_home / "server.json"
    state.write_text(json.dumps({"pid": pid, "started": started, "port": port,
                                 "api_url": f"http://127.0.0.1:{port}/api", "home": str(prefect_home)}))
    return state


def test_a_reused_pid_is_never_signalled(tmp_path, sleeper):
    """The recorded pid now belongs to another process (another start time): stop leaves it alone."""
    state = _state(tmp_path, sleeper.pid, "12345", 4200)
    assert stop_prefect_server(tmp_path) is False
    assert sleeper.poll() is None, "a process the state file did not start was signalled"
    assert not state.exists()  # the stale file is gone


def test_a_stale_file_is_replaced_not_trusted(tmp_path, sleeper):
    """The port answers healthy, but the recorded process is not the one that started: not reused."""
    api = _fake_api(str(tmp_path.resolve() / "prefect"))
    try:
        state = _state(tmp_path, sleeper.pid, "12345", api.server_address[1])
        assert _reuse(state, tmp_path.resolve() / "prefect", timeout_s=5) is None
        assert not state.exists() and sleeper.poll() is None
    finally:
        api.shutdown()


def test_the_server_answering_must_be_this_homes(tmp_path, sleeper):
    """Our process, but the port answers as another home's server: refused, with what to do."""
    api = _fake_api("/somewhere/else/prefect")
    try:
        state = _state(tmp_path, sleeper.pid, process_start_time(sleeper.pid), api.server_address[1])
        with pytest.raises(ServiceError, match="podium server stop"):
            _reuse(state, tmp_path.resolve() / "prefect", timeout_s=5)
    finally:
        api.shutdown()


def test_a_verified_server_is_reused(tmp_path, sleeper):
    api = _fake_api(str(tmp_path.resolve() / "prefect"))
    try:
        port = api.server_address[1]
        state = _state(tmp_path, sleeper.pid, process_start_time(sleeper.pid), port)
        assert _reuse(state, tmp_path.resolve() / "prefect", timeout_s=5) == f"http://127.0.0.1:{port}/api"
        assert state.exists()
    finally:
        api.shutdown()


def test_stop_signals_the_recorded_process_when_it_is_still_the_one(tmp_path, sleeper):
    _state(tmp_path, sleeper.pid, process_start_time(sleeper.pid), 4200)
    assert stop_prefect_server(tmp_path) is True
    assert sleeper.wait(timeout=10) is not None


def test_a_server_with_basic_auth_is_verified_with_prefects_auth_string(tmp_path, sleeper, monkeypatch):
    """The server requires basic auth: podium's check sends PREFECT_API_AUTH_STRING, as Prefect's client does;
    without it the server cannot be verified, and is not reused."""
    api = _fake_api(str(tmp_path.resolve() / "prefect"), auth="podium:s3cret")
    try:
        port = api.server_address[1]
        state = _state(tmp_path, sleeper.pid, process_start_time(sleeper.pid), port)
        monkeypatch.delenv("PREFECT_API_AUTH_STRING", raising=False)
        with pytest.raises(ServiceError):
            _reuse(state, tmp_path.resolve() / "prefect", timeout_s=5)
        monkeypatch.setenv("PREFECT_API_AUTH_STRING", "podium:s3cret")
        assert _reuse(state, tmp_path.resolve() / "prefect", timeout_s=5) == f"http://127.0.0.1:{port}/api"
    finally:
        api.shutdown()


# --- the MLflow check before training (the store itself opens while training runs) ----------------

def test_a_sqlite_store_is_checked_without_opening_it(tmp_path):
    db = tmp_path / "new" / "mlflow.db"
    check_mlflow(f"sqlite:///{db}")
    assert db.parent.is_dir() and not db.exists()  # its folder made; the flow creates the store

    (tmp_path / "notes.txt").write_text("not a database")
    with pytest.raises(ServiceError, match="notes.txt is not a SQLite database"):
        check_mlflow(f"sqlite:///{tmp_path / 'notes.txt'}")
    with pytest.raises(ServiceError, match="is a folder, expected a SQLite database file"):
        check_mlflow(f"sqlite:///{tmp_path / 'new'}")
    (tmp_path / "file").write_text("")
    with pytest.raises(ServiceError, match="cannot create its folder"):
        check_mlflow(f"sqlite:///{tmp_path / 'file' / 'mlflow.db'}")


def test_a_tracking_server_must_answer_and_any_answer_will_do():
    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        check_mlflow(url)  # a proxy without /health is still a server: what it says is the flow's to read
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(ServiceError, match=r"MLflow tracking server http://127\.0\.0\.1:\d+ is not reachable: "
                                           r".*refused.* \(tried for 0 s\)"):
        check_mlflow(url, wait_s=0)
