"""The built-in model: a small MLP classifier over tabular features."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to rebuild the model's architecture from a checkpoint."""

    in_features: int
    num_classes: int
    hidden_size: int = 64
    kind: str = "mlp"

    def to_dict(self) -> dict:
        """Plain dict for the checkpoint's metadata file."""
        return asdict(self)


def build_model(spec: ModelSpec) -> nn.Module:
    """Build the MLP described by `spec`."""
    if spec.kind != "mlp":
        raise ValueError(f"model kind {spec.kind!r} is not known; expected 'mlp'")
    return nn.Sequential(
        nn.Linear(spec.in_features, spec.hidden_size),
        nn.ReLU(),
        nn.Linear(spec.hidden_size, spec.hidden_size),
        nn.ReLU(),
        nn.Linear(spec.hidden_size, spec.num_classes),
    )


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 4096) -> dict[str, float]:
    """Mean cross-entropy loss and accuracy of `model` on (x, y)."""
    model.eval()
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(x), batch_size):
            logits = model(x[i : i + batch_size])
            target = y[i : i + batch_size]
            loss_sum += nn.functional.cross_entropy(logits, target, reduction="sum").item()
            correct += (logits.argmax(1) == target).sum().item()
    n = max(len(x), 1)
    return {"loss": loss_sum / n, "accuracy": correct / n}
