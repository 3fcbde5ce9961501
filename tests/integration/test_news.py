"""News of podium's decisions, as a team gets it: the `podium-news` automation, declared by
`python -m podium.deployments notify --notify-webhook URL`, forwards each Prefect event podium emits
(a promotion, a refusal, a failed validation) from the Prefect server to a webhook receiver on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from test_cli_process import cli_env, podium  # noqa: F401  (cli_env is a fixture)

pytestmark = pytest.mark.integration


class Receiver(BaseHTTPRequestHandler):
    """A webhook endpoint: keeps every JSON body POSTed to it."""

    received: list[dict] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.received.append(json.loads(body or b"{}"))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def webhook():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    Receiver.received = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", Receiver.received
    finally:
        server.shutdown()


def _news_about(received: list[dict], model: str, events: set[str], timeout_s: float = 90) -> dict[str, dict]:
    """The first message of each event about `model`, once all have arrived."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = {e: m for m in list(received) for e in events if f"podium: {e} ({model})" == m.get("subject")}
        if set(got) == events or time.monotonic() > deadline:
            assert set(got) == events, f"received {received}; the server's podium events: {_events_on_server()}"
            return got
        time.sleep(0.5)


def _events_on_server() -> list[str]:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        response = client.request("POST", "/events/filter", json={"filter": {"event": {"prefix": ["podium."]}},
                                                                  "limit": 50})
    return [f"{e['event']} {e['resource'].get('prefect.resource.name')}" for e in response.json()["events"]]


def test_a_promotion_a_refusal_and_a_failed_validation_each_reach_the_webhook(cli_env, webhook, tmp_path):  # noqa: F811
    from prefect.automations import Automation
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    url, received = webhook
    declared = subprocess.run([sys.executable, "-m", "podium.deployments", "notify", "--notify-webhook", url],
                              env=cli_env, capture_output=True, text=True, timeout=300)
    assert declared.returncode == 0, declared.stderr[-3000:]
    assert "automation podium-news" in declared.stdout
    env = {**cli_env, "PYTHONPATH": os.path.dirname(__file__)}  # the loop's module, as a user's own code
    common = ["run", "--json", "--model", "newsy", "--train-loop", "podium_user_code:train_func",
              "--validate-fn", "podium_user_code:validate_fn", "--loop-config", "epochs=2", "--num-workers", "1",
              "--validation-retries", "0", "--metric", "score", "--mode", "max",
              "--storage", str(tmp_path / "storage"), "--serving", str(tmp_path / "serving")]
    try:
        first = podium([*common, "--run-name", "news-1", "--validate-kwargs", '{"scores": [1, 2], "fail_epoch": 0}'],
                       env)
        assert json.loads(first.stdout.strip().splitlines()[-1])["promoted"]["version"] == "v000001"
        second = podium([*common, "--run-name", "news-2", "--validate-kwargs", '{"scores": [1, 2.5]}',
                         "--min-delta", "1"], env)
        assert json.loads(second.stdout.strip().splitlines()[-1])["promoted"] is None
        news = _news_about(received, "newsy", {"podium.promotion.promoted", "podium.promotion.refused",
                                               "podium.validation.failed"})
        promoted = news["podium.promotion.promoted"]["text"]
        assert promoted.startswith("podium.promotion.promoted: model newsy, run news-1; v000001 (MLflow version 1)")
        assert promoted.endswith(", step 1, score = 2. step 1 has score = 2; first promotion to this serving location")
        refused = news["podium.promotion.refused"]["text"]
        assert refused.startswith("podium.promotion.refused: model newsy, run news-2"), refused
        assert "min_delta" in refused or "does not beat" in refused, refused
        failed = news["podium.validation.failed"]["text"]
        assert "run news-1" in failed and "validation data unavailable for epoch 0" in failed, failed
    finally:  # the session's Prefect server serves other tests: leave no automation sending to a closed port
        from prefect.client.orchestration import get_client

        Automation.read(name="podium-news").delete()
        with get_client(sync_client=True) as client:
            client.delete_block_document(CustomWebhookNotificationBlock.load("podium-news")._block_document_id)
