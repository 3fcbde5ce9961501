"""podium: train on Ray Train, validate every checkpoint as it lands, record in MLflow, promote the best.

The public API is what this module exports (`__all__`); everything else is internal and may change.

- `PipelineConfig`: the typed configuration of a run (data, training, scaling, validation, promotion)
- `train_validate_promote`: the Prefect flow `train-validate-promote`
- `promote_run`: the Prefect flow `promote-run` (promotion alone, on a run that has trained)
- `load_promoted_model`: the champion of a serving location, checked against its manifest
- `CheckpointAnnouncer`: the Ray Train callback that announces each persisted checkpoint, for a
  `TorchTrainer` you build yourself
- `PrefectEventSink`: sends those announcements as Prefect events (`podium.checkpoint.persisted`)
- `validate_checkpoint`: the built-in validation function, `(checkpoint, **kwargs) -> dict of floats`

Each name is imported when first used, so `import podium` stays cheap in Ray workers and for `podium --help`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from podium.core.version import __version__

if TYPE_CHECKING:
    from podium.config import PipelineConfig
    from podium.flows.pipeline import train_validate_promote
    from podium.flows.promote import promote_run
    from podium.prefect_events import PrefectEventSink
    from podium.training.raytrain import CheckpointAnnouncer
    from podium.training.validate import validate_checkpoint

# name -> the module that defines it
_EXPORTS = {
    "PipelineConfig": "podium.config",
    "train_validate_promote": "podium.flows.pipeline",
    "promote_run": "podium.flows.promote",
    "CheckpointAnnouncer": "podium.training.raytrain",
    "PrefectEventSink": "podium.prefect_events",
    "validate_checkpoint": "podium.training.validate",
}

__all__ = ["CheckpointAnnouncer", "PipelineConfig", "PrefectEventSink", "__version__", "load_promoted_model",
           "promote_run", "train_validate_promote", "validate_checkpoint"]


def load_promoted_model(serving_uri: str) -> Any:
    """The current champion at a serving location (a path or an s3:// URI), checked against its manifest.

    The result answers `predict(DataFrame)` (class labels; `predict_proba` for probabilities) as MLflow's
    pyfunc of the same model does; `.module` is the torch module where there is one, and calling the
    result calls it. Nothing promoted yet, or a champion served as plain files, raises `ServingError`."""
    from podium.training.promoted import load_promoted_model as _load

    return _load(serving_uri)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'podium' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
