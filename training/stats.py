"""Statistics of the training data, in one streaming pass: row count and, per feature, mean, standard
deviation (and the scale standardisation divides by), min and max.

Each block of rows is reduced to a few numbers per feature (`partial_stats`), and those are merged
(`merge_stats`, Chan et al.'s parallel update of mean and sum of squared deviations, in float64).
Nothing holds the table. Data up to `IN_PROCESS_BYTES` is read here, one batch at a time; larger data
is a Ray Data job whose read tasks each reduce what they read, in parallel where the cluster has
CPUs for it (`scaling.data_cpus`). The job costs a few seconds of start-up whatever the size: on the
demo data it was most of the pass. podium runs the pass once per run and saves the result with the run
(`podium.tasks.train.load_or_compute_stats`); it is the one place such statistics are computed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads

from podium.storage.locations import fsspec_filesystem
from podium.training.data import BATCH_ROWS, open_dataset
from podium.training.ingest import podium_data_context, read_cpus, read_parquet_dataset

PARTS = ("count", "mean", "m2", "min", "max")
IN_PROCESS_BYTES = 256 << 20  # Parquet bytes below which one process reads it faster than a Ray Data job starts


@dataclass(frozen=True)
class DataStats:
    """Row count, and per feature (in `columns` order) the count of non-null values, mean, population
    standard deviation, min and max. A column with no values has mean and std 0, min and max NaN."""

    rows: int
    columns: list[str]
    counts: list[int]
    mean: list[float]
    std: list[float]
    min: list[float]
    max: list[float]

    @property
    def scale(self) -> list[float]:
        """What standardisation divides by: the standard deviation, or 1 for a constant (or empty) column."""
        return [s if s > 0 else 1.0 for s in self.std]

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON), as saved with the run and in the loop config under `feature_stats` (so in
        each checkpoint's metadata). It also carries `scale` and `count` (values in the fullest column)."""
        return {**asdict(self), "scale": self.scale, "count": max(self.counts, default=0)}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> DataStats:
        """The inverse of `to_dict`."""
        return cls(rows=int(doc["rows"]), columns=list(doc["columns"]), counts=[int(c) for c in doc["counts"]],
                   **{k: [float(v) for v in doc[k]] for k in ("mean", "std", "min", "max")})


def partial_stats(batch: pa.Table | pa.RecordBatch, columns: list[str]) -> dict[str, np.ndarray]:
    """Per-column count, mean, sum of squared deviations, min and max of one batch (nulls and NaNs left out)."""
    out = {k: np.zeros(len(columns)) for k in PARTS}
    out["min"][:], out["max"][:] = np.inf, -np.inf
    for i, name in enumerate(columns):
        values = batch.column(name).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
        values = values[~np.isnan(values)]
        if len(values):
            mean = values.mean()
            out["count"][i], out["mean"][i] = len(values), mean
            out["m2"][i] = float(((values - mean) ** 2).sum())
            out["min"][i], out["max"][i] = values.min(), values.max()
    return out


def merge_stats(parts: Iterable[dict[str, np.ndarray]], columns: list[str], rows: int) -> DataStats:
    """Combine partial statistics (Chan et al.: exact for count, mean and M2, whatever the split)."""
    n, mean, m2 = np.zeros(len(columns)), np.zeros(len(columns)), np.zeros(len(columns))
    lo, hi = np.full(len(columns), np.inf), np.full(len(columns), -np.inf)
    for p in parts:
        nb = p["count"]
        total = n + nb
        with np.errstate(invalid="ignore", divide="ignore"):
            delta = p["mean"] - mean
            mean = np.where(total > 0, mean + delta * nb / total, 0.0)
            m2 = np.where(total > 0, m2 + p["m2"] + delta**2 * n * nb / total, 0.0)
        n, lo, hi = total, np.minimum(lo, p["min"]), np.maximum(hi, p["max"])
    std = np.sqrt(m2 / np.maximum(n, 1.0))
    lo, hi = np.where(n > 0, lo, np.nan), np.where(n > 0, hi, np.nan)  # no values: no range

    def listed(a: np.ndarray) -> list[float]:
        return [float(v) for v in a]

    return DataStats(rows=rows, columns=list(columns), counts=[int(c) for c in n], mean=listed(mean),
                     std=listed(std), min=listed(lo), max=listed(hi))


def scan_stats(dataset: pads.Dataset, columns: list[str], batch_rows: int = BATCH_ROWS) -> DataStats:
    """The pass in this process: `batch_rows` rows at a time, one batch read ahead."""
    parts, rows = [], 0
    for batch in dataset.to_batches(columns=columns, batch_size=batch_rows, batch_readahead=1, fragment_readahead=1):
        rows += batch.num_rows
        parts.append(partial_stats(batch, columns))
    return merge_stats(parts, columns, rows)


def _partials_of_block(batch: pa.Table, columns: list[str]) -> dict[str, np.ndarray]:
    part = partial_stats(batch, columns)
    # one output row per block: each statistic a [1, F] array (a tensor column), plus the block's rows
    return {**{k: v[None, :] for k, v in part.items()}, "rows": np.array([batch.num_rows])}


def compute_data_stats(uri: str, columns: list[str], *, data_cpus: float = 1.0,
                       in_process_bytes: int = IN_PROCESS_BYTES) -> DataStats:
    """One streaming pass over the Parquet data at `uri`: the statistics of `columns`.

    Up to `in_process_bytes` of Parquet, this process reads it one batch at a time; beyond, a Ray
    Data job with at most `data_cpus` CPUs, each read task reducing what it read."""
    if _stored_bytes(uri) <= in_process_bytes:
        return scan_stats(open_dataset(uri), columns)
    cpus = read_cpus(data_cpus)
    with podium_data_context(data_cpus):
        ds = read_parquet_dataset(uri, columns, read_cpus=cpus).map_batches(
            lambda block: _partials_of_block(block, columns), batch_format="pyarrow", batch_size=None, num_cpus=cpus)
        parts, rows = [], 0
        for batch in ds.iter_batches(batch_format="numpy", batch_size=None):
            rows += int(batch["rows"].sum())
            parts += [{k: batch[k][i] for k in PARTS} for i in range(len(batch["rows"]))]
    return merge_stats(parts, columns, rows)


def _stored_bytes(uri: str) -> int:
    """Bytes under a path or URI (one recursive listing)."""
    fs, path = fsspec_filesystem(uri)
    return int(fs.du(path, total=True))


__all__ = ["DataStats", "partial_stats", "merge_stats", "scan_stats", "compute_data_stats"]
