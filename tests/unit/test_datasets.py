"""The dataset digest: from file identities and Parquet footers, never the rows."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from podium.storage.fingerprint import TAIL_READ, DatasetError, dataset_digest


def write(path, rows: int = 1000, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    pq.write_table(pa.table({"x": rng.random(rows), "label": rng.integers(0, 3, rows)}), str(path), row_group_size=400)
    return str(path)


@pytest.fixture
def folder(tmp_path):
    for i in range(3):
        write(tmp_path / f"part-{i}.parquet", seed=i)
    return tmp_path


def test_digest_describes_a_folder_from_its_footers(folder):
    d = dataset_digest(str(folder))
    assert (d.files, d.rows, d.row_groups) == (3, 3000, 9)
    assert d.schema == {"x": "double", "label": "int64"}
    assert d.size_bytes == sum(os.path.getsize(folder / f"part-{i}.parquet") for i in range(3))
    # what it read: each file's last 64 KiB at most (these small files whole), once
    assert d.bytes_read == d.size_bytes
    assert len(d.digest) == 32 and dataset_digest(str(folder)) == d, "the same data gives the same digest"


def test_files_the_dataset_reader_skips_do_not_count(folder):
    before = dataset_digest(str(folder)).digest
    (folder / "_SUCCESS").write_text("")
    os.makedirs(folder / ".tmp")
    (folder / ".tmp" / "part-9.parquet").write_bytes(b"partial")
    assert dataset_digest(str(folder)).digest == before


def test_a_changed_file_changes_the_digest(folder):
    before = dataset_digest(str(folder))
    write(folder / "part-1.parquet", seed=42)  # same shape, other rows
    after = dataset_digest(str(folder))
    assert after.digest != before.digest and after.rows == before.rows
    write(folder / "part-3.parquet", rows=10)
    assert dataset_digest(str(folder)).rows == 3010


def test_data_pages_are_never_decoded(tmp_path):
    path = write(tmp_path / "data.parquet", rows=20000)
    footer = pq.read_metadata(path).serialized_size + 8
    with open(path, "r+b") as f:  # garbage over every data page: a reader of rows would fail
        f.seek(4)
        f.write(os.urandom(os.path.getsize(path) - footer - 4))
    d = dataset_digest(path)
    assert d.rows == 20000 and d.files == 1 and d.bytes_read == TAIL_READ < os.path.getsize(path)
    with pytest.raises(OSError):  # pyarrow's errors reading the corrupt pages
        pq.read_table(path)


def test_a_footer_longer_than_the_tail_read_costs_one_more_read_of_the_rest(tmp_path):
    rng = np.random.default_rng(0)
    table = pa.table({f"c{i:03d}": rng.random(2000) for i in range(200)})
    path = str(tmp_path / "wide.parquet")
    pq.write_table(table, path, row_group_size=100)  # 20 row groups x 200 columns of statistics
    footer = pq.read_metadata(path).serialized_size + 8
    assert footer > TAIL_READ
    d = dataset_digest(path)
    assert (d.rows, d.row_groups, len(d.schema)) == (2000, 20, 200)
    assert d.bytes_read == footer, "the tail, then exactly the rest of the footer"
    assert dataset_digest(path).digest == d.digest


def test_what_is_not_a_parquet_dataset_is_named(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        dataset_digest(str(tmp_path / "missing"))
    (tmp_path / "notes.csv").write_text("a,b\n1,2\n")
    with pytest.raises(DatasetError, match="notes.csv is not a readable Parquet file"):
        dataset_digest(str(tmp_path))
