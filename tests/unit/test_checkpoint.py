"""podium's checkpoint format: round trip, and every way a checkpoint can be broken or hostile."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from podium.training.checkpoint import CheckpointFormatError, load_model, load_training_state, read_meta
from podium.training.model import build_model


class _RunsCodeWhenUnpickled:
    """Unpickling this creates `marker`: the shape of a malicious checkpoint."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def rewrite_meta(checkpoint, change: Callable[[dict], Any]) -> None:
    """Replace podium.json with change(its current content)."""
    path = checkpoint.path / "podium.json"
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def test_round_trip(saved_checkpoint):
    model, meta = load_model(saved_checkpoint.directory)
    assert not model.training
    assert torch.equal(saved_checkpoint.outputs(model), saved_checkpoint.outputs())
    assert meta == saved_checkpoint.meta


def test_training_state_restores_weights_in_place(saved_checkpoint):
    fresh = build_model(saved_checkpoint.meta.model)
    meta = load_training_state(saved_checkpoint.directory, fresh, torch.optim.Adam(fresh.parameters()))
    assert meta.step == 7
    assert torch.equal(saved_checkpoint.outputs(fresh), saved_checkpoint.outputs())


def test_truncated_weights(saved_checkpoint):
    weights = saved_checkpoint.path / "model.pt"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CheckpointFormatError, match="model.pt' cannot be loaded safely"):
        load_model(saved_checkpoint.directory)


@pytest.mark.parametrize("name, expected", [("model.pt", "model.pt' is missing"),
                                            ("podium.json", "not a podium checkpoint: podium.json is missing")])
def test_missing_file(saved_checkpoint, name, expected):
    (saved_checkpoint.path / name).unlink()
    with pytest.raises(CheckpointFormatError, match=expected):
        load_model(saved_checkpoint.directory)


def test_pickle_that_runs_code_is_refused_and_not_run(saved_checkpoint, tmp_path):
    marker = tmp_path / "code-ran"
    weights = saved_checkpoint.path / "model.pt"
    torch.save(_RunsCodeWhenUnpickled(marker), weights)

    with pytest.raises(CheckpointFormatError, match="cannot be loaded safely"):
        load_model(saved_checkpoint.directory)
    assert not marker.exists()

    torch.load(weights, weights_only=False)  # the payload is live: an unsafe load runs it
    assert marker.exists()


def test_weights_that_do_not_fit_the_spec(saved_checkpoint):
    rewrite_meta(saved_checkpoint, lambda m: {**m, "model": {**m["model"], "hidden_size": 16}})
    with pytest.raises(CheckpointFormatError, match="weights do not match the model spec"):
        load_model(saved_checkpoint.directory)


def test_wrong_format_string(saved_checkpoint):
    rewrite_meta(saved_checkpoint, lambda m: {**m, "format": "podium/0"})
    with pytest.raises(CheckpointFormatError, match="format 'podium/0', expected 'podium/1'"):
        load_model(saved_checkpoint.directory)


@pytest.mark.parametrize("text", ["{not json", '{"format": "podium/1"}'], ids=["not-json", "no-fields"])
def test_corrupt_metadata(saved_checkpoint, text):
    (saved_checkpoint.path / "podium.json").write_text(text)
    with pytest.raises(CheckpointFormatError, match="is corrupt"):
        read_meta(saved_checkpoint.directory)


@pytest.mark.parametrize("change", [lambda m: [], lambda m: {**m, "metrics": [1.0]},
                                    lambda m: {**m, "model": {**m["model"], "kind": "cnn"}}],
                         ids=["list", "metrics-list", "unknown-kind"])
def test_malformed_metadata_is_a_format_error(saved_checkpoint, change):
    rewrite_meta(saved_checkpoint, change)
    with pytest.raises(CheckpointFormatError):
        load_model(saved_checkpoint.directory)
