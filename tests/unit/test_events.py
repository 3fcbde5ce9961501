"""step_of, the checkpoint announcement's plain-dict form, and what a validation function returned."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from podium.core.events import CheckpointEvent, CheckpointPayload, read_validation_result, step_of


@pytest.mark.parametrize("metrics, expected", [
    ({"step": 12, "epoch": 3}, 12),
    ({"global_step": 40, "training_iteration": 2}, 40),
    ({"training_iteration": 5.0, "epoch": 1}, 5),
    ({"epoch": 2, "loss": 0.1}, 2),
    ({"loss": 0.1}, 99),
    ({"step": True, "epoch": 4}, 4),
    ({"step": "12", "epoch": 4}, 4),
    ({}, 99),
], ids=["step-first", "global_step", "float", "epoch", "fallback", "bool-ignored", "string-ignored", "empty"])
def test_step_of(metrics, expected):
    assert step_of(metrics, fallback=99) == expected


def test_event_round_trips_through_a_plain_dict():
    event = CheckpointEvent(run_name="r", step=3, metrics={"loss": 0.5}, checkpoint_uri="/c/3", epoch=1)
    assert CheckpointPayload(**event.to_dict()).event() == event
    assert event.has_checkpoint and not CheckpointEvent(run_name="r", step=4, metrics={}).has_checkpoint


def test_an_event_comes_back_from_its_json_payload_with_its_time_and_its_non_finite_metrics():
    event = CheckpointEvent(run_name="r", step=3, metrics={"loss": math.nan, "acc": 0.5}, checkpoint_uri="/c/3",
                            persisted_at=1234.5)
    # Prefect's event JSON has no NaN: a metric that was not finite travels as null
    sent = json.loads(json.dumps(event.to_dict()).replace("NaN", "null"))
    back = CheckpointPayload(**sent).event()
    assert back.persisted_at == 1234.5 and math.isnan(back.metrics["loss"]) and back.metrics["acc"] == 0.5
    assert set(sent) == {f.name for f in dataclasses.fields(CheckpointPayload)}  # one schema


def test_a_validation_result_keeps_every_number_exactly_and_names_the_rest():
    result = read_validation_result({"val_loss": float("nan"), "acc": np.float32(0.5), "n": 3, "big": math.inf,
                                     "score": "high", "ok": True})
    assert math.isnan(result.metrics["val_loss"])
    assert {k: v for k, v in result.metrics.items() if k != "val_loss"} == {"acc": 0.5, "n": 3.0, "big": math.inf}
    assert result.non_numeric == {"score": "'high' (str)", "ok": "True (bool)"}
