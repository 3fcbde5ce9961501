"""The promotion policy through the `podium` command: thresholds, guards and confidence.

A linear model whose quality each run's config sets (tests/integration/podium_nightly_code.py), ranked by
accuracy, on one small validation set with label noise (200 rows: a few rows' difference is within its noise):

gate-1  turned 54 deg (accuracy 0.57), threshold accuracy min 0.5          -> promoted (first promotion; the guard
        has no champion to compare)
gate-2  turned 9 deg (0.69), overconfident (scale 20): its loss regressed  -> refused by the guard on loss
        `podium promote` gate-2 with an unreachable threshold (min 0.99)  -> refused, naming it with its value
        `podium promote` gate-2 with confidence 0.95                      -> promoted: a clear gain, interval shown
gate-3  turned 0 deg (0.705 against 0.69), confidence 0.95               -> refused: the interval holds 0
        (two epochs; the second one's validation fails)

News of each decision, as a team gets it: the `podium-news` automation, declared first by
`python -m podium.deployments notify --notify-webhook URL`, forwards the Prefect events podium emits (the
promotion of gate-1, the refusal of gate-2, the failed validation of gate-3) from the Prefect server to a
webhook receiver on loopback.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers.commands import awaiting_approval, podium
from podium_nightly_code import FEATURES, write_data

pytestmark = pytest.mark.integration

INTERVAL = r"\[([+-][\d.e+-]+), ([+-][\d.e+-]+)\]"


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
def news(cli_env):
    """A webhook receiver on loopback and the `podium-news` automation sending to it (removed afterwards: the
    session's Prefect server serves other tests); yields the messages received."""
    from prefect.automations import Automation
    from prefect.blocks.notifications import CustomWebhookNotificationBlock
    from prefect.client.orchestration import get_client

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    Receiver.received = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    try:
        declared = subprocess.run([sys.executable, "-m", "podium.deployments", "notify", "--notify-webhook", url],
                                  env=cli_env, capture_output=True, text=True, timeout=300)
        assert declared.returncode == 0, declared.stderr[-3000:]
        assert "automation podium-news" in declared.stdout
        yield Receiver.received
    finally:
        server.shutdown()
        try:
            Automation.read(name="podium-news").delete()
            with get_client(sync_client=True) as client:
                client.delete_block_document(CustomWebhookNotificationBlock.load("podium-news")._block_document_id)
        except ValueError:
            pass  # never declared


def _news_about(received: list[dict], wanted: dict[str, str], timeout_s: float = 90) -> dict[str, str]:
    """The text of the first message of each event (`wanted`: event -> a text its message must hold), once
    all have arrived."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = {e: m["text"] for m in list(received) for e, needle in wanted.items()
               if m.get("subject") == f"podium: {e} (podium)" and needle in m.get("text", "")}
        if set(got) == set(wanted) or time.monotonic() > deadline:
            assert set(got) == set(wanted), f"received {received}; the server's podium events: {_events_on_server()}"
            return got
        time.sleep(0.5)


def _events_on_server() -> list[str]:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        response = client.request("POST", "/events/filter", json={"filter": {"event": {"prefix": ["podium."]}},
                                                                  "limit": 50})
    return [f"{e['event']} {e['resource'].get('prefect.resource.name')}" for e in response.json()["events"]]


def _run(env, tmp_path, name: str, angle: float, promotion: dict, scale: float = 1.0, command: str = "run",
         epochs: int = 1, validation: dict | None = None):
    config = {"run_name": name, "storage": str(tmp_path / "storage"), "serving": str(tmp_path / "serving"),
              "data": {"train": str(tmp_path / "train.parquet"), "val": str(tmp_path / "val.parquet"),
                       "feature_columns": list(FEATURES)},
              "training": {"train_loop": "podium_nightly_code:train_func",
                           "train_loop_config": {"epochs": epochs, "angle_deg": angle, "scale": scale}},
              "scaling": {"num_workers": 1},
              "validation": {"fn": "podium_nightly_code:validate_fn", "concurrency": 1, **(validation or {})},
              "promotion": {"metric": "accuracy", "mode": "max", "verify": "hashes", **promotion}}
    path = tmp_path / f"{name}-{command}.json"
    path.write_text(json.dumps(config))
    out = podium([command, "--json", "--config", str(path)], env).stdout.strip().splitlines()[-1]
    return json.loads(out)


def test_thresholds_guards_and_confidence_decide_through_the_command_and_each_decision_is_news(
        cli_env, news, tmp_path):
    from mlflow.tracking import MlflowClient

    from podium.serving.layout import read_version

    cli_env["PYTHONPATH"] = os.path.dirname(__file__)  # the loop's module, as a user's own code
    write_data(str(tmp_path / "train.parquet"), 100, 0.0, seed=1)
    write_data(str(tmp_path / "val.parquet"), 200, 0.35, seed=2)
    guard = {"loss": {"max_increase": 0.05}}

    # gate-1: the first promotion; its threshold holds, the guard has no champion to compare
    one = _run(cli_env, tmp_path, "gate-1", 54.0, {"thresholds": {"accuracy": {"min": 0.5}}, "guards": guard})
    assert one["promoted"]["version"] == "v000001", one["promotion_reason"]
    assert "threshold accuracy min 0.5: candidate 0.5700, holds" in one["promotion_reason"]
    assert "guard loss max_increase 0.05: candidate" in one["promotion_reason"]
    assert "no champion to compare" in one["promotion_reason"]

    # gate-2: more accurate, but overconfident: its loss regressed past the guard
    two = _run(cli_env, tmp_path, "gate-2", 9.0, {"guards": guard}, scale=20.0)
    reason = two["promotion_reason"]
    assert two["promoted"] is None and reason.startswith("refused by the promotion policy (guard loss)"), reason
    assert "accuracy = 0.6900, better than champion v000001 (0.5700)" in reason
    loss = re.search(r"guard loss max_increase 0.05: candidate ([\d.]+), champion ([\d.]+), change \+([\d.]+), FAILS",
                     reason)
    assert loss and float(loss[1]) > float(loss[2]) + 0.05, reason

    # the same candidate, promoted alone: an unreachable threshold refuses it and names it, with its value
    again = _run(cli_env, tmp_path, "gate-2", 9.0, {"thresholds": {"accuracy": {"min": 0.99}}}, command="promote")
    assert again["promoted"] is None
    assert again["promotion_reason"].startswith("refused by the promotion policy (threshold accuracy)")
    assert "threshold accuracy min 0.99: candidate 0.6900, FAILS" in again["promotion_reason"]

    # ... and with a confidence: 0.69 against 0.57 on the same 200 rows is clear
    clear = _run(cli_env, tmp_path, "gate-2", 9.0, {"confidence": 0.95}, command="promote")
    assert clear["promoted"]["version"] == "v000002", clear["promotion_reason"]
    low, high = map(float, re.search("confidence 0.95 on accuracy: gain " + INTERVAL + " over 200 paired rows",
                                     clear["promotion_reason"]).groups())
    assert 0 < low < 0.12 < high

    # gate-3: better by its point value (0.705 against 0.69), within the noise of 200 rows: refused (its second
    # epoch's validation fails, news of it too; not its first: the champion, re-scored with this run's validation
    # arguments, is a first epoch too)
    three = _run(cli_env, tmp_path, "gate-3", 0.0, {"confidence": 0.95}, epochs=2,
                 validation={"kwargs": {"fail_epoch": 1}, "retries": 0})
    reason = three["promotion_reason"]
    assert three["promoted"] is None and reason.startswith("refused by the promotion policy (confidence accuracy)"), \
        reason
    assert "better than champion v000002 (0.6900)" in reason
    low, high = map(float, re.search(INTERVAL + r" over 200 paired rows, lower bound > min_delta 0, FAILS",
                                     reason).groups())
    assert low <= 0 < high

    # what a person reads: `podium status`, the promotion report in MLflow, the champion's manifest
    text = podium(["status", "--run-name", "gate-3", "--serving", str(tmp_path / "serving")], cli_env).stdout
    assert "refused by the promotion policy (confidence accuracy)" in text and "over 200 paired rows" in text
    status = json.loads(podium(["status", "--json", "--run-name", "gate-3", "--serving", str(tmp_path / "serving")],
                               cli_env).stdout)
    [check] = status["last_decision"]["checks"]
    assert (check["kind"], check["passed"], check["rows"], check["level"]) == ("confidence", False, 200, 0.95)
    client = MlflowClient(cli_env["MLFLOW_TRACKING_URI"])
    report = open(client.download_artifacts(three["mlflow_run_id"], "podium/promotion_report.md", str(tmp_path))).read()
    assert "## Promotion policy" in report and "**fails**" in report and "at 0.95, 200 rows" in report
    manifest = read_version(str(tmp_path / "serving"), "v000002").manifest
    assert [(c["kind"], c["passed"]) for c in manifest["checks"]] == [("confidence", True)]

    # news of the decisions, sent by the automation to the webhook
    got = _news_about(news, {"podium.promotion.promoted": "run gate-1", "podium.promotion.refused": "guard loss",
                             "podium.validation.failed": "run gate-3"})
    promoted = got["podium.promotion.promoted"]
    assert promoted.startswith("podium.promotion.promoted: model podium, run gate-1; v000001 (MLflow version 1)")
    assert "first promotion to this serving location" in promoted, promoted
    refused = got["podium.promotion.refused"]
    assert refused.startswith("podium.promotion.refused: model podium, run gate-2"), refused
    assert "validation data unavailable for epoch 1" in got["podium.validation.failed"], got


def _start(env, tmp_path, name: str, serving: str, command: str, promotion: dict) -> subprocess.Popen:
    """`podium <command> --json` on run `name` (the policy test's model and data), in the background."""
    config = {"run_name": name, "model": "approval", "storage": str(tmp_path / "storage"),
              "serving": str(tmp_path / serving),
              "data": {"train": str(tmp_path / "train.parquet"), "val": str(tmp_path / "val.parquet"),
                       "feature_columns": list(FEATURES)},
              "training": {"train_loop": "podium_nightly_code:train_func",
                           "train_loop_config": {"epochs": 1, "angle_deg": 20.0}},
              "scaling": {"num_workers": 1}, "validation": {"fn": "podium_nightly_code:validate_fn"},
              "promotion": {"metric": "accuracy", "mode": "max", "verify": "hashes", "approval": "required",
                            **promotion}}
    path = tmp_path / f"{name}-{serving}.json"
    path.write_text(json.dumps(config))
    return subprocess.Popen(["podium", command, "--json", "--config", str(path)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _ended(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{out[-2000:]}\n{err[-4000:]}"
    return json.loads(out.strip().splitlines()[-1])


def test_a_person_approves_or_rejects_the_candidate_through_the_command_and_silence_rejects(
        cli_env, tmp_path):
    from mlflow.tracking import MlflowClient

    from podium.serving.layout import read_history, read_version

    cli_env["PYTHONPATH"] = os.path.dirname(__file__)  # the loop's module, as a user's own code
    write_data(str(tmp_path / "train.parquet"), 100, 0.0, seed=1)
    write_data(str(tmp_path / "val.parquet"), 200, 0.35, seed=2)
    client = MlflowClient(cli_env["MLFLOW_TRACKING_URI"])

    # `podium run`: the candidate waits under the challenger alias, the flow run paused, until `podium approve`
    proc = _start(cli_env, tmp_path, "appr", "serving", "run", {})
    awaiting_approval(proc, "appr")
    challenger = client.get_model_version_by_alias("approval", "challenger")
    assert challenger.tags["podium.approval"] == "pending"
    assert not (tmp_path / "serving" / "CURRENT").exists() and not [
        a for a in client.get_registered_model("approval").aliases if a == "champion"]
    said = podium(["approve", "--run-name", "appr", "--reason", "beats last week's on every slice", "--by", "ana"],
                  cli_env).stdout
    assert "run appr: approved by ana (podium approve): beats last week's on every slice" in said, said
    out = _ended(proc)
    assert out["promoted"]["version"] == "v000001", out["promotion_reason"]
    assert "approved by ana (podium approve): beats last week's on every slice" in out["promotion_reason"]
    [switch] = read_history(str(tmp_path / "serving"))
    assert switch["origin"]["approval"]["by"] == "ana (podium approve)" and "beats" in switch["reason"]
    assert read_version(str(tmp_path / "serving"), "v000001").manifest["approval"]["approved"] is True
    version = client.get_model_version_by_alias("approval", "champion")
    assert version.version == challenger.version and version.tags["podium.approval"] == "approved"
    assert version.tags["podium.approval.reason"] == "beats last week's on every slice"
    assert "challenger" not in client.get_registered_model("approval").aliases
    history = podium(["history", "--serving", str(tmp_path / "serving")], cli_env).stdout
    assert "approval: approved by ana (podium approve): beats last week's on every slice" in history, history
    lineage = podium(["lineage", "v000001", "--serving", str(tmp_path / "serving"), "--model", "approval"],
                     cli_env).stdout
    assert "approval:   approved by ana (podium approve)" in lineage, lineage

    # `podium promote` of the same run to another serving location (an alias of its own): rejected, with the reason
    # in its output
    proc = _start(cli_env, tmp_path, "appr", "serving-2", "promote", {"alias": "second"})
    awaiting_approval(proc, "appr")
    said = podium(["reject", "--run-name", "appr", "--reason", "not before the freeze"], cli_env).stdout
    assert "run appr: rejected by " in said and "(podium reject): not before the freeze" in said, said
    out = _ended(proc)
    assert out["promoted"] is None
    assert out["promotion_reason"].startswith("rejected by "), out["promotion_reason"]
    assert "(podium reject): not before the freeze: step 0 not promoted" in out["promotion_reason"]
    assert not (tmp_path / "serving-2" / "CURRENT").exists()
    [tombstone] = (tmp_path / "serving-2" / "versions").iterdir()  # the staged copy is gone, its number kept
    assert sorted(os.listdir(tombstone)) == ["DISCARDED.json"]
    [rejected] = [v for v in client.search_model_versions("name = 'approval'") if v.version != version.version]
    assert rejected.tags["podium.approval"] == "rejected" and "second-challenger" not in rejected.aliases
    assert client.get_model_version_by_alias("approval", "champion").version == version.version

    # no decision in time: rejected (the default of promotion.approval_on_timeout), nothing left waiting
    out = _ended(_start(cli_env, tmp_path, "appr", "serving-3", "promote", {"approval_timeout_s": 3, "alias": "third"}))
    assert out["promoted"] is None
    assert out["promotion_reason"].startswith("rejected on timeout: no decision within 3 s"), out["promotion_reason"]
    assert not (tmp_path / "serving-3" / "CURRENT").exists()
    text = podium(["status", "--run-name", "appr", "--model", "approval", "--serving", str(tmp_path / "serving-3")],
                  cli_env).stdout
    assert "rejected on timeout" in text, text
