"""The built-in loop's data arithmetic and its chunk format (no Ray runtime needed)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from podium.training.ingest import chunk_rows, steps_per_epoch
from podium.training.loop import FeatureCollate, flag_last


@pytest.mark.parametrize("rows, world, batch, steps", [
    (24000, 2, 128, 94),   # 12000 rows each
    (10, 3, 4, 1),         # 3 rows each, the 10th row is left out (equal split)
    (7, 1, 7, 1),
    (129, 1, 128, 2),
])
def test_steps_per_epoch_follow_the_equal_split(rows, world, batch, steps):
    assert steps_per_epoch(rows, world, batch) == steps


@pytest.mark.parametrize("batch, window, chunk", [(128, 65536, 65536), (100, 65536, 65600), (128, 1, 128),
                                                  (1000, 10, 1000)])
def test_chunks_are_whole_batches(batch, window, chunk):
    assert chunk_rows(batch, window) == chunk and chunk % batch == 0 and chunk >= window


def test_a_chunk_of_rows_becomes_feature_and_label_tensors():
    table = pa.table({"b": pa.array([1, 2, 3], pa.int32()), "a": [0.5, 1.5, 2.5], "flag": [True, False, True],
                      "label": pa.array([2, 0, 1], pa.int16())})
    x, y = FeatureCollate(["a", "b", "flag"], "label")(table)
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    assert x.tolist() == [[0.5, 1.0, 1.0], [1.5, 2.0, 0.0], [2.5, 3.0, 1.0]] and y.tolist() == [2, 0, 1]


def test_flag_last():
    assert list(flag_last(iter([]))) == []
    assert list(flag_last(iter([1]))) == [(1, True)]
    assert list(flag_last(np.arange(3))) == [(0, False), (1, False), (2, True)]
