"""A user's own training loop and validation function, written only against plain Ray Train APIs,
as in Ray's documentation: nothing here knows podium."""

import os
import signal
import tempfile
import time

import ray.train
import torch
from torch import nn


def make_model() -> nn.Module:
    return nn.Linear(4, 1)


def train_func(config: dict) -> None:
    torch.manual_seed(0)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        start = int(state["epoch"]) + 1
    x = torch.randn(256, 4, generator=torch.Generator().manual_seed(1))
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    for epoch in range(start, config.get("epochs", 3)):
        marker = config.get("die_marker")
        if marker and epoch == config.get("die_at_epoch") and not os.path.exists(marker):
            open(marker, "w").close()  # die once: the restarted worker group carries on
            os.kill(os.getpid(), signal.SIGKILL)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if ray.train.get_context().get_world_rank() == 0:
                torch.save({"model": model.state_dict(), "epoch": epoch}, os.path.join(tmp, "state.pt"))
                checkpoint = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report({"loss": loss.item(), "epoch": epoch}, checkpoint=checkpoint)


def validate_fn(checkpoint: ray.train.Checkpoint, config: dict) -> dict:
    """Ray's documented form: (checkpoint, config) -> dict of metrics."""
    model = make_model()
    with checkpoint.as_directory() as d:
        state = torch.load(os.path.join(d, "state.pt"), weights_only=True)
    model.load_state_dict(state["model"])
    x = torch.randn(128, 4, generator=torch.Generator().manual_seed(2))
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    with torch.no_grad():
        mse = nn.functional.mse_loss(model(x), y).item()
    epoch = int(state["epoch"])
    if config.get("paths_log"):
        with open(config["paths_log"], "a") as f:
            f.write(f"{checkpoint.path}\n")
    if config.get("calls_log"):
        with open(config["calls_log"], "a") as f:
            f.write(f"{epoch}\n")
    if config.get("fail_epoch") is not None and epoch == int(config["fail_epoch"]):
        raise RuntimeError(f"validation data unavailable for epoch {epoch}")
    if config.get("hang_epoch") is not None and epoch == int(config["hang_epoch"]):
        time.sleep(3600)
    time.sleep(float(config.get("sleep_s", 0)))
    return {"score": -mse}
