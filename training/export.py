"""From a checkpoint to what serving needs: the module alone, as a `torch.export` program, and its spec.

A training checkpoint carries the optimizer state (twice the weights for Adam) to resume; serving
needs the weights, the preprocessing, the feature names and types in order and the class labels.
`load_servable` turns a checkpoint folder into a torch module (podium's format, or the user's
`promotion.model_loader`), `write_model_folder` writes the folder `podium.serving.tabular` loads.
No MLflow here: podium.tracking.models wraps the folder as an MLflow model.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.export import Dim

from podium.errors import PodiumError
from podium.imports import resolve_callable
from podium.serving.tabular import MODULE_FILE, SPEC_FILE
from podium.training.checkpoint import META_FILE, load_model
from podium.training.loaders import DEFAULT_CLASS_LOADER
from podium.training.model import Standardize


class ExportError(PodiumError, ValueError):
    """The checkpoint's module cannot be turned into a served model."""


def load_servable(checkpoint_dir: str, model_loader: str | None,
                  model_class: str | None = None) -> tuple[Any, dict[str, Any]]:
    """The servable object of a local checkpoint folder and facts about it (`kind`: torch or pyfunc).

    podium's format loads with its safe loader (weights only). Another format goes through
    `model_loader` ('package.module:function', called with the folder, and `model_class=` the class
    `model_class` names when set): a torch module, or an object with `predict`. `model_class` without a
    loader: the state dict the checkpoint holds, loaded into `model_class()` (podium.training.loaders:state_dict).
    Neither: (None, {}), the checkpoint is served as files."""
    if os.path.exists(os.path.join(checkpoint_dir, META_FILE)) and model_loader is None:
        model, meta = load_model(checkpoint_dir)
        return model, {"step": meta.step, "epoch": meta.epoch, "feature_columns": meta.feature_columns,
                       "label_column": meta.label_column, "num_classes": meta.model.num_classes,
                       "format": "podium", "kind": "torch"}
    if model_loader is None and model_class:
        model_loader = DEFAULT_CLASS_LOADER
    if model_loader is None:
        return None, {}
    loader = resolve_callable(model_loader, "promotion.model_loader")
    if model_class:
        loaded = loader(checkpoint_dir, model_class=resolve_callable(model_class, "promotion.model_class"))
    else:
        loaded = loader(checkpoint_dir)
    if isinstance(loaded, nn.Module):
        return loaded.eval(), {"format": model_loader, "kind": "torch"}
    if callable(getattr(loaded, "predict", None)):
        return loaded, {"format": model_loader, "kind": "pyfunc"}
    raise ExportError(f"promotion.model_loader {model_loader} returned a {type(loaded).__name__}: expected a "
                      "torch.nn.Module or an object with a predict(DataFrame) method")


def preprocessing_of(module: nn.Module) -> dict[str, Any]:
    """The standardisation a module applies first, in numbers (empty when it has none)."""
    first = next(iter(module.children()), None)
    if isinstance(first, Standardize):
        return {"standardize": {"mean": first.mean.tolist(), "scale": first.scale.tolist()}}
    return {}


def num_outputs(module: nn.Module, example: np.ndarray) -> int:
    """How many logits the module gives per row (its classes), from a few rows of float32 features."""
    with torch.no_grad():
        return int(module.eval()(torch.from_numpy(np.ascontiguousarray(example, dtype=np.float32))).shape[-1])


def write_model_folder(module: nn.Module, out_dir: str, spec: dict[str, Any], example: np.ndarray) -> np.ndarray:
    """Export `module` (float32 features in, logits out) with a dynamic batch size and write the spec.

    `example`: a few real rows (float32, features in order). Returns the module's logits on them,
    so that a copy can be checked to give the same answers."""
    os.makedirs(out_dir, exist_ok=True)
    module.eval()
    rows = torch.from_numpy(np.ascontiguousarray(example, dtype=np.float32))
    # two rows at least: torch.export specialises a batch dimension of size 1 to a constant
    sample = rows if len(rows) >= 2 else rows.repeat(2, 1)
    try:
        program = torch.export.export(module, (sample,), dynamic_shapes=({0: Dim("batch")},))
    except Exception as exc:  # torch raises many kinds for graphs it cannot capture
        raise ExportError(f"the model cannot be exported with torch.export ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''})") from exc
    torch.export.save(program, os.path.join(out_dir, MODULE_FILE))
    with open(os.path.join(out_dir, SPEC_FILE), "w") as f:
        json.dump({**spec, "preprocessing": preprocessing_of(module),
                   "torch_version": str(torch.__version__)}, f, indent=2)
    with torch.no_grad():
        return module(rows).numpy()
