"""Pure pieces of podium's answers to outages and stops: the Prefect link's bookkeeping, a clean stop's
signal handling, the user's frames of a remote traceback, a full disk told apart."""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket

import pytest

from podium import prefect_api
from podium.core.failures import user_frames
from podium.errors import RunStopped
from podium.flows.stop import StopRequest, exit_code, stop_on_signals
from podium.outages import is_unreachable
from podium.serving.layout import is_disk_full


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/api"  # nothing listens there once the socket is closed


def test_a_call_to_a_server_that_is_down_is_skipped_said_once_and_replayed_when_it_returns(caplog):
    link = prefect_api.PrefectLink(_dead_url())
    calls: list[int] = []

    def failing() -> int:
        import httpx

        raise httpx.ConnectError("All connection attempts failed")

    with caplog.at_level(logging.WARNING, logger="podium.prefect_api"):
        assert link.call("an artifact", failing, key="a") is None
        assert link.down
        for i in range(5):  # while down: not called, the latest write per key kept
            assert link.call("an artifact", lambda i=i: calls.append(i), key="a") is None
        assert link.call("a read", lambda: calls.append(99)) is None
    assert calls == []
    assert sum("stopped answering" in r.getMessage() for r in caplog.records) == 1
    link.mark_up()
    assert calls == [4], "the latest held write is sent when the server answers again"
    assert not link.down and link.outages == 1


def test_the_watch_takes_a_refused_connection_for_an_outage_at_once_and_late_answers_only_when_they_last():
    """A server that is gone refuses the connection: down after two probes. One that accepts and does not answer
    in time may only be busy (a loaded machine): down once it has not answered for `slow_down_s`."""
    import time

    gone = prefect_api.PrefectLink(_dead_url())
    assert not gone.probe(timeout=0.2, misses_to_down=2, slow_down_s=60)
    assert not gone.down
    assert not gone.probe(timeout=0.2, misses_to_down=2, slow_down_s=60)
    assert gone.down, "two refused probes: an outage, whatever slow_down_s says"

    with socket.socket() as listening:  # accepts connections (the kernel's backlog) and never answers
        listening.bind(("127.0.0.1", 0))
        listening.listen(8)
        busy = prefect_api.PrefectLink(f"http://127.0.0.1:{listening.getsockname()[1]}/api")
        started = time.monotonic()
        assert not busy.probe(timeout=0.2, misses_to_down=2, slow_down_s=1.0)
        assert not busy.probe(timeout=0.2, misses_to_down=2, slow_down_s=1.0)
        assert not busy.down, "two late answers are not an outage yet"
        while time.monotonic() - started < 1.0:
            busy.probe(timeout=0.2, misses_to_down=2, slow_down_s=1.0)
        busy.probe(timeout=0.2, misses_to_down=2, slow_down_s=1.0)
        assert busy.down, "no answer for slow_down_s: an outage"


def test_a_posted_write_does_not_wait_for_a_slow_server_and_only_the_latest_waiting_one_is_sent():
    """Found in a profile of a benchmark run: the flow's loop waited 3-10 s per progress update on a Prefect
    server starved of CPU beside training, and the checkpoints announced meanwhile reached MLflow that late."""
    import threading
    import time

    link = prefect_api.PrefectLink(_dead_url())
    answer, asked, sent = threading.Event(), threading.Event(), []

    def slow_write(i: int) -> None:
        asked.set()
        answer.wait(10)  # the server answers only when the test says so
        sent.append(i)

    started = time.monotonic()
    link.post("a progress update", lambda: slow_write(0), key="progress")
    assert asked.wait(5)
    for i in range(1, 5):
        link.post("a progress update", lambda i=i: slow_write(i), key="progress")
    assert time.monotonic() - started < 2.0, "the caller waited for the server"
    assert not link.flush(timeout_s=0.2)  # still in flight
    answer.set()
    assert link.flush(timeout_s=5)
    assert sent == [0, 4], "the first write, then the latest of those posted while it was in flight"

    link.mark_down("a test")
    link.post("a progress update", lambda: sent.append(5), key="progress")
    assert link.flush(timeout_s=5) and sent == [0, 4]  # held while down, like a call with a key
    link.mark_up()
    assert sent == [0, 4, 5]


def test_a_write_held_past_the_end_of_its_flows_client_is_sent_with_a_client_of_its_own():
    """Found in the suite: the server came back just as the flow ended, and the held artifacts were sent with
    the client the flow's engine had closed ("Cannot send a request, as the client has been closed")."""
    from prefect.client.orchestration import get_client
    from prefect.context import SyncClientContext

    link = prefect_api.PrefectLink(_dead_url())
    link.mark_down("a test")
    used = []

    def write() -> None:
        client = get_client(sync_client=True)
        assert not client._closed, "a closed client would refuse the request"
        used.append(client)

    with SyncClientContext() as run_ctx:  # the flow's engine: the write is held inside its context
        link.call("an artifact", write, key="a")
    assert run_ctx.client._closed  # the engine is done
    link.mark_up()
    assert len(used) == 1 and used[0] is not run_ctx.client


def test_a_refused_request_is_logged_not_taken_for_an_outage(caplog):
    link = prefect_api.PrefectLink(_dead_url())

    def refused() -> None:
        raise ValueError("422 Unprocessable Entity")

    assert link.call("an artifact", refused, key="a") is None
    assert not link.down


def test_held_log_lines_wait_while_down_and_settle_says_what_was_not_recorded():
    link = prefect_api.PrefectLink(_dead_url())
    link.mark_down("test")
    for i in range(3):
        link.log_sink({"message": str(i)})
    link.call("an artifact", lambda: None, key="chart")
    said = link.settle(flow_end_recorded=False)
    assert said is not None and said.startswith(f"the Prefect server {link.api_url} has not answered since ")
    assert "the flow run's final state, 1 artifact(s), 3 log line(s)" in said


def test_unreachable_is_a_transport_failure_a_timeout_or_a_5xx():
    import httpx

    assert is_unreachable(httpx.ConnectError("refused"))
    assert is_unreachable(httpx.ReadTimeout("slow"))
    assert is_unreachable(TimeoutError())
    response = httpx.Response(503, request=httpx.Request("GET", "http://x"))
    assert is_unreachable(httpx.HTTPStatusError("503", request=response.request, response=response))
    bad = httpx.Response(422, request=httpx.Request("GET", "http://x"))
    assert not is_unreachable(httpx.HTTPStatusError("422", request=bad.request, response=bad))
    assert not is_unreachable(ValueError("no"))


def test_the_same_rule_holds_for_the_tracking_server_s_client():
    import httpx
    import requests

    assert is_unreachable(requests.ConnectionError("refused"))
    answered = requests.Response()
    answered.status_code = 404
    assert not is_unreachable(requests.HTTPError("404", response=answered))
    answered.status_code = 502
    assert is_unreachable(requests.HTTPError("502", response=answered))
    try:
        try:
            raise httpx.ConnectError("refused")
        except httpx.ConnectError as exc:
            raise RuntimeError("the call failed") from exc
    except RuntimeError as wrapped:
        assert is_unreachable(wrapped)  # what it was raised from decides


def test_client_settings_are_bounded_unless_set():
    env = {"PREFECT_API_REQUEST_TIMEOUT": "30"}
    prefect_api.bound_client_settings(env)
    assert env == {"PREFECT_API_REQUEST_TIMEOUT": "30", "PREFECT_CLIENT_MAX_RETRIES": "2"}


def test_a_signal_asks_for_a_stop_instead_of_interrupting():
    stop = StopRequest()
    stop.check()  # nothing asked
    stop.request(signal.SIGTERM)
    with pytest.raises(RunStopped, match="stopped by SIGTERM"):
        stop.check()
    assert exit_code(signal.SIGINT) == 130 and exit_code(signal.SIGTERM) == 143


def test_sigint_inside_the_flow_sets_the_request_and_the_handlers_are_restored():
    before = signal.getsignal(signal.SIGINT)
    from podium.flows import stop as stop_module

    with stop_on_signals() as stop:
        assert stop is stop_module.STOP and not stop.requested
        os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt: a request
        assert stop.wait(5) and stop.signum == signal.SIGINT
    assert signal.getsignal(signal.SIGINT) is before
    with stop_on_signals() as again:  # the next flow run in the process starts with no request
        assert not again.requested


RAY_TRACE = '''Traceback (most recent call last):
  File "/venv/lib/python3.12/site-packages/ray/train/v2/_internal/execution/thread_runner.py", line 48, in _run_target
    result = target()
             ^^^^^^^^
  File "/home/me/proj/mypkg/train.py", line 30, in train_func
    check(batch)
  File "/home/me/proj/mypkg/train.py", line 12, in check
    raise ValueError("bad batch")
ValueError: bad batch'''


def test_user_frames_leave_out_rays_machinery():
    text = user_frames(RAY_TRACE)
    assert "site-packages/ray" not in text and "result = target()" not in text
    assert text.splitlines() == [
        "Traceback (most recent call last):",
        '  File "/home/me/proj/mypkg/train.py", line 30, in train_func',
        "    check(batch)",
        '  File "/home/me/proj/mypkg/train.py", line 12, in check',
        '    raise ValueError("bad batch")',
        "ValueError: bad batch"]


def test_a_ray_task_error_reads_as_the_users_traceback():
    # Ray 2.60's RayTaskError(RuntimeError) keeps the remote trace as its message, after the task's header
    text = ("\x1b[36mray::podium-validate:checkpoint_000001()\x1b[39m (pid=15462, ip=192.0.2.2)\n"
            '  File "/venv/lib/python3.11/site-packages/podium/training/validation_call.py", line 120, in call_validation\n'
            "    out = fn(checkpoint, config)\n"
            '  File "/home/me/proj/mypkg/evaluate.py", line 9, in validate\n'
            '    raise RuntimeError("no data")\n'
            "RuntimeError: no data")
    assert user_frames(text).splitlines() == [
        "Traceback (most recent call last):",
        '  File "/home/me/proj/mypkg/evaluate.py", line 9, in validate',
        '    raise RuntimeError("no data")',
        "RuntimeError: no data"]


def test_disk_full_is_told_apart_also_as_a_cause():
    full = OSError(errno.ENOSPC, "No space left on device")
    assert is_disk_full(full)
    try:
        try:
            raise full
        except OSError as exc:
            raise RuntimeError("copy failed") from exc
    except RuntimeError as wrapped:
        assert is_disk_full(wrapped)
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))


class _FreezesMidAnswer:
    """An MLflow-like HTTP server on loopback whose first answer stops after half its body (a server frozen
    mid-answer) or, with `ends`, after its headers, its connection closed (a worker that ended mid-answer), then
    answers whole."""

    def __init__(self, ends: bool = False) -> None:
        import http.server
        import json
        import threading

        outer = self
        self.requests = 0
        body = json.dumps({"experiment": {"experiment_id": "7", "name": "podium", "artifact_location": "/tmp/a",
                                          "lifecycle_stage": "active"}}).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if outer.requests == 1 and ends:
                    self.close_connection = True  # nothing of the body: the client reads IncompleteRead(0 bytes)
                    return
                if outer.requests == 1:
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    outer.release.wait(10)  # the rest never comes in time
                    return
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.release = threading.Event()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("ends", [False, True], ids=["frozen", "ended"])
def test_an_answer_cut_short_mid_body_is_asked_for_again(monkeypatch, ends):
    """MLflow's HTTP retries cover no answer at all, not an answer whose body stopped coming (requests reads the
    body after urllib3's Retry is done), frozen or its connection closed: podium's tracking calls are asked again,
    on MLflow's schedule."""
    from podium.errors import TrackingUnavailable
    from podium.tracking.client import answer_cut_short, tracking_call, tracking_client

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")

    @tracking_call("reading the experiment")
    def experiment(uri: str):
        return tracking_client(uri).get_experiment_by_name("podium")

    server = _FreezesMidAnswer(ends)
    try:
        assert experiment(server.url).experiment_id == "7"
        assert server.requests == 2
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # no retry left: said as an outage
        server.requests = 0
        with pytest.raises(TrackingUnavailable, match="unreachable while reading the experiment"):
            experiment(server.url)
    finally:
        server.close()
    from mlflow.exceptions import MlflowException

    refused = MlflowException("API request to http://x failed with exception HTTPConnectionPool(host='x', port=1): "
                              "Max retries exceeded with url: /a (Caused by ReadTimeoutError(\"Read timed out.\"))")
    assert not answer_cut_short(refused)  # urllib3 retried that one already
