"""The served model of a checkpoint, built once, at promotion: what goes to serving and to MLflow.

From the chosen checkpoint podium builds an MLflow model folder: the weights alone (no optimizer
state) as a `torch.export` program with the preprocessing inside, the feature names and types in
order, the class labels, a signature and an input example (the first rows of the validation
data). A checkpoint that is neither in podium's format nor covered by `promotion.model_class` or
`promotion.model_loader` is served as its files. The raw checkpoint stays in storage, for resuming; the manifest names it.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from podium.core.records import CheckpointRecord
from podium.core.served import FILES, MAKE_LOADABLE, SERVED_AS_FILES
from podium.imports import Preload
from podium.serving.staging import list_objects
from podium.storage.locations import is_remote
from podium.tasks.plan import RunPlan
from podium.tracking.client import TrackingRun
from podium.tracking.models import package_files, package_model, package_python_model
from podium.training.data import open_dataset
from podium.training.promoted import fetch_folder

logger = logging.getLogger(__name__)

EXAMPLE_ROWS = 5


@dataclass(frozen=True)
class ServedModel:
    """What promotion stages (`files_uri` into the version's `content` folder) and logs to MLflow."""

    files_uri: str
    local_folder: str  # the same files on this machine, for MLflow
    content: str  # "model" (an MLflow model folder) or "checkpoint" (the checkpoint's files)
    info: dict[str, Any] = field(default_factory=dict)  # for the manifest


def load_hint(plan: RunPlan, content: str) -> str:
    """How to load the champion, in one line (for the summary and the registry)."""
    p = plan.config.promotion
    uri = f"models:/{p.registered_model}@{p.alias}"
    if content == "model":
        return f"mlflow.pyfunc.load_model('{uri}').predict(df), or podium.load_promoted_model('{plan.serving}')"
    return (f"{SERVED_AS_FILES} ({MAKE_LOADABLE}): mlflow.artifacts.download_artifacts('{uri}') fetches them, "
            "for your own code to load")


def _folder_size(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(folder) for f in names)


def _features(plan: RunPlan, facts: dict[str, Any]) -> tuple[list[dict[str, str]], Any]:
    """The feature columns with their Parquet types, in order, and the first validation rows of them.

    Without readable validation data (a plan built by hand) the checkpoint's own feature list is used,
    typed `double`, with rows of zeros as the example."""

    columns = list(plan.data_facts.get("feature_columns") or facts.get("feature_columns") or [])
    if not columns:
        raise ValueError("the served model needs the feature columns: neither the plan nor the checkpoint names them")
    try:
        dataset = open_dataset(plan.data_facts["val_data"])
        features = [{"name": c, "type": str(dataset.schema.field(c).type)} for c in columns]
        return features, dataset.head(EXAMPLE_ROWS, columns=columns).to_pandas()
    except (KeyError, OSError, ValueError) as exc:
        logger.warning("no validation rows for the served model's input example (%s): zeros instead", exc)
        return [{"name": c, "type": "double"} for c in columns], pd.DataFrame({c: [0.0, 0.0] for c in columns})


def _load_export_modules() -> None:
    importlib.import_module("podium.training.export")
    importlib.import_module("torch.export._trace")


_EXPORT = Preload("podium-preload-export", _load_export_modules)


def preload_packaging() -> None:
    """Load what building a served model loads the first time, in a background thread: `torch.export`'s
    tracing (dynamo, sympy), about a second of imports. The flow calls this once training has reported its
    first checkpoint, while this process mostly waits; promotion then does not wait for the imports, and
    neither does the start of the run. Once per process."""
    _EXPORT.start()


def build_served_model(plan: RunPlan, tracking: TrackingRun, record: CheckpointRecord, workdir: str) -> ServedModel:
    """Build the served model of `record`'s checkpoint in `workdir` (see the module's docstring)."""
    _EXPORT.wait()  # the modules it loads are not loaded from two threads at once
    from podium.training.export import load_servable, num_outputs, write_model_folder  # torch loads here, not at import

    start = time.monotonic()
    checkpoint_files = list_objects(record.uri)
    checkpoint_size = sum(o["size"] for o in checkpoint_files.values())
    local = record.uri if not is_remote(record.uri) else fetch_folder(record.uri, os.path.join(workdir, "checkpoint"))
    loaded, facts = load_servable(local, plan.config.promotion.model_loader, plan.config.promotion.model_class)
    sizes = {"checkpoint_size_bytes": checkpoint_size}
    metadata = {"podium": {"model": plan.config.model, "checkpoint": record.uri, "step": record.step,
                           "run_name": tracking.run_name, "checkpoint_format": facts.get("format")}}
    if loaded is None:  # served as files: MLflow gets them with an MLmodel that says so when loaded
        logged = package_files(local, os.path.join(workdir, "mlflow-files"), model_id=record.model_id,
                               run_id=tracking.run_id, metadata=metadata)
        return ServedModel(record.uri, logged, "checkpoint", {**sizes, "served_as": FILES,
                                                            "load": load_hint(plan, "checkpoint")})
    features, example = _features(plan, facts)
    out = os.path.join(workdir, "mlflow-model")
    if facts["kind"] == "torch":  # exported, with podium's pyfunc around it
        rows = example[[f["name"] for f in features]].to_numpy("float32")
        # a module of the user's, on data podium could not read: as many classes as it gives logits
        num_classes = int(facts.get("num_classes") or plan.data_facts.get("num_classes") or num_outputs(loaded, rows))
        label = facts.get("label_column") or plan.config.data.label_column
        spec: dict[str, Any] = {"features": features, "label_column": label,
                "classes": list(range(num_classes)), "model": plan.config.model,
                "source": {"checkpoint": record.uri, "step": record.step, "run_name": tracking.run_name,
                           "mlflow_run_id": tracking.run_id, "model_id": record.model_id}}
        folder = os.path.join(workdir, "model")  # its name is the folder's name inside the MLflow model (data/model)
        logits = write_model_folder(loaded, folder, spec, rows)
        predictions = [spec["classes"][i] for i in logits.argmax(axis=1).tolist()]
        package_model(folder, out, example=example, model_id=record.model_id, run_id=tracking.run_id,
                      metadata=metadata)
    else:  # the user's object with predict(DataFrame)
        predictions = None
        package_python_model(loaded, out, features=features, example=example, model_id=record.model_id,
                             run_id=tracking.run_id, metadata=metadata)
    size = _folder_size(out)
    logger.info("served model of step %d built in %.1f s: %d bytes (checkpoint %d bytes)", record.step,
                time.monotonic() - start, size, checkpoint_size)
    return ServedModel(out, out, "model", {**sizes, "size_bytes": size, "served_as": "mlflow-model",
                                           "example_predictions": predictions, "load": load_hint(plan, "model")})
