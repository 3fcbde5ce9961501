"""The built-in train_loop_per_worker: an MLP on Parquet features, written against plain Ray Train APIs.

It reads its shard of the training data from Ray Data (`ray.train.get_dataset_shard("train")`, made
by `podium.training.ingest.builtin_datasets`), checkpoints from rank 0 every epoch (or every N
steps), resumes from `ray.train.get_checkpoint()`, and reports training metrics with each checkpoint.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import ray.train
import ray.train.torch
import torch
from ray.data.collate_fn import ArrowBatchCollateFn
from torch import nn

from podium.training.checkpoint import CheckpointMeta, load_training_state, save_checkpoint
from podium.training.ingest import TRAIN, chunk_rows, steps_per_epoch
from podium.training.model import ModelSpec, build_model
from podium.training.preprocessing import FeatureStats
from podium.training.stats import compute_data_stats

logger = logging.getLogger(__name__)
T = TypeVar("T")


def checkpoint_dir_name(step: int) -> str:
    """Directory name of the checkpoint at `step`; zero-padded so names sort by step."""
    return f"checkpoint_{step:08d}"


def _all_reduce(values: list[float], op: str = "sum") -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        reduce_op = torch.distributed.ReduceOp.MAX if op == "max" else torch.distributed.ReduceOp.SUM
        torch.distributed.all_reduce(t, op=reduce_op)
    return t.tolist()


class FeatureCollate(ArrowBatchCollateFn):
    """A chunk of rows from Ray Data (an Arrow table) as (features float32 [rows, F], labels int64 [rows])."""

    def __init__(self, feature_columns: list[str], label_column: str):
        self.feature_columns, self.label_column = list(feature_columns), label_column

    # Ray types the result as an unbound TypeVar (CollatedData): any concrete type is an 'override'
    def __call__(self, batch: pa.Table) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        """Stack the feature columns; runs in Ray Data's prefetch thread, beside the training step."""
        x = np.column_stack([batch.column(c).to_numpy(zero_copy_only=False) for c in self.feature_columns])
        y = batch.column(self.label_column).to_numpy(zero_copy_only=False)
        return torch.from_numpy(x.astype(np.float32, copy=False)), torch.from_numpy(y.astype(np.int64, copy=False))


def minibatches(shard: Any, config: dict[str, Any], epoch: int, rank: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of this worker's shard in `batch_size` batches.

    Rows come from Ray Data in chunks of `shuffle_window_rows` (rounded up to whole batches): one
    chunk is being trained on while the next is read, and with shuffling the rows of each chunk are
    taken in a random order (a new one each epoch)."""
    batch_size = int(config["batch_size"])
    chunk = chunk_rows(batch_size, int(config.get("shuffle_window_rows", 65536)))
    shuffle = config.get("shuffle", "local") != "none"
    generator = torch.Generator().manual_seed(int(config["seed"]) * 1_000_003 + epoch * 1009 + rank)
    collate = FeatureCollate(config["feature_columns"], config["label_column"])
    for x, y in shard.iter_torch_batches(batch_size=chunk, collate_fn=collate, prefetch_batches=1):
        order = torch.randperm(len(y), generator=generator) if shuffle else torch.arange(len(y))
        for start in range(0, len(y), batch_size):
            idx = order[start:start + batch_size]
            yield x[idx], y[idx]


def flag_last(items: Iterable[T]) -> Iterator[tuple[T, bool]]:
    """Each item with whether it is the last one (one item of lookahead)."""
    it = iter(items)
    try:
        current = next(it)
    except StopIteration:
        return
    for following in it:
        yield current, False
        current = following
    yield current, True


def train_shard() -> Any:
    """This worker's shard of the `train` dataset, with a clear error if the trainer was given none."""
    try:
        return ray.train.get_dataset_shard(TRAIN)
    except KeyError:
        raise RuntimeError("the built-in loop reads its data through Ray Data: pass "
                           "datasets=podium.training.ingest.builtin_datasets(loop_config, data_cpus) and "
                           "dataset_config=podium.training.ingest.dataset_config(data_cpus) to the TorchTrainer") from None


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Train the built-in MLP; `config` is PipelineConfig's training section plus data facts.

    Keys: train_data, train_rows, label_column, feature_columns, num_classes, epochs, batch_size,
    learning_rate, hidden_size, checkpoint_every_steps, seed, shuffle, shuffle_window_rows, cache,
    torch_threads, standardize and feature_stats (the training data's statistics: podium computes
    them once, before training, and saves them with the run; a loop started without them computes
    them itself).
    """
    torch.set_num_threads(int(config.get("torch_threads", 1)))
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.manual_seed(int(config["seed"]))

    shard = train_shard()
    spec = ModelSpec(in_features=len(config["feature_columns"]), num_classes=int(config["num_classes"]),
                     hidden_size=int(config["hidden_size"]), standardize=bool(config.get("standardize", False)))
    stats = _feature_stats(config) if spec.standardize else None
    model = build_model(spec, *((stats.mean, stats.scale) if stats else ()))
    optimizer = torch.optim.Adam(model.parameters(), lr=float(config["learning_rate"]))

    epochs, batch_size = int(config["epochs"]), int(config["batch_size"])
    every = config.get("checkpoint_every_steps")
    # every worker gets the same number of rows (Ray Train splits with equal=True), so the same number
    # of steps (DDP needs them in lockstep); the count places a resumed step in its epoch
    per_epoch = max(1, steps_per_epoch(int(config["train_rows"]), world, batch_size))

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
    for epoch in range(step // per_epoch, epochs):
        model.train()
        done = step - epoch * per_epoch  # batches of this epoch trained before the resume: passed over
        batches = 0
        for (xb, yb), end_of_epoch in flag_last(minibatches(shard, config, epoch, rank)):
            batches += 1
            if batches <= done:
                continue
            logits = model(xb)
            loss = nn.functional.cross_entropy(logits, yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            loss_sum += loss.item() * len(yb)
            correct += (logits.argmax(1) == yb).sum().item()
            seen += len(yb)
            due = (step % every == 0) if every else end_of_epoch
            last = epoch == epochs - 1 and end_of_epoch
            if due or (last and step != last_saved):
                ls, c, n = _all_reduce([loss_sum, correct, seen])
                metrics = {"loss": ls / max(n, 1), "accuracy": c / max(n, 1),
                           "epoch": epoch + (1 if end_of_epoch else 0), "step": step}
                _report_checkpoint(model, optimizer, spec, metrics, config, rank)
                last_saved = step
                loss_sum = correct = seen = 0.0
        if batches != per_epoch:  # the data changed since the run planned: resumed steps land elsewhere
            logger.warning("epoch %d took %d steps, %d expected from train_rows=%s", epoch, batches, per_epoch,
                           config["train_rows"])


def _feature_stats(config: dict[str, Any]) -> FeatureStats:
    """The training data's feature statistics: from the config, else computed here (one pass over the
    training data: every worker reads the same data, so every worker gets the same numbers)."""
    if config.get("feature_stats"):
        stats = FeatureStats.from_dict(config["feature_stats"])
        if stats.columns != list(config["feature_columns"]):
            raise ValueError(f"feature_stats are for columns {stats.columns}, the loop trains on "
                             f"{config['feature_columns']}")
        return stats

    return FeatureStats.from_dict(compute_data_stats(config["train_data"], list(config["feature_columns"])).to_dict())


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
