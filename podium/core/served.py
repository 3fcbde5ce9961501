"""How a promoted version is served, said the same way by every command: an MLflow model, or its files.

A checkpoint podium can build no model from (a format of your own, with neither `promotion.model_class`
nor `promotion.model_loader`) is *served as files*: MLflow's pyfunc and `podium.load_promoted_model`
cannot load it, so every output that shows such a version says so, and how to make it loadable.
"""

from __future__ import annotations

FILES = "files"  # a manifest's `served_as` for a checkpoint's files ("mlflow-model" for a built model)
SERVED_AS_FILES = "served as files"
MAKE_LOADABLE = "name a --model-class or --model-loader to get a loadable model"


def is_served_as_files(served_as: str | None) -> bool:
    """Whether a version's `served_as` (its manifest's; absent in versions older than served models) is files."""
    return (served_as or FILES) == FILES


def files_note(served_as: str | None) -> str:
    """'served as files (name a --model-class ...)' for a files version, '' for a model."""
    return f"{SERVED_AS_FILES} ({MAKE_LOADABLE})" if is_served_as_files(served_as) else ""
