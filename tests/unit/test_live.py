"""The live server's replica (podium.live.server.ChampionServer), as Ray Serve calls it, on a real serving
location with real served models (no training: checkpoints in podium's format, promoted as a run promotes):
MLflow's scoring protocol, the version header, following CURRENT, and a version that must not be switched to."""

# ruff: noqa: F811 (the fixtures `data` and `checkpoint` are test_served_model's, imported by name)
from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pandas as pd
import torch
from starlette.requests import Request
from test_served_model import FEATURES, _promote, _served, checkpoint, data  # noqa: F401 (fixtures)

from podium.live.server import VERSION_HEADER, ChampionServer
from podium.serving.layout import switch_current
from podium.training.checkpoint import CheckpointMeta, save_checkpoint
from podium.training.model import ModelSpec, build_model


def _call(server: ChampionServer, method: str, path: str, body: bytes = b"",
          content_type: str = "application/json") -> tuple[int, dict[str, str], dict]:
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"type": "http", "method": method, "path": path, "headers": [(b"content-type", content_type.encode())],
             "query_string": b""}
    response = asyncio.run(server(Request(scope, receive)))
    return response.status_code, dict(response.headers), json.loads(response.body or b"null")


def _rows(data: tuple[str, str]) -> bytes:
    frame = pd.read_parquet(data[1])[FEATURES].head(5)
    return json.dumps({"dataframe_split": json.loads(frame.to_json(orient="split", index=False))}).encode()


def _second(tmp_path: Path, data: tuple[str, str]):
    """Another checkpoint in podium's format (other weights), built as a served model: a second version."""
    torch.manual_seed(7)
    spec = ModelSpec(in_features=4, num_classes=3, hidden_size=8)
    directory = str(tmp_path / "storage" / "run" / "checkpoint_00000009")
    save_checkpoint(directory, build_model(spec), None, CheckpointMeta(spec, 2, 9, {}, {}, FEATURES, "label"))
    (tmp_path / "second").mkdir()
    return _served(tmp_path / "second", data, directory)[1]


def test_a_replica_answers_as_mlflow_names_its_version_and_follows_promotions_and_rollbacks(
        tmp_path, data, checkpoint):
    plan, served = _served(tmp_path, data, checkpoint[0])
    server = ChampionServer(plan.serving, poll_s=3600)  # CURRENT is read by the test, not the follower
    status, _, said = _call(server, "GET", "/health")
    assert status == 503 and said["version"] is None  # nothing promoted yet
    assert _call(server, "POST", "/invocations", _rows(data))[0] == 503

    v1 = _promote(plan, served)
    server._follow_once()
    status, headers, said = _call(server, "POST", "/invocations", _rows(data))
    assert status == 200 and headers[VERSION_HEADER.lower()] == v1.version and len(said["predictions"]) == 5
    assert _call(server, "GET", "/health")[2]["version"] == v1.version
    status, _, said = _call(server, "POST", "/invocations", b'{"no": "rows"}')
    assert status == 400 and said["error_code"] == "BAD_REQUEST"  # MLflow's own answer to a malformed body

    served_2 = _second(tmp_path, data)
    v2 = _promote(plan, served_2, step=9)
    server._follow_once()
    assert _call(server, "POST", "/invocations", _rows(data))[1][VERSION_HEADER.lower()] == v2.version

    switch_current(plan.serving, v1, "rollback", action="rollback")
    server._follow_once()
    assert _call(server, "POST", "/invocations", _rows(data))[1][VERSION_HEADER.lower()] == v1.version

    # what each version answered, as this replica counted it (not the 503 from before anything was promoted)
    counted = _call(server, "GET", "/version")[2]["this_replica"]["versions"]
    assert {v: (c["requests"], c["errors"], c["error_statuses"]) for v, c in counted.items()} == {
        v1.version: (3, 1, {"400": 1}), v2.version: (1, 0, {})}
    assert 0 < counted[v1.version]["latency_ms"]["p50"] <= counted[v1.version]["latency_ms"]["p95"]
    assert "this_replica" not in _call(server, "GET", "/ping")[2]


def test_a_version_that_fails_its_checks_is_never_switched_to_and_the_replica_says_why(tmp_path, data, checkpoint):
    plan, served = _served(tmp_path, data, checkpoint[0])
    v1 = _promote(plan, served)
    server = ChampionServer(plan.serving, poll_s=3600)
    served_2 = _second(tmp_path, data)
    v2 = _promote(plan, served_2, step=9)
    program = Path(v2.uri) / "data" / "model" / "model.pt2"
    program.write_bytes(program.read_bytes()[:200])  # damaged after its promotion
    server._follow_once()
    status, headers, said = _call(server, "GET", "/health")
    assert status == 200 and said["version"] == v1.version and headers[VERSION_HEADER.lower()] == v1.version
    assert v2.version in said["refused"] and "sha256" in said["refused"][v2.version]
    assert _call(server, "POST", "/invocations", _rows(data))[1][VERSION_HEADER.lower()] == v1.version

    shutil.rmtree(Path(v2.uri))  # gone altogether, and the location rolled back: nothing refused any more
    switch_current(plan.serving, v1, "rollback", action="rollback")
    server._follow_once()
    assert _call(server, "GET", "/health")[2]["refused"] == {}
