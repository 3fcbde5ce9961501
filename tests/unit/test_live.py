"""The live server's replica (podium.live.server.ChampionServer), as Ray Serve calls it, on a real serving
location with real served models (no training: checkpoints in podium's format, promoted as a run promotes):
MLflow's scoring protocol, the version header, following CURRENT, and a version that must not be switched to; the
fast path (podium.live.fast) against MLflow's own scoring code on the same model, and what it leaves to MLflow."""

# ruff: noqa: F811 (the fixtures `data` and `checkpoint` are tests/helpers/served.py's, imported by name)
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pandas as pd
from helpers.served import FEATURES, _call, _promote, _rows, _second, _served, checkpoint, data  # noqa: F401 (fixtures)

from podium.live.fast import fast_model_of
from podium.live.server import VERSION_HEADER, ChampionServer, Fast, Serving, _answer_fast, _invoke, invoke
from podium.serving.layout import switch_current


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


def _bodies(frame: pd.DataFrame) -> dict[str, bytes]:
    """The same rows in each of MLflow's JSON shapes (and the split's columns in another order)."""
    records = json.loads(frame.to_json(orient="records"))
    columns = {name: [r[name] for r in records] for name in frame.columns}
    split = json.loads(frame.to_json(orient="split", index=False))
    backwards = frame[frame.columns[::-1]]
    return {name: json.dumps(body).encode() for name, body in {
        "dataframe_split": {"dataframe_split": split},
        "dataframe_split, columns reordered": {
            "dataframe_split": json.loads(backwards.to_json(orient="split", index=False))},
        "dataframe_records": {"dataframe_records": records},
        "instances": {"instances": records}, "inputs": {"inputs": records},
        "inputs by column": {"inputs": columns}, "instances by column": {"instances": columns}}.items()}


def _fast_server(tmp_path: Path, data: tuple[str, str], checkpoint) -> tuple[ChampionServer, Serving]:
    """A replica serving a model podium built (numbers and booleans in): one the fast path serves."""
    plan, served = _served(tmp_path, data, checkpoint[0])
    _promote(plan, served)
    server = ChampionServer(plan.serving, poll_s=3600)
    active = server._active
    assert active is not None and active.fast is not None
    return server, active


def test_the_fast_path_answers_each_mlflow_shape_as_mlflow_s_scoring_code_does(tmp_path, data, checkpoint):
    server, active = _fast_server(tmp_path, data, checkpoint)
    assert active.fast is not None
    frame = pd.read_parquet(data[1])[FEATURES]
    for name, body in _bodies(frame).items():
        assert active.fast.parse(body, "application/json") is not None, name  # taken by the fast path
        status, headers, said = _call(server, "POST", "/invocations", body)
        mlflow_s = _invoke(active, body, "application/json")  # MLflow's scoring server's own code, on the pyfunc
        assert mlflow_s.status == status == 200, (name, mlflow_s)
        assert said == json.loads(mlflow_s.body) and len(said["predictions"]) == len(frame), name
    # the same bytes as MLflow writes, and the classifier's own labels (not one class for every row)
    body = _bodies(frame)["dataframe_split"]
    assert invoke(active, body, "application/json").body == _invoke(active, body, "application/json").body
    assert len(set(json.loads(_invoke(active, body, "application/json").body)["predictions"])) > 1
    # one model call for a batch of requests of different sizes: each gets its own rows' answers
    requests = [Fast(active, active.fast.parse(b, "application/json"), b, "application/json")
                for b in (_rows(data), body, _bodies(frame.head(1))["dataframe_records"])]
    answers = _answer_fast(requests)
    assert [a.body for a in answers] == [_invoke(active, r.body, "application/json").body for r in requests]


def test_what_the_fast_path_cannot_take_is_answered_by_mlflow_s_code_unchanged(tmp_path, data, checkpoint):
    server, active = _fast_server(tmp_path, data, checkpoint)
    row = [52000.0, 0.01, 3, False]
    split = {"columns": FEATURES, "data": [row]}
    others = {  # name: (body, content type)
        "params (probabilities)": ({"dataframe_split": split, "params": {"probabilities": True}}, "application/json"),
        "a float in an integer column": ({"dataframe_split": {**split, "data": [[52000.0, 0.01, 3.5, False]]}}, None),
        "an integer in a boolean column": ({"dataframe_split": {**split, "data": [[52000.0, 0.01, 3, 1]]}}, None),
        "a null": ({"dataframe_split": {**split, "data": [[None, 0.01, 3, False]]}}, None),
        "a string": ({"dataframe_split": {**split, "data": [["rich", 0.01, 3, False]]}}, None),
        "a column more": ({"dataframe_split": {"columns": [*FEATURES, "label"], "data": [[*row, 1]]}}, None),
        "a column missing": ({"dataframe_split": {"columns": FEATURES[:3], "data": [row[:3]]}}, None),
        "NaN": (b'{"dataframe_split": {"columns": ["income", "ratio", "visits", "member"], '
                b'"data": [[NaN, 0.01, 3, false]]}}', None),
        "no rows": ({"dataframe_split": {**split, "data": []}}, None),
        "two shapes": ({"dataframe_split": split, "inputs": [dict(zip(FEATURES, row))]}, None),
        "not JSON": (b"{", None),
        "CSV": (b"income,ratio,visits,member\n52000.0,0.01,3,False\n", "text/csv"),
        "another charset": ({"dataframe_split": split}, "application/json; charset=latin-1"),
    }
    statuses = {}
    for name, (body, content_type) in others.items():
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        content_type = content_type or "application/json"
        assert active.fast.parse(raw, content_type) is None, name  # left to MLflow's code
        status, _, said = _call(server, "POST", "/invocations", raw, content_type)
        mlflow_s = _invoke(active, raw, content_type)
        assert status == mlflow_s.status, (name, status, mlflow_s)
        assert said == (json.loads(mlflow_s.body) if mlflow_s.media_type == "application/json"
                        else {"text": mlflow_s.body}), name
        statuses[name] = status
    assert statuses["params (probabilities)"] == 200 and statuses["CSV"] == 200 and statuses["a string"] == 400
    status, _, said = _call(server, "POST", "/invocations", json.dumps(others["params (probabilities)"][0]).encode())
    assert list(said["predictions"][0]) == ["0", "1", "2"]  # probabilities: the pyfunc path's answer


def test_a_batch_the_model_fails_on_is_answered_request_by_request_by_mlflow_s_code(tmp_path, data, checkpoint):
    _, active = _fast_server(tmp_path, data, checkpoint)
    body = _rows(data)
    good = Fast(active, active.fast.parse(body, "application/json"), body, "application/json")
    # rows of the wrong width reach the module (as a model with a bug would fail): MLflow's code answers instead
    broken = Fast(active, good.rows[:, :3], body, "application/json")
    answers = _answer_fast([good, broken])
    assert [a.status for a in answers] == [200, 200]
    assert answers[0].body == answers[1].body == _invoke(active, body, "application/json").body


def test_a_model_podium_did_not_build_has_no_fast_path(tmp_path, data, checkpoint):
    plan, served = _served(tmp_path, data, checkpoint[0])
    _promote(plan, served)
    active = ChampionServer(plan.serving, poll_s=3600)._active
    assert active is not None
    assert fast_model_of(object(), active.input_schema) is None
    assert fast_model_of(active.model, None) is None


def test_a_model_that_raises_answers_500_and_a_client_s_bad_request_400(tmp_path, data, checkpoint):
    """MLflow's scoring code answers 400 to both; a model's own failure is the server's (500), and only that counts
    against a version in the shadow and the watch."""
    _, active = _fast_server(tmp_path, data, checkpoint)

    class Raising:
        metadata = active.model.metadata

        def predict(self, data, params=None):
            raise ValueError("f1 out of range")

    failing = dataclasses.replace(active, model=Raising(), fast=None)
    answer = _invoke(failing, _rows(data), "application/json")
    assert answer.status == 500 and answer.message() == "the model failed: ValueError: f1 out of range", answer
    for bad in (b"not json", json.dumps({"dataframe_split": {"columns": ["nope"], "data": [["x"]]}}).encode()):
        refused = _invoke(active, bad, "application/json")
        assert refused.status == 400, (bad, refused)
