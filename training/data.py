"""Parquet data read with pyarrow: schema checks, synthetic data, tensors for a worker's shard."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from podium.storage.locations import arrow_filesystem, fsspec_filesystem, is_remote, join
from podium.storage.preflight import check_location


class DataSchemaError(ValueError):
    """A dataset that does not fit what podium expects (missing or mistyped columns)."""


@dataclass(frozen=True)
class DatasetInfo:
    """What the trainer needs to know about a dataset before it starts."""

    uri: str
    num_rows: int
    feature_columns: list[str]
    label_column: str
    num_classes: int


def open_dataset(uri: str) -> pads.Dataset:
    """Open a Parquet file or directory of Parquet files at a path or URI."""
    fs, path = arrow_filesystem(uri)
    try:
        return pads.dataset(path, filesystem=fs, format="parquet")
    except FileNotFoundError:
        raise FileNotFoundError(f"dataset {uri!r} does not exist") from None
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataSchemaError(f"dataset {uri!r} cannot be read as Parquet: {exc}") from None


def inspect_dataset(uri: str, label_column: str, feature_columns: list[str] | None) -> DatasetInfo:
    """Check the schema (label integer, features numeric) and count classes; raise naming the column.

    The location is checked first (one quick request on S3), so an unreachable
    endpoint, rejected credentials or a missing bucket raise StorageError at once.
    """
    check_location(uri, write=False)
    ds = open_dataset(uri)
    schema = ds.schema
    names = schema.names
    if label_column not in names:
        raise DataSchemaError(
            f"dataset {uri!r} has no label column {label_column!r}; its columns are {names}"
        )
    if not pa.types.is_integer(schema.field(label_column).type):
        raise DataSchemaError(
            f"dataset {uri!r}: label column {label_column!r} has type {schema.field(label_column).type}, "
            "expected an integer type (class index 0..K-1)"
        )
    features = feature_columns if feature_columns else [n for n in names if n != label_column]
    if not features:
        raise DataSchemaError(f"dataset {uri!r} has no feature columns besides the label {label_column!r}")
    for col in features:
        if col not in names:
            raise DataSchemaError(f"dataset {uri!r} has no feature column {col!r}; its columns are {names}")
        t = schema.field(col).type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
            raise DataSchemaError(
                f"dataset {uri!r}: feature column {col!r} has type {t}, expected a numeric type"
            )
    labels = ds.to_table(columns=[label_column]).column(label_column)
    if labels.null_count:
        raise DataSchemaError(f"dataset {uri!r}: label column {label_column!r} has {labels.null_count} nulls")
    if len(labels) == 0:
        raise DataSchemaError(f"dataset {uri!r} is empty")
    lo = pa.compute.min(labels).as_py()
    hi = pa.compute.max(labels).as_py()
    if lo < 0:
        raise DataSchemaError(f"dataset {uri!r}: label column {label_column!r} has negative value {lo}")
    return DatasetInfo(uri=uri, num_rows=len(labels), feature_columns=features,
                       label_column=label_column, num_classes=int(hi) + 1)


def load_arrays(
    uri: str, label_column: str, feature_columns: list[str], rank: int = 0, world_size: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Features (float32, rows x features) and labels (int64) of this worker's shard (every world_size-th row)."""
    table = open_dataset(uri).to_table(columns=[*feature_columns, label_column])
    x = np.column_stack([table.column(c).to_numpy(zero_copy_only=False) for c in feature_columns])
    y = table.column(label_column).to_numpy(zero_copy_only=False)
    x = x.astype(np.float32, copy=False)[rank::world_size]
    y = y.astype(np.int64, copy=False)[rank::world_size]
    return x, y


def make_classification_data(
    out_dir: str,
    *,
    train_rows: int = 24000,
    val_rows: int = 6000,
    num_features: int = 16,
    num_classes: int = 4,
    seed: int = 0,
    label_column: str = "label",
) -> tuple[str, str]:
    """Write a deterministic synthetic classification dataset as train.parquet and val.parquet.

    Classes are Gaussian blobs around random centers, partly overlapping so that
    accuracy improves over epochs without reaching 100% at once.
    """
    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, 1.5, size=(num_classes, num_features))

    def sample(n: int) -> pa.Table:
        y = rng.integers(0, num_classes, size=n)
        x = centers[y] + rng.normal(0.0, 2.0, size=(n, num_features))
        cols = {f"f{i:02d}": pa.array(x[:, i].astype(np.float32)) for i in range(num_features)}
        cols[label_column] = pa.array(y.astype(np.int64))
        return pa.table(cols)

    fs, base = fsspec_filesystem(out_dir)
    if not is_remote(out_dir):  # on an object store there are no folders (and no bucket is created)
        fs.makedirs(base, exist_ok=True)
    paths = []
    for name, n in (("train", train_rows), ("val", val_rows)):
        uri = join(out_dir, f"{name}.parquet")
        _, path = fsspec_filesystem(uri)
        with fs.open(path, "wb") as f:
            pq.write_table(sample(n), f)
        paths.append(uri)
    return paths[0], paths[1]
