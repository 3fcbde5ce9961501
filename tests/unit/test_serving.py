"""The serving location on local folders: versions, manifests, the CURRENT pointer, safe copies."""

from __future__ import annotations

import errno
import json
import re
import shutil
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers.servers import small_tmpfs

from podium.errors import ServingError
from podium.serving.layout import (
    PromotedVersion,
    ServingFull,
    read_current,
    read_history,
    read_lineage,
    safe_relpath,
    seal_version,
    switch_current,
    withdrawn_checkpoints,
)
from podium.serving.staging import stage_version, verify_files
from podium.storage.documents import write_json
from podium.training.promoted import check_loadable, fetch_version, load_promoted_model


@pytest.fixture
def serving(tmp_path: Path) -> str:
    return str(tmp_path / "serving")


def promote(serving: str, checkpoint: str, step: int = 7, reason: str = "better") -> PromotedVersion:
    version = stage_version(serving, checkpoint, {"step": step, "run_name": "r"})
    seal_version(serving, version)
    switch_current(serving, version, reason)
    return version


def version_dir(version: PromotedVersion) -> Path:
    return Path(version.uri).parent


# --- versions and the pointer --------------------------------------------------------------------

def test_nothing_is_current_before_the_first_promotion(serving):
    assert read_current(serving) is None
    assert read_history(serving) == []


def test_staged_version_is_a_verified_copy_with_a_manifest(serving, saved_checkpoint):
    version = stage_version(serving, saved_checkpoint.directory, {"step": 7})
    assert version.version == "v000001"
    copied = sorted(p.name for p in Path(version.uri).iterdir())
    assert copied == ["model.pt", "optimizer.pt", "podium.json"] == sorted(version.manifest["files"])
    for name in copied:
        assert (Path(version.uri) / name).read_bytes() == (saved_checkpoint.path / name).read_bytes()
    assert version.manifest["step"] == 7 and version.manifest["source"] == saved_checkpoint.directory


def test_promotions_move_the_pointer_and_are_recorded_in_order(serving, saved_checkpoint):
    first = promote(serving, saved_checkpoint.directory, step=7, reason="first")
    assert read_current(serving).version == first.version == "v000001"

    second = promote(serving, saved_checkpoint.directory, step=9, reason="better by 0.1")
    current = read_current(serving)
    assert (current.version, current.uri, current.manifest["step"]) == ("v000002", second.uri, 9)

    history = read_history(serving)
    assert [(h["version"], h["previous"], h["reason"], h["step"]) for h in history] == [
        ("v000001", None, "first", 7), ("v000002", "v000001", "better by 0.1", 9)]


def test_a_version_without_manifest_never_becomes_current(serving, saved_checkpoint):
    champion = promote(serving, saved_checkpoint.directory)
    unsealed = stage_version(serving, saved_checkpoint.directory, {"step": 8})

    with pytest.raises(ServingError, match=f"{unsealed.version} is incomplete"):
        switch_current(serving, unsealed, "should not happen")

    assert read_current(serving).version == champion.version
    assert len(read_history(serving)) == 1


def test_pointer_naming_an_unsealed_version_is_an_error(serving, saved_checkpoint):
    unsealed = stage_version(serving, saved_checkpoint.directory, {"step": 8})
    write_json(f"{serving}/CURRENT", {"version": unsealed.version})
    with pytest.raises(ServingError, match="has no MANIFEST.json"):
        read_current(serving)


def test_history_keeps_order_of_switches_within_one_second(serving, saved_checkpoint, monkeypatch):
    frozen = time.gmtime()
    monkeypatch.setattr(time, "gmtime", lambda *_: frozen)  # three switches in the same second
    first = promote(serving, saved_checkpoint.directory, reason="first")
    promote(serving, saved_checkpoint.directory, reason="second")
    switch_current(serving, first, "rollback")
    assert [h["reason"] for h in read_history(serving)] == ["first", "second", "rollback"]


@pytest.mark.parametrize("content, expected", [('{"version": "v0000', "is not valid JSON (truncated or corrupt?)"),
                                               ("[1, 2]", "is corrupt: expected a JSON object, found a list")])
def test_a_truncated_or_corrupt_pointer_is_a_serving_error(serving, content, expected):
    Path(serving).mkdir(parents=True)
    (Path(serving) / "CURRENT").write_text(content)
    with pytest.raises(ServingError, match=re.escape(f"{serving}/CURRENT {expected}")):
        read_current(serving)


def test_a_rollback_record_names_what_it_withdrew_and_what_started_it(serving, saved_checkpoint, tmp_path):
    other = shutil.copytree(saved_checkpoint.directory, tmp_path / "other")
    first = promote(serving, saved_checkpoint.directory, reason="first")
    promote(serving, str(other), reason="better")
    switch_current(serving, first, "rollback from v000002", action="rollback", withdrawn="v000002",
                   origin={"command": "podium rollback", "user": "ops"})
    record = read_history(serving)[-1]
    assert (record["action"], record["withdrawn"], record["origin"]["command"]) == ("rollback", "v000002",
                                                                                    "podium rollback")
    assert read_lineage(serving).champions == ("v000001", "v000002")
    # promotion reads which checkpoints were withdrawn, by their source
    (source, why), = withdrawn_checkpoints(serving).items()
    assert source == str(other) and "served as v000002" in why and "podium rollback --to v000002" in why


# --- checking files against the manifest ---------------------------------------------------------

def test_verify_files_detects_a_modified_file(serving, saved_checkpoint):
    version = stage_version(serving, saved_checkpoint.directory, {})
    (Path(version.uri) / "podium.json").write_text("{}")
    with pytest.raises(ServingError, match="podium.json has sha256"):
        verify_files(str(version_dir(version)), version.manifest)


def test_verify_files_detects_a_missing_file(serving, saved_checkpoint):
    version = stage_version(serving, saved_checkpoint.directory, {})
    (Path(version.uri) / "model.pt").unlink()
    with pytest.raises(ServingError, match="model.pt is missing"):
        verify_files(str(version_dir(version)), version.manifest)


# --- a copy that fails half way: its version is discarded, never left half written ---------------

def _only_tombstones(serving: str) -> dict[str, list[str]]:
    versions = Path(serving) / "versions"
    return {v.name: sorted(p.name for p in v.iterdir()) for v in sorted(versions.iterdir())}


def _big_checkpoint(folder: Path, mb: int) -> Path:
    """A checkpoint folder with one sparse file of `mb` MiB (zeros, read like any other bytes) and a small one."""
    folder.mkdir()
    with open(folder / "weights.bin", "wb") as f:
        f.truncate(mb << 20)
    (folder / "podium.json").write_text("{}")
    return folder


def test_a_source_file_gone_when_it_is_copied_discards_the_version(serving, saved_checkpoint, tmp_path):
    source = Path(shutil.copytree(saved_checkpoint.directory, tmp_path / "source"))
    (source / "extra.pt").symlink_to(tmp_path / "removed.pt")  # listed, and gone when it is read
    with pytest.raises(FileNotFoundError):
        stage_version(serving, str(source), {"step": 1}, mark={"pid": 1})
    tombstone = json.loads((Path(serving) / "versions" / "v000001" / "DISCARDED.json").read_text())
    assert _only_tombstones(serving) == {"v000001": ["DISCARDED.json"]}, "no file of the partial copy is left"
    assert tombstone["why"].startswith("its copy failed") and tombstone["staged_by"] == {"pid": 1}
    assert stage_version(serving, saved_checkpoint.directory, {"step": 1}).version == "v000002"


def test_a_write_error_half_way_discards_the_version(serving, tmp_path):
    """A write that the kernel refuses half way (EFBIG: the file-size limit of this process), not a full disk."""
    import resource
    import signal

    source = _big_checkpoint(tmp_path / "source", 24)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of ending the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (12 << 20, hard))
    try:
        with pytest.raises(OSError) as failed:
            stage_version(serving, str(source), {"step": 1})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert failed.value.errno == errno.EFBIG
    assert _only_tombstones(serving) == {"v000001": ["DISCARDED.json"]}
    assert "File too large" in json.loads((Path(serving) / "versions" / "v000001" / "DISCARDED.json").read_text())["why"]


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs: a filesystem that fills up for real (mounting it needs root)."""
    with small_tmpfs(tmp_path / "small-disk") as mnt:
        yield mnt


def test_a_disk_that_fills_up_half_way_discards_the_version_and_says_so(small_disk, tmp_path):
    serving = str(small_disk / "serving")
    source = _big_checkpoint(tmp_path / "source", 8)
    with pytest.raises(ServingFull, match=f"no space left at the serving location {serving} while writing v000001 "
                                          r"\(No space left on device\): the partial v000001 was removed"):
        stage_version(serving, str(source), {"step": 1})
    assert _only_tombstones(serving) == {"v000001": ["DISCARDED.json"]}


@pytest.mark.parametrize("entry", ["../x", "a/../../x", "..", ".", "", "/etc/passwd", "a\\..\\x"])
def test_safe_relpath_rejects_entries_that_escape(entry):
    with pytest.raises(ServingError, match="escapes its folder"):
        safe_relpath(entry)


@pytest.mark.parametrize("entry, expected", [("model.pt", "model.pt"), ("sub/./w.pt", "sub/w.pt"),
                                             ("sub/../w.pt", "w.pt")])
def test_safe_relpath_keeps_entries_inside(entry, expected):
    assert safe_relpath(entry) == expected


def test_fetch_version_refuses_a_manifest_entry_outside_the_version(serving, saved_checkpoint, tmp_path):
    version = promote(serving, saved_checkpoint.directory)
    # a real file next to checkpoint/, so that following the entry would really copy it out of dest
    (version_dir(version) / "planted.txt").write_text("planted")
    files = {**version.manifest["files"], "../planted.txt": {"sha256": "0" * 64, "size": 7}}
    dest = tmp_path / "fetched" / "inner"
    with pytest.raises(ServingError, match="escapes its folder"):
        fetch_version(replace(version, manifest={**version.manifest, "files": files}), str(dest))
    assert not (dest.parent / "planted.txt").exists()


def test_fetch_version_refuses_an_absolute_manifest_entry(serving, saved_checkpoint, tmp_path):
    version = promote(serving, saved_checkpoint.directory)
    target = tmp_path / "overwritten.txt"
    files = {str(target): {"sha256": "0" * 64, "size": 1}}
    with pytest.raises(ServingError, match="escapes its folder"):
        fetch_version(replace(version, manifest={**version.manifest, "files": files}), str(tmp_path / "dest"))
    assert not target.exists()


# --- write_json ----------------------------------------------------------------------------------

def test_write_json_replaces_the_file_and_leaves_no_temp_file(tmp_path):
    target = tmp_path / "doc.json"
    write_json(str(target), {"v": 1})
    with open(target) as reader:  # a reader that opened the old file keeps reading it, whole
        write_json(str(target), {"v": 2})
        assert json.load(reader) == {"v": 1}
    assert json.loads(target.read_text()) == {"v": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["doc.json"]


def test_write_json_failing_midway_keeps_old_content(tmp_path):
    target = tmp_path / "doc.json"
    write_json(str(target), {"v": 1})
    with pytest.raises(TypeError):
        write_json(str(target), {"v": 2, "bad": object()})
    assert json.loads(target.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["doc.json"]


def test_write_json_removes_its_temp_file_when_the_rename_fails(tmp_path):
    target = tmp_path / "taken"
    (target / "inside").mkdir(parents=True)  # a non-empty folder: os.replace onto it fails
    with pytest.raises(OSError):
        write_json(str(target), {"v": 1})
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]


# --- load_promoted_model -------------------------------------------------------------------------

def test_load_promoted_model_returns_the_promoted_weights(serving, saved_checkpoint):
    promote(serving, saved_checkpoint.directory)
    model = load_promoted_model(serving)  # a version promoted as a checkpoint, before served models
    assert not model.module.training
    assert torch.equal(saved_checkpoint.outputs(model.module), saved_checkpoint.outputs())
    rows = pd.DataFrame({"c": [0.5, -1.0], "a": [1.0, 0.0], "b": [2, 3]})  # any column order, any numeric type
    expected = saved_checkpoint.model(torch.tensor(rows[["a", "b", "c"]].to_numpy("float32"))).argmax(1)
    assert model.predict(rows).tolist() == expected.tolist()
    assert list(model.predict_proba(rows).columns) == ["0", "1"]


def test_load_promoted_model_refuses_a_tampered_file(serving, saved_checkpoint):
    version = promote(serving, saved_checkpoint.directory)
    weights = Path(version.uri) / "model.pt"
    data = weights.read_bytes()
    weights.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    with pytest.raises(ServingError, match="model.pt.*sha256"):
        load_promoted_model(serving)


def test_load_promoted_model_on_an_empty_serving_location(serving):
    Path(serving).mkdir()
    with pytest.raises(ServingError, match=re.escape(f"nothing has been promoted to {serving!r} yet")):
        load_promoted_model(serving)


def test_check_loadable_refuses_a_copy_that_does_not_load(serving, saved_checkpoint, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(saved_checkpoint.directory, broken)
    weights = broken / "model.pt"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated at the source: the hashes agree, loading fails
    version = stage_version(serving, str(broken), {"step": 1})
    with pytest.raises(ServingError, match="model.pt"):
        check_loadable(version)
    check_loadable(stage_version(serving, saved_checkpoint.directory, {"step": 2}))


def test_check_loadable_leaves_other_formats_to_their_hashes(serving, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "weights.bin").write_bytes(b"not podium's format")
    check_loadable(stage_version(serving, str(other), {"step": 1}))
