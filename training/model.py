"""The built-in model: a small MLP classifier over tabular features."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to rebuild the model's architecture from a checkpoint."""

    in_features: int
    num_classes: int
    hidden_size: int = 64
    kind: str = "mlp"
    # a Standardize layer first (mean/scale buffers); False for checkpoints written before it existed
    standardize: bool = False

    def to_dict(self) -> dict:
        """Plain dict for the checkpoint's metadata file."""
        return asdict(self)


class Standardize(nn.Module):
    """(x - mean) / scale per feature, with the training data's statistics kept as buffers.

    Buffers, not parameters: they are saved in the state dict (so a checkpoint carries them and
    a resumed run, the validation and the exported serving graph use the same numbers), and the
    optimizer never touches them."""

    mean: torch.Tensor
    scale: torch.Tensor

    def __init__(self, in_features: int, mean: list[float] | None = None, scale: list[float] | None = None):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean if mean is not None else [0.0] * in_features,
                                                  dtype=torch.float32))
        self.register_buffer("scale", torch.tensor(scale if scale is not None else [1.0] * in_features,
                                                   dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Standardised features."""
        return (x - self.mean) / self.scale


def build_model(spec: ModelSpec, mean: list[float] | None = None, scale: list[float] | None = None) -> nn.Module:
    """Build the MLP described by `spec`; with `spec.standardize`, its first layer standardises the
    features with `mean` and `scale` (left at 0 and 1 when the weights are loaded from a checkpoint)."""
    if spec.kind != "mlp":
        raise ValueError(f"model kind {spec.kind!r} is not known; expected 'mlp'")
    scaler = [Standardize(spec.in_features, mean, scale)] if spec.standardize else []
    return nn.Sequential(
        *scaler,
        nn.Linear(spec.in_features, spec.hidden_size),
        nn.ReLU(),
        nn.Linear(spec.hidden_size, spec.hidden_size),
        nn.ReLU(),
        nn.Linear(spec.hidden_size, spec.num_classes),
    )


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 4096) -> dict[str, float]:
    """Mean cross-entropy loss and accuracy of `model` on (x, y)."""
    return evaluate_batches(model, ((x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, len(x), batch_size)))


def evaluate_batches(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                     per_row: bool = False) -> dict[str, Any]:
    """Mean cross-entropy loss and accuracy of `model` over (x, y) batches, one batch in memory at a time.

    `per_row`: also each row's loss and correctness (1.0 or 0.0), in the batches' order, as NumPy arrays
    under "loss_rows" and "accuracy_rows" (their means are the two numbers)."""
    try:
        model.eval()
    except NotImplementedError:  # a torch.export program (a served model) has no train mode to leave
        pass
    loss_sum, correct, n = 0.0, 0, 0
    losses: list[torch.Tensor] = []
    hits: list[torch.Tensor] = []
    with torch.no_grad():
        for x, target in batches:
            logits = model(x)
            row_loss = nn.functional.cross_entropy(logits, target, reduction="none")
            row_hit = logits.argmax(1) == target
            loss_sum += row_loss.sum().item()
            correct += int(row_hit.sum().item())
            n += len(target)
            if per_row:
                losses.append(row_loss.double())
                hits.append(row_hit.double())
    n = max(n, 1)
    out: dict[str, Any] = {"loss": loss_sum / n, "accuracy": correct / n}
    if per_row:
        out["loss_rows"] = torch.cat(losses).numpy() if losses else torch.zeros(0, dtype=torch.float64).numpy()
        out["accuracy_rows"] = torch.cat(hits).numpy() if hits else torch.zeros(0, dtype=torch.float64).numpy()
    return out
