"""Feature standardisation statistics of the training data, computed in one pass over record batches.

The built-in loop standardises every feature with the training data's mean and standard deviation
(`podium.training.model.Standardize`). The statistics are computed once per training run, before the
workers start, and travel to them in the loop config; the model keeps them as buffers, so the
checkpoint, the validation and the serving artifact all apply the same numbers.

Only numpy and pyarrow here (the task that computes them does not load torch). The statistics come
from `podium.training.stats`, the one place they are computed: one streaming pass, a Ray Data job
where the data is large, saved with the run (`podium.tasks.train.load_or_compute_stats`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow.dataset as pads

from podium.training.data import BATCH_ROWS
from podium.training.stats import scan_stats


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


def compute_feature_stats(dataset: pads.Dataset, columns: list[str], batch_rows: int = BATCH_ROWS) -> FeatureStats:
    """Mean and scale of each feature column of `dataset`, reading `batch_rows` rows at a time (the
    in-process pass of `podium.training.stats`, where the arithmetic lives)."""
    return FeatureStats.from_dict(scan_stats(dataset, columns, batch_rows).to_dict())
