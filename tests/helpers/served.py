"""A served model's small world for the unit tests of the live server and the shadow (test_served_model, test_live,
test_shadow): mixed-type Parquet data, a checkpoint in podium's format, the served model built from it as a
promotion builds it, promoted into a local serving location; and a replica called as Ray Serve calls it.

The fixtures `data` and `checkpoint` are imported by name where they are used."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
import torch
from starlette.requests import Request
from torch import nn

from podium.config import build_config
from podium.core.records import CheckpointRecord
from podium.live.server import ChampionServer
from podium.serving.layout import seal_version, switch_current
from podium.serving.staging import stage_version
from podium.tasks.package import build_served_model
from podium.tasks.plan import plan_run
from podium.tracking.client import TrackingRun
from podium.training.checkpoint import CheckpointMeta, save_checkpoint
from podium.training.model import ModelSpec, build_model
from podium.training.preprocessing import compute_feature_stats
from podium.training.promoted import check_loadable

FEATURES = ["income", "ratio", "visits", "member"]


def _write(path: Path, n: int, seed: int) -> str:
    """Mixed scales and types: a float64 in the thousands, a float32 fraction, an int count, a bool."""
    rng = np.random.default_rng(seed)
    pq.write_table(pa.table({
        "income": rng.normal(50_000, 12_000, n), "ratio": rng.normal(0, 0.01, n).astype(np.float32),
        "visits": rng.integers(0, 40, n), "member": rng.random(n) < 0.3, "label": rng.integers(0, 3, n)}), path)
    return str(path)


@pytest.fixture
def data(tmp_path: Path) -> tuple[str, str]:
    return _write(tmp_path / "train.parquet", 200, 0), _write(tmp_path / "val.parquet", 60, 1)


@pytest.fixture
def checkpoint(tmp_path: Path, data: tuple[str, str]) -> tuple[str, nn.Module]:
    stats = compute_feature_stats(pads.dataset(data[0]), FEATURES)
    spec = ModelSpec(in_features=4, num_classes=3, hidden_size=8, standardize=True)
    torch.manual_seed(0)
    model = build_model(spec, stats.mean, stats.scale)
    directory = str(tmp_path / "storage" / "run" / "checkpoint_00000005")
    save_checkpoint(directory, model, torch.optim.Adam(model.parameters()),
                    CheckpointMeta(spec, 1, 5, {"loss": 1.0}, {}, FEATURES, "label"))
    return directory, model.eval()


def _plan(tmp_path: Path, data: tuple[str, str], **promotion: str):
    return plan_run(build_config({"model": "churn", "storage": str(tmp_path / "storage"),
                                  "serving": str(tmp_path / "serving"), "data": {"train": data[0], "val": data[1]},
                                  "promotion": promotion}))


def _served(tmp_path: Path, data: tuple[str, str], uri: str, **promotion: str):
    tracking = TrackingRun(f"sqlite:///{tmp_path / 'mlflow.db'}", "1", "run-id", "run")
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    plan = _plan(tmp_path, data, **promotion)
    return plan, build_served_model(plan, tracking, CheckpointRecord(step=5, uri=uri), str(work))


def _promote(plan, served, step: int = 5):
    version = stage_version(plan.serving, served.files_uri, {"step": step, "source": "/ckpt", **served.info},
                            served.content)
    check_loadable(version)
    seal_version(plan.serving, version)
    switch_current(plan.serving, version, "test")
    return version


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
    try:
        return response.status_code, dict(response.headers), json.loads(response.body or b"null")
    except ValueError:  # MLflow's plain-text answers (415)
        return response.status_code, dict(response.headers), {"text": response.body.decode()}


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
