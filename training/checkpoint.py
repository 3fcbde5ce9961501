"""podium's checkpoint format: tensors in torch files loaded with weights_only=True, metadata in JSON.

A checkpoint directory holds
  model.pt      the model's state_dict
  optimizer.pt  the optimizer's state_dict (to resume)
  podium.json   format, model spec, epoch, step, config, training metrics
Nothing in it is unpickled beyond tensors and plain containers, so a checkpoint
cannot run code when loaded.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from podium.errors import PodiumError
from podium.training.model import ModelSpec, build_model

FORMAT = "podium/1"
MODEL_FILE = "model.pt"
OPTIMIZER_FILE = "optimizer.pt"
META_FILE = "podium.json"


class CheckpointFormatError(PodiumError, ValueError):
    """A checkpoint that is missing files, corrupt, or not in podium's format."""


@dataclass(frozen=True)
class CheckpointMeta:
    """The metadata of a podium checkpoint."""

    model: ModelSpec
    epoch: int
    step: int
    metrics: dict[str, float]
    config: dict[str, Any]
    feature_columns: list[str]
    label_column: str


def save_checkpoint(
    directory: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    meta: CheckpointMeta,
) -> None:
    """Write model, optimizer and metadata into `directory`."""
    os.makedirs(directory, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(directory, MODEL_FILE))
    if optimizer is not None:
        torch.save(optimizer.state_dict(), os.path.join(directory, OPTIMIZER_FILE))
    doc = {
        "format": FORMAT,
        "model": meta.model.to_dict(),
        "epoch": meta.epoch,
        "step": meta.step,
        "metrics": {k: float(v) for k, v in meta.metrics.items()},
        "config": meta.config,
        "feature_columns": meta.feature_columns,
        "label_column": meta.label_column,
    }
    with open(os.path.join(directory, META_FILE), "w") as f:
        json.dump(doc, f, indent=2, allow_nan=True)


def read_meta(directory: str) -> CheckpointMeta:
    """Read and check podium.json."""
    path = os.path.join(directory, META_FILE)
    if not os.path.exists(path):
        raise CheckpointFormatError(f"{directory!r} is not a podium checkpoint: {META_FILE} is missing")
    try:
        with open(path) as f:
            doc = json.load(f)
        if not isinstance(doc, dict):
            raise CheckpointFormatError(f"{path!r} is corrupt: expected a JSON object, got {type(doc).__name__}")
        if doc.get("format") != FORMAT:
            raise CheckpointFormatError(f"{path!r}: format {doc.get('format')!r}, expected {FORMAT!r}")
        return CheckpointMeta(
            model=ModelSpec(**doc["model"]),
            epoch=int(doc["epoch"]),
            step=int(doc["step"]),
            metrics={k: float(v) for k, v in doc.get("metrics", {}).items()},
            config=dict(doc.get("config", {})),
            feature_columns=list(doc["feature_columns"]),
            label_column=str(doc["label_column"]),
        )
    except CheckpointFormatError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointFormatError(f"{path!r} is corrupt: {exc}") from None


def _load_tensors(path: str) -> dict:
    if not os.path.exists(path):
        raise CheckpointFormatError(f"checkpoint file {path!r} is missing")
    try:
        # weights_only=True: tensors and plain containers only; a pickle that
        # would run code is refused instead of executed.
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError... for bad files
        raise CheckpointFormatError(f"checkpoint file {path!r} cannot be loaded safely: {exc}") from None


def load_model(directory: str) -> tuple[nn.Module, CheckpointMeta]:
    """Rebuild the model from a podium checkpoint directory, in eval mode."""
    meta = read_meta(directory)
    try:
        model = build_model(meta.model)
    except ValueError as exc:
        raise CheckpointFormatError(f"{directory!r}: {exc}") from None
    try:
        model.load_state_dict(_load_tensors(os.path.join(directory, MODEL_FILE)))
    except RuntimeError as exc:
        raise CheckpointFormatError(f"{directory!r}: weights do not match the model spec: {exc}") from None
    model.eval()
    return model, meta


def load_training_state(
    directory: str, model: nn.Module, optimizer: torch.optim.Optimizer
) -> CheckpointMeta:
    """Restore model and optimizer in place to resume training; returns the metadata."""
    meta = read_meta(directory)
    model.load_state_dict(_load_tensors(os.path.join(directory, MODEL_FILE)))
    opt_path = os.path.join(directory, OPTIMIZER_FILE)
    if os.path.exists(opt_path):
        optimizer.load_state_dict(_load_tensors(opt_path))
    return meta
