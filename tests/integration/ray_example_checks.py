"""The tests' side of running Ray's examples under podium: validation functions for loops that
bring none, and small loops for what the examples do not do (every form of `validation=`, a
restart, a loop that never checkpoints). Plain Ray Train APIs only; nothing here knows podium."""

from __future__ import annotations

import json
import os
import signal
import tempfile

import numpy as np
import ray.train
import torch
from ray.train import ValidationTaskConfig
from torch import nn


def _log(path: str | None, **fields) -> None:
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(fields) + "\n")


def _state(checkpoint: ray.train.Checkpoint, name: str = "model.pt") -> dict:
    with checkpoint.as_directory() as d:
        state = torch.load(os.path.join(d, name), weights_only=True)
    return {k.removeprefix("module."): v for k, v in state.items()}  # saved from a DDP model or not


def validate_linear(checkpoint: ray.train.Checkpoint, config: dict) -> dict:
    """torch_linear_example's model on its own target, y = 2x + 5: a 1-wide nn.Linear(1, 1)."""
    _log(config.get("calls_log"), checkpoint=checkpoint.path)
    model = nn.Linear(1, 1)
    model.load_state_dict(_state(checkpoint))  # a 64-wide model (podium's hidden_size) would not load
    x = torch.arange(0, 10, 0.1, dtype=torch.float32)[:, None]
    with torch.no_grad():
        return {"val_loss": nn.functional.mse_loss(model(x), 2 * x + 5).item()}


def validate_guide_checkpoint(checkpoint: ray.train.Checkpoint, **kwargs) -> dict:
    """The checkpoint guide's nn.Linear(4, 1) against a fixed target."""
    _log(kwargs.get("calls_log"), checkpoint=checkpoint.path)
    model = nn.Linear(4, 1)
    model.load_state_dict(_state(checkpoint))
    x = torch.from_numpy(np.random.default_rng(0).normal(0, 1, size=(64, 4)).astype(np.float32))
    with torch.no_grad():
        return {"score": -nn.functional.mse_loss(model(x), torch.full((64, 1), 0.5)).item()}


def validate_tagged(checkpoint: ray.train.Checkpoint, tag: str = "default", **kwargs) -> dict:
    """Records which checkpoint it saw with which tag; the score says which report it was."""
    _log(kwargs.get("calls_log"), checkpoint=checkpoint.path, tag=tag)
    with checkpoint.as_directory() as d:
        index = int(open(os.path.join(d, "index")).read())
    return {"score": float(index)}


def every_form_of_validation(config: dict) -> None:
    """Five reports: a metrics-only one, then checkpoints whose reports say nothing, validation=False,
    validation=True and a ValidationTaskConfig; the worker group dies once, after the second."""
    rank = ray.train.get_context().get_world_rank()
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            start = int(open(os.path.join(d, "index")).read()) + 1
    forms = [{}, {"validation": False}, {"validation": True},
             {"validation": ValidationTaskConfig(fn_kwargs={"tag": "from-report"}, timeout_s=120)}]
    if start == 0:
        ray.train.report({"loss": 1.0})
    for index in range(start, len(forms)):
        marker = config.get("die_marker")
        if marker and index == 2 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)  # the restarted worker group resumes from index 1's checkpoint
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "index"), "w") as f:
                f.write(str(index))
            kwargs = forms[index] if rank == 0 else {}
            ray.train.report({"loss": 1.0 / (index + 1)},
                             checkpoint=ray.train.Checkpoint.from_directory(tmp) if rank == 0 else None, **kwargs)


def never_checkpoints(config: dict) -> None:
    """Reports metrics, as Ray's FashionMNIST example does, and never a checkpoint."""
    for epoch in range(2):
        ray.train.report({"loss": 1.0 / (epoch + 1), "epoch": epoch})
