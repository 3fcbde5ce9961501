"""Train loops for the comparison: podium's built-in loop with validation added in two ways.

Both wrap `training.loop.train_loop_per_worker` unchanged and replace only the
function it calls to report a checkpoint (`training.loop._report_checkpoint`, a
private name: this is benchmark code, pinned to the loop it measures), so the
training arithmetic, data order and checkpoint format are identical to (a) and podium.

(b) `train_loop_inline_validation`: after each checkpoint report, rank 0 runs the
    validation function on the persisted checkpoint, in the training process;
    other ranks wait for it at the next report (a barrier).
(c) `train_loop_ray_validation`: each checkpoint is reported with
    `validation=ValidationTaskConfig(...)`; Ray Train's controller runs the
    `ValidationConfig.fn` as a Ray task, one at a time (ray 2.60).
"""

from __future__ import annotations

import os
import time
from typing import Any

import ray.train
from ray.train import ValidationTaskConfig

import podium.training.loop as builtin
from benchmarks.workload import append_jsonl, validate_repeated

# kept before the variants below replace it in this worker
_report_checkpoint = builtin._report_checkpoint


def _save_and_report(model, optimizer, spec, metrics: dict[str, float], config: dict[str, Any], rank: int,
                     validation: bool | ValidationTaskConfig = False) -> None:
    """training.loop._report_checkpoint, plus the `validation` argument of ray.train.report."""
    _report_checkpoint(model, optimizer, spec, metrics, config, rank, validation=validation if rank == 0 else False)


def _finish(config: dict[str, Any]) -> None:
    if ray.train.get_context().get_world_rank() == 0:
        append_jsonl(config["bench_log"], {"kind": "loop_done", "t": time.time()})


def train_loop_inline_validation(config: dict[str, Any]) -> None:
    """(b) The built-in loop; after each checkpoint, rank 0 validates it synchronously and records the metrics."""
    vkw = dict(config["bench_validate_kwargs"])

    def report_then_validate(model, optimizer, spec, metrics, cfg, rank):
        _save_and_report(model, optimizer, spec, metrics, cfg, rank)
        if rank == 0:
            persisted = ray.train.get_checkpoint()  # the copy Ray Train just persisted to storage
            result = validate_repeated(persisted, step=int(metrics["step"]), **vkw)
            append_jsonl(cfg["bench_log"], {"kind": "recorded", "step": int(metrics["step"]),
                                            "checkpoint": os.path.basename(persisted.path.rstrip("/")),
                                            "path": persisted.path, "t": time.time(), "metrics": result})

    builtin._report_checkpoint = report_then_validate
    builtin.train_loop_per_worker(config)
    _finish(config)


def train_loop_ray_validation(config: dict[str, Any]) -> None:
    """(c) The built-in loop; each checkpoint is handed to Ray Train's own async validation."""

    def report_with_validation(model, optimizer, spec, metrics, cfg, rank):
        _save_and_report(model, optimizer, spec, metrics, cfg, rank,
                         validation=ValidationTaskConfig(fn_kwargs={"step": int(metrics["step"])}))

    builtin._report_checkpoint = report_with_validation
    builtin.train_loop_per_worker(config)
    _finish(config)


def train_loop_plain(config: dict[str, Any]) -> None:
    """(a) The built-in loop as is, plus the 'loop done' timestamp."""
    builtin.train_loop_per_worker(config)
    _finish(config)
