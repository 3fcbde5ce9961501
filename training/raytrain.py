"""Every direct use of Ray Train's V2 APIs (marked alpha) lives here.

Tested with ray 2.60.0. On the controller, a `ReportCallback`'s `after_report` runs once all
workers have reported and the checkpoint is persisted: the moment podium announces it. On each
worker, a `WorkerCallback` installs podium's `TrainFnUtils` (Ray's documented seam for changing
what the user-facing `ray.train.report` does) so that the `validation=` of every report reaches
podium instead of Ray's own validation manager (see `ReportCapture`).
"""

from __future__ import annotations

import importlib.abc
import inspect
import json
import logging
import os
import sys
from collections.abc import Callable, Collection
from typing import Any, cast

import pyarrow.fs as pafs
import ray
import ray.train
from ray.train import CheckpointConfig, CheckpointUploadMode, FailureConfig, RunConfig, ValidationTaskConfig
from ray.train.v2._internal.execution.callback import ControllerCallback, ReportCallback, WorkerCallback
from ray.train.v2._internal.execution.context import get_train_context
from ray.train.v2._internal.execution.train_fn_utils import DistributedTrainFnUtils, set_train_fn_utils
from ray.util.queue import Queue

from podium.core.events import (
    CheckpointEvent,
    EventSink,
    TrainingRestart,
    TrainingStarted,
    ValidationRequest,
    numeric_metrics,
    step_of,
)
from podium.core.failures import describe_failure
from podium.settings import count_start
from podium.storage.locations import arrow_filesystem, join, normalize_location, persisted_uri
from podium.training.cluster import (  # noqa: F401  (moved to cluster.py; the names stay importable here)
    DEFAULT_POLL_INTERVAL_S,
    POLL_INTERVAL_ENV,
    code_roots,
    ensure_ray,
)
from podium.training.ingest import dataset_config, podium_data_context, read_parquet_dataset

logger = logging.getLogger(__name__)


class RayQueueSink:
    """Puts announcements on a Ray queue actor that the orchestrating process reads."""

    def __init__(self, queue: Queue):
        self.queue = queue

    def put(self, event: CheckpointEvent | TrainingRestart | TrainingStarted) -> None:
        """Enqueue without blocking the controller. The event goes as it is (pickled by Ray): its
        validation request may hold a Ray Dataset, which travels by reference."""
        self.queue.put_nowait(event)


class _NotStated:
    """The default of `ray.train.report`'s `validation` in podium's workers: falsy like Ray's own
    default `False`, but tells "the report said nothing" from `validation=False`."""

    def __bool__(self) -> bool:
        return False


NOT_STATED = _NotStated()


class _ReportedValidation:
    """What a report asked of validation, as Ray Train carries it from the worker to the controller.

    Falsy, so that Ray's own machinery (the "validation_config was not set" check, the checkpoint
    manager's pending validations and its JSON snapshot) sees a report that asks for no validation
    of its own; podium's `CheckpointAnnouncer` reads the request on the controller."""

    def __init__(self, request: ValidationRequest, report_index: int):
        self.request, self.report_index = request, report_index

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:  # Ray logs every report: keep fn_kwargs (a dataset) out of its lines
        return f"<podium: {self.request.describe()}>"


def validation_request(validation: Any) -> ValidationRequest:
    """What `ray.train.report(..., validation=...)` asked, as podium's request."""
    if isinstance(validation, ValidationTaskConfig):
        return ValidationRequest(requested=True, stated=True, fn_kwargs=dict(validation.fn_kwargs or {}),
                                 timeout_s=validation.timeout_s)
    if validation is NOT_STATED:
        return ValidationRequest()
    return ValidationRequest(requested=bool(validation), stated=True)


class PodiumTrainFnUtils(DistributedTrainFnUtils):
    """`ray.train.report` in podium's workers: Ray's own report, with `validation=` handed to podium."""

    def report(self, metrics: dict[str, Any], checkpoint: Any = None, checkpoint_dir_name: str | None = None,
               checkpoint_upload_mode: Any = CheckpointUploadMode.SYNC,
               delete_local_checkpoint_after_upload: bool | None = None,
               checkpoint_upload_fn: Callable[..., Any] | None = None, validation: Any = False) -> None:
        """Report as Ray does; a checkpoint's validation request rides along, for podium's controller hook."""
        carried: Any = False
        if checkpoint is not None:
            # the index this report gets in the run: Ray Train counts reports across worker-group
            # restarts and reruns (its run snapshot keeps the count), so it names the report uniquely
            carried = _ReportedValidation(validation_request(validation), get_train_context().report_call_index + 1)
        super().report(metrics, checkpoint, checkpoint_dir_name, checkpoint_upload_mode,
                       delete_local_checkpoint_after_upload, checkpoint_upload_fn, carried)


def _validation_default_to_not_stated(fn: Any) -> None:
    """Replace a function's `validation` default of False by NOT_STATED (nothing else changes)."""
    fn = inspect.unwrap(fn)
    names = list(inspect.signature(fn).parameters)
    defaults = list(fn.__defaults__ or ())
    if "validation" not in names:
        return
    i = names.index("validation") - (len(names) - len(defaults))
    if 0 <= i < len(defaults) and defaults[i] is False:
        defaults[i] = NOT_STATED
        fn.__defaults__ = tuple(defaults)


def _default_validation_to_not_stated() -> None:
    """Make `ray.train.report`'s `validation` default NOT_STATED in this (worker) process.

    Ray passes `validation=` on to TrainFnUtils explicitly, so its default is the only way to tell
    a report that said nothing from one that said `validation=False`. Left alone (and so read as
    not stated, i.e. validated) if Ray's signature is not the one podium was tested with."""
    _validation_default_to_not_stated(ray.train.report)


# Ray's framework callbacks that pass `validation=self.validation` to every report, with a constructor
# default of False: module -> class. Lightning's (Ray 2.60) does; Transformers' passes no `validation=`.
FRAMEWORK_CALLBACKS = {"ray.train.lightning._lightning_utils": "RayTrainReportCallback"}


def _callback_validation_to_not_stated(module: Any) -> None:
    """Make the `validation` default of a framework callback's constructor NOT_STATED.

    `RayTrainReportCallback()`, as Ray's Lightning guide writes it, then reports "not stated" (podium
    validates every checkpoint), and only `RayTrainReportCallback(validation=False)`, written in the
    user's own code, opts out. Left alone if the constructor is not the one podium was tested with."""
    cls = getattr(module, FRAMEWORK_CALLBACKS.get(module.__name__, ""), None)
    if cls is not None:
        _validation_default_to_not_stated(cls.__init__)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Applies `_callback_validation_to_not_stated` to a framework callback's module when the user's
    loop imports it (importing Lightning in every worker only to patch it would cost seconds)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in FRAMEWORK_CALLBACKS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    """The module's own loader, patching the module once it has run."""

    def __init__(self, loader: Any):
        self.loader = loader

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... (tracebacks, inspect)
        return getattr(self.loader, name)

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        _callback_validation_to_not_stated(module)


def _framework_callbacks_to_not_stated() -> None:
    """Patch the framework callbacks already imported in this (worker) process, and those imported later."""
    for name in FRAMEWORK_CALLBACKS:
        if name in sys.modules:
            _callback_validation_to_not_stated(sys.modules[name])
    if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


class ReportCapture(WorkerCallback):
    """Runs in every training worker before the user's loop: installs PodiumTrainFnUtils."""

    def after_init_train_context(self) -> None:
        """Called by Ray Train once the worker's train context is set."""
        _default_validation_to_not_stated()
        _framework_callbacks_to_not_stated()
        set_train_fn_utils(PodiumTrainFnUtils())


class CheckpointAnnouncer(ReportCallback, ControllerCallback):
    """Ray Train callback: announces every report, each persisted checkpoint, and every restart of
    the worker group, to its sinks (on the controller).

    A report's step is the first step-like metric it carries (`step_of`), else its index in the
    run: Ray Train's count of reports, which goes on across worker-group restarts and reruns.
    `step_base` (the run's last recorded step) starts the count where that index is not known.
    `storage`, the location Ray Train's storage_path and storage_filesystem came from, names the checkpoints as
    the user spelled it (without it, Ray's filesystem does, which a filesystem of your own cannot).
    """

    def __init__(self, run_name: str, sinks: list[EventSink], step_base: int = 0, announce_controller: bool = False,
                 storage: str | None = None):
        self.run_name = run_name
        self.storage = storage
        self.sinks = sinks
        self._index = step_base
        self._restarts = 0
        self.announce_controller = announce_controller  # the orchestrating process's own queue: it may stop training

    def after_controller_start(self, train_run_context: Any) -> None:
        """Called on the controller when it starts: with `announce_controller`, hand its actor handle to
        the sinks, so that the process that started training can stop it cleanly (`abort_training`)."""
        if self.announce_controller:
            controller = ray.get_runtime_context().current_actor
            self._announce(TrainingStarted(run_name=self.run_name, controller=controller))  # type: ignore[arg-type]

    def after_report(self, training_report: Any, metrics: list[dict[str, Any]]) -> None:
        """Called on the controller after a report; rank 0's metrics go with the checkpoint."""
        checkpoint, validation = training_report.checkpoint, training_report.validation
        if isinstance(validation, _ReportedValidation):
            self._index = validation.report_index
            request: ValidationRequest | None = validation.request
        else:  # a job of its own, without ReportCapture: Ray's own value, if any
            self._index += 1
            request = validation_request(validation) if checkpoint is not None and validation else None
        rank0 = metrics[0] if metrics else {}
        event = CheckpointEvent(
            run_name=self.run_name,
            step=step_of(rank0, self._index),
            epoch=int(rank0["epoch"]) if isinstance(rank0.get("epoch"), (int, float)) else None,
            metrics=numeric_metrics(rank0),
            checkpoint_uri=persisted_uri(checkpoint.filesystem, checkpoint.path, self.storage,
                                         f"{self.run_name}/{os.path.basename(checkpoint.path.rstrip('/'))}")
            if checkpoint else None,
            checkpoint_name=os.path.basename(checkpoint.path.rstrip("/")) if checkpoint else None,
            validation=request,
        )
        self._announce(event)

    def after_controller_state_update(self, previous_state: Any, current_state: Any) -> None:
        """Announce a restart of the worker group after a failure, with its cause."""
        if type(current_state).__name__ not in ("RestartingState", "ReschedulingState"):
            return
        self._restarts += 1
        self._announce(TrainingRestart(run_name=self.run_name, restart=self._restarts,
                                       cause=describe_failure(getattr(current_state, "training_failed_error", None))))

    def _announce(self, event: CheckpointEvent | TrainingRestart | TrainingStarted) -> None:
        for sink in self.sinks:
            try:
                sink.put(event)
            except Exception:  # an announcement must never stop training
                logger.exception("checkpoint sink %r failed for %r", sink, event)


def abort_training(controller: Any, timeout_s: float = 30.0) -> None:
    """Stop a training run cleanly, as Ray Train's own Ctrl-C handler does: its controller aborts the
    worker group (a checkpoint being uploaded is not registered) and exits, and `fit()` returns with an
    error in the thread that waits on it. Checkpoints already persisted stay for the resume."""
    try:
        ray.get(controller.abort.remote(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        logger.warning("Ray Train's controller did not abort in %g s: killed", timeout_s)
        ray.kill(controller)
    except ray.exceptions.RayActorError:
        pass  # it exits as it aborts: the answer to the call is its death


def open_event_queue() -> Queue:
    """A Ray queue actor for announcements (lives as long as this driver)."""
    return Queue(actor_options={"num_cpus": 0})


class EventReader:
    """Reads the announcements on an event queue (`open_event_queue`), in the driver.

    One `get` waits in the queue's actor at a time, and the driver waits on its answer locally (`ray.wait`): a
    poll that finds nothing makes no call to the actor. Asking the actor at every poll (`Queue.get` with a
    timeout, 5 polls a second) cost the driver and the actor together about 2.3 CPU-s per minute of training on
    the 2-core dev machine, each empty answer an `Empty` raised in the actor and raised again here; waiting
    on one call costs about 0.8 (most of it the actor's idle process)."""

    def __init__(self, queue: Queue):
        self.queue = queue
        self._waiting: Any = None  # the ObjectRef of the `get` waiting in the actor, if one is

    def drain(self, timeout: float) -> list[CheckpointEvent | TrainingRestart | TrainingStarted]:
        """Wait up to `timeout` for one announcement, then take every other one already there."""
        if self._waiting is None:
            actor: Any = self.queue.actor  # what `Queue.get(block=True)` sends, without waiting on its answer here
            self._waiting = actor.get.remote(None)
        ready, _ = ray.wait([self._waiting], timeout=timeout)
        if not ready:
            return []
        first, self._waiting = self._waiting, None
        items = [ray.get(first)]
        there = self.queue.size()  # one reader: these are there to take
        if there:
            items.extend(self.queue.get_nowait_batch(there))
        return items

    def close(self) -> None:
        """Stop the queue's actor, its waiting `get` answered first: an actor with a call still running is
        given its grace period (5 s) before it is killed. What was not read goes with it."""
        waiting, self._waiting = self._waiting, None
        try:
            if waiting is not None:
                self.queue.put_nowait(None)  # the answer the waiting `get` takes, or one left unread
                ray.get(waiting, timeout=5.0)
        finally:
            self.queue.shutdown()


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
    loop_datasets: dict[str, str] | None = None,
    datasets: dict[str, Any] | None = None,
    data_cpus: float = 1.0,
) -> None:
    """Run a TorchTrainer to completion; same run name and storage resume from the latest checkpoint.

    `loop_datasets` ({key: Parquet location}) become Ray Datasets in the loop's config under their
    keys, read here, in the process that trains: the config and every record hold only locations.
    `datasets` (Ray Datasets by name) are the trainer's: split across the workers
    (`ray.train.get_dataset_shard`), Ray Data using at most `data_cpus` CPUs.
    Every worker runs podium's ReportCapture, so reports' `validation=` reach the announcer."""
    from ray.train.torch import TorchTrainer  # torch loads here, in the process that trains, not on import


    forget_deleted_checkpoints(storage, run_name)  # a resume after checkpoints.keep deleted some
    fs, path = arrow_filesystem(storage)
    in_config = {key: read_parquet_dataset(normalize_location(uri)) for key, uri in (loop_datasets or {}).items()}
    trainer = TorchTrainer(
        train_loop_per_worker=train_loop,
        train_loop_config={**loop_config, **in_config},
        scaling_config=ray.train.ScalingConfig(
            num_workers=num_workers, use_gpu=use_gpu, resources_per_worker={"CPU": cpus_per_worker}
        ),
        run_config=RunConfig(
            name=run_name,
            storage_path=path,
            storage_filesystem=fs,
            callbacks=[cast(Any, ReportCapture()), *callbacks],
            failure_config=FailureConfig(max_failures=max_failures),
            # keep every checkpoint: promotion may pick any of them
            checkpoint_config=CheckpointConfig(num_to_keep=None),
        ),
        datasets=datasets or None,
        dataset_config=dataset_config(data_cpus) if datasets else None,
    )
    count_start("ray_train")  # counted in the process that starts it, which knows the test that asked
    with podium_data_context(data_cpus):  # Ray Train copies Ray Data's context for the workers when fit starts
        trainer.fit()


def user_failures(error: BaseException) -> list[tuple[int, BaseException, str]]:
    """(rank, the user's exception, the traceback as Ray Train reported it) for each worker whose loop
    raised (Ray Train's WorkerGroupError: `worker_failures` holds the user's exceptions, its message their
    tracebacks); empty for other failures, and for workers that died rather than raised."""
    failures = getattr(error, "worker_failures", None)
    if not isinstance(failures, dict):
        return []
    text = str(getattr(error, "_error_message", "") or error)
    out = []
    for rank, exc in sorted(failures.items()):
        exc = getattr(exc, "_base_exc", exc)  # older releases kept the wrapper
        if isinstance(exc, ray.exceptions.RayError) or not isinstance(exc, BaseException):
            continue  # a worker process that died, a lost node: not the user's code
        out.append((int(rank), exc, first_traceback(text)))
    return out


def first_traceback(text: str) -> str:
    """The first Python traceback in a text (Ray Train's error message groups the ranks' tracebacks)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")), None)
    if start is None:
        return text.strip()
    end = start + 1
    while end < len(lines) and lines[end].strip() and not lines[end].startswith("[Rank"):
        end += 1
    return "\n".join(lines[start:end])


def checkpoint_at(uri: str) -> ray.train.Checkpoint:
    """A Ray Checkpoint for a path or URI (downloaded lazily by `as_directory`)."""
    fs, path = arrow_filesystem(uri)
    return ray.train.Checkpoint(path=path, filesystem=fs)


SNAPSHOT = "checkpoint_manager_snapshot.json"


def _read_snapshot(storage: str, run_name: str) -> tuple[Any, str, dict[str, Any] | None]:
    """Ray Train's run snapshot of `run_name` (None if there is none yet), with the filesystem and path it is under."""
    fs, path = arrow_filesystem(join(storage, run_name))
    try:
        with fs.open_input_stream(f"{path}/{SNAPSHOT}") as f:
            return fs, path, json.loads(f.read().decode())
    except (FileNotFoundError, OSError):
        return fs, path, None


def forget_deleted_checkpoints(storage: str, run_name: str) -> list[str]:
    """Before a resume: drop from Ray Train's run snapshot the checkpoints whose folders are gone, as Ray Train's
    own `num_to_keep` eviction does, and return their folder names. checkpoints.keep deletes checkpoints Ray Train
    never evicted, and Ray Train refuses to resume a run whose snapshot names a missing checkpoint
    (CheckpointManagerInitializationError: "a corrupted run directory"). The report indices of the checkpoints
    kept stay as they were: podium's step numbers come from them."""
    fs, path, snapshot = _read_snapshot(storage, run_name)
    if snapshot is None:
        return []
    results, indices = snapshot.get("checkpoint_results", []), snapshot.get("checkpoint_report_indices", [])
    present = [i for i, r in enumerate(results)
               if fs.get_file_info(f"{path}/{r['checkpoint_dir_name']}").type != pafs.FileType.NotFound]
    if len(present) == len(results):
        return []
    gone = [r["checkpoint_dir_name"] for i, r in enumerate(results) if i not in present]
    kept = {results[i]["checkpoint_dir_name"] for i in present}
    snapshot["checkpoint_results"] = [results[i] for i in present]
    snapshot["checkpoint_report_indices"] = [indices[i] for i in present if i < len(indices)]
    pending = [(t, v) for t, v in zip(snapshot.get("pending_training_results", []),
                                      snapshot.get("pending_validation_specs", [])) if t["checkpoint_dir_name"] in kept]
    snapshot["pending_training_results"] = [t for t, _ in pending]
    snapshot["pending_validation_specs"] = [v for _, v in pending]
    for key in ("validated_checkpoint_dir_names", "timed_out_validation_checkpoint_dir_names",
                "failed_validation_checkpoint_dir_names"):
        if key in snapshot:
            snapshot[key] = [name for name in snapshot[key] if name in kept]
    latest = snapshot.get("latest_checkpoint_result")
    if latest and latest["checkpoint_dir_name"] not in kept:
        snapshot["latest_checkpoint_result"] = snapshot["checkpoint_results"][-1] if present else None
    staged = f"{path}/{SNAPSHOT}.podium-tmp"  # written whole, then moved over the old one
    with fs.open_output_stream(staged) as f:
        f.write(json.dumps(snapshot).encode())
    fs.move(staged, f"{path}/{SNAPSHOT}")
    logger.info("run %s: Ray Train's snapshot forgets %d deleted checkpoint(s) (checkpoints.keep)", run_name, len(gone))
    return gone


def remove_unregistered_checkpoints(storage: str, run_name: str, announced: Collection[str] = ()) -> list[str]:
    """After training was aborted: delete the run's `checkpoint_*` folders that Ray Train's run snapshot does not
    name (registered or pending), nor `announced` (folder names the run has records of). An abort lands while a
    checkpoint is uploaded: its folder is written but never registered, announced or recorded. Returns their
    names; nothing is removed without a snapshot to compare."""
    fs, path, snapshot = _read_snapshot(storage, run_name)
    if snapshot is None:
        return []
    named = {r["checkpoint_dir_name"] for key in ("checkpoint_results", "pending_training_results")
             for r in snapshot.get(key) or []} | set(announced)
    found = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    orphans = sorted(info.base_name for info in found if info.type == pafs.FileType.Directory
                     and info.base_name.startswith("checkpoint_") and info.base_name not in named)
    for name in orphans:
        fs.delete_dir(f"{path}/{name}")
        logger.info("run %s: removed %s, a checkpoint folder Ray Train never registered (training aborted)",
                    run_name, name)
    return orphans


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
    results = snapshot.get("checkpoint_results", [])
    # a report's index in the run, as the announcer numbers step-less reports (0-based in the snapshot)
    indices = snapshot.get("checkpoint_report_indices") or range(len(results))
    for index, result in zip(indices, results):
        name = result["checkpoint_dir_name"]
        metrics = result.get("metrics", {})
        epoch = metrics.get("epoch")
        events.append(CheckpointEvent(
            run_name=run_name, step=step_of(metrics, int(index) + 1), metrics=numeric_metrics(metrics),
            epoch=int(epoch) if isinstance(epoch, (int, float)) else None,
            checkpoint_uri=persisted_uri(fs, f"{path}/{name}", run_dir, name), checkpoint_name=name))
    return events
