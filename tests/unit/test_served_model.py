"""The served model built at promotion, and the standardisation the built-in model carries into it.

No servers: a checkpoint on disk, the plan podium makes for it, the MLflow model folder built from it,
staged into a local serving location and loaded back the ways users load it.
"""

# ruff: noqa: F811 (the fixtures `data` and `checkpoint` are tests/helpers/served.py's, imported by name)
from __future__ import annotations

import json
import os
from pathlib import Path

import mlflow.models
import mlflow.pyfunc
import mlflow.pytorch
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
import torch
from helpers.served import FEATURES, _promote, _served, _write, checkpoint, data  # noqa: F401 (fixtures)
from torch import nn

from podium.errors import ServingError
from podium.serving.staging import stage_version
from podium.tracking.models import column_type
from podium.training.checkpoint import load_model
from podium.training.export import ExportError
from podium.training.model import Standardize
from podium.training.preprocessing import compute_feature_stats
from podium.training.promoted import check_loadable, load_promoted_model


def test_feature_stats_streamed_in_batches_match_the_whole_column(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.normal(10_000, 5, size=(1000, 3))
    x[7, 1] = np.nan
    x[:, 2] = 4.0  # constant: left unscaled
    pq.write_table(pa.table({"a": x[:, 0], "b": x[:, 1].astype(np.float32), "c": x[:, 2]}), tmp_path / "d.parquet",
                   row_group_size=100)
    stats = compute_feature_stats(pads.dataset(str(tmp_path / "d.parquet")), ["a", "b", "c"], batch_rows=64)
    b = x[:, 1].astype(np.float32).astype(np.float64)
    assert np.allclose(stats.mean, [x[:, 0].mean(), np.nanmean(b), 4.0], rtol=0, atol=1e-9)
    assert np.allclose(stats.scale, [x[:, 0].std(), np.nanstd(b), 1.0], rtol=1e-9)
    assert stats.count == 1000 and stats.columns == ["a", "b", "c"]


def test_standardisation_is_a_layer_saved_with_the_checkpoint(checkpoint):
    directory, model = checkpoint
    loaded, meta = load_model(directory)
    assert meta.model.standardize and isinstance(loaded[0], Standardize)
    assert torch.equal(loaded[0].mean, model[0].mean) and torch.equal(loaded[0].scale, model[0].scale)
    assert float(model[0].mean[0]) > 10_000  # the training data's numbers, not placeholders


def test_served_model_predicts_like_the_checkpoint_through_podium_and_mlflow(tmp_path, data, checkpoint):
    directory, model = checkpoint
    plan, served = _served(tmp_path, data, directory)
    assert served.content == "model" and served.info["served_as"] == "mlflow-model"
    version = _promote(plan, served)
    assert "optimizer.pt" not in str(version.manifest["files"])  # weights, not the training state
    assert {"MLmodel", "data/model/model.pt2", "data/model/podium_model.json",
            "code/podium_tabular.py", "input_example.json"} <= set(version.manifest["files"])

    rows = pd.read_parquet(data[1])  # raw validation rows, label column included
    expected = model(torch.from_numpy(rows[FEATURES].to_numpy("float32"))).argmax(1).numpy()
    champion = load_promoted_model(plan.serving)
    assert (champion.predict(rows) == expected).all()
    assert (champion.predict(rows[FEATURES[::-1]]) == expected).all()  # by name, not position
    proba = champion.predict_proba(rows)
    assert list(proba.columns) == ["0", "1", "2"] and np.allclose(proba.sum(axis=1), 1.0)
    assert (mlflow.pyfunc.load_model(version.uri).predict(rows) == expected).all()
    module = mlflow.pytorch.load_model(version.uri)
    assert torch.allclose(module(torch.from_numpy(rows[FEATURES].to_numpy("float32"))),
                          champion.module(torch.from_numpy(rows[FEATURES].to_numpy("float32"))))

    info = mlflow.models.get_model_info(version.uri)
    assert [(c.name, c.type.name) for c in info.signature.inputs] == [
        ("income", "double"), ("ratio", "double"), ("visits", "long"), ("member", "boolean")]
    assert info.signature.outputs.input_names() == ["label"] and info.flavors.keys() >= {"pytorch", "python_function"}
    spec = json.loads((Path(version.uri) / "data/model/podium_model.json").read_text())
    assert [f["type"] for f in spec["features"]] == ["double", "float", "int64", "bool"]
    assert spec["classes"] == [0, 1, 2] and spec["label_column"] == "label"
    assert np.allclose(spec["preprocessing"]["standardize"]["mean"], model[0].mean.numpy())


def test_a_copy_that_answers_its_example_differently_or_does_not_load_is_refused(tmp_path, data, checkpoint):
    plan, served = _served(tmp_path, data, checkpoint[0])
    version = stage_version(plan.serving, served.files_uri, {"step": 5, **served.info}, served.content)
    wrong = [(p + 1) % 3 for p in served.info["example_predictions"]]
    with pytest.raises(ServingError, match="input example"):
        check_loadable(type(version)(version.version, version.uri, {**version.manifest, "example_predictions": wrong}))
    program = Path(version.uri) / "data" / "model" / "model.pt2"
    program.write_bytes(program.read_bytes()[:200])  # the hashes are checked elsewhere: loading must fail too
    with pytest.raises(ServingError, match="does not load as an MLflow model"):
        check_loadable(version)


class _Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def load_linear(directory: str) -> nn.Module:
    """A user's own checkpoint format: a state dict in weights.bin."""
    module = _Linear()
    module.load_state_dict(torch.load(os.path.join(directory, "weights.bin"), weights_only=True))
    return module


class _Constant:
    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        return np.full(len(frame), 2)


def load_constant(directory: str) -> _Constant:
    return _Constant()


def load_nothing(directory: str) -> str:
    return "not a model"


@pytest.fixture
def own_format(tmp_path: Path) -> tuple[str, nn.Module]:
    torch.manual_seed(1)
    module = _Linear()
    directory = tmp_path / "storage" / "run" / "checkpoint_own"
    directory.mkdir(parents=True)
    torch.save(module.state_dict(), directory / "weights.bin")
    return str(directory), module


def test_model_loader_builds_the_same_served_model_from_a_users_format(tmp_path, data, own_format):
    directory, module = own_format
    plan, served = _served(tmp_path, data, directory, model_loader="test_served_model:load_linear")
    _promote(plan, served)
    rows = pd.read_parquet(data[1])
    expected = module(torch.from_numpy(rows[FEATURES].to_numpy("float32"))).argmax(1).numpy()
    assert (load_promoted_model(plan.serving).predict(rows) == expected).all()


def test_model_loader_may_return_an_object_with_predict(tmp_path, data, own_format):
    plan, served = _served(tmp_path, data, own_format[0], model_loader="test_served_model:load_constant")
    champion = load_promoted_model(_promote(plan, served) and plan.serving)
    assert champion.predict(pd.read_parquet(data[1])).tolist() == [2] * 60 and champion.module is None


def test_model_loader_returning_something_else_is_refused(tmp_path, data, own_format):
    with pytest.raises(ExportError, match="expected a torch.nn.Module or an object with a predict"):
        _served(tmp_path, data, own_format[0], model_loader="test_served_model:load_nothing")


def test_without_a_loader_another_format_is_served_as_its_files(tmp_path, data, own_format, capsys):
    """Served as files: its `load:` line, load_promoted_model, `podium history`'s and `podium rollback`'s output say
    so and how to make it loadable; nothing suggests `mlflow models serve`."""
    from types import SimpleNamespace

    from podium.cli.output import print_history, print_rollback

    plan, served = _served(tmp_path, data, own_format[0])
    assert (served.content, served.files_uri, served.info["served_as"]) == ("checkpoint", own_format[0], "files")
    assert served.info["load"].startswith("served as files (name a --model-class or --model-loader to get a loadable ")
    assert "download_artifacts('models:/churn@champion')" in served.info["load"]
    # what MLflow gets: the checkpoint's files, and an MLmodel whose pyfunc says so instead of MLflow's "Could not
    # find an MLmodel configuration file" (the docs' load line, `mlflow models serve`)
    from mlflow.exceptions import MlflowException

    from podium.core import served as words
    from podium.serving import files_only

    assert (files_only._SERVED_AS_FILES, files_only._MAKE_LOADABLE) == (words.SERVED_AS_FILES, words.MAKE_LOADABLE)
    assert set(os.listdir(own_format[0])) <= set(os.listdir(served.local_folder))
    with pytest.raises(MlflowException, match=r"served as files: .*; name a --model-class or --model-loader to get a "
                                              r"loadable model"):
        mlflow.pyfunc.load_model(served.local_folder)
    version = _promote(plan, served)
    with pytest.raises(ServingError, match=r"^served as files: .*/v000001/checkpoint; name a --model-class or "
                                           r"--model-loader to get a loadable model"):
        load_promoted_model(plan.serving)
    print_history(plan.serving, [{"version": "v000001", "action": "promote"}], "v000001", set())
    print_rollback(plan.serving, SimpleNamespace(switched=False, to_version=version.version, mlflow_version="1"),
                   "champion")
    said = capsys.readouterr().out.splitlines()
    assert said[0].endswith("current v000001; served as files (name a --model-class or --model-loader to get a "
                            "loadable model)"), said
    assert said[-1].endswith("alias champion -> version 1; served as files (name a --model-class or --model-loader "
                             "to get a loadable model)"), said
    assert "mlflow models serve" not in "\n".join(said)


@pytest.mark.parametrize("arrow, mlflow_type", [("int32", "long"), ("uint8", "long"), ("float", "double"),
                                                ("double", "double"), ("bool", "boolean")])
def test_signature_column_types_accept_what_dataframes_and_json_carry(arrow, mlflow_type):
    assert column_type(arrow) == mlflow_type
