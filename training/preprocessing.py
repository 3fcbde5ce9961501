"""Feature standardisation statistics of the training data, computed in one pass over record batches.

The built-in loop standardises every feature with the training data's mean and standard deviation
(`podium.training.model.Standardize`). The statistics are computed once per training run, before the
workers start, and travel to them in the loop config; the model keeps them as buffers, so the
checkpoint, the validation and the serving artifact all apply the same numbers.

Only numpy and pyarrow here (the task that computes them does not load torch). The pass reads one
batch at a time, never the whole table: `compute_feature_stats` is the one function to replace with a
distributed pass (Ray Data) where the data is too large for one process to read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.dataset as pads

BATCH_ROWS = 65536


@dataclass(frozen=True)
class FeatureStats:
    """Per-feature mean and scale (population standard deviation; 1 where a feature is constant)."""

    columns: list[str]
    mean: list[float]
    scale: list[float]
    count: int

    def to_dict(self) -> dict[str, Any]:
        """Plain values for the loop config (a Ray boundary) and the checkpoint's metadata."""
        return {"columns": list(self.columns), "mean": list(self.mean), "scale": list(self.scale),
                "count": self.count}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> FeatureStats:
        """The inverse of `to_dict`."""
        return cls(columns=list(doc["columns"]), mean=[float(v) for v in doc["mean"]],
                   scale=[float(v) for v in doc["scale"]], count=int(doc["count"]))


def _merge(n: np.ndarray, mean: np.ndarray, m2: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, ...]:
    """Fold one batch into running count/mean/M2 per column (Chan et al.'s parallel update).

    Sums of squares about the batch mean, never about zero: values in the thousands with a spread
    of a few units keep their precision. NaN values are left out of their column's statistics."""
    ok = ~np.isnan(x)
    nb = ok.sum(axis=0).astype(np.float64)
    mb = np.where(ok, x, 0.0).sum(axis=0) / np.maximum(nb, 1.0)
    m2b = (np.where(ok, x - mb, 0.0) ** 2).sum(axis=0)
    total = n + nb
    share = np.divide(nb, total, out=np.zeros_like(total), where=total > 0)
    delta = mb - mean
    mean = mean + delta * share
    m2 = m2 + m2b + delta**2 * n * share
    return total, mean, m2


def compute_feature_stats(dataset: pads.Dataset, columns: list[str], batch_rows: int = BATCH_ROWS) -> FeatureStats:
    """Mean and scale of each feature column of `dataset`, reading `batch_rows` rows at a time."""
    k = len(columns)
    n, mean, m2 = np.zeros(k), np.zeros(k), np.zeros(k)
    for batch in dataset.to_batches(columns=columns, batch_size=batch_rows):
        if batch.num_rows == 0:
            continue
        x = np.column_stack([batch.column(c).to_numpy(zero_copy_only=False).astype(np.float64)
                             for c in columns])
        n, mean, m2 = _merge(n, mean, m2, x)
    std = np.sqrt(m2 / np.maximum(n, 1.0))
    # a constant (or empty) column carries no information to scale: leave it as it is, centred
    scale = np.where(std > 0, std, 1.0)
    return FeatureStats(columns=list(columns), mean=mean.tolist(), scale=scale.tolist(), count=int(n.max(initial=0)))
