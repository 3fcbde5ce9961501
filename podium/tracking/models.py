"""The champion as MLflow knows it: an MLflow model folder, logged into the checkpoint's LoggedModel.

podium writes the folder itself, with explicit ids, instead of `mlflow.pyfunc.log_model`: that one
finds its client through the process-wide tracking URI and logs the model as an output of the run,
which a promotion (possibly of another process's run) must not do.

- `package_model`: a torch model folder (`podium.training.export`) becomes an MLflow model with two
  flavours sharing one weights file: `python_function` (loader `podium_tabular`, shipped in `code/`,
  class labels or probabilities from a DataFrame of raw features) and `pytorch` (`model.pt2`, so
  `mlflow.pytorch.load_model` gives the module). Signature and input example included.
- `package_python_model`: a user's object with `predict(DataFrame)` (from `promotion.model_loader`),
  saved the pyfunc way (cloudpickle: its code must be importable where it is loaded).
- `package_files`: a checkpoint podium can build no model from, as its files (linked, not copied) with an
  MLmodel whose loader (`podium_files_only`, shipped in `code/`) raises "served as files: ...", so that
  pyfunc says what the champion is instead of "Could not find an MLmodel configuration file".
- `log_served_model`: upload a promotion's built folder into the checkpoint's LoggedModel, at a path of its own
  (`served_files_path`: the files its registered version names, the bytes its serving version serves), and at the
  LoggedModel's root the first time only (so that `models:/<model_id>` loads). A checkpoint promoted twice (a
  second serving location, `--always-promote` again) thus has two sets of files, neither overwritten: each
  registered version keeps the bytes its serving version's MANIFEST.json lists.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from podium.serving import files_only, tabular
from podium.tracking.client import TrackingRun, tracking_call

if TYPE_CHECKING:
    from mlflow.models import ModelSignature

LOADER_MODULE = "podium_tabular"  # the name tabular.py is shipped under, inside each model's code/
FILES_LOADER_MODULE = "podium_files_only"  # the name files_only.py is shipped under


def column_type(arrow_type: str) -> str:
    """The MLflow column type a Parquet feature is declared with in the signature.

    Floats are `double` even when stored as float32: MLflow refuses to narrow the float64 that
    a DataFrame or a JSON request carries into `float`, and the model casts to float32 itself."""
    t = arrow_type.lower()
    if t in ("bool", "boolean"):
        return "boolean"
    if t.startswith(("int", "uint")):
        return "long"
    return "double"


def signature_for(features: list[dict[str, str]], label_column: str | None,
                  with_probabilities: bool = True) -> ModelSignature:
    """Inputs: the feature columns in order; output: the class label; param: `probabilities`."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

    inputs = Schema([ColSpec(column_type(f["type"]), f["name"]) for f in features])
    outputs = Schema([ColSpec("long", label_column)]) if label_column else None
    if not with_probabilities:
        return ModelSignature(inputs=inputs, outputs=outputs)
    return ModelSignature(inputs=inputs, outputs=outputs,
                          params=ParamSchema([ParamSpec(tabular.PROBABILITIES, "boolean", False)]))


def requirements(torch_version: str | None) -> list[str]:
    """What the served model needs, pinned to what built it (`+cpu`-style local tags dropped)."""
    import mlflow

    reqs = [f"mlflow=={mlflow.__version__}", f"numpy=={np.__version__}", f"pandas=={pd.__version__}"]
    if torch_version:
        reqs.append(f"torch=={torch_version.split('+')[0]}")
    return reqs


def package_model(model_folder: str, out_dir: str, *, example: pd.DataFrame, model_id: str | None,
                  run_id: str | None, metadata: dict[str, Any]) -> str:
    """Wrap a model folder (model.pt2 + podium_model.json) as an MLflow model at `out_dir`."""
    import mlflow
    from mlflow.models import Model

    spec = tabular.read_spec(model_folder)
    with tempfile.TemporaryDirectory(prefix="podium-code-") as code:
        loader = os.path.join(code, f"{LOADER_MODULE}.py")
        shutil.copyfile(tabular.__file__, loader)
        mlflow.pyfunc.save_model(
            out_dir, loader_module=LOADER_MODULE, data_path=model_folder, code_paths=[loader],
            signature=signature_for(spec["features"], spec.get("label_column")), input_example=example,
            pip_requirements=requirements(spec.get("torch_version")), metadata=metadata,
            mlflow_model=Model(model_id=model_id, run_id=run_id))
    mlmodel = os.path.join(out_dir, "MLmodel")
    model = Model.load(mlmodel)
    # the pytorch flavour reads the same model.pt2 (it loads `<model_data>/model.pt2` when there is
    # no pickled model.pth): one copy of the weights serves both flavours
    model.add_flavor("pytorch", model_data=model.flavors["python_function"]["data"],
                     pytorch_version=str(spec.get("torch_version", "")), code=None)
    model.save(mlmodel)
    return out_dir


def package_python_model(loaded: Any, out_dir: str, *, features: list[dict[str, str]], example: pd.DataFrame,
                         model_id: str | None, run_id: str | None, metadata: dict[str, Any]) -> str:
    """An object with `predict(DataFrame)` as an MLflow pyfunc model (its `predict` is called as it is)."""
    import mlflow
    from mlflow.models import Model


    # the argument name pyfunc expects, and no type hints (pyfunc would read them as a schema); the
    # function is pickled by value, with `loaded` inside
    def predict(model_input):  # type: ignore[no-untyped-def]
        return loaded.predict(model_input)

    mlflow.pyfunc.save_model(
        out_dir, python_model=predict, signature=signature_for(features, None, with_probabilities=False),
        input_example=example, pip_requirements=requirements(None), metadata=metadata,
        mlflow_model=Model(model_id=model_id, run_id=run_id))
    return out_dir


def package_files(checkpoint_dir: str, out_dir: str, *, model_id: str | None, run_id: str | None,
                  metadata: dict[str, Any]) -> str:
    """A checkpoint's files at `out_dir` (symbolic links: uploading reads through them) beside an MLmodel whose
    pyfunc loader says the model is served as files. A checkpoint that has files of the stub's names (MLmodel,
    code/...) is left as it is: `out_dir` is then the checkpoint's folder."""
    import mlflow
    from mlflow.models import Model

    with tempfile.TemporaryDirectory(prefix="podium-code-") as code:
        loader = os.path.join(code, f"{FILES_LOADER_MODULE}.py")
        shutil.copyfile(files_only.__file__, loader)
        mlflow.pyfunc.save_model(out_dir, loader_module=FILES_LOADER_MODULE, code_paths=[loader],
                                 pip_requirements=[f"mlflow=={mlflow.__version__}"], metadata=metadata,
                                 mlflow_model=Model(model_id=model_id, run_id=run_id))
    stub = set(os.listdir(out_dir))
    if stub & set(os.listdir(checkpoint_dir)):
        shutil.rmtree(out_dir)
        return checkpoint_dir
    for root, _, names in os.walk(checkpoint_dir):
        target = os.path.join(out_dir, os.path.relpath(root, checkpoint_dir))
        os.makedirs(target, exist_ok=True)
        for name in names:
            os.symlink(os.path.abspath(os.path.join(root, name)), os.path.join(target, name))
    return out_dir


SERVED_FILES = "served"  # inside a LoggedModel: one folder per promotion of its checkpoint


def served_files_path(version: str, version_uid: str | None) -> str | None:
    """Where one promotion's built model goes inside the checkpoint's LoggedModel: `served/<vN>-<uid>`, named by the
    serving `version` (as `podium history` shows it) and its identity (two serving locations both have a v000001).
    None for a version of podium <= 0.4 (no `version_uid`), whose build was the LoggedModel's root."""
    return f"{SERVED_FILES}/{version}-{version_uid}" if version_uid else None


@tracking_call("logging the served model")
def log_served_model(tr: TrackingRun, model_id: str, local_dir: str, files_path: str | None) -> None:
    """Upload a promotion's built folder (an MLflow model, or a checkpoint's files with their MLmodel) into a
    LoggedModel at `files_path`, and at its root if nothing was logged there yet (idempotent: a retry uploads the
    same bytes to the same paths). `files_path` None (a version without an identity): the root alone."""
    client = tr.client()
    if files_path:
        client.log_model_artifacts(model_id, local_dir, files_path)
    # the root is the LoggedModel's own model (`models:/<model_id>`, the MLflow UI's page of it): logged once and
    # never rewritten, since a later build of the same checkpoint may differ (other validation rows in its input
    # example, another torch); registered versions never name it
    if not any(f.path == "MLmodel" for f in client.list_logged_model_artifacts(model_id)):
        client.log_model_artifacts(model_id, local_dir)
