"""The built-in validation function: `(checkpoint, **kwargs) -> dict of floats`, as in Ray's docs; per-row
values too when podium asks for them (`per_row`, for `promotion.confidence`)."""

from __future__ import annotations

from typing import Any

import ray.train
import torch
from torch import nn

from podium.core.events import PER_ROW_KEY
from podium.training.checkpoint import load_model
from podium.training.data import iter_arrays
from podium.training.model import evaluate_batches


def validate_checkpoint(
    checkpoint: ray.train.Checkpoint,
    val_data: str,
    label_column: str = "label",
    feature_columns: list[str] | None = None,
    torch_threads: int = 1,
    per_row: bool = False,
) -> dict[str, Any]:
    """Validation loss and accuracy of a podium checkpoint on the Parquet dataset `val_data`.

    The data is streamed in batches (pyarrow's scanner, in this process): memory does not grow with
    the validation set, and no Ray tasks are started from inside this one (which, holding its CPUs
    while waiting for theirs, could deadlock a small cluster).

    `per_row`: also each validation row's loss and correctness under PER_ROW_KEY (podium asks for them when
    a promotion states a confidence)."""
    torch.set_num_threads(torch_threads)
    with checkpoint.as_directory() as d:
        model, meta = load_model(d)
    return evaluate_module(model, val_data, label_column, feature_columns or meta.feature_columns, per_row)


def evaluate_module(module: nn.Module, val_data: str, label_column: str, feature_columns: list[str],
                    per_row: bool = False) -> dict[str, Any]:
    """val_loss and val_accuracy of a module (raw float32 features in, logits out) on a Parquet dataset,
    streamed in batches; also how promotion re-checks a served model (`promotion.verify = "revalidate"`).
    `per_row`: also each row's values, under PER_ROW_KEY."""
    batches = ((torch.from_numpy(x), torch.from_numpy(y)) for x, y in iter_arrays(val_data, label_column, feature_columns))
    m = evaluate_batches(module, batches, per_row)
    out: dict[str, Any] = {"val_loss": m["loss"], "val_accuracy": m["accuracy"]}
    if per_row:
        out[PER_ROW_KEY] = {"val_loss": m["loss_rows"], "val_accuracy": m["accuracy_rows"]}
    return out
