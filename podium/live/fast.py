"""The fast request path: MLflow's scoring protocol answered from numpy arrays, without a per-request DataFrame.

`mlflow models serve` turns every request into a pandas DataFrame, casts and checks it against the model's
signature, hands it to the model, and writes the answer back through pandas: for a small model that is nine
tenths of a request's time in the replica (the profile is in docs/serving-live.md). For a model podium built (its
TabularClassifier: a torch module over float32 features) whose input schema is named columns of numbers and
booleans, a request in one of the common shapes carries nothing pandas adds: this module reads it into one float32
array, and the replica answers a batch of such requests with one call of the torch module.

Whatever this path cannot take as MLflow would is left to MLflow (`parse` returns None) and answered by the pyfunc
path, unchanged: another content type, `params`, columns other than the model's, a value of another JSON type than
its column's (a float in an integer column, a null, a string), NaN, an empty request, a model podium did not
build. So every answer this path gives is the one MLflow's scoring server gives on the same body, byte for byte.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

# MLflow schema types -> what a JSON value of that column must be here (bool is an int in Python: told apart)
FLOATS, INTS, INT32S, BOOLS = "float", "int", "int32", "bool"
KINDS = {"double": FLOATS, "float": FLOATS, "long": INTS, "integer": INT32S, "boolean": BOOLS}
INT32 = 2**31  # MLflow's "integer" is int32: a value beyond it is MLflow's to refuse
FORMATS = ("dataframe_split", "dataframe_records", "instances", "inputs")


@dataclass(frozen=True)
class FastModel:
    """A version the fast path serves: its torch module, its features (in the module's order) with the kind
    of value each takes, and its class labels."""

    module: Any
    features: tuple[str, ...]
    kinds: tuple[str, ...]
    classes: np.ndarray

    def parse(self, body: bytes, content_type: str) -> np.ndarray | None:
        """The request's rows as a float32 array in the module's feature order, or None: a request this path
        does not take as MLflow would (left to the pyfunc path)."""
        if not _is_json(content_type):
            return None
        try:
            said = orjson.loads(body)  # stricter than json (no NaN): what it refuses goes to MLflow's parser
        except orjson.JSONDecodeError:
            return None
        if not isinstance(said, dict) or len(said) != 1:
            return None
        (form, value), = said.items()
        columns = self._columns(form, value)
        if columns is None:
            return None
        return self._array(columns)

    def _columns(self, form: str, value: Any) -> list[Sequence[Any]] | None:
        """The request's values by feature, in the module's order (None: not a shape taken here)."""
        names = self.features
        if form == "dataframe_split":
            if not isinstance(value, dict) or value.keys() != {"columns", "data"}:
                return None
            columns, data = value["columns"], value["data"]
            if (not isinstance(columns, list) or not isinstance(data, list) or not data or len(columns) != len(names)
                    or set(columns) != set(names) or len(set(columns)) != len(columns)):
                return None
            width = len(columns)
            if not all(isinstance(row, list) and len(row) == width for row in data):
                return None
            by_name = dict(zip(columns, zip(*data)))
            return [by_name[name] for name in names]
        if form in ("dataframe_records", "instances", "inputs"):
            if isinstance(value, dict) and form != "dataframe_records":  # columnar: {"income": [...], ...}
                if value.keys() != set(names) or not all(isinstance(v, list) for v in value.values()):
                    return None
                columns_ = [value[name] for name in names]
                rows = len(columns_[0])
                return columns_ if rows and all(len(c) == rows for c in columns_) else None
            if not isinstance(value, list) or not value:
                return None
            keys = set(names)
            if not all(isinstance(r, dict) and r.keys() == keys for r in value):
                return None
            return [[r[name] for r in value] for name in names]
        return None

    def _array(self, columns: list[Sequence[Any]]) -> np.ndarray | None:
        """The float32 matrix, converted column by column as pandas converts them (None: a value MLflow would
        cast, refuse or read otherwise)."""
        x = np.empty((len(columns[0]), len(columns)), dtype=np.float32)
        for j, (column, kind) in enumerate(zip(columns, self.kinds)):
            types = set(map(type, column))
            if kind == FLOATS and types <= {float, int}:
                x[:, j] = np.asarray(column, dtype=np.float64)
            elif kind in (INTS, INT32S) and types == {int}:
                try:
                    values = np.asarray(column, dtype=np.int64)
                except OverflowError:
                    return None
                if kind == INT32S and (values.min() < -INT32 or values.max() >= INT32):
                    return None
                x[:, j] = values
            elif kind == BOOLS and types == {bool}:
                x[:, j] = np.asarray(column, dtype=bool)
            else:
                return None
        return x

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Class labels of the rows of `x` (float32, the module's feature order): what the pyfunc predicts."""
        import torch  # loaded already: the version's module is a torch program

        with torch.no_grad():
            return self.classes[self.module(torch.from_numpy(x)).argmax(dim=1).numpy()]


def fast_model_of(pyfunc: Any, input_schema: Any) -> FastModel | None:
    """The fast path of a loaded MLflow pyfunc model, or None where only its pyfunc can answer: a model other than
    podium's TabularClassifier, a schema other than required named columns of numbers and booleans that are the
    model's features. (A request with `params`, such as podium's {"probabilities": true}, goes to the pyfunc path.)"""
    impl: Any = getattr(pyfunc, "_model_impl", None)  # MLflow's PyFuncModel keeps the loader module's object here
    if type(impl).__name__ != "TabularClassifier" or not all(hasattr(impl, a) for a in ("module", "features", "classes")):
        return None
    if input_schema is None or input_schema.is_tensor_spec() or not input_schema.has_input_names():
        return None
    types: dict[str, str] = {}
    for spec in input_schema.inputs:
        name, kind = spec.name, getattr(getattr(spec, "type", None), "name", None)
        if kind not in KINDS or not getattr(spec, "required", True):
            return None
        types[name] = kind
    features = tuple(impl.features)
    if set(types) != set(features) or len(types) != len(features):
        return None
    return FastModel(impl.module, features, tuple(KINDS[types[f]] for f in features), np.asarray(impl.classes))


def _is_json(content_type: str) -> bool:
    """application/json, with at most a utf-8 charset: other types and charsets are MLflow's to answer."""
    mime, *parameters = (p.strip().lower() for p in content_type.split(";"))
    return mime == "application/json" and all(p.replace(" ", "") == "charset=utf-8" for p in parameters)


@dataclass(frozen=True)
class FastAnswer:
    """The answer to one request of a batch: MLflow's JSON body, and the time of its batch's model call."""

    body: str
    seconds: float


def answer_batch(model: FastModel, arrays: list[np.ndarray]) -> list[FastAnswer]:
    """One model call on the requests' rows together, split back into one answer per request, each the body
    MLflow's scoring server writes ({"predictions": [...]}, json.dump's separators)."""
    started = time.perf_counter()
    labels = model.predict(arrays[0] if len(arrays) == 1 else np.concatenate(arrays))
    seconds = time.perf_counter() - started
    out, at = [], 0
    for x in arrays:
        out.append(FastAnswer(json.dumps({"predictions": labels[at:at + len(x)].tolist()}), seconds))
        at += len(x)
    return out
