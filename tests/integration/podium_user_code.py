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
        time.sleep(float(config.get("epoch_s", 0)))  # a longer epoch, for tests that act while training runs
        if epoch == config.get("raise_at_epoch"):
            _check_batch(epoch)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if ray.train.get_context().get_world_rank() == 0:
                torch.save({"model": model.state_dict(), "epoch": epoch}, os.path.join(tmp, "state.pt"))
                if config.get("pad_bytes"):  # a bigger checkpoint, for tests of space running out
                    with open(os.path.join(tmp, "pad.bin"), "wb") as f:
                        f.write(os.urandom(int(config["pad_bytes"])))
                checkpoint = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report({"loss": loss.item(), "epoch": epoch}, checkpoint=checkpoint)


def _check_batch(epoch: int) -> None:
    raise ValueError(f"bad batch at epoch {epoch}")


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
    time.sleep(_sleep_s(config))
    if config.get("none_epoch") is not None and epoch == int(config["none_epoch"]):
        return None  # type: ignore[return-value]  # a function that forgot its `return`, for one epoch
    if config.get("scores") is not None:  # the score of each epoch, as the test wants them
        return {"score": float(config["scores"][epoch])}
    if config.get("plateau_from") is not None:  # a score that improves each epoch until then, and no more
        return {"score": float(min(epoch, int(config["plateau_from"])))}
    return {"score": -mse}


def _sleep_s(config: dict) -> float:
    """How long a validation sleeps: `sleep_s_file`'s content, read at each call (a test changes it while a run
    validates: slow while it acts, quick once it is done), or else `sleep_s`."""
    if config.get("sleep_s_file"):
        with open(config["sleep_s_file"]) as f:
            return float(f.read().strip() or 0)
    return float(config.get("sleep_s", 0))


def _features(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of columns from Ray Data: every column but the label, stacked, and the label."""
    x = torch.stack([batch[k].float() for k in sorted(batch) if k != "label"], dim=1)
    return x, batch["label"].long()


def train_func_with_datasets(config: dict) -> None:
    """Ray's data-ingest pattern: the trainer's datasets, one shard per worker, iter_torch_batches."""
    train_shard = ray.train.get_dataset_shard("train")
    val_shard = ray.train.get_dataset_shard("val")
    torch.manual_seed(0)
    model = None
    for epoch in range(config.get("epochs", 2)):
        train_rows = val_rows = correct = 0
        for batch in train_shard.iter_torch_batches(batch_size=256):
            x, y = _features(batch)
            if model is None:
                model = nn.Linear(x.shape[1], 4)
                opt = torch.optim.Adam(model.parameters(), lr=0.05)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            train_rows += len(y)
        with torch.no_grad():
            for batch in val_shard.iter_torch_batches(batch_size=1024):
                x, y = _features(batch)
                correct += int((model(x).argmax(1) == y).sum())
                val_rows += len(y)
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if ray.train.get_context().get_world_rank() == 0:
                torch.save({"model": model.state_dict(), "epoch": epoch}, os.path.join(tmp, "softmax.pt"))
                checkpoint = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report({"epoch": epoch, "train_rows": train_rows, "val_rows": val_rows,
                              "accuracy": correct / max(val_rows, 1)}, checkpoint=checkpoint)


def validate_softmax(checkpoint: ray.train.Checkpoint, val_data: str, fail_epoch: int | None = None,
                     hang_epoch: int | None = None, none_epoch: int | None = None,
                     paths_log: str | None = None) -> dict:
    """Accuracy of train_func_with_datasets' model on the validation Parquet file. For the epochs named, it
    fails, hangs, or forgets its `return`, as a user's validation function may; `paths_log` gets each path it
    was given."""
    import pyarrow.parquet as pq

    table = pq.read_table(val_data)
    x = torch.stack([torch.from_numpy(table.column(k).to_numpy().copy()).float()
                     for k in sorted(table.column_names) if k != "label"], dim=1)
    y = torch.from_numpy(table.column("label").to_numpy().copy())
    with checkpoint.as_directory() as d:
        state = torch.load(os.path.join(d, "softmax.pt"), weights_only=True)
    if paths_log:
        with open(paths_log, "a") as f:
            f.write(f"{checkpoint.path}\n")
    epoch = int(state["epoch"])
    if epoch == fail_epoch:
        raise RuntimeError(f"validation data unavailable for epoch {epoch}")
    if epoch == hang_epoch:
        time.sleep(3600)
    if epoch == none_epoch:
        return None  # type: ignore[return-value]  # a function that forgot its `return`, for one epoch
    model = nn.Linear(x.shape[1], 4)
    model.load_state_dict(state["model"])
    with torch.no_grad():
        return {"accuracy": float((model(x).argmax(1) == y).float().mean())}


def validate_returns_none(checkpoint: ray.train.Checkpoint, config: dict) -> None:
    """A validation function that forgot its `return`."""
    validate_fn(checkpoint, config)
