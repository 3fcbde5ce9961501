"""Ray's documentation as code, run under podium by import path; nothing here knows podium.

- `train_func` / `validate_fn`: the async-validation guide (../shared/reference/ray-train-async-
  validation.zh.txt), in Ray 2.60's form: `validation=ValidationTaskConfig(fn_kwargs=...)` on
  `ray.train.report` instead of the page's `validate_fn=`/`validate_config=`. The page's `...` are
  filled with a small image classifier; the validation dataset arrives in the loop's config, as the
  page's `run_trainer` passes it. Ray 2.60's Dataset has no len(): `dataset.count()` is used.
- `checkpoint_guide_train_func`: the first example of the checkpoint guide
  (../shared/reference/ray-train-checkpoints.en.txt), as printed there.

The one addition to the guide's code is `_log_call`: the tests read which checkpoint each
validation saw, with which arguments.
"""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import ray.train
import ray.train.torch
import torch
import torch.nn as nn
from ray import train
from ray.train import Checkpoint, ValidationTaskConfig
from torch.optim import Adam

IMAGE_SHAPE = (1, 8, 8)


def make_model() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(IMAGE_SHAPE)), 2))


def synthetic_images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Images whose class is whether they are bright (mean above 0.5)."""
    images = np.random.default_rng(seed).random((n, *IMAGE_SHAPE), dtype=np.float32)
    return images, (images.mean(axis=(1, 2, 3)) > 0.5).astype(np.int64)


def _log_call(checkpoint: ray.train.Checkpoint, config: dict) -> None:
    if config.get("calls_log"):
        seen = {k: v for k, v in config.items() if isinstance(v, (str, int, float)) and k != "calls_log"}
        with open(config["calls_log"], "a") as f:
            f.write(json.dumps({"checkpoint": checkpoint.path, **seen,
                                "dataset": type(config.get("dataset")).__name__}) + "\n")


# ---- the async-validation guide -------------------------------------------------------------


def validate_fn(checkpoint: ray.train.Checkpoint, config: dict) -> dict:
    _log_call(checkpoint, config)
    # Load the checkpoint
    model = make_model()
    with checkpoint.as_directory() as checkpoint_dir:
        model_state_dict = torch.load(os.path.join(checkpoint_dir, "model.pt"))
        model.load_state_dict(model_state_dict)
    model.eval()

    # Perform validation on the data
    total_accuracy = 0
    dataset = config["dataset"]
    with torch.no_grad():
        for batch in dataset.iter_torch_batches(batch_size=128):
            images, labels = batch["image"], batch["label"]
            outputs = model(images)
            total_accuracy += (outputs.argmax(1) == labels).sum().item()
    return {"score": total_accuracy / dataset.count()}


def train_func(config: dict) -> None:
    images, labels = synthetic_images(256, seed=1)
    x, y = torch.from_numpy(images), torch.from_numpy(labels)
    epochs = range(config.get("epochs", 2))
    model = ray.train.torch.prepare_model(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    rank = ray.train.get_context().get_world_rank()
    for epoch in epochs:
        loss = nn.functional.cross_entropy(model(x), y)  # training step
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0:
            training_metrics = {"loss": loss.item(), "epoch": epoch}
            local_checkpoint_dir = tempfile.mkdtemp()
            torch.save(
                model.module.state_dict(),
                os.path.join(local_checkpoint_dir, "model.pt"),
            )
            ray.train.report(
                training_metrics,
                checkpoint=ray.train.Checkpoint.from_directory(local_checkpoint_dir),
                checkpoint_upload_mode=ray.train.CheckpointUploadMode.ASYNC,
                validation=ValidationTaskConfig(fn_kwargs={
                    "dataset": config["validation_dataset"],
                    "train_run_name": ray.train.get_context().get_experiment_name(),
                    "epoch": epoch,
                }),
            )
        else:
            ray.train.report({}, None)


# ---- the checkpoint guide --------------------------------------------------------------------


def checkpoint_guide_train_func(config):
    n = 100
    # create a toy dataset
    # data : X - dim = (n, 4)
    # target : Y - dim = (n, 1)
    X = torch.Tensor(np.random.normal(0, 1, size=(n, 4)))
    Y = torch.Tensor(np.random.uniform(0, 1, size=(n, 1)))
    # toy neural network : 1-layer
    # Wrap the model in DDP
    model = ray.train.torch.prepare_model(nn.Linear(4, 1))
    criterion = nn.MSELoss()
    optimizer = Adam(model.parameters(), lr=3e-4)
    for epoch in range(config["num_epochs"]):
        y = model.forward(X)
        loss = criterion(y, Y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        metrics = {"loss": loss.item()}
        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            checkpoint = None
            should_checkpoint = epoch % config.get("checkpoint_freq", 1) == 0
            # In standard DDP training, where the model is the same across all ranks,
            # only the global rank 0 worker needs to save and report the checkpoint
            if train.get_context().get_world_rank() == 0 and should_checkpoint:
                torch.save(
                    model.module.state_dict(),  # NOTE: Unwrap the model.
                    os.path.join(temp_checkpoint_dir, "model.pt"),
                )
                checkpoint = Checkpoint.from_directory(temp_checkpoint_dir)
            train.report(metrics, checkpoint=checkpoint)
