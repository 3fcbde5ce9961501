"""Parquet data: synthetic data, schema checks that name the column, sharding."""

from __future__ import annotations

import re

import numpy as np
import pyarrow.parquet as pq
import pytest

from podium.training.data import (
    DataSchemaError,
    count_non_finite,
    inspect_dataset,
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
