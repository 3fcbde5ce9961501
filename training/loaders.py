"""Model loaders shipped with podium: a framework's checkpoint folder to the module podium serves.

Name one as `promotion.model_loader` (`--model-loader`), with the model's class as
`promotion.model_class` (`--model-class`) where the loader needs it:

- `podium.training.loaders:lightning`: the `checkpoint.ckpt` that Ray's Lightning
  `RayTrainReportCallback` writes, loaded with `model_class.load_from_checkpoint` (a LightningModule
  whose `forward` takes the float32 features and returns logits).
- `podium.training.loaders:transformers`: the `checkpoint/` folder that Ray's Transformers
  `RayTrainReportCallback` writes (`save_pretrained`), loaded with `model_class.from_pretrained`
  (default `transformers.AutoModelForSequenceClassification`); the features go in as the model's
  main input (token ids for a text model) and its `logits` come out.
- `podium.training.loaders:sharded`: a `torch.distributed.checkpoint` (DCP) sharded state dict,
  consolidated in one process into `model_class()`.
- `podium.training.loaders:state_dict`: a loop of your own that saves its module's `state_dict()` with
  `torch.save` (as Ray's guides do): `model_class()` with that state dict. It reads `model.pt`
  (`STATE_DICT_FILE`), else the checkpoint's only `.pt` / `.pth` file; the file holds the state dict
  itself or a dict with it under `model_state_dict`, `state_dict` or `model` (an optimizer's state beside
  it is ignored), DDP's `module.` prefixes dropped. It is the loader podium uses when
  `promotion.model_class` is named without a `promotion.model_loader` (`DEFAULT_CLASS_LOADER`).

Each returns a torch module, so the served model is exported with `torch.export` like podium's own
(`podium.training.export`). The frameworks are imported only when a loader is called.
"""

from __future__ import annotations

import glob
import os
from typing import Any

import torch
from torch import nn

from podium.errors import PodiumError
from podium.training.sharded import load_sharded, mismatch_text

LIGHTNING_CHECKPOINT = "checkpoint.ckpt"  # ray.train.lightning.RayTrainReportCallback.CHECKPOINT_NAME
TRANSFORMERS_CHECKPOINT = "checkpoint"  # ray.train.huggingface.transformers.RayTrainReportCallback.CHECKPOINT_NAME
STATE_DICT_FILE = "model.pt"  # the name Ray's PyTorch guides save the state dict under
STATE_DICT_KEYS = ("model_state_dict", "state_dict", "model")  # where a saved dict of several things holds it
DEFAULT_CLASS_LOADER = "podium.training.loaders:state_dict"  # for promotion.model_class without a model_loader


class LoaderError(PodiumError, ValueError):
    """The checkpoint folder is not what the loader reads, or the class cannot load it."""


def _one_file(checkpoint_dir: str, name: str, *patterns: str) -> str:
    """`name` in the folder, else its only file matching one of `patterns`."""
    path = os.path.join(checkpoint_dir, name)
    if os.path.exists(path):
        return path
    found = sorted({f for pattern in patterns for f in glob.glob(os.path.join(checkpoint_dir, pattern))})
    if len(found) == 1:
        return found[0]
    raise LoaderError(f"{checkpoint_dir}: expected {name} (or one {' or '.join(patterns)}), found "
                      f"{sorted(os.listdir(checkpoint_dir)) if os.path.isdir(checkpoint_dir) else 'no folder'}")


def lightning(checkpoint_dir: str, model_class: type) -> nn.Module:
    """A LightningModule from the checkpoint Ray's Lightning callback wrote (`checkpoint.ckpt`), on the CPU."""
    from lightning.pytorch import LightningModule

    if not (isinstance(model_class, type) and issubclass(model_class, LightningModule)):
        raise LoaderError(f"promotion.model_class = {model_class!r}: expected a lightning.pytorch.LightningModule "
                          "subclass")
    path = _one_file(checkpoint_dir, LIGHTNING_CHECKPOINT, "*.ckpt")
    module = model_class.load_from_checkpoint(path, map_location="cpu")
    return module.eval()


class LogitsOf(nn.Module):
    """A Transformers model as podium serves a module: the features in as its main input, its logits out."""

    def __init__(self, model: Any):
        super().__init__()
        self.model = model
        self.input_name = getattr(model, "main_input_name", "input_ids")

    def forward(self, features: Any) -> Any:
        """Token ids (a text model) are whole numbers carried as float32 features: cast back to int64."""
        x = features.long() if self.input_name == "input_ids" else features
        return self.model(**{self.input_name: x}).logits


def transformers(checkpoint_dir: str, model_class: type | None = None) -> nn.Module:
    """A Transformers model from the `checkpoint/` folder Ray's Transformers callback wrote, on the CPU."""
    if model_class is None:
        from transformers import AutoModelForSequenceClassification

        model_class = AutoModelForSequenceClassification
    folder = os.path.join(checkpoint_dir, TRANSFORMERS_CHECKPOINT)
    if not os.path.isdir(folder):
        folder = checkpoint_dir
    if not os.path.exists(os.path.join(folder, "config.json")):
        raise LoaderError(f"{checkpoint_dir}: expected a Transformers checkpoint (config.json, in "
                          f"{TRANSFORMERS_CHECKPOINT}/ or the folder itself)")
    model = model_class.from_pretrained(folder)  # type: ignore[attr-defined]
    return LogitsOf(model.eval()).eval()


def sharded(checkpoint_dir: str, model_class: type) -> nn.Module:
    """`model_class()` with the state dict of a DCP sharded checkpoint, consolidated in this process."""

    return load_sharded(checkpoint_dir, model_class)


def build_model_class(model_class: type, field: str = "promotion.model_class") -> nn.Module:
    """`model_class()`, a torch module; a LoaderError naming the class when it cannot be built with no
    arguments or is not a torch.nn.Module."""
    name = getattr(model_class, "__qualname__", repr(model_class))
    try:
        model = model_class()
    except Exception as exc:  # the user's constructor: any error it raises says why it cannot be built
        raise LoaderError(f"{field} = {name}: cannot be built with no arguments ({type(exc).__name__}: {exc}); "
                          "podium builds the class with no arguments and loads the checkpoint's state dict into it: "
                          "give its arguments defaults, or name a promotion.model_loader of your own") from None
    if not isinstance(model, nn.Module):
        raise LoaderError(f"{field} = {name}: {name}() is a {type(model).__name__}, expected a torch.nn.Module")
    return model


def _state_dict_in(saved: Any, path: str) -> dict[str, Any]:
    """The module's state dict in what `torch.load` read: the dict itself, or under one of STATE_DICT_KEYS."""
    if isinstance(saved, dict):
        for key in STATE_DICT_KEYS:
            if isinstance(saved.get(key), dict):
                saved = saved[key]
                break
    if not isinstance(saved, dict) or not all(isinstance(k, str) for k in saved):
        raise LoaderError(f"{path}: expected a state dict (torch.save(model.state_dict(), ...)) or a dict holding one "
                          f"under {' / '.join(STATE_DICT_KEYS)}, found a {type(saved).__name__}")
    return {k.removeprefix("module."): v for k, v in saved.items()}


def state_dict(checkpoint_dir: str, model_class: type) -> nn.Module:
    """`model_class()` with the state dict a loop of one's own saved with `torch.save` (see the module's
    docstring for the file it reads), on the CPU, in eval mode."""
    model = build_model_class(model_class)
    path = _one_file(checkpoint_dir, STATE_DICT_FILE, "*.pt", "*.pth")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # not a file torch.save wrote, or one that needs pickled code (weights only)
        raise LoaderError(f"{path}: not a state dict torch.load reads with weights_only=True "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
    try:
        model.load_state_dict(_state_dict_in(saved, path))
    except RuntimeError as exc:
        raise LoaderError(f"{path}: its state dict does not fit promotion.model_class {model_class.__qualname__}: "
                          f"{mismatch_text(exc)}") from None
    return model.eval()
