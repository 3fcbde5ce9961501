"""What a user of the champion checks, the MLflow way and podium's way: shared by the tests that promote
for real (a local SQLite store; an MLflow server on PostgreSQL with S3 artifacts)."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import mlflow.models
import mlflow.pyfunc
import mlflow.pytorch
import numpy as np
import pandas as pd
import torch
from mlflow.tracking import MlflowClient

from helpers.servers import model_server
from podium import load_promoted_model
from podium.serving.layout import read_current
from podium.storage.locations import fsspec_filesystem


def check_served_champion(tracking_uri: str, model: str, serving: str, val_data: str, logs: Path,
                          env: dict[str, str], monkeypatch, serve: bool = True) -> None:
    """The champion of `model`, loaded from `models:/<model>@champion` with MLflow (pyfunc, pytorch and, with
    `serve`, a real `mlflow models serve` process) and with podium's `load_promoted_model`, gives the same
    classes on raw validation rows; the registry version names its run, schema and metrics. `serving` and
    `val_data` are local paths or store URIs (this process reaching the store)."""
    fs, path = fsspec_filesystem(val_data)  # a local path or a store's URI, through podium's own settings
    with fs.open(path, "rb") as f:
        rows = pd.read_parquet(f).head(40)  # raw validation rows, the label column included
    current = read_current(serving)
    features = [f"f{i:02d}" for i in range(16)]
    champion = load_promoted_model(serving)
    expected = champion.predict(rows)
    assert len(set(expected.tolist())) > 1, "a model that predicts one class proves little"

    uri = f"models:/{model}@champion"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
    pyfunc = mlflow.pyfunc.load_model(uri)
    assert (pyfunc.predict(rows) == expected).all()
    proba = pyfunc.predict(rows, params={"probabilities": True})
    assert (proba.to_numpy().argmax(axis=1) == expected).all() and np.allclose(proba.sum(axis=1), 1.0)
    module = mlflow.pytorch.load_model(uri)
    assert isinstance(module, torch.nn.Module)
    with torch.no_grad():
        assert (module(torch.from_numpy(rows[features].to_numpy("float32"))).argmax(1).numpy() == expected).all()

    # the registry version: its run, its schema, and the metrics of the LoggedModel it was made from
    info = mlflow.models.get_model_info(uri)
    assert info.signature.inputs.input_names() == features and info.model_id == current.manifest["model_id"]
    client = MlflowClient(tracking_uri, registry_uri=tracking_uri)
    version = client.get_model_version_by_alias(model, "champion")
    assert version.run_id == current.manifest["mlflow_run_id"]
    assert version.tags["podium.served_uri"] == current.uri and "load_model" in version.description
    logged = client.get_logged_model(current.manifest["model_id"])
    assert {"val_loss", "val_accuracy"} <= {m.key for m in logged.metrics}
    assert {"name": model, "version": str(version.version)} in json.loads(logged.tags["mlflow.modelVersions"])

    assert os.path.basename(current.uri) == "model"
    if not serve:
        return
    # `mlflow models serve` answers a POST of those rows with the same classes
    with model_server(uri, {**env, "MLFLOW_TRACKING_URI": tracking_uri}, logs / f"serve-{model}.log") as url:
        body = json.dumps({"dataframe_split": json.loads(rows[features].to_json(orient="split", index=False))})
        request = urllib.request.Request(f"{url}/invocations", data=body.encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            assert json.loads(answer.read())["predictions"] == expected.tolist()
