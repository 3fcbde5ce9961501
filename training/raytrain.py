"""Every direct use of Ray Train's V2 APIs (marked alpha) lives here.

Tested with ray 2.60.0: `ray.train.UserCallback.after_report` runs on the
controller once all workers have reported and the checkpoint is persisted,
which is the moment podium announces it.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
from collections.abc import Callable
from typing import Any

import ray
import ray.train
from ray.train import CheckpointConfig, FailureConfig, RunConfig, UserCallback
from ray.util.queue import Empty, Queue

from podium.imports import resolve_callable
from podium.storage.locations import arrow_filesystem, join, uri_of
from podium.training.cluster import (  # noqa: F401  (moved to cluster.py; the names stay importable here)
    DEFAULT_POLL_INTERVAL_S,
    POLL_INTERVAL_ENV,
    code_roots,
    ensure_ray,
    prewarm_validation_workers,
)
from podium.training.events import CheckpointEvent, EventSink, numeric_metrics, step_of

logger = logging.getLogger(__name__)


class RayQueueSink:
    """Puts announcements on a Ray queue actor that the orchestrating process reads."""

    def __init__(self, queue: Queue):
        self.queue = queue

    def put(self, event: CheckpointEvent) -> None:
        """Enqueue without blocking the controller."""
        self.queue.put_nowait(event.to_dict())


class CheckpointAnnouncer(UserCallback):
    """Ray Train callback: announces every report, and each persisted checkpoint, to its sinks."""

    def __init__(self, run_name: str, sinks: list[EventSink]):
        self.run_name = run_name
        self.sinks = sinks
        self._reports = 0

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        """Called on the controller after a report; rank 0's metrics go with the checkpoint."""
        self._reports += 1
        rank0 = metrics[0] if metrics else {}
        event = CheckpointEvent(
            run_name=self.run_name,
            step=step_of(rank0, self._reports),
            epoch=int(rank0["epoch"]) if isinstance(rank0.get("epoch"), (int, float)) else None,
            metrics=numeric_metrics(rank0),
            checkpoint_uri=uri_of(checkpoint.filesystem, checkpoint.path) if checkpoint else None,
            checkpoint_name=os.path.basename(checkpoint.path.rstrip("/")) if checkpoint else None,
        )
        for sink in self.sinks:
            try:
                sink.put(event)
            except Exception:  # an announcement must never stop training
                logger.exception("checkpoint sink %r failed for step %d", sink, event.step)


def open_event_queue() -> Queue:
    """A Ray queue actor for announcements (lives as long as this driver)."""
    return Queue(actor_options={"num_cpus": 0})


def drain(queue: Queue, timeout: float) -> list[CheckpointEvent]:
    """Wait up to `timeout` for one announcement, then take every other one already there."""
    try:
        first = queue.get(block=True, timeout=timeout)
    except Empty:
        return []
    items = [first]
    while True:
        try:
            items.append(queue.get_nowait())
        except Empty:
            break
    return [CheckpointEvent.from_dict(i) for i in items]


def fit(
    *,
    train_loop: Callable[[dict], None],
    loop_config: dict[str, Any],
    run_name: str,
    storage: str,
    num_workers: int,
    use_gpu: bool,
    cpus_per_worker: float,
    callbacks: list[Any],
    max_failures: int = 0,
) -> None:
    """Run a TorchTrainer to completion; same run name and storage resume from the latest checkpoint."""
    from ray.train.torch import TorchTrainer  # torch loads here, in the process that trains, not on import

    fs, path = arrow_filesystem(storage)
    trainer = TorchTrainer(
        train_loop_per_worker=train_loop,
        train_loop_config=loop_config,
        scaling_config=ray.train.ScalingConfig(
            num_workers=num_workers, use_gpu=use_gpu, resources_per_worker={"CPU": cpus_per_worker}
        ),
        run_config=RunConfig(
            name=run_name,
            storage_path=path,
            storage_filesystem=fs,
            callbacks=callbacks,
            failure_config=FailureConfig(max_failures=max_failures),
            # keep every checkpoint: promotion may pick any of them
            checkpoint_config=CheckpointConfig(num_to_keep=None),
        ),
    )
    trainer.fit()


def checkpoint_at(uri: str) -> ray.train.Checkpoint:
    """A Ray Checkpoint for a path or URI (downloaded lazily by `as_directory`)."""
    fs, path = arrow_filesystem(uri)
    return ray.train.Checkpoint(path=path, filesystem=fs)


def call_validation(fn_path: str, checkpoint_uri: str, kwargs: dict[str, Any]) -> dict[str, float]:
    """Import the validation function, call it on the checkpoint, check it returned a dict of numbers."""
    fn = resolve_callable(fn_path, "validation.fn")
    result = fn(checkpoint_at(checkpoint_uri), **select_kwargs(fn, kwargs))
    if not isinstance(result, dict):
        raise TypeError(f"validation function {fn_path} returned {type(result).__name__}, expected a dict")
    metrics = numeric_metrics(result)
    dropped = sorted(set(result) - set(metrics))
    if dropped:
        logger.warning("validation of %s: non-numeric metrics ignored: %s", checkpoint_uri, dropped)
    return metrics


def select_kwargs(fn: Callable[..., Any], offered: dict[str, Any]) -> dict[str, Any]:
    """The offered kwargs that `fn` accepts by name (all of them if it takes **kwargs)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return dict(offered)
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in offered.items() if k in names}


def validate_remote(
    fn_path: str,
    checkpoint_uri: str,
    kwargs: dict[str, Any],
    *,
    num_cpus: float,
    num_gpus: float,
    resources: dict[str, float],
    timeout_s: float,
) -> dict[str, float]:
    """Run the validation function as a Ray task with its own resource request; cancel it on timeout."""
    task = ray.remote(call_validation).options(
        num_cpus=num_cpus, num_gpus=num_gpus, resources=resources or None, max_retries=0,
        name=f"podium-validate:{os.path.basename(checkpoint_uri)}",
    )
    ref = task.remote(fn_path, checkpoint_uri, kwargs)
    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        ray.cancel(ref, force=True)
        raise TimeoutError(f"validation of {checkpoint_uri} took longer than {timeout_s:g} s") from None
    except ray.exceptions.RayTaskError as exc:
        # re-raise the user's own exception, not Ray's wrapper
        raise exc.as_instanceof_cause() from None


SNAPSHOT = "checkpoint_manager_snapshot.json"


def persisted_checkpoints(storage: str, run_name: str) -> list[CheckpointEvent]:
    """Every checkpoint Ray Train registered for this run (from its run snapshot), as announcements.

    Used to catch up after the orchestrating process was gone while checkpoints
    landed (a resumed run): the snapshot only lists fully persisted checkpoints.
    """
    run_dir = join(storage, run_name)
    fs, path = arrow_filesystem(run_dir)
    try:
        with fs.open_input_stream(f"{path}/{SNAPSHOT}") as f:
            snapshot = json.loads(f.read().decode())
    except (FileNotFoundError, OSError):
        return []
    events = []
    for i, result in enumerate(snapshot.get("checkpoint_results", []), start=1):
        name = result["checkpoint_dir_name"]
        metrics = result.get("metrics", {})
        epoch = metrics.get("epoch")
        events.append(CheckpointEvent(
            run_name=run_name, step=step_of(metrics, i), metrics=numeric_metrics(metrics),
            epoch=int(epoch) if isinstance(epoch, (int, float)) else None,
            checkpoint_uri=uri_of(fs, f"{path}/{name}"), checkpoint_name=name))
    return events
