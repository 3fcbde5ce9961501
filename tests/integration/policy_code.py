"""User code for the policy refusal tests (tests/integration/test_policy_refusals.py), on plain Ray Train APIs.

The linear model of podium_nightly_code, reported one epoch every `epoch_s` seconds so that validations keep up
with training (early stopping acts while it runs); a validation function that gives no per-row values even when
asked for them; one whose metrics are named otherwise than a team's policy expects.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time

import ray.train
from podium_nightly_code import validate_fn


def slow_train_func(config: dict) -> None:
    """One checkpoint per epoch, `epoch_s` seconds apart, resuming after the latest checkpoint's epoch; the weights
    are turned by `angle_deg` (0: every epoch is the same model, a plateau from the first)."""
    epochs, angle, pause = int(config["epochs"]), float(config["angle_deg"]), float(config.get("epoch_s", 0.0))
    start = 0
    latest = ray.train.get_checkpoint()
    if latest is not None:
        with latest.as_directory() as d, open(os.path.join(d, "weights.json")) as f:
            start = int(json.load(f)["epoch"]) + 1
    for epoch in range(start, epochs):
        time.sleep(pause)
        theta = math.radians(angle * (epochs - epoch))
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if ray.train.get_context().get_world_rank() == 0:
                with open(os.path.join(tmp, "weights.json"), "w") as f:
                    json.dump({"w": [math.cos(theta), math.sin(theta), 0.0, 0.0], "epoch": epoch}, f)
                checkpoint = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report({"epoch": epoch}, checkpoint=checkpoint)


def validate_without_rows(checkpoint: ray.train.Checkpoint, val_data: str, label_column: str, feature_columns: list,
                          per_row: bool = False) -> dict:
    """Accuracy and loss, never per-row values (asked for them or not)."""
    return validate_fn(checkpoint, val_data, label_column, feature_columns)
