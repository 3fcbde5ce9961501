"""Loading what was promoted: the champion as a model, checked against its manifest first."""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import tempfile
from typing import Any

from podium.core.served import MAKE_LOADABLE, SERVED_AS_FILES
from podium.errors import ServingError
from podium.serving.layout import CHUNK, PromotedVersion, parallel, read_current, safe_relpath
from podium.serving.staging import list_objects, verify_files
from podium.serving.tabular import PROBABILITIES, TabularClassifier
from podium.storage.locations import fsspec_filesystem, is_remote

logger = logging.getLogger(__name__)

MLMODEL = "MLmodel"
CHECKPOINT_META = "podium.json"  # podium.training.checkpoint.META_FILE, named here without loading torch


class PromotedModel:
    """A promoted version, loaded: `predict(DataFrame)` answers as MLflow's pyfunc of the same model
    does (class labels; `params={"probabilities": True}` for probabilities), `module` is the torch
    module (raw float32 features in, logits out) where there is one, and calling the object calls it."""

    def __init__(self, version: PromotedVersion, pyfunc: Any):
        self.version = version.version
        self.uri = version.uri
        self.manifest = version.manifest
        self.pyfunc = pyfunc

    @property
    def module(self) -> Any:
        """The torch module, or None for a model that is not one (a user's object with predict)."""
        try:
            return self.pyfunc.get_raw_model()
        except NotImplementedError:
            return None

    def predict(self, data: Any, params: dict[str, Any] | None = None) -> Any:
        """Class labels of the rows of `data` (a DataFrame of the raw feature columns)."""
        return self.pyfunc.predict(data, params=params) if params else self.pyfunc.predict(data)

    def predict_proba(self, data: Any) -> Any:
        """Class probabilities, one column per class label."""
        return self.pyfunc.predict(data, params={PROBABILITIES: True})

    def __call__(self, *args: Any) -> Any:
        module = self.module
        if module is None:
            raise TypeError(f"{self.uri} is not a torch module: use predict(DataFrame)")
        return module(*args)


def fetch_folder(uri: str, dest: str, files: dict[str, dict[str, Any]] | None = None) -> str:
    """Download the files under `uri` (those of `files`, checked against their sha256, or all) into `dest`."""
    fs, root = fsspec_filesystem(uri)
    entries: dict[str, dict[str, Any]] = files if files is not None else list_objects(uri)

    def fetch(item: tuple[str, dict[str, Any]]) -> None:
        rel, entry = safe_relpath(item[0]), item[1]
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fs.get_file(posixpath.join(root, rel), target)
        if "sha256" not in entry:
            return
        h = hashlib.sha256()
        with open(target, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
        if h.hexdigest() != entry["sha256"]:
            raise ServingError(f"{uri}/{rel}: sha256 does not match the manifest")

    parallel(fetch, sorted(entries.items()))
    return dest


def fetch_version(version: PromotedVersion, dest: str) -> str:
    """Download a version's files into local `dest` and check them against its manifest."""
    return fetch_folder(version.uri, dest, version.manifest["files"])


def _load_local(version: PromotedVersion, path: str) -> Any:
    """The pyfunc-like object of a version's files at a local `path`."""
    files = version.manifest["files"]
    if MLMODEL in files:
        import mlflow.pyfunc  # MLflow loads only here: the folder is an MLflow model

        try:
            return mlflow.pyfunc.load_model(path)
        except Exception as exc:  # MLflow, torch and the loader raise many kinds for a broken model
            raise ServingError(f"{version.uri} does not load as an MLflow model: {exc}") from exc
    from podium.training.checkpoint import CheckpointFormatError, load_model  # torch loads only here

    if CHECKPOINT_META not in files:
        raise ServingError(f"{SERVED_AS_FILES}: {version.uri}; {MAKE_LOADABLE} (the files: "
                           "mlflow.artifacts.download_artifacts('models:/<model>@champion'), or "
                           "podium.training.promoted.fetch_version)")
    try:  # a version promoted before podium built served models: the checkpoint itself
        module, meta = load_model(path)
    except CheckpointFormatError as exc:
        raise ServingError(f"{version.uri}: {exc}") from None
    return TabularClassifier(module, {"features": [{"name": c, "type": "unknown"} for c in meta.feature_columns],
                                      "classes": list(range(meta.model.num_classes)),
                                      "label_column": meta.label_column})


def load_version(version: PromotedVersion, check_answers: bool = False) -> PromotedModel:
    """A complete version as a model. A local version is loaded where it is; a remote one is
    fetched and checked against its manifest first. `check_answers`: a served model must answer its input
    example as it did when it was built (`example_predictions` in the manifest), or ServingError."""
    if not is_remote(version.uri):
        return _load_checked(version, version.uri, check_answers)
    with tempfile.TemporaryDirectory(prefix="podium-serving-") as tmp:
        fetch_version(version, tmp)
        return _load_checked(version, tmp, check_answers)


def _load_checked(version: PromotedVersion, folder: str, check_answers: bool) -> PromotedModel:
    model = PromotedModel(version, _load_local(version, folder))
    expected = version.manifest.get("example_predictions")
    if not check_answers or expected is None or MLMODEL not in version.manifest["files"]:
        return model
    import mlflow.models

    example = mlflow.models.Model.load(os.path.join(folder, MLMODEL)).load_input_example(folder)
    got = [v.item() if hasattr(v, "item") else v for v in model.predict(example)]
    if got != list(expected):
        raise ServingError(f"{version.uri}: the served model predicts {got} on its input example, the "
                           f"checkpoint predicted {list(expected)}: not promoted")
    return model


def load_version_model(version: PromotedVersion) -> Any:
    """A version's torch module in eval mode (see `load_version` for the whole model)."""
    return load_version(version).module


def check_loadable(version: PromotedVersion) -> None:
    """A staged version must load, and a served model must answer its input example as it did when it
    was built (`example_predictions` in the manifest); files of another format are left to their hashes."""
    files = version.manifest["files"]
    if MLMODEL not in files and CHECKPOINT_META not in files:
        logger.info("%s is not a model podium can load: checked by its hashes only", version.uri)
        return
    load_version(version, check_answers=True)


def load_promoted_model(serving: str) -> PromotedModel:
    """The current champion, checked against its manifest: `predict(DataFrame)` as MLflow's pyfunc,
    `module` the torch module (see PromotedModel).

    Serving code calls this (or follows CURRENT itself). A champion served as plain files (a
    checkpoint podium could not build a model from) raises, saying how to fetch them."""
    current = read_current(serving)
    if current is None:
        raise ServingError(f"nothing has been promoted to {serving!r} yet")
    if not is_remote(current.uri):
        verify_files(os.path.dirname(current.uri.rstrip("/")), current.manifest)  # served in place: check it first
    return load_version(current)
