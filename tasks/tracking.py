"""MLflow records: one run per training run, one LoggedModel per checkpoint, the registry alias.

Workers use `MlflowClient` with explicit ids only: the fluent API would silently
create runs. Checkpoint status lives in the `podium.status` tag (searchable on
every backend) and in the LoggedModel status (READY / FAILED) for the UI.

A tracking server that stops answering is ridden out by MLflow's own HTTP retries,
with podium's settings (`HTTP_RETRY_DEFAULTS`); a call that still fails raises
`TrackingUnavailable`, which names the server and what was being recorded.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar

import requests
from mlflow.entities import LoggedModelStatus, Metric, Param
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.selection import FAILED, PENDING, VALIDATED, CheckpointRecord
from training.events import CheckpointEvent

logger = logging.getLogger(__name__)

TAG_RUN = "podium.run_name"
TAG_CHECKPOINT = "podium.checkpoint"
TAG_URI = "podium.checkpoint_uri"
TAG_STEP = "podium.step"
TAG_STATUS = "podium.status"
TAG_FAILURE = "podium.failure"
TAG_VALIDATED_AT = "podium.validated_at"
TAG_SERVED_URI = "podium.served_uri"
MAX_TAG = 4000

# MLflow's HTTP client retries refused connections, timeouts and 5xx answers, waiting
# factor * 2**(k-1) s before the k-th retry (none before the first), each attempt limited to
# the timeout. MLflow's defaults (7 retries, factor 2, 120 s) keep one write waiting over 4
# minutes on a server that refuses connections and about 20 minutes on one that hangs.
# podium's: attempts at 0, 0, 4, 12, 28 and 60 s (plus up to 1 s of jitter per wait), so a
# restart or network blip of up to about a minute is ridden out by every write, and a server
# that stays down fails the write after about 1 minute (connections refused) or 3 minutes
# (connections accepted but never answered: 6 attempts x 20 s + the waits). 20 s per attempt
# is far above what podium's small requests take, and a hang shorter than that costs no
# retry at all. Variables already set in the environment win.
HTTP_RETRY_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "5",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "2",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
}


def apply_http_retry_defaults() -> None:
    """Set podium's MLflow HTTP retry settings in this process, unless the environment has its own.

    MLflow reads them on every request, so this takes effect for clients already made."""
    for name, value in HTTP_RETRY_DEFAULTS.items():
        os.environ.setdefault(name, value)


class TrackingUnavailable(RuntimeError):
    """The tracking server did not answer, through all of MLflow's HTTP retries.

    Nothing was recorded by the call that raised it; the run can be resumed once the
    server answers again."""

    def __init__(self, tracking_uri: str, action: str, reason: str, waited_s: float):
        self.tracking_uri, self.action, self.reason, self.waited_s = tracking_uri, action, reason, waited_s
        super().__init__(f"MLflow tracking server {redact('tracking_uri', tracking_uri)} unreachable while "
                         f"{action}: gave up after {waited_s:.0f} s of retries ({reason})")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.tracking_uri, self.action, self.reason, self.waited_s))


# Transport failures leave MLflow's REST client as "API request to <url> failed with ...";
# answers the server did give (a missing run, a bad parameter) carry its error code instead.
_TRANSPORT_FAILURE = re.compile(r"^API request to \S+ failed with")
_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\")]+)")


def is_unreachable(exc: BaseException) -> bool:
    """Whether an MLflow client error means the server could not be reached (not an answer it gave)."""
    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        return exc.response.status_code >= 500  # an artifact upload the server refused is an answer
    if isinstance(exc, requests.RequestException):
        return True
    return isinstance(exc, MlflowException) and bool(_TRANSPORT_FAILURE.match(str(exc.message)))


def _short_reason(exc: BaseException) -> str:
    """The cause at the bottom of MLflow's nested transport error, in a few words."""
    text = str(getattr(exc, "message", exc))
    if m := _ERRNO.search(text):
        return m.group(1).strip()  # "Connection refused", "Name or service not known"
    if m := re.search(r"read timeout=([\d.]+)", text):
        return f"no answer within {m.group(1)} s"
    if m := re.search(r"too many (\d+) error responses", text):
        return f"answered {m.group(1)} every time"
    return text[:200]


@contextlib.contextmanager
def reaching_tracking(tracking_uri: str, action: str) -> Iterator[None]:
    """Turn a tracking server that could not be reached into `TrackingUnavailable`, naming it."""
    start = time.monotonic()
    try:
        yield
    except (MlflowException, requests.RequestException) as exc:
        if not is_unreachable(exc):
            raise
        raise TrackingUnavailable(tracking_uri, action, _short_reason(exc), time.monotonic() - start) from exc


_F = TypeVar("_F", bound=Callable[..., Any])


def _tracking_call(action: str) -> Callable[[_F], _F]:
    """Decorate a function whose first argument is a TrackingRun or a tracking URI (see reaching_tracking)."""
    def wrap(fn: _F) -> _F:
        @functools.wraps(fn)
        def call(target: Any, *args: Any, **kwargs: Any) -> Any:
            uri = target.tracking_uri if isinstance(target, TrackingRun) else str(target)
            with reaching_tracking(uri, action):
                return fn(target, *args, **kwargs)
        return call  # type: ignore[return-value]
    return wrap


def tracking_client(tracking_uri: str) -> MlflowClient:
    """An MlflowClient for this tracking URI (and the same registry), with podium's retry settings."""
    apply_http_retry_defaults()
    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


@dataclass(frozen=True)
class TrackingRun:
    """Where a podium run is recorded: passed between tasks instead of a client."""

    tracking_uri: str
    experiment_id: str
    run_id: str
    run_name: str

    def client(self) -> MlflowClient:
        """A client bound to this tracking URI (and the same registry)."""
        return tracking_client(self.tracking_uri)

    def run_url(self, ui: str) -> str:
        """Link to the run in an MLflow UI at base URL `ui`."""
        return f"{ui.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{self.run_id}"

    def models_url(self, ui: str) -> str:
        """Link to the experiment's model (checkpoint) comparison page."""
        return f"{ui.rstrip('/')}/#/experiments/{self.experiment_id}/models"


SECRET_KEY = re.compile(r"(secret|passw|token|credential|api[_-]?key|access[_-]?key|private[_-]?key)", re.I)
URI_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@\s]+@", re.I)


def redact(key: str, value: str) -> str:
    """Hide values of secret-looking keys and credentials embedded in URIs (user:password@host)."""
    if SECRET_KEY.search(key):
        return "***"
    return URI_USERINFO.sub(r"\g<scheme>***@", value)


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = redact(prefix, json.dumps(value) if isinstance(value, (list, tuple)) else str(value))


def flatten_params(config: dict[str, Any]) -> dict[str, str]:
    """Nested config -> MLflow params ('training.epochs': '5')."""
    out: dict[str, str] = {}
    _flatten("", config, out)
    return {k: v[:6000] for k, v in out.items()}


def _find_runs(client: MlflowClient, experiment_id: str, run_name: str) -> list[Any]:
    """The MLflow runs tagged with this podium run name, the one podium uses first.

    There is one, unless a create the HTTP client retried after a timeout landed more than
    once. Those copies share their start time (the client sets it), so the run podium uses
    is told apart by its params, logged right after the create: a copy that landed too late
    to be deleted has none."""
    runs = client.search_runs([experiment_id], filter_string=f"tags.`{TAG_RUN}` = '{run_name}'", max_results=100)
    return sorted(runs, key=lambda r: (not r.data.params, r.info.start_time or 0, r.info.run_id))


def _get_or_create_experiment(client: MlflowClient, name: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp:
        return exp.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException as exc:
        # a create retried after a timeout may have landed the first time
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return client.get_experiment_by_name(name).experiment_id


@_tracking_call("opening the run's MLflow run")
def open_tracking_run(tracking_uri: str, experiment: str, run_name: str, params: dict[str, Any]) -> TrackingRun:
    """Find the MLflow run of this podium run (same name: resumed), or create it; log config as params."""
    client = tracking_client(tracking_uri)
    experiment_id = _get_or_create_experiment(client, experiment)
    found = _find_runs(client, experiment_id, run_name)
    if found:
        run_id = found[0].info.run_id
        if found[0].info.status != "RUNNING":
            client.update_run(run_id, status="RUNNING")
    else:
        client.create_run(experiment_id, run_name=run_name, tags={TAG_RUN: run_name})
        # a create retried after a timeout can land twice (the server got both requests): keep the
        # first of them in `_find_runs` order, which the params logged below keep first, and
        # delete the others
        found = _find_runs(client, experiment_id, run_name)
        run_id = found[0].info.run_id
        for extra in found[1:]:
            logger.warning("run %s: deleting duplicate MLflow run %s (a retried create)", run_name, extra.info.run_id)
            client.delete_run(extra.info.run_id)
    flat = flatten_params(params)
    existing = client.get_run(run_id).data.params
    changed = {k: (existing[k], v) for k, v in flat.items() if k in existing and existing[k] != v}
    if changed:
        logger.warning("run %s resumed with changed config (MLflow keeps the first values): %s", run_name, changed)
    new = [(k, v) for k, v in flat.items() if k not in existing]
    for i in range(0, len(new), 100):
        client.log_batch(run_id, params=[Param(k, v) for k, v in new[i : i + 100]])
    return TrackingRun(tracking_uri, experiment_id, run_id, run_name)


@_tracking_call("closing the MLflow run")
def close_tracking_run(tr: TrackingRun, failed: bool = False) -> None:
    """Mark the MLflow run finished (or failed)."""
    tr.client().set_terminated(tr.run_id, status="FAILED" if failed else "FINISHED")


def _metrics(values: dict[str, float], step: int, model_id: str | None = None) -> list[Metric]:
    now = int(time.time() * 1000)
    # MLflow stores NaN/inf; keep them so the record shows what the function returned
    return [Metric(k, float(v), now, int(step), model_id=model_id) for k, v in sorted(values.items())]


@_tracking_call("logging training metrics")
def log_training_metrics(tr: TrackingRun, event: CheckpointEvent) -> None:
    """Training metrics of a report without a checkpoint, by step on the run."""
    if event.metrics:
        tr.client().log_batch(tr.run_id, metrics=_metrics(event.metrics, event.step))


def _record_from_model(model: Any) -> CheckpointRecord:
    latest: dict[str, tuple[int, int, float]] = {}
    for m in model.metrics or []:
        key = (m.timestamp, m.step)
        if m.key not in latest or key >= latest[m.key][:2]:
            latest[m.key] = (m.timestamp, m.step, m.value)
    tags = model.tags or {}
    return CheckpointRecord(
        step=int(tags.get(TAG_STEP, 0)),
        uri=tags.get(TAG_URI, ""),
        status=tags.get(TAG_STATUS, PENDING),
        metrics={k: v[2] for k, v in latest.items()},
        model_id=model.model_id,
        run_name=tags.get(TAG_RUN),
        failure=tags.get(TAG_FAILURE),
        validated_at=float(tags[TAG_VALIDATED_AT]) if TAG_VALIDATED_AT in tags else None,
    )


def _search(tr: TrackingRun, extra: str = "") -> list[Any]:
    client = tr.client()
    flt = f"source_run_id = '{tr.run_id}'" + (f" AND {extra}" if extra else "")
    models, token = [], None
    while True:
        page = client.search_logged_models([tr.experiment_id], filter_string=flt, max_results=1000,
                                           page_token=token)
        models.extend(page)
        token = page.token
        if not token:
            return models


def _one_per_checkpoint(tr: TrackingRun, models: list[Any]) -> list[Any]:
    """One LoggedModel per checkpoint: the oldest. The others, left by a create the HTTP client
    retried after a timeout although the server had received it, are deleted.

    Every reader keeps the same one: a duplicate found late was created after the one that
    got the verdict, so the oldest is always the record the run wrote to."""
    by_checkpoint: dict[str, list[Any]] = {}
    for m in models:
        by_checkpoint.setdefault((m.tags or {}).get(TAG_CHECKPOINT, m.model_id), []).append(m)
    kept = []
    for name, group in by_checkpoint.items():
        group.sort(key=lambda m: (m.creation_timestamp or 0, m.model_id))
        kept.append(group[0])
        for extra in group[1:]:
            logger.warning("checkpoint %s: deleting duplicate record %s (a retried create)", name, extra.model_id)
            tr.client().delete_logged_model(extra.model_id)
    return kept


@_tracking_call("recording a checkpoint")
def record_checkpoint(tr: TrackingRun, event: CheckpointEvent) -> CheckpointRecord:
    """Create the checkpoint's LoggedModel (status pending) with its training metrics; idempotent.

    A checkpoint announced twice (a resumed run, a replayed event) gets its
    existing record back, never a second one.
    """
    if not event.has_checkpoint:
        raise ValueError(f"report at step {event.step} has no checkpoint to record")
    same_checkpoint = f"tags.`{TAG_CHECKPOINT}` = '{event.checkpoint_name}'"
    existing = _one_per_checkpoint(tr, _search(tr, same_checkpoint))
    if existing:
        return _record_from_model(tr.client().get_logged_model(existing[0].model_id))
    client = tr.client()
    tags = {TAG_RUN: tr.run_name, TAG_CHECKPOINT: event.checkpoint_name, TAG_URI: event.checkpoint_uri,
            TAG_STEP: str(event.step), TAG_STATUS: PENDING}
    created = client.create_logged_model(
        experiment_id=tr.experiment_id, name=f"{tr.run_name}-step-{event.step}", source_run_id=tr.run_id,
        tags=tags, params={"step": str(event.step), "checkpoint_uri": event.checkpoint_uri,
                           "epoch": str(event.epoch)},
    )
    kept = _one_per_checkpoint(tr, _search(tr, same_checkpoint))
    model_id = kept[0].model_id if kept else created.model_id
    if event.metrics:
        client.log_batch(tr.run_id, metrics=_metrics(event.metrics, event.step, model_id))
    return CheckpointRecord(step=event.step, uri=event.checkpoint_uri, status=PENDING,
                            metrics=dict(event.metrics), model_id=model_id, run_name=tr.run_name)


@_tracking_call("recording checkpoints")
def record_checkpoints(tr: TrackingRun, events: list[CheckpointEvent]) -> list[CheckpointRecord]:
    """Records for many checkpoints at once (a resumed run catching up): one listing, then only the
    missing records are created."""
    existing = {r.uri: r for r in list_records(tr)}
    return [existing.get(e.checkpoint_uri) or record_checkpoint(tr, e) for e in events]


@_tracking_call("writing validation metrics")
def merge_validation(tr: TrackingRun, record: CheckpointRecord, metrics: dict[str, float]) -> CheckpointRecord:
    """Attach validation metrics to the checkpoint's model (and the run, by step); status validated.

    The status is set only once the metrics are written: a write that fails leaves the
    checkpoint pending (validated again when the run resumes), never validated without metrics."""
    client = tr.client()
    client.log_batch(tr.run_id, metrics=_metrics(metrics, record.step, record.model_id))
    bad = sorted(k for k, v in metrics.items() if not math.isfinite(v))
    now = time.time()
    tags = {TAG_STATUS: VALIDATED, TAG_VALIDATED_AT: repr(now)}
    if bad:
        tags["podium.nonfinite_metrics"] = ",".join(bad)
    client.set_logged_model_tags(record.model_id, tags)
    client.finalize_logged_model(record.model_id, LoggedModelStatus.READY)
    return CheckpointRecord(step=record.step, uri=record.uri, status=VALIDATED,
                            metrics={**record.metrics, **metrics}, model_id=record.model_id,
                            run_name=record.run_name, validated_at=now)


@_tracking_call("recording a failed validation")
def mark_failed(tr: TrackingRun, record: CheckpointRecord, reason: str) -> CheckpointRecord:
    """Mark a checkpoint's validation failed, with the reason; it will never be promoted."""
    client = tr.client()
    client.set_logged_model_tags(record.model_id, {TAG_STATUS: FAILED, TAG_FAILURE: reason[:MAX_TAG],
                                                   TAG_VALIDATED_AT: repr(time.time())})
    client.finalize_logged_model(record.model_id, LoggedModelStatus.FAILED)
    return CheckpointRecord(step=record.step, uri=record.uri, status=FAILED, metrics=record.metrics,
                            model_id=record.model_id, run_name=record.run_name, failure=reason)


@_tracking_call("listing checkpoint records")
def list_records(tr: TrackingRun) -> list[CheckpointRecord]:
    """Every checkpoint record of the run, sorted by step (one paged search)."""
    return sorted((_record_from_model(m) for m in _one_per_checkpoint(tr, _search(tr))), key=lambda r: r.step)


@_tracking_call("finding the run's MLflow run")
def find_tracking_run(tracking_uri: str, experiment: str, run_name: str) -> TrackingRun:
    """The MLflow run of an existing podium run; raises LookupError naming what was searched."""
    client = tracking_client(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise LookupError(f"MLflow experiment {experiment!r} does not exist at {tracking_uri}")
    found = _find_runs(client, exp.experiment_id, run_name)
    if not found:
        raise LookupError(f"no podium run named {run_name!r} in MLflow experiment {experiment!r} at {tracking_uri}")
    return TrackingRun(tracking_uri, exp.experiment_id, found[0].info.run_id, run_name)


@_tracking_call("registering the champion")
def register_champion(tr: TrackingRun, record: CheckpointRecord, served_uri: str, name: str, alias: str,
                      tags: dict[str, str]) -> str:
    """Register the promoted copy as a new model version and move `alias` to it; returns the version."""
    client = tr.client()
    try:
        client.create_registered_model(name, description="Checkpoints promoted by podium.")
    except MlflowException as exc:
        if "already exists" not in str(exc).lower() and "RESOURCE_ALREADY_EXISTS" not in str(exc):
            raise
    tags = {**tags, TAG_SERVED_URI: served_uri}
    description = f"{tr.run_name} step {record.step}"
    try:
        mv = client.create_model_version(name, source=served_uri, run_id=tr.run_id, tags=tags,
                                         description=description)
    except MlflowException as exc:
        # an MLflow server accepts a local path as a source only inside the run's own artifacts: a
        # serving folder on local or shared disk is registered as the checkpoint's LoggedModel, and
        # the served copy is named by the tag
        if not record.model_id or "Invalid model version source" not in str(exc):
            raise
        mv = client.create_model_version(name, source=f"models:/{record.model_id}", run_id=tr.run_id,
                                         model_id=record.model_id, tags=tags, description=description)
    client.set_registered_model_alias(name, alias, mv.version)
    if record.model_id:
        client.set_logged_model_tags(record.model_id, {
            "mlflow.modelVersions": json.dumps([{"name": name, "version": mv.version}]),
            "podium.promoted": "true"})
    return str(mv.version)


@_tracking_call("reading the model registry")
def registered_version_for(tracking_uri: str, name: str, served_uri: str) -> str | None:
    """The registered model version whose source is this served copy, if it was registered."""
    client = tracking_client(tracking_uri)
    try:
        versions = client.search_model_versions(f"name = '{name}'")
    except MlflowException as exc:
        if is_unreachable(exc):  # "not registered" must not be concluded from a server that did not answer
            raise
        return None
    matches = sorted((int(v.version) for v in versions
                      if v.source == served_uri or (v.tags or {}).get(TAG_SERVED_URI) == served_uri), reverse=True)
    return str(matches[0]) if matches else None


@_tracking_call("reading the model registry")
def alias_target(tracking_uri: str, name: str, alias: str) -> str | None:
    """The version an alias points at, or None."""
    client = tracking_client(tracking_uri)
    try:
        return str(client.get_model_version_by_alias(name, alias).version)
    except MlflowException as exc:
        if is_unreachable(exc):
            raise
        return None


@_tracking_call("moving the registry alias")
def set_alias(tracking_uri: str, name: str, alias: str, version: str) -> None:
    """Move a registry alias (rollback uses this)."""
    tracking_client(tracking_uri).set_registered_model_alias(name, alias, version)


@_tracking_call("writing an artifact")
def log_artifact_text(tr: TrackingRun, text: str, path: str) -> None:
    """A text artifact on the run (the promotion report)."""
    tr.client().log_text(tr.run_id, text, path)


def resolve_tracking_uri(tracking_uri: str | None) -> str:
    """The given tracking URI, else MLFLOW_TRACKING_URI, else podium's embedded SQLite store."""
    from podium.settings import PodiumSettings

    return tracking_uri or PodiumSettings().resolved_tracking_uri()


@task(name="open-tracking-run", cache_policy=NO_CACHE)
def open_tracking_run_task(tracking_uri: str | None, experiment: str, run_name: str,
                           params: dict[str, Any]) -> TrackingRun:
    """Find or create the MLflow run of this podium run and log its configuration."""
    return open_tracking_run(resolve_tracking_uri(tracking_uri), experiment, run_name, params)


@task(name="record-checkpoint", cache_policy=NO_CACHE)
def record_checkpoint_task(tracking: TrackingRun, event: CheckpointEvent) -> CheckpointRecord:
    """Create the checkpoint's MLflow record (idempotent)."""
    return record_checkpoint(tracking, event)


@task(name="catch-up-checkpoints", cache_policy=NO_CACHE)
def record_checkpoints_task(tracking: TrackingRun, events: list[CheckpointEvent]) -> list[CheckpointRecord]:
    """Records of checkpoints persisted while no flow was listening (created if missing)."""
    return record_checkpoints(tracking, events)


@task(name="find-tracking-run", cache_policy=NO_CACHE)
def find_tracking_run_task(tracking_uri: str | None, experiment: str, run_name: str) -> TrackingRun:
    """Find the MLflow run of an existing podium run."""
    return find_tracking_run(resolve_tracking_uri(tracking_uri), experiment, run_name)
