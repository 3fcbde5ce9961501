"""Parquet data read with pyarrow: schema checks from the footers, batches for validation, synthetic data."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from podium.errors import PodiumError
from podium.storage.locations import arrow_filesystem, fsspec_filesystem, is_remote, join
from podium.storage.preflight import check_location

T = TypeVar("T")


class DataSchemaError(PodiumError, ValueError):
    """A dataset that does not fit what podium expects (missing or mistyped columns)."""


@dataclass(frozen=True)
class DatasetInfo:
    """What the trainer needs to know about a dataset before it starts.

    `row_groups_read` counts the row groups whose label column had to be read because their Parquet
    statistics did not answer (every other fact comes from the files' footers)."""

    uri: str
    num_rows: int
    feature_columns: list[str]
    label_column: str
    num_classes: int
    label_min: int = 0
    label_max: int = 0
    types: dict[str, str] = field(default_factory=dict)  # feature column -> "integer", "floating" or "boolean"
    non_finite: dict[str, int] = field(default_factory=dict)  # feature column -> NaN, infinite or null values
    files: int = 1
    row_groups_read: int = 0


@dataclass
class _LabelSummary:
    rows: int = 0
    nulls: int = 0
    low: int | None = None
    high: int | None = None
    row_groups_read: int = 0

    def add(self, rows: int, nulls: int, low: Any, high: Any) -> None:
        self.rows += rows
        self.nulls += nulls
        if low is not None:
            self.low = int(low) if self.low is None else min(self.low, int(low))
            self.high = int(high) if self.high is None else max(self.high, int(high))


def type_kind(t: pa.DataType) -> str | None:
    """What a feature's arrow type is as a number ("integer", "floating", "boolean"), or None if it is not one."""
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_floating(t):
        return "floating"
    return "boolean" if pa.types.is_boolean(t) else None


def _nulls_from_statistics(ds: pads.Dataset, columns: list[str]) -> dict[str, int] | None:
    """Null counts of `columns` from the Parquet footers alone, or None where a row group has no statistics."""
    counts = dict.fromkeys(columns, 0)
    for fragment in ds.get_fragments():
        meta = fragment.metadata  # type: ignore[attr-defined]  # a Parquet fragment: the footer, read once
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for c in range(group.num_columns):
                chunk = group.column(c)
                if chunk.path_in_schema in counts:
                    stats = chunk.statistics
                    if stats is None or not stats.has_null_count:
                        return None
                    counts[chunk.path_in_schema] += stats.null_count
    return counts


def count_non_finite(ds: pads.Dataset, types: dict[str, str]) -> dict[str, int]:
    """Feature column -> how many values are NaN, infinite or null (load_arrays reads a null as NaN); only
    columns that have some.

    Integer and boolean columns can only hold nulls: counted from the Parquet statistics where every row
    group has them, without reading the data. Float columns are scanned once, in batches: Parquet
    statistics leave NaN out of min/max and keep no NaN count, so they cannot show one NaN."""
    exact = [c for c, kind in types.items() if kind != "floating"]
    from_stats = _nulls_from_statistics(ds, exact) if exact else {}
    scan = [c for c, kind in types.items() if kind == "floating" or from_stats is None]
    counts = dict(from_stats or {})
    for batch in ds.to_batches(columns=scan, batch_readahead=1, fragment_readahead=1) if scan else []:
        for c in scan:
            values = batch.column(c)
            bad = values.null_count
            if types[c] == "floating":
                bad += pc.sum(pc.invert(pc.is_finite(values))).as_py() or 0
            counts[c] = counts.get(c, 0) + bad
    return {c: n for c, n in counts.items() if n}


def open_dataset(uri: str) -> pads.Dataset:
    """Open a Parquet file or directory of Parquet files at a path or URI."""
    fs, path = arrow_filesystem(uri)
    try:
        return pads.dataset(path, filesystem=fs, format="parquet")
    except FileNotFoundError:
        raise FileNotFoundError(f"dataset {uri!r} does not exist") from None
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataSchemaError(f"dataset {uri!r} cannot be read as Parquet: {exc}") from None


def _label_summary(fragment: pads.ParquetFileFragment, label_column: str) -> _LabelSummary:
    """Rows, nulls, min and max of the label in one file: from its footer's row-group statistics, and
    from the label column itself only in row groups whose statistics are missing or incomplete."""
    out = _LabelSummary()
    metadata = fragment.metadata  # the footer: one ranged read
    paths = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
    if label_column not in paths:
        raise DataSchemaError(f"file {fragment.path!r} has no label column {label_column!r}")
    col = paths.index(label_column)
    for i in range(metadata.num_row_groups):
        group = metadata.row_group(i)
        if group.num_rows == 0:
            continue
        stats = group.column(col).statistics
        if stats is not None and stats.has_null_count and (stats.has_min_max or stats.null_count == group.num_rows):
            out.add(group.num_rows, stats.null_count, stats.min if stats.has_min_max else None,
                    stats.max if stats.has_min_max else None)
            continue
        labels = fragment.subset(row_group_ids=[i]).to_table(columns=[label_column]).column(label_column)
        out.row_groups_read += 1
        out.add(len(labels), labels.null_count, pc.min(labels).as_py(), pc.max(labels).as_py())
    return out


def _check_columns(uri: str, schema: pa.Schema, label_column: str,
                   feature_columns: list[str] | None) -> tuple[list[str], dict[str, str]]:
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
    types = {}
    for col in features:
        if col not in names:
            raise DataSchemaError(f"dataset {uri!r} has no feature column {col!r}; its columns are {names}")
        t = schema.field(col).type
        kind = type_kind(t)
        if kind is None:
            raise DataSchemaError(
                f"dataset {uri!r}: feature column {col!r} has type {t}, expected a numeric type"
            )
        types[col] = kind
    return features, types


FOOTER_READERS = 8  # footers read at once: on S3 each is a round trip


def map_fragments(fn: Callable[[pads.ParquetFileFragment], T], fragments: list[Any]) -> list[T]:
    """`fn` over each file of a dataset, FOOTER_READERS files at a time (each reads its footer: on S3, a round trip)."""
    with ThreadPoolExecutor(max_workers=max(1, min(FOOTER_READERS, len(fragments)))) as pool:
        return list(pool.map(fn, fragments))


def inspect_dataset(uri: str, label_column: str, feature_columns: list[str] | None) -> DatasetInfo:
    """Check the schema (label integer, features numeric), count rows and classes; raise naming the column.

    Rows and the label's range and nulls come from the Parquet footers' statistics; the label column
    is read only in row groups written without them. Float feature columns are scanned once for NaN
    and infinite values, which Parquet statistics cannot show (`count_non_finite`). The location is
    checked first (one quick request on S3), so an unreachable endpoint, rejected credentials or a
    missing bucket raise StorageError at once.
    """
    check_location(uri, write=False)
    ds = open_dataset(uri)
    features, types = _check_columns(uri, ds.schema, label_column, feature_columns)
    fragments = list(ds.get_fragments())
    parts = map_fragments(lambda f: _label_summary(f, label_column), fragments)
    total = _LabelSummary()
    for part in parts:
        total.add(part.rows, part.nulls, part.low, part.high)
        total.row_groups_read += part.row_groups_read
    if total.nulls:
        raise DataSchemaError(f"dataset {uri!r}: label column {label_column!r} has {total.nulls} nulls")
    if total.rows == 0 or total.low is None or total.high is None:
        raise DataSchemaError(f"dataset {uri!r} is empty")
    if total.low < 0:
        raise DataSchemaError(f"dataset {uri!r}: label column {label_column!r} has negative value {total.low}")
    return DatasetInfo(uri=uri, num_rows=total.rows, feature_columns=features, label_column=label_column,
                       num_classes=total.high + 1, label_min=total.low, label_max=total.high, types=types,
                       non_finite=count_non_finite(ds, types), files=len(fragments),
                       row_groups_read=total.row_groups_read)


BATCH_ROWS = 65536  # rows a streaming pass over Parquet reads at a time
RELEASE_AFTER_BYTES = 1 << 20  # iter_arrays gives memory back after each batch, or after batches this large in
# all: a release costs about 10 ms, most of it faulting the pages in again (benchmarks/validation_memory.py)


def iter_arrays(uri: str, label_column: str, feature_columns: list[str],
                batch_rows: int = BATCH_ROWS) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The dataset in batches of at most `batch_rows` rows: features (float32, rows x features) and
    labels (int64). The files are read one after another, each with one batch read ahead, so memory does
    not grow with the dataset (a row group of the file being read is the largest thing held); after each
    batch, once RELEASE_AFTER_BYTES have been read since the last time, what the allocators kept of the
    freed buffers goes back to the system (`release_freed_memory`). A scanner over the whole dataset, even
    with `fragment_readahead=1`, held more files at once: its peak memory grew with the number of files
    (benchmarks/validation_memory.py; BENCHMARKS.md, "Data larger than memory")."""
    columns = [*feature_columns, label_column]
    read = 0  # bytes read since memory was last given back
    for fragment in open_dataset(uri).get_fragments():
        for batch in fragment.to_batches(columns=columns, batch_size=batch_rows, batch_readahead=1):
            if batch.num_rows:
                yield _to_arrays(batch, label_column, feature_columns)
            read += batch.nbytes
            if read >= RELEASE_AFTER_BYTES:  # the caller is done with this batch (it asked for the next one)
                release_freed_memory()
                read = 0


def release_freed_memory() -> None:
    """Give the memory the allocators keep after large buffers are freed back to the system: pyarrow's
    pool (mimalloc by default) and glibc's malloc, which keeps freed large buffers in its heap once its
    threshold for mapping them has risen. Without it a reader's memory grows with the number of files it
    has read (benchmarks/validation_memory.py)."""
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    """glibc's malloc_trim, or None (another C library, or no dlopen of the running program)."""

    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None


def _to_arrays(batch: pa.RecordBatch | pa.Table, label_column: str,
               feature_columns: list[str]) -> tuple[np.ndarray, np.ndarray]:
    x = np.column_stack([batch.column(c).to_numpy(zero_copy_only=False) for c in feature_columns])
    y = batch.column(label_column).to_numpy(zero_copy_only=False)
    return x.astype(np.float32, copy=False), y.astype(np.int64, copy=False)


def load_arrays(
    uri: str, label_column: str, feature_columns: list[str], rank: int = 0, world_size: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """The whole dataset in memory (for tests and small tools; training and validation stream it):
    features (float32, rows x features) and labels (int64), every world_size-th row from `rank`."""
    x, y = _to_arrays(open_dataset(uri).to_table(columns=[*feature_columns, label_column]), label_column,
                      feature_columns)
    return x[rank::world_size], y[rank::world_size]


def make_classification_data(
    out_dir: str,
    *,
    train_rows: int = 24000,
    val_rows: int = 6000,
    num_features: int = 16,
    num_classes: int = 4,
    seed: int = 0,
    label_column: str = "label",
    row_group_rows: int | None = None,
) -> tuple[str, str]:
    """Write a deterministic synthetic classification dataset as train.parquet and val.parquet
    (row groups of `row_group_rows`, default: pyarrow's).

    Classes are Gaussian blobs around random centers, partly overlapping so that
    accuracy improves over epochs without reaching 100% at once.
    """
    for name, value, least in (("train_rows", train_rows, 1), ("val_rows", val_rows, 1),
                               ("num_features", num_features, 1), ("num_classes", num_classes, 2)):
        if value < least:
            raise ValueError(f"{name} = {value}: expected at least {least}")
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
            pq.write_table(sample(n), f, row_group_size=row_group_rows)
        paths.append(uri)
    return paths[0], paths[1]
