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

Each returns a torch module, so the served model is exported with `torch.export` like podium's own
(`podium.training.export`). The frameworks are imported only when a loader is called.
"""

from __future__ import annotations

import glob
import os
from typing import Any

from torch import nn

from podium.training.sharded import load_sharded

LIGHTNING_CHECKPOINT = "checkpoint.ckpt"  # ray.train.lightning.RayTrainReportCallback.CHECKPOINT_NAME
TRANSFORMERS_CHECKPOINT = "checkpoint"  # ray.train.huggingface.transformers.RayTrainReportCallback.CHECKPOINT_NAME


class LoaderError(ValueError):
    """The checkpoint folder is not what the loader reads, or the class cannot load it."""


def _one_file(checkpoint_dir: str, name: str, pattern: str) -> str:
    """`name` in the folder, else its only file matching `pattern`."""
    path = os.path.join(checkpoint_dir, name)
    if os.path.exists(path):
        return path
    found = sorted(glob.glob(os.path.join(checkpoint_dir, pattern)))
    if len(found) == 1:
        return found[0]
    raise LoaderError(f"{checkpoint_dir}: expected {name} (or one {pattern}), found "
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
