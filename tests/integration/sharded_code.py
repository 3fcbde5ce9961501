"""A user's loop for a model sharded across its workers, written only against plain Ray Train and torch APIs:
nothing here knows podium.

Two workers (Ray's TorchTrainer, gloo on the CPU) each hold half of every parameter with FSDP2's
`fully_shard` (it runs on the CPU with gloo in torch 2.13: no fallback to DDP was needed). Every epoch
every rank saves its shard with `torch.distributed.checkpoint.save` into a local folder of its own and
reports it, as Ray's checkpoint guide shows for distributed checkpointing: rank 0's folder holds
`__0_0.distcp` and the `.metadata`, rank 1's `__1_0.distcp`, and Ray merges them into one checkpoint
folder in storage. The validation function loads that folder in one process, with no process group.
"""

from __future__ import annotations

import tempfile

import pyarrow.parquet as pq
import ray.train
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

NUM_FEATURES = 16  # the synthetic dataset of the tests: f00..f15, labels 0..3
NUM_CLASSES = 4


class ShardedClassifier(nn.Module):
    """The model, built with no arguments (what a loader calls to consolidate a checkpoint into it)."""

    def __init__(self, num_features: int = NUM_FEATURES, num_classes: int = NUM_CLASSES, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(num_features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def read_table(path: str, label_column: str, feature_columns: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Features (float32, in order) and labels of a Parquet file."""
    table = pq.read_table(path, columns=[*feature_columns, label_column])
    x = torch.stack([torch.from_numpy(table.column(c).to_numpy()).float() for c in feature_columns], dim=1)
    return x, torch.from_numpy(table.column(label_column).to_numpy()).long()


def train_func(config: dict) -> None:
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    facts = config["podium"]
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    x, y = read_table(facts["train_data"], facts["label_column"], facts["feature_columns"])
    x, y = x[rank::world], y[rank::world]  # this worker's share of the rows

    torch.manual_seed(0)  # the same initial weights on every rank before sharding
    model = ShardedClassifier(num_features=x.shape[1])
    mesh = init_device_mesh("cpu", (world,))  # the process group Ray's TorchTrainer set up (gloo)
    for layer in model.net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=float(config.get("lr", 0.01)))
    batch_size = int(config.get("batch_size", 256))
    for epoch in range(int(config.get("epochs", 2))):
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(epoch))
        total = 0.0
        for start in range(0, len(y), batch_size):
            idx = order[start:start + batch_size]
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        model_state, optimizer_state = get_state_dict(model, opt)  # sharded (DTensor) state, no gather
        with tempfile.TemporaryDirectory() as tmp:
            dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=tmp)
            ray.train.report({"epoch": epoch, "train_loss": total / len(y)},
                             checkpoint=ray.train.Checkpoint.from_directory(tmp))


def validate_fn(checkpoint: ray.train.Checkpoint, val_data: str, label_column: str,
                feature_columns: list[str]) -> dict:
    """val_loss and val_accuracy of the sharded checkpoint, loaded in this one process (no process group)."""
    x, y = read_table(val_data, label_column, feature_columns)
    model = ShardedClassifier(num_features=x.shape[1])
    state = {"model": model.state_dict()}  # DCP loads into these tensors, reading every rank's shard
    with checkpoint.as_directory() as d:
        dcp.load(state, checkpoint_id=d, no_dist=True)
    model.load_state_dict(state["model"])
    model.eval()
    with torch.no_grad():
        logits = model(x)
    return {"val_loss": nn.functional.cross_entropy(logits, y).item(),
            "val_accuracy": (logits.argmax(1) == y).float().mean().item()}
