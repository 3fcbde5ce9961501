"""The promotion policy and approval through the `podium` command: thresholds, guards, confidence, a person's
decision, and the news of each.

One training: the approval's `podium run` (a `podium run` with approval required has its only real-process test
here; test_browser's and test_outage's approvals are of `podium promote`). Every other run exists only to be promoted:
its checkpoints are made directly in storage and recorded in the test's MLflow store with podium's own functions,
validated by the real validation function (tests/helpers/checkpoints.py), and each decision is `podium promote`, the
real process.

A linear model whose quality each run's config sets (tests/integration/podium_nightly_code.py), ranked by
accuracy, on one small validation set with label noise (200 rows: a few rows' difference is within its noise):

gate-1  turned 54 deg (accuracy 0.57), threshold accuracy min 0.5          -> promoted (first promotion; the guard
        has no champion to compare)
gate-2  turned 9 deg (0.69), overconfident (scale 20): its loss regressed  -> refused by the guard on loss
        the same with an unreachable threshold (min 0.99)                  -> refused, naming it with its value
        the same with confidence 0.95                                      -> promoted: a clear gain, interval shown
gate-3  turned 0 deg (0.705 against 0.69), confidence 0.95               -> refused: the interval holds 0
appr    the one training (`podium run`, 2 epochs: the first one's validation fails), approval required ->
        approved with `podium approve`; then `podium promote` of it to two more locations: rejected, and no
        decision in time

News of each decision, as a team gets it: the `podium-news` automation, declared first (for the module) by
`python -m podium.deployments notify --notify-webhook URL`, forwards the Prefect events podium emits (the
promotion of gate-1, the refusal of gate-2, the failed validation of appr's first epoch) from the Prefect server to a
webhook receiver on loopback.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from helpers.checkpoints import make_trained_run
from helpers.commands import awaiting_approval, podium, podium_in_process
from podium_nightly_code import FEATURES, write_data

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent

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


@pytest.fixture(scope="module")
def news(prefect_api, tmp_path_factory):
    """A webhook receiver on loopback and the `podium-news` automation sending to it, for the module (removed
    afterwards: the session's Prefect server serves other tests); yields the messages received."""
    from prefect.automations import Automation
    from prefect.blocks.notifications import CustomWebhookNotificationBlock
    from prefect.client.orchestration import get_client

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    Receiver.received = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "PODIUM_HOME": str(tmp_path_factory.mktemp("news-home"))}
    try:
        declared = subprocess.run([sys.executable, "-m", "podium.deployments", "notify", "--notify-webhook", url],
                                  env=env, capture_output=True, text=True, timeout=300)
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


def _news_about(received: list[dict], wanted: dict[str, str], timeout_s: float = 90,
                model: str = "podium") -> dict[str, str]:
    """The text of the first message of each event about `model` (`wanted`: event -> a text its message must
    hold), once all have arrived."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = {e: m["text"] for m in list(received) for e, needle in wanted.items()
               if m.get("subject") == f"podium: {e} ({model})" and needle in m.get("text", "")}
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


def _config(tmp_path, name: str, angle: float, promotion: dict, scale: float = 1.0) -> dict:
    return {"run_name": name, "storage": str(tmp_path / "storage"), "serving": str(tmp_path / "serving"),
            "data": {"train": str(tmp_path / "train.parquet"), "val": str(tmp_path / "val.parquet"),
                     "feature_columns": list(FEATURES)},
            "training": {"train_loop": "podium_nightly_code:train_func",
                         "train_loop_config": {"epochs": 1, "angle_deg": angle, "scale": scale}},
            "scaling": {"num_workers": 1},
            "validation": {"fn": "podium_nightly_code:validate_fn", "concurrency": 1},
            "promotion": {"metric": "accuracy", "mode": "max", "verify": "hashes", **promotion}}


def _make(env, tmp_path, name: str, angle: float, scale: float = 1.0) -> None:
    """Run `name`'s checkpoint, made and recorded as its `podium run` would have left it (no training)."""
    made = make_trained_run(_config(tmp_path, name, angle, {}, scale), env["MLFLOW_TRACKING_URI"])
    assert [r.status for r in made.records] == ["validated"], made.records


def _promote(env, tmp_path, name: str, angle: float, promotion: dict, scale: float = 1.0) -> dict:
    """`podium promote --json` of run `name` with `promotion`; its result."""
    path = tmp_path / f"{name}-{abs(hash(json.dumps(promotion, sort_keys=True)))}.json"
    path.write_text(json.dumps(_config(tmp_path, name, angle, promotion, scale)))
    out = podium(["promote", "--json", "--config", str(path)], env).stdout.strip().splitlines()[-1]
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
    _make(cli_env, tmp_path, "gate-1", 54.0)
    one = _promote(cli_env, tmp_path, "gate-1", 54.0, {"thresholds": {"accuracy": {"min": 0.5}}, "guards": guard})
    assert one["promoted"]["version"] == "v000001", one["promotion_reason"]
    assert "threshold accuracy min 0.5: candidate 0.5700, holds" in one["promotion_reason"]
    assert "guard loss max_increase 0.05: candidate" in one["promotion_reason"]
    assert "no champion to compare" in one["promotion_reason"]

    # gate-2: more accurate, but overconfident: its loss regressed past the guard
    _make(cli_env, tmp_path, "gate-2", 9.0, scale=20.0)
    two = _promote(cli_env, tmp_path, "gate-2", 9.0, {"guards": guard}, scale=20.0)
    reason = two["promotion_reason"]
    assert two["promoted"] is None and reason.startswith("refused by the promotion policy (guard loss)"), reason
    assert "accuracy = 0.6900, better than champion v000001 (0.5700)" in reason
    loss = re.search(r"guard loss max_increase 0.05: candidate ([\d.]+), champion ([\d.]+), change \+([\d.]+), FAILS",
                     reason)
    assert loss and float(loss[1]) > float(loss[2]) + 0.05, reason

    # the same candidate again: an unreachable threshold refuses it and names it, with its value
    again = _promote(cli_env, tmp_path, "gate-2", 9.0, {"thresholds": {"accuracy": {"min": 0.99}}}, scale=20.0)
    assert again["promoted"] is None
    assert again["promotion_reason"].startswith("refused by the promotion policy (threshold accuracy)")
    assert "threshold accuracy min 0.99: candidate 0.6900, FAILS" in again["promotion_reason"]

    # ... and with a confidence: 0.69 against 0.57 on the same 200 rows is clear
    clear = _promote(cli_env, tmp_path, "gate-2", 9.0, {"confidence": 0.95}, scale=20.0)
    assert clear["promoted"]["version"] == "v000002", clear["promotion_reason"]
    low, high = map(float, re.search("confidence 0.95 on accuracy: gain " + INTERVAL + " over 200 paired rows",
                                     clear["promotion_reason"]).groups())
    assert 0 < low < 0.12 < high

    # gate-3: better by its point value (0.705 against 0.69), within the noise of 200 rows: refused
    _make(cli_env, tmp_path, "gate-3", 0.0)
    three = _promote(cli_env, tmp_path, "gate-3", 0.0, {"confidence": 0.95})
    reason = three["promotion_reason"]
    assert three["promoted"] is None and reason.startswith("refused by the promotion policy (confidence accuracy)"), \
        reason
    assert "better than champion v000002 (0.6900)" in reason
    low, high = map(float, re.search(INTERVAL + r" over 200 paired rows, lower bound > min_delta 0, FAILS",
                                     reason).groups())
    assert low <= 0 < high

    # what a person reads: `podium status`, the promotion report in MLflow, the champion's manifest
    # (read in this process: the status and history commands' processes are test_cli_process's and test_cli_small's)
    text = podium_in_process(["status", "--run-name", "gate-3", "--serving", str(tmp_path / "serving")],
                             cli_env).stdout
    assert "refused by the promotion policy (confidence accuracy)" in text and "over 200 paired rows" in text
    status = json.loads(podium_in_process(["status", "--json", "--run-name", "gate-3", "--serving",
                                           str(tmp_path / "serving")], cli_env).stdout)
    [check] = status["last_decision"]["checks"]
    assert (check["kind"], check["passed"], check["rows"], check["level"]) == ("confidence", False, 200, 0.95)
    client = MlflowClient(cli_env["MLFLOW_TRACKING_URI"])
    report = open(client.download_artifacts(three["mlflow_run_id"], "podium/promotion_report.md", str(tmp_path))).read()
    assert "## Promotion policy" in report and "**fails**" in report and "at 0.95, 200 rows" in report
    manifest = read_version(str(tmp_path / "serving"), "v000002").manifest
    assert [(c["kind"], c["passed"]) for c in manifest["checks"]] == [("confidence", True)]

    # news of the decisions, sent by the automation to the webhook
    got = _news_about(news, {"podium.promotion.promoted": "run gate-1", "podium.promotion.refused": "guard loss"})
    promoted = got["podium.promotion.promoted"]
    assert promoted.startswith("podium.promotion.promoted: model podium, run gate-1; v000001 (MLflow version 1)")
    assert "first promotion to this serving location" in promoted, promoted
    refused = got["podium.promotion.refused"]
    assert refused.startswith("podium.promotion.refused: model podium, run gate-2"), refused


def _start(env, root, name: str, serving: str, command: str, promotion: dict) -> subprocess.Popen:
    """`podium <command> --json` on run `name` (2 epochs; the first one's validation fails), in the background."""
    config = {"run_name": name, "model": "approval", "storage": str(root / "storage"),
              "serving": str(root / serving),
              "data": {"train": str(root / "train.parquet"), "val": str(root / "val.parquet"),
                       "feature_columns": list(FEATURES)},
              "training": {"train_loop": "podium_nightly_code:train_func",
                           "train_loop_config": {"epochs": 2, "angle_deg": 20.0}},
              "scaling": {"num_workers": 1},
              "validation": {"fn": "podium_nightly_code:validate_fn", "kwargs": {"fail_epoch": 0}, "retries": 0},
              "promotion": {"metric": "accuracy", "mode": "max", "verify": "hashes", "approval": "required",
                            **promotion}}
    path = root / f"{name}-{serving}.json"
    path.write_text(json.dumps(config))
    return subprocess.Popen(["podium", command, "--json", "--config", str(path)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _ended(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{out[-2000:]}\n{err[-4000:]}"
    return json.loads(out.strip().splitlines()[-1])


@dataclass
class Approved:
    """The module's one training: `podium run` of `appr` with approval required, approved by `podium approve`."""

    root: Path
    env: dict[str, str]
    challenger: Any  # the registered version under the challenger alias while the candidate waited
    waiting: dict[str, Any]  # what the serving location and the registry said meanwhile
    said: str  # what `podium approve` said
    out: dict[str, Any]  # the run's result


@pytest.fixture(scope="module")
def approved(prefect_api, shared_ray, tmp_path_factory, mlflow_template_db, news) -> Approved:
    """The module's one training, with the news automation declared first: `podium run` of `appr` (its first
    epoch's validation fails), its candidate awaiting a person's decision until `podium approve`."""
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("approval")
    shutil.copy(mlflow_template_db, root / "mlflow.db")
    env = {**os.environ, "PODIUM_HOME": str(root / "home"), "PREFECT_API_URL": prefect_api,
           "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}", **shared_ray.driver_env(),
           "PYTHONPATH": str(HERE)}  # the loop's module, as a user's own code
    write_data(str(root / "train.parquet"), 100, 0.0, seed=1)
    write_data(str(root / "val.parquet"), 200, 0.35, seed=2)
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])

    # `podium run`: the candidate waits under the challenger alias, the flow run paused, until `podium approve`
    proc = _start(env, root, "appr", "serving", "run", {})
    awaiting_approval(proc, "appr")
    challenger = client.get_model_version_by_alias("approval", "challenger")
    waiting = {"current": (root / "serving" / "CURRENT").exists(),
               "aliases": list(client.get_registered_model("approval").aliases)}
    said = podium(["approve", "--run-name", "appr", "--reason", "beats last week's on every slice", "--by", "ana"],
                  env).stdout
    return Approved(root, env, challenger, waiting, said, _ended(proc))


def test_a_person_approves_or_rejects_the_candidate_through_the_command_and_silence_rejects(approved):
    from mlflow.tracking import MlflowClient

    from podium.serving.layout import read_history, read_version

    root, env = approved.root, approved.env
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])

    # `podium run`: the candidate waited under the challenger alias, the flow run paused, until `podium approve`
    challenger, said, out = approved.challenger, approved.said, approved.out
    assert challenger.tags["podium.approval"] == "pending"
    assert not approved.waiting["current"] and "champion" not in approved.waiting["aliases"]
    assert "run appr: approved by ana (podium approve): beats last week's on every slice" in said, said
    assert out["promoted"]["version"] == "v000001" and out["promoted"]["step"] == 1, out["promotion_reason"]
    assert "approved by ana (podium approve): beats last week's on every slice" in out["promotion_reason"]
    [switch] = read_history(str(root / "serving"))
    assert switch["origin"]["approval"]["by"] == "ana (podium approve)" and "beats" in switch["reason"]
    assert read_version(str(root / "serving"), "v000001").manifest["approval"]["approved"] is True
    version = client.get_model_version_by_alias("approval", "champion")
    assert version.version == challenger.version and version.tags["podium.approval"] == "approved"
    assert version.tags["podium.approval.reason"] == "beats last week's on every slice"
    assert "challenger" not in client.get_registered_model("approval").aliases
    history = podium_in_process(["history", "--serving", str(root / "serving")], env).stdout
    assert "approval: approved by ana (podium approve): beats last week's on every slice" in history, history
    lineage = podium(["lineage", "v000001", "--serving", str(root / "serving"), "--model", "approval"], env).stdout
    assert "approval:   approved by ana (podium approve)" in lineage, lineage

    # `podium promote` of the same run to another serving location (an alias of its own): rejected, with the reason
    # in its output
    proc = _start(env, root, "appr", "serving-2", "promote", {"alias": "second"})
    awaiting_approval(proc, "appr")
    said = podium(["reject", "--run-name", "appr", "--reason", "not before the freeze"], env).stdout
    assert "run appr: rejected by " in said and "(podium reject): not before the freeze" in said, said
    out = _ended(proc)
    assert out["promoted"] is None
    assert out["promotion_reason"].startswith("rejected by "), out["promotion_reason"]
    assert "(podium reject): not before the freeze: step 1 not promoted" in out["promotion_reason"]
    assert not (root / "serving-2" / "CURRENT").exists()
    [tombstone] = (root / "serving-2" / "versions").iterdir()  # the staged copy is gone, its number kept
    assert sorted(os.listdir(tombstone)) == ["DISCARDED.json"]
    [rejected] = [v for v in client.search_model_versions("name = 'approval'") if v.version != version.version]
    assert rejected.tags["podium.approval"] == "rejected" and "second-challenger" not in rejected.aliases
    assert client.get_model_version_by_alias("approval", "champion").version == version.version

    # no decision in time: rejected (the default of promotion.approval_on_timeout), nothing left waiting
    out = _ended(_start(env, root, "appr", "serving-3", "promote", {"approval_timeout_s": 3, "alias": "third"}))
    assert out["promoted"] is None
    assert out["promotion_reason"].startswith("rejected on timeout: no decision within 3 s"), out["promotion_reason"]
    assert not (root / "serving-3" / "CURRENT").exists()
    text = podium_in_process(["status", "--run-name", "appr", "--model", "approval", "--serving",
                              str(root / "serving-3")], env).stdout
    assert "rejected on timeout" in text, text


def test_a_failed_validation_of_a_run_is_news_and_the_run_goes_on(approved, news):
    assert [c["status"] for c in approved.out["checkpoints"]] == ["failed", "validated"], approved.out
    got = _news_about(news, {"podium.validation.failed": "run appr"}, model="approval")
    assert "validation data unavailable for epoch 0" in got["podium.validation.failed"], got
