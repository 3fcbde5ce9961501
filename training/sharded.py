"""Sharded checkpoints (`torch.distributed.checkpoint`, DCP) consolidated in one process.

A loop for a model too large for one worker saves its state with `torch.distributed.checkpoint.save`
from every rank: each writes its shard (`__0_0.distcp`, `__1_0.distcp`, ...) and rank 0 the
`.metadata`. Validation and serving run in one process with no process group: DCP's own
`dcp_to_torch_save` gathers the shards into one state dict.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch
from torch import nn

from podium.errors import PodiumError

METADATA_FILE = ".metadata"  # what DCP's FileSystemWriter writes beside the shards
MODEL_KEY = "model"  # the usual top-level key: dcp.save({"model": ..., "optimizer": ...})


class ShardedCheckpointError(PodiumError, ValueError):
    """The folder is not a DCP checkpoint, or its state does not fit the model."""


def is_sharded(checkpoint_dir: str) -> bool:
    """Whether the folder holds a DCP checkpoint."""
    return os.path.exists(os.path.join(checkpoint_dir, METADATA_FILE))


def load_sharded_state(checkpoint_dir: str) -> dict[str, Any]:
    """Every tensor of a DCP checkpoint, gathered from its shards into one state dict (on the CPU)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    if not is_sharded(checkpoint_dir):
        raise ShardedCheckpointError(f"{checkpoint_dir}: expected a torch.distributed.checkpoint folder "
                                     f"({METADATA_FILE} and *.distcp shards), found {sorted(os.listdir(checkpoint_dir))}")
    with tempfile.TemporaryDirectory(prefix="podium-dcp-") as tmp:
        path = os.path.join(tmp, "consolidated.pt")
        dcp_to_torch_save(checkpoint_dir, path)
        return torch.load(path, map_location="cpu", weights_only=True)


def model_state(state: dict[str, Any]) -> dict[str, Any]:
    """The model's part of a consolidated state: under "model" when saved with the optimizer, DDP's
    `module.` prefixes dropped."""
    inner = state.get(MODEL_KEY)
    if isinstance(inner, dict):
        state = inner
    return {k.removeprefix("module."): v for k, v in state.items()}


def load_sharded(checkpoint_dir: str, model_class: type) -> nn.Module:
    """`model_class()` with the consolidated state of the DCP checkpoint in `checkpoint_dir`, in eval mode."""
    model = model_class()
    if not isinstance(model, nn.Module):
        raise ShardedCheckpointError(f"promotion.model_class = {model_class!r}: expected a torch.nn.Module class "
                                     "that takes no arguments")
    try:
        model.load_state_dict(model_state(load_sharded_state(checkpoint_dir)))
    except RuntimeError as exc:
        raise ShardedCheckpointError(f"{checkpoint_dir}: its state does not fit {model_class.__name__}: "
                                     f"{mismatch_text(exc)}") from None
    return model.eval()


def mismatch_text(exc: RuntimeError) -> str:
    """`load_state_dict`'s refusal in one line: its first two reasons (missing or unexpected keys, shape
    mismatches: one per line after torch's heading) and how many more."""
    details = [line.strip().rstrip(".") for line in str(exc).splitlines()[1:] if line.strip()] or [str(exc)]
    more = f" (and {len(details) - 2} more)" if len(details) > 2 else ""
    return f"{'; '.join(details[:2])}{more}"
