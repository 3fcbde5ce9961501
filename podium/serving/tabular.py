"""The served classifier: a torch graph plus what serving needs to feed it, as MLflow's pyfunc loads it.

This file is copied into every MLflow model podium builds (`code/podium_tabular.py`, the model's
`loader_module`), so it imports nothing from podium: a model keeps loading with numpy, pandas and
torch alone, whatever podium version (if any) is installed where it is served. podium's own
`load_promoted_model` loads the same file through MLflow, so both give the same answers.

A model folder (`data/model` in the MLflow model) holds
  model.pt2          the module as a `torch.export` program: raw float32 features in, logits out
                     (podium's built-in model carries its standardisation as its first layer)
  podium_model.json  the features (name and type, in order), the label column, the class labels,
                     the preprocessing in words and numbers, and where the weights came from
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pandas as pd

SPEC_FILE = "podium_model.json"
MODULE_FILE = "model.pt2"
PROBABILITIES = "probabilities"  # the predict param that asks for class probabilities


class TabularClassifier:
    """Class predictions (or probabilities) for a DataFrame of raw feature columns."""

    def __init__(self, module: Any, spec: dict[str, Any]):
        self.module = module
        self.spec = spec
        self.features: list[str] = [f["name"] for f in spec["features"]]
        self.classes = np.asarray(spec["classes"])

    def _logits(self, data: Any) -> Any:
        import torch

        frame = data if isinstance(data, pd.DataFrame) else pd.DataFrame(data, columns=self.features)
        missing = [c for c in self.features if c not in frame.columns]
        if missing:
            raise ValueError(f"missing feature columns {missing}; the model takes {self.features}")
        # the module takes float32 in the training's column order, whatever order or types arrived
        x = np.ascontiguousarray(frame[self.features].to_numpy(dtype=np.float32))
        with torch.no_grad():
            return self.module(torch.from_numpy(x))

    def predict_proba(self, data: Any) -> pd.DataFrame:
        """One column per class label (as text), one row per input row."""
        import torch

        probs = torch.softmax(self._logits(data), dim=1).numpy()
        return pd.DataFrame(probs, columns=[str(c) for c in self.classes])

    def predict(self, data: Any, params: dict[str, Any] | None = None) -> Any:
        """The class label of each row; with params {"probabilities": true}, `predict_proba`."""
        if params and params.get(PROBABILITIES):
            return self.predict_proba(data)
        return self.classes[self._logits(data).argmax(dim=1).numpy()]

    def get_raw_model(self) -> Any:
        """The torch module (MLflow's `PyFuncModel.get_raw_model()` returns it)."""
        return self.module


def read_spec(path: str) -> dict[str, Any]:
    """The model folder's description (features, classes, preprocessing)."""
    with open(os.path.join(path, SPEC_FILE)) as f:
        return json.load(f)


def load(path: str) -> TabularClassifier:
    """The classifier in a model folder. `torch.export.load` reads the program; the folder must come
    from a trusted place (podium checks a served copy against its manifest first)."""
    import torch

    module = torch.export.load(os.path.join(path, MODULE_FILE)).module()
    return TabularClassifier(module, read_spec(path))


def _load_pyfunc(data_path: str, model_config: dict[str, Any] | None = None) -> TabularClassifier:
    """MLflow's entry point for a `loader_module` (called with the model's `data` folder)."""
    return load(data_path)
