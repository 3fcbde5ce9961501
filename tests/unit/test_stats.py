"""The one statistics pass: partial statistics per block, merged exactly, whatever the split."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pytest

from podium.training.stats import DataStats, merge_stats, partial_stats


def _table(rng: np.random.Generator, n: int) -> pa.Table:
    big = rng.normal(5_000.0, 300.0, n)  # a large mean next to a small spread: cancellation would show
    ints = rng.integers(-3, 9, n).astype(np.int32)
    gappy = pa.array([None if i % 7 == 0 else float(i) for i in range(n)], pa.float64())
    return pa.table({"big": big, "ints": ints, "gappy": gappy, "flag": rng.random(n) < 0.3})


@pytest.mark.parametrize("cuts", [[], [1], [17, 18, 300], list(range(10, 990, 10))],
                         ids=["whole", "one-row-block", "uneven", "many-blocks"])
def test_merged_partials_equal_the_statistics_of_the_whole_table(cuts):
    rng = np.random.default_rng(7)
    table = _table(rng, 1000)
    columns = table.column_names
    bounds = [0, *cuts, table.num_rows]
    parts = [partial_stats(table.slice(a, b - a), columns) for a, b in zip(bounds, bounds[1:])]
    stats = merge_stats(parts, columns, table.num_rows)
    assert stats.rows == 1000
    for i, name in enumerate(columns):
        values = table.column(name).to_numpy(zero_copy_only=False).astype(np.float64)
        values = values[~np.isnan(values)]
        assert stats.counts[i] == len(values)
        assert stats.mean[i] == pytest.approx(values.mean(), rel=1e-12, abs=1e-12)
        assert stats.std[i] == pytest.approx(values.std(), rel=1e-9)
        assert (stats.min[i], stats.max[i]) == (values.min(), values.max())


def test_empty_and_constant_columns_standardise_to_themselves_and_the_record_round_trips():
    table = pa.table({"empty": pa.array([None, None], pa.float32()), "x": [1.0, 3.0], "same": [4.0, 4.0]})
    columns = ["empty", "x", "same"]
    stats = merge_stats([partial_stats(table, columns)], columns, 2)
    assert stats.counts == [0, 2, 2] and (stats.mean[0], stats.std[0]) == (0.0, 0.0) and math.isnan(stats.min[0])
    assert (stats.mean[1], stats.std[1]) == (2.0, 1.0)
    assert stats.scale == [1.0, 1.0, 1.0]  # nothing to scale by in an empty or constant column
    doc = json.loads(json.dumps(stats.to_dict()))
    assert doc["count"] == 2 and doc["scale"] == [1.0, 1.0, 1.0]
    again = DataStats.from_dict(doc)
    assert again.columns == columns and again.mean[1] == 2.0 and math.isnan(again.max[0])


def test_no_blocks_at_all():
    stats = merge_stats([], ["x"], 0)
    assert stats.rows == 0 and stats.counts == [0] and stats.mean == [0.0] and stats.scale == [1.0]


def test_small_data_is_read_in_this_process_one_batch_at_a_time(tmp_path):
    import pyarrow.parquet as pq

    from podium.training.stats import compute_data_stats

    rng = np.random.default_rng(3)
    tables = [_table(rng, n) for n in (70_000, 5, 1000)]  # more rows than one batch, and a tiny file
    (tmp_path / "d").mkdir()
    for i, t in enumerate(tables):
        pq.write_table(t, tmp_path / "d" / f"{i}.parquet", row_group_size=30_000)
    stats = compute_data_stats(str(tmp_path / "d"), ["big", "gappy"])
    whole = pa.concat_tables(tables)
    assert stats.rows == whole.num_rows
    big = whole.column("big").to_numpy()
    assert stats.mean[0] == pytest.approx(big.mean(), rel=1e-12) and stats.std[0] == pytest.approx(big.std(), rel=1e-9)
    gappy = whole.column("gappy").to_numpy(zero_copy_only=False)
    assert stats.counts[1] == int((~np.isnan(gappy)).sum())
