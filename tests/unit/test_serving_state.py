"""The serving location's own record of promotion state: numbers never reused, staged versions and who stages
them, the location's identity (podium.serving.layout, .staged, .location)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from podium.core.approval import challenger_alias
from podium.errors import ServingError
from podium.serving.layout import DISCARDED, claim_version, discard_version
from podium.serving.location import ensure_location, read_location
from podium.serving.staged import is_alive, mark_staged, staged_versions, this_process


def test_a_discarded_version_keeps_its_number(tmp_path):
    serving = str(tmp_path / "serving")
    version, folder = claim_version(serving)
    (tmp_path / "serving" / "versions" / version / "model.bin").write_bytes(b"x" * 10)
    discard_version(folder, "rejected by ana")
    assert os.listdir(folder) == [DISCARDED]
    assert claim_version(serving)[0] == "v000002"


def test_a_staged_version_is_alive_while_its_process_runs(tmp_path):
    serving = str(tmp_path / "serving")
    _, mine = claim_version(serving)
    mark_staged(mine, this_process("nightly"))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _, theirs = claim_version(serving)
    mark_staged(theirs, {**this_process("nightly"), "pid": int(gone.stdout)})
    _, elsewhere = claim_version(serving)
    mark_staged(elsewhere, {**this_process("nightly"), "host": socket.gethostname() + "-other"})
    claim_version(serving)  # claimed, never marked: a promoter killed before it wrote the mark
    assert [(s.version, s.alive) for s in staged_versions(serving)] == [
        ("v000001", True), ("v000002", False), ("v000003", None), ("v000004", False)]
    discard_version(theirs, "its command is gone")
    assert [s.version for s in staged_versions(serving)] == ["v000001", "v000003", "v000004"]
    assert is_alive({"host": socket.gethostname(), "pid": os.getpid(), "pid_started": "0"}) is False  # pid reused


def test_a_location_belongs_to_one_registered_model_and_alias(tmp_path):
    serving = str(tmp_path / "serving")
    assert read_location(serving) is None
    first = ensure_location(serving, "churn", "champion")
    assert ensure_location(serving, "churn", "champion") == first == read_location(serving)
    with pytest.raises(ServingError, match="promotes registered model 'churn' under alias @champion"):
        ensure_location(serving, "churn", "canary")


def test_each_alias_has_a_challenger_of_its_own():
    assert challenger_alias("champion") == "challenger"
    assert challenger_alias("canary") == "canary-challenger"
