"""The built-in validation function: `(checkpoint, **kwargs) -> dict of floats`, as in Ray's docs."""

from __future__ import annotations

import ray.train
import torch
from torch import nn

from podium.training.checkpoint import load_model
from podium.training.data import iter_arrays
from podium.training.model import evaluate_batches


def validate_checkpoint(
    checkpoint: ray.train.Checkpoint,
    val_data: str,
    label_column: str = "label",
    feature_columns: list[str] | None = None,
    torch_threads: int = 1,
) -> dict[str, float]:
    """Validation loss and accuracy of a podium checkpoint on the Parquet dataset `val_data`.

    The data is streamed in batches (pyarrow's scanner, in this process): memory does not grow with
    the validation set, and no Ray tasks are started from inside this one (which, holding its CPUs
    while waiting for theirs, could deadlock a small cluster)."""
    torch.set_num_threads(torch_threads)
    with checkpoint.as_directory() as d:
        model, meta = load_model(d)
    return evaluate_module(model, val_data, label_column, feature_columns or meta.feature_columns)


def evaluate_module(module: nn.Module, val_data: str, label_column: str, feature_columns: list[str]) -> dict[str, float]:
    """val_loss and val_accuracy of a module (raw float32 features in, logits out) on a Parquet dataset,
    streamed in batches; also how promotion re-checks a served model (`promotion.verify = "revalidate"`)."""
    batches = ((torch.from_numpy(x), torch.from_numpy(y)) for x, y in iter_arrays(val_data, label_column, feature_columns))
    m = evaluate_batches(module, batches)
    return {"val_loss": m["loss"], "val_accuracy": m["accuracy"]}
