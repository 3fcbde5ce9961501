"""The MLflow loader of a version served as files: it loads nothing and says why.

A checkpoint podium can build no model from (neither `promotion.model_class` nor `promotion.model_loader`) is
logged to MLflow as its files, with an MLmodel whose `python_function` loader is this module, shipped in the
model's `code/` as `podium_files_only` (as `tabular` is as `podium_tabular`: the model needs no podium to open).
`mlflow.pyfunc.load_model("models:/<model>@champion")` and `mlflow models serve` then say what the champion is
and how to make it loadable, instead of MLflow's "Could not find an MLmodel configuration file".

Standalone: imports nothing of podium. Its words are podium.core.served's (a unit test compares them).
"""

from __future__ import annotations

_SERVED_AS_FILES = "served as files"
_MAKE_LOADABLE = "name a --model-class or --model-loader to get a loadable model"


def _load_pyfunc(path: str) -> None:
    """MLflow's pyfunc entry point: raise, naming the files (`path`, where MLflow put them) and the way out."""
    from mlflow.exceptions import MlflowException

    raise MlflowException(f"{_SERVED_AS_FILES}: {path}; {_MAKE_LOADABLE} (the checkpoint's files are in that folder, "
                          "for your own code to load)")
