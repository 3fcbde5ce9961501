"""The built-in train_loop_per_worker: an MLP on Parquet features, written against plain Ray Train APIs.

It checkpoints from rank 0 every epoch (or every N steps), resumes from
`ray.train.get_checkpoint()`, and reports training metrics with each checkpoint.
"""

from __future__ import annotations

import logging
import tempfile
from typing import Any

import numpy as np
import ray.train
import ray.train.torch
import torch
from torch import nn

from podium.training.checkpoint import CheckpointMeta, load_training_state, save_checkpoint
from podium.training.data import load_arrays, open_dataset
from podium.training.model import ModelSpec, build_model
from podium.training.preprocessing import FeatureStats, compute_feature_stats

logger = logging.getLogger(__name__)


def checkpoint_dir_name(step: int) -> str:
    """Directory name of the checkpoint at `step`; zero-padded so names sort by step."""
    return f"checkpoint_{step:08d}"


def _all_reduce(values: list[float], op: str = "sum") -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        reduce_op = torch.distributed.ReduceOp.MAX if op == "max" else torch.distributed.ReduceOp.SUM
        torch.distributed.all_reduce(t, op=reduce_op)
    return t.tolist()


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Train the built-in MLP; `config` is PipelineConfig's training section plus data facts.

    Keys: train_data, label_column, feature_columns, num_classes, epochs, batch_size,
    learning_rate, hidden_size, checkpoint_every_steps, seed, torch_threads, standardize and
    feature_stats (podium computes them once, before training; a loop started without them
    computes them itself).
    """
    torch.set_num_threads(int(config.get("torch_threads", 1)))
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.manual_seed(int(config["seed"]))

    x_np, y_np = load_arrays(config["train_data"], config["label_column"], config["feature_columns"], rank, world)
    x, y = torch.from_numpy(x_np), torch.from_numpy(y_np)
    spec = ModelSpec(in_features=x.shape[1], num_classes=int(config["num_classes"]),
                     hidden_size=int(config["hidden_size"]), standardize=bool(config.get("standardize", False)))
    stats = _feature_stats(config) if spec.standardize else None
    model = build_model(spec, *((stats.mean, stats.scale) if stats else ()))
    optimizer = torch.optim.Adam(model.parameters(), lr=float(config["learning_rate"]))

    epochs, batch_size = int(config["epochs"]), int(config["batch_size"])
    every = config.get("checkpoint_every_steps")
    # every worker must take the same number of steps (DDP): shards differ by at most one row
    steps_per_epoch = int(_all_reduce([max(1.0, float(-(-len(x) // batch_size)))], op="max")[0])

    start_step = 0
    resume = ray.train.get_checkpoint()
    if resume is not None:
        with resume.as_directory() as d:
            start_step = load_training_state(d, model, optimizer).step
        logger.info("rank %d resumed from step %d", rank, start_step)
    model = ray.train.torch.prepare_model(model)

    step = start_step
    loss_sum = correct = seen = 0.0
    last_saved = start_step
    for epoch in range(step // steps_per_epoch, epochs):
        model.train()
        order = np.random.default_rng(int(config["seed"]) + epoch).permutation(len(x))
        for b in range(step - epoch * steps_per_epoch, steps_per_epoch):
            idx = torch.from_numpy(order[b * batch_size : (b + 1) * batch_size])
            if len(idx) == 0:  # a shorter shard: still take the step so DDP stays in lockstep
                idx = torch.from_numpy(order[:batch_size])
            logits = model(x[idx])
            loss = nn.functional.cross_entropy(logits, y[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            loss_sum += loss.item() * len(idx)
            correct += (logits.argmax(1) == y[idx]).sum().item()
            seen += len(idx)
            end_of_epoch = b == steps_per_epoch - 1
            due = (step % every == 0) if every else end_of_epoch
            last = epoch == epochs - 1 and end_of_epoch
            if due or (last and step != last_saved):
                ls, c, n = _all_reduce([loss_sum, correct, seen])
                metrics = {"loss": ls / max(n, 1), "accuracy": c / max(n, 1),
                           "epoch": epoch + (1 if end_of_epoch else 0), "step": step}
                _report_checkpoint(model, optimizer, spec, metrics, config, rank)
                last_saved = step
                loss_sum = correct = seen = 0.0


def _feature_stats(config: dict[str, Any]) -> FeatureStats:
    """The training data's feature statistics: from the config, else computed here (every worker
    reads the same data, so every worker gets the same numbers)."""
    if config.get("feature_stats"):
        stats = FeatureStats.from_dict(config["feature_stats"])
        if stats.columns != list(config["feature_columns"]):
            raise ValueError(f"feature_stats are for columns {stats.columns}, the loop trains on "
                             f"{config['feature_columns']}")
        return stats
    return compute_feature_stats(open_dataset(config["train_data"]), list(config["feature_columns"]))


def _report_checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer, spec: ModelSpec,
                       metrics: dict[str, float], config: dict[str, Any], rank: int, **report_kwargs: Any) -> None:
    """Rank 0 writes the checkpoint; every rank calls report (it is a barrier).

    `report_kwargs` go to `ray.train.report` as they are (the benchmarks pass Ray's `validation`)."""
    step = int(metrics["step"])
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = None
        if rank == 0:
            wrapped = getattr(model, "module", None)  # DDP wraps the model
            inner = wrapped if isinstance(wrapped, nn.Module) else model
            meta = CheckpointMeta(model=spec, epoch=int(metrics["epoch"]), step=step, metrics=metrics,
                                  config={k: v for k, v in config.items() if _is_plain(v)},
                                  feature_columns=list(config["feature_columns"]),
                                  label_column=config["label_column"])
            save_checkpoint(tmp, inner, optimizer, meta)
            checkpoint = ray.train.Checkpoint.from_directory(tmp)
        ray.train.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=checkpoint_dir_name(step),
                         **report_kwargs)


def _is_plain(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool, list, dict))


__all__ = ["train_loop_per_worker", "checkpoint_dir_name"]
