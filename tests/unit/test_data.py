"""Parquet data: synthetic data, schema checks that name the column, footers before rows, batches."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from podium.training.data import (
    DataSchemaError,
    count_non_finite,
    inspect_dataset,
    iter_arrays,
    load_arrays,
    make_classification_data,
    open_dataset,
)


def test_same_seed_writes_the_same_data(tmp_path):
    def make(name: str, seed: int):
        train, val = make_classification_data(str(tmp_path / name), train_rows=40, val_rows=20, seed=seed)
        return pq.read_table(train), pq.read_table(val)

    first, again, other = make("a", 1), make("b", 1), make("c", 2)
    assert all(x.equals(y) for x, y in zip(first, again))
    assert not first[0].equals(other[0])


def test_inspect_demo_data(demo_data):
    info = inspect_dataset(demo_data[0], "label", None)
    assert (info.num_rows, info.feature_columns, info.num_classes) == (60, ["f00", "f01", "f02"], 3)


def test_inspect_counts_classes_from_the_largest_label(write_parquet):
    info = inspect_dataset(write_parquet("d.parquet", x=[1.0, 2.0], label=[0, 4]), "label", None)
    assert info.num_classes == 5


@pytest.mark.parametrize("columns, label, features, expected", [
    ({"x": [1.0], "y": [0]}, "label", None, "no label column 'label'; its columns are ['x', 'y']"),
    ({"x": [1.0], "label": [0.0]}, "label", None, "label column 'label' has type double, expected an integer type"),
    ({"x": [1.0], "label": ["cat"]}, "label", None, "label column 'label' has type string, expected an integer type"),
    ({"x": [1.0], "label": [0]}, "label", ["x", "z"], "no feature column 'z'"),
    ({"x": [1.0], "name": ["a"], "label": [0]}, "label", None, "feature column 'name' has type string, expected a numeric type"),
    ({"label": [0]}, "label", None, "no feature columns besides the label 'label'"),
    ({"x": [1.0, 2.0], "label": [1, -1]}, "label", None, "label column 'label' has negative value -1"),
    ({"x": [1.0, 2.0], "label": [1, None]}, "label", None, "label column 'label' has 1 nulls"),
], ids=["no-label", "float-label", "string-label", "unknown-feature", "string-feature", "no-features",
        "negative-label", "null-label"])
def test_schema_errors_name_the_column(write_parquet, columns, label, features, expected):
    with pytest.raises(DataSchemaError, match=re.escape(expected)):
        inspect_dataset(write_parquet("d.parquet", **columns), label, features)


def test_empty_dataset(write_parquet):
    path = write_parquet("d.parquet", x=np.array([], dtype=np.float32), label=np.array([], dtype=np.int64))
    with pytest.raises(DataSchemaError, match="is empty"):
        inspect_dataset(path, "label", None)


def test_directory_of_parquet_files(write_parquet, tmp_path):
    write_parquet("parts/a.parquet", x=[1.0, 2.0], label=[0, 1])
    write_parquet("parts/b.parquet", x=[3.0], label=[2])
    info = inspect_dataset(str(tmp_path / "parts"), "label", None)
    assert (info.num_rows, info.num_classes) == (3, 3)
    x, y = load_arrays(str(tmp_path / "parts"), "label", ["x"])
    assert sorted(y.tolist()) == [0, 1, 2] and x.shape == (3, 1)


def test_load_arrays_types(demo_data):
    x, y = load_arrays(demo_data[1], "label", ["f00", "f01", "f02"])
    assert (x.dtype, y.dtype, x.shape, y.shape) == (np.float32, np.int64, (30, 3), (30,))


@pytest.mark.parametrize("world_size", [2, 3, 7])
def test_shards_partition_the_rows(write_parquet, world_size):
    path = write_parquet("d.parquet", x=np.arange(20, dtype=np.float64), label=np.arange(20) % 3)
    shards = [load_arrays(path, "label", ["x"], rank=r, world_size=world_size) for r in range(world_size)]
    rows = np.concatenate([x[:, 0] for x, _ in shards])
    assert sorted(rows.tolist()) == list(range(20))
    for x, y in shards:  # features and labels stay paired within a shard
        assert (x[:, 0].astype(int) % 3 == y).all()


def test_non_finite_values_are_counted_per_column(tmp_path):
    import pyarrow as pa

    nan, inf = float("nan"), float("inf")
    path = str(tmp_path / "d.parquet")
    table = pa.table({"clean": [1.0, 2.0, 3.0, 4.0], "one_nan": pa.array([1.0, nan, 3.0, 4.0], pa.float32()),
                      "inf_and_null": [-inf, None, 1.0, 2.0], "int_null": pa.array([1, None, 3, 4], pa.int64()),
                      "flag": [True, False, None, True], "label": [0, 1, 0, 1]})
    pq.write_table(table, path, row_group_size=2)  # several row groups, each with its statistics
    types = {"clean": "floating", "one_nan": "floating", "inf_and_null": "floating", "int_null": "integer",
             "flag": "boolean"}
    assert count_non_finite(open_dataset(path), types) == {"one_nan": 1, "inf_and_null": 2, "int_null": 1, "flag": 1}
    # without statistics, integer and boolean columns are read instead: the same counts
    pq.write_table(table, path, write_statistics=False)
    assert count_non_finite(open_dataset(path), types) == {"one_nan": 1, "inf_and_null": 2, "int_null": 1, "flag": 1}


@pytest.mark.parametrize("kwargs, expected", [({"num_classes": 0}, "num_classes = 0: expected at least 2"),
                                              ({"train_rows": -5}, "train_rows = -5: expected at least 1"),
                                              ({"num_features": 0}, "num_features = 0: expected at least 1")])
def test_make_data_refuses_counts_that_make_no_dataset(tmp_path, kwargs, expected):
    with pytest.raises(ValueError, match=re.escape(expected)):
        make_classification_data(str(tmp_path / "d"), **kwargs)
    assert not (tmp_path / "d").exists()
# ---------------------------------------------------------------------------------------------
# The preflight reads footers; row data only where statistics are missing


def _write(path, table: pa.Table, **kwargs) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, **kwargs)
    return str(path)


def _table(labels) -> pa.Table:
    return pa.table({"x": np.arange(len(labels), dtype=np.float32), "label": pa.array(labels, pa.int64())})


def test_preflight_reads_no_row_data_when_the_footers_have_statistics(tmp_path):
    path = _write(tmp_path / "d.parquet", _table([3, 0, 1, 2] * 25), row_group_size=10)
    info = inspect_dataset(path, "label", None)
    assert (info.num_rows, info.num_classes, info.row_groups_read) == (100, 4, 0)


def test_preflight_reads_the_label_column_of_row_groups_without_statistics(tmp_path):
    with_stats = _write(tmp_path / "parts/a.parquet", _table([0, 1] * 10), row_group_size=5)
    without = _write(tmp_path / "parts/b.parquet", _table([1, 6, 2]), row_group_size=2, write_statistics=False)
    assert pq.ParquetFile(without).metadata.row_group(0).column(1).statistics is None
    info = inspect_dataset(str(tmp_path / "parts"), "label", None)
    # the largest label (6) is only in b.parquet, which has no statistics: found by reading its 2 row groups
    assert (info.num_rows, info.num_classes, info.files, info.row_groups_read) == (23, 7, 2, 2)
    assert inspect_dataset(with_stats, "label", None).row_groups_read == 0


@pytest.mark.parametrize("statistics", [True, False], ids=["from-statistics", "from-row-data"])
def test_preflight_finds_nulls_and_negative_labels_either_way(tmp_path, statistics):
    nulls = _write(tmp_path / "n.parquet", _table([0, None, 1, None]), row_group_size=2, write_statistics=statistics)
    with pytest.raises(DataSchemaError, match="has 2 nulls"):
        inspect_dataset(nulls, "label", None)
    negative = _write(tmp_path / "m.parquet", _table([0, 1, -3, 1]), row_group_size=2, write_statistics=statistics)
    with pytest.raises(DataSchemaError, match="negative value -3"):
        inspect_dataset(negative, "label", None)


def test_preflight_all_null_label_is_reported_as_nulls(tmp_path):
    path = _write(tmp_path / "d.parquet", _table([None, None]))
    with pytest.raises(DataSchemaError, match="has 2 nulls"):
        inspect_dataset(path, "label", None)


def test_validation_batches_cover_every_row_once_and_stay_bounded(tmp_path):
    n = 1000
    table = pa.table({"a": np.arange(n, dtype=np.float64), "b": np.ones(n, dtype=np.int32),
                      "label": np.arange(n) % 3})
    path = _write(tmp_path / "v.parquet", table, row_group_size=300)
    batches = list(iter_arrays(path, "label", ["a", "b"], batch_rows=128))
    assert max(len(y) for _, y in batches) <= 128
    xs = np.concatenate([x for x, _ in batches])
    assert sorted(xs[:, 0].astype(int).tolist()) == list(range(n))
    assert all(x.dtype == np.float32 and y.dtype == np.int64 and x.shape == (len(y), 2) for x, y in batches)
    assert all((x[:, 0].astype(int) % 3 == y).all() for x, y in batches)  # rows stay paired


def test_validation_batches_give_memory_back_as_they_go(tmp_path, monkeypatch):
    """Several files, memory given back after every batch: every row still comes once, in its pair; and
    on glibc the trim is found (without it the reader's memory grows with the files read)."""
    import platform

    from podium.training import data

    monkeypatch.setattr(data, "RELEASE_AFTER_BYTES", 1)
    released, release = [], data.release_freed_memory
    monkeypatch.setattr(data, "release_freed_memory", lambda: released.append(release()))
    for i in range(3):
        table = pa.table({"a": np.arange(i * 100, (i + 1) * 100, dtype=np.float64), "label": np.arange(100) % 2})
        _write(tmp_path / "v" / f"part-{i}.parquet", table)
    batches = list(iter_arrays(str(tmp_path / "v"), "label", ["a"], batch_rows=64))
    assert sorted(np.concatenate([x for x, _ in batches])[:, 0].astype(int).tolist()) == list(range(300))
    assert len(released) == len(batches) == 6
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert data._malloc_trim() is not None


def test_synthetic_data_row_groups(tmp_path):
    train, _ = make_classification_data(str(tmp_path / "d"), train_rows=1000, val_rows=10, row_group_rows=256)
    assert pq.ParquetFile(train).metadata.num_row_groups == 4


def test_the_training_data_is_kept_in_the_object_store_when_it_fits_in_a_quarter(tmp_path):
    from podium.training.ingest import caches, decoded_bytes

    rows = 10_000
    pq.write_table(pa.table({"a": np.arange(rows, dtype=np.float64), "b": np.zeros(rows, dtype=np.float32),
                             "label": np.zeros(rows, dtype=np.int64)}), tmp_path / "t.parquet", row_group_size=2500)
    uri = str(tmp_path / "t.parquet")
    size = decoded_bytes(uri, ["a", "label"])
    assert rows * 16 <= size < rows * 16 * 1.1  # two 8-byte columns, plain-encoded; column b is not counted
    assert caches("auto", uri, ["a", "label"], store_bytes=4 * size)
    assert not caches("auto", uri, ["a", "label"], store_bytes=4 * size - 4)
    assert caches("always", uri, ["a"], store_bytes=0) and not caches("never", uri, ["a"], store_bytes=1e12)
    with pytest.raises(ValueError, match=r"training.cache = 'yes': expected one of \['never', 'auto', 'always'\]"):
        caches("yes", uri, ["a"])
    assert not caches("auto", str(tmp_path / "gone.parquet"), ["a"], store_bytes=1e12)  # unknown size: not kept
