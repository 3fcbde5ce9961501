"""The dataset digest: from the bytes of the files and their Parquet footers, never decoding a row."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from podium.storage import fingerprint
from podium.storage.fingerprint import TAIL_READ, DatasetError, _listed_hash, dataset_digest


def write(path, rows: int = 1000, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    pq.write_table(pa.table({"x": rng.random(rows), "label": rng.integers(0, 3, rows)}), str(path), row_group_size=400)
    return str(path)


@pytest.fixture(autouse=True)
def content_cache(tmp_path_factory, monkeypatch):
    """This test's own cache of local files' hashes (podium.storage.fingerprint.content_cache_dir)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))


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
    assert d.bytes_hashed == os.path.getsize(path), "a local file's bytes are hashed, not parsed"
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


def test_the_same_bytes_written_again_or_elsewhere_are_the_same_dataset(folder, tmp_path_factory):
    """The digest is a function of the bytes and their relative names, not of when they were written: data written
    again byte for byte is not new data to the same-data gate."""
    before = dataset_digest(str(folder))
    assert before.bytes_hashed == before.size_bytes
    assert dataset_digest(str(folder)).bytes_hashed == 0, "this process hashed these files already"
    for i in range(3):  # rewritten, byte for byte: a new modification time (and inode)
        path = folder / f"part-{i}.parquet"
        data = path.read_bytes()
        path.unlink()
        path.write_bytes(data)
        os.utime(path, ns=(10**18 + i, 10**18 + i))
    again = dataset_digest(str(folder))
    assert again.digest == before.digest and again.bytes_hashed == before.size_bytes  # read again, same answer
    elsewhere = tmp_path_factory.mktemp("copy")
    for i in range(3):
        (elsewhere / f"part-{i}.parquet").write_bytes((folder / f"part-{i}.parquet").read_bytes())
    assert dataset_digest(str(elsewhere)).digest == before.digest


def test_a_later_command_reads_no_byte_of_files_digested_before(folder, monkeypatch):
    first = dataset_digest(str(folder))
    monkeypatch.setattr(fingerprint, "_CONTENT_HASHES", {})  # a new process
    later = dataset_digest(str(folder))
    assert later.digest == first.digest and later.bytes_hashed == 0, "kept by path, size, mtime and inode"
    assert len(list(fingerprint.content_cache_dir().iterdir())) == 3
    path = folder / "part-1.parquet"
    path.write_bytes(path.read_bytes())  # written again: a new mtime, read again
    monkeypatch.setattr(fingerprint, "_CONTENT_HASHES", {})
    again = dataset_digest(str(folder))
    assert again.digest == first.digest and again.bytes_hashed == path.stat().st_size


def test_a_change_the_footer_does_not_show_changes_the_digest(tmp_path):
    """Same size, same footer (row counts, statistics), other bytes in a data page: other data."""
    path = write(tmp_path / "data.parquet", rows=5000)
    before = dataset_digest(path)
    data = bytearray(open(path, "rb").read())
    data[100] ^= 0xFF  # inside the first data page
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(os.stat(path).st_mtime_ns + 10**9,) * 2)
    after = dataset_digest(path)
    assert (after.rows, after.size_bytes) == (before.rows, before.size_bytes) and after.digest != before.digest


def test_a_hash_the_store_lists_spares_reading_the_bytes():
    class ContentSettings:  # Azure's, as adlfs lists it
        content_md5 = bytearray(b"\x01\x02")

    assert _listed_hash({"ETag": '"9b2cf535f27731c974343645a3985328"', "size": 3}) == '"9b2cf535f27731c974343645a3985328"'
    assert _listed_hash({"etag": "CKih16GjycICEAE=", "md5Hash": "m7LVNfJ3Mcl0NDZFo5hTKA=="}) == "m7LVNfJ3Mcl0NDZFo5hTKA=="
    assert _listed_hash({"etag": "CKih16GjycICEAE=", "crc32c": "yZRlqg=="}) == "yZRlqg=="  # a composed GCS object
    assert _listed_hash({"etag": "0x8DBF0", "content_settings": ContentSettings()}) == "md5:0102"
    # an Azure blob written in blocks has no Content-MD5, and its etag changes on every write: no hash listed
    assert _listed_hash({"etag": "0x8DBF0", "content_settings": {"content_md5": None}}) is None
    assert _listed_hash({"mtime": 1.5, "size": 3}) is None
