"""One MLflow LoggedModel per checkpoint: training metrics, then the verdict (validated or failed).

Checkpoint status lives in the `podium.status` tag (searchable on every backend) and in the
LoggedModel status (READY / FAILED) for the UI. The metrics podium decides on are its own copy in
the `podium.metrics` tag, written in the same request as the status: MLflow's SQL stores keep a
LoggedModel metric of NaN as 0.0 and an infinite one as +-1.8e308 (the model's metrics table has no
NaN flag), so the LoggedModel metrics are for the UI's comparison view only: they are rounded to 6
significant digits (`display_value`), as people read them. Each LoggedModel is an output of the run
(the run page lists it).
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from podium.core.events import CheckpointEvent
from podium.core.failures import plain_text
from podium.core.records import FAILED, PENDING, SKIPPED, VALIDATED, CheckpointRecord
from podium.core.verdict import Verdict
from podium.outages import is_unreachable
from podium.storage.fingerprint import DatasetDigest
from podium.tracking.client import (
    MAX_TAG,
    TAG_CHECKPOINT,
    TAG_DELETED,
    TAG_FAILURE,
    TAG_METRICS,
    TAG_NOTE,
    TAG_RUN,
    TAG_STATUS,
    TAG_STEP,
    TAG_URI,
    TAG_VALIDATED_AT,
    TAG_WITHDRAWN,
    TrackingRun,
    tracking_call,
)
from podium.tracking.datasets import TAG_VAL_DATA, TAG_VAL_DIGEST

if TYPE_CHECKING:
    from mlflow.entities import LoggedModelOutput, Metric

logger = logging.getLogger(__name__)

SIGNIFICANT_DIGITS = 6


def display_value(value: float) -> float:
    """A metric as MLflow's tables show it: 6 significant digits (NaN and infinities as they are).

    Sixteen decimals of a float are noise to a reader; podium decides on the exact values
    (TAG_METRICS)."""
    return float(f"{float(value):.{SIGNIFICANT_DIGITS}g}")


def _metrics(values: dict[str, float], step: int, model_id: str | None = None,
             dataset: DatasetDigest | None = None) -> list[Metric]:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    # the data they were measured on goes with validation metrics (MLflow 3 metrics name their dataset)
    on = {"dataset_name": dataset.name, "dataset_digest": dataset.digest} if dataset else {}
    # for the UI: the run's metric history keeps NaN (not infinities); a LoggedModel keeps neither (TAG_METRICS)
    return [Metric(k, display_value(v), now, int(step), model_id=model_id, **on) for k, v in sorted(values.items())]


@tracking_call("logging training metrics")
def log_training_metrics(tr: TrackingRun, event: CheckpointEvent) -> None:
    """Training metrics of a report without a checkpoint, by step on the run."""
    if event.metrics:
        tr.client().log_batch(tr.run_id, metrics=_metrics(event.metrics, event.step))


def encode_metrics(metrics: dict[str, float]) -> str:
    """Metrics as the `podium.metrics` tag: JSON that keeps NaN, infinities and every float's exact value."""
    return json.dumps({k: float(v) for k, v in metrics.items()}, sort_keys=True)


# podium <= 0.2 kept no copy of its own: it tagged a verdict's non-finite metrics by name
_OLD_NONFINITE_TAG = "podium.nonfinite_metrics"


def _metrics_of(model: Any) -> dict[str, float]:
    """The metrics of a checkpoint record: podium's own copy, else (records of older podium) the
    LoggedModel's, with the values the SQL store altered turned back into NaN and infinities."""
    tags = model.tags or {}
    if TAG_METRICS in tags:
        try:
            return {str(k): float(v) for k, v in json.loads(tags[TAG_METRICS]).items()}
        except (ValueError, TypeError, AttributeError):
            logger.warning("record %s: tag %s is not a JSON object of numbers: %.200r", model.model_id, TAG_METRICS,
                           tags[TAG_METRICS])
    val_digest = tags.get(TAG_VAL_DIGEST)
    latest: dict[str, tuple[int, int, float]] = {}
    for m in model.metrics or []:
        if m.dataset_digest and m.dataset_digest != val_digest:
            continue  # measured on other data (a re-score for a later comparison): not this record's own
        key = (m.timestamp, m.step)
        if m.key not in latest or key >= latest[m.key][:2]:
            latest[m.key] = (m.timestamp, m.step, m.value)
    nonfinite = set(filter(None, tags.get(_OLD_NONFINITE_TAG, "").split(",")))
    out = {}
    for k, (_, _, v) in latest.items():
        if abs(v) >= sys.float_info.max:
            v = math.copysign(math.inf, v)
        elif k in nonfinite:
            v = math.nan
        out[k] = v
    return out


def _record_from_model(model: Any) -> CheckpointRecord:
    tags = model.tags or {}
    return CheckpointRecord(
        step=int(tags.get(TAG_STEP, 0)),
        uri=tags.get(TAG_URI, ""),
        status=tags.get(TAG_STATUS, PENDING),
        metrics=_metrics_of(model),
        model_id=model.model_id,
        run_name=tags.get(TAG_RUN),
        failure=tags.get(TAG_FAILURE),
        note=tags.get(TAG_NOTE),
        validated_at=float(tags[TAG_VALIDATED_AT]) if TAG_VALIDATED_AT in tags else None,
        withdrawn=tags.get(TAG_WITHDRAWN) or None,
        val_digest=tags.get(TAG_VAL_DIGEST),
        deleted=tags.get(TAG_DELETED) or None,
    )


def _search(tr: TrackingRun, extra: str = "") -> list[Any]:
    client = tr.client()
    flt = f"source_run_id = '{tr.run_id}'" + (f" AND {extra}" if extra else "")
    models: list[Any] = []
    token = None
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


def list_as_output(tr: TrackingRun, model_id: str, step: int) -> None:
    """List the LoggedModel as an output of the run (the run's page shows it); idempotent.

    MLflow refuses a second identical output (the store's primary key): a request the HTTP client
    retried after a timeout, although the server had taken it, is answered 400. That answer is
    success when the run already lists the model."""
    from mlflow.entities import LoggedModelOutput
    from mlflow.exceptions import MlflowException

    client = tr.client()
    try:
        client.log_outputs(tr.run_id, [LoggedModelOutput(model_id, step)])
    except MlflowException as exc:
        if is_unreachable(exc) or model_id not in {o.model_id for o in _run_outputs(client, tr.run_id)}:
            raise
        logger.info("checkpoint %s: already an output of run %s (a retried request)", model_id, tr.run_id)


def _run_outputs(client: Any, run_id: str) -> list[LoggedModelOutput]:
    outputs = client.get_run(run_id).outputs
    return list(outputs.model_outputs or []) if outputs is not None else []


@tracking_call("recording a checkpoint")
def record_checkpoint(tr: TrackingRun, event: CheckpointEvent) -> CheckpointRecord:
    """Create the checkpoint's LoggedModel (status pending) with its training metrics; idempotent.

    A checkpoint announced twice (a resumed run, a replayed event) gets its
    existing record back, never a second one.
    """
    if event.checkpoint_uri is None or event.checkpoint_name is None:
        raise ValueError(f"report at step {event.step} has no checkpoint to record")
    same_checkpoint = f"tags.`{TAG_CHECKPOINT}` = '{event.checkpoint_name}'"
    existing = _one_per_checkpoint(tr, _search(tr, same_checkpoint))
    if existing:
        return _record_from_model(_completed(tr, existing[0]))  # the search gave its tags and metrics
    client = tr.client()
    tags = {TAG_RUN: tr.run_name, TAG_CHECKPOINT: event.checkpoint_name, TAG_URI: event.checkpoint_uri,
            TAG_STEP: str(event.step), TAG_STATUS: PENDING, TAG_METRICS: encode_metrics(event.metrics)}
    created = client.create_logged_model(
        experiment_id=tr.experiment_id, name=logged_model_name(tr.run_name, event.step), source_run_id=tr.run_id,
        tags=tags, params={"step": str(event.step), "checkpoint_uri": event.checkpoint_uri,
                           "epoch": str(event.epoch)},
    )
    kept = _one_per_checkpoint(tr, _search(tr, same_checkpoint))
    model_id = kept[0].model_id if kept else created.model_id
    list_as_output(tr, model_id, event.step)
    if event.metrics:
        client.log_batch(tr.run_id, metrics=_metrics(event.metrics, event.step, model_id))
    return CheckpointRecord(step=event.step, uri=event.checkpoint_uri, status=PENDING,
                            metrics=dict(event.metrics), model_id=model_id, run_name=tr.run_name)


# characters MLflow refuses in a LoggedModel's name (mlflow.utils.validation._validate_logged_model_name) that a
# run name may hold: a run named "nightly-v1.2" records its checkpoints as "nightly-v1_2-step-<n>"
_NOT_IN_LOGGED_MODEL_NAMES = str.maketrans({c: "_" for c in "/:.%\"'"})


def logged_model_name(run_name: str, step: int) -> str:
    """The display name of a checkpoint's record in MLflow: the run name (with the characters MLflow refuses in a
    LoggedModel's name replaced by '_') and the step. Records are found by their tags, never by this name."""
    return f"{run_name.translate(_NOT_IN_LOGGED_MODEL_NAMES)}-step-{step}"


def _completed(tr: TrackingRun, model: Any) -> Any:
    """A record found existing, made whole: one whose writer was killed after its create (SIGKILL, a lost
    machine) has its tags but not yet its place among the run's outputs nor its training metrics in MLflow
    (podium's own copy, the tag, has them, and the record is read from it). Both writes are idempotent; a
    whole record costs no request."""
    own = _metrics_of(model)
    if not own or model.metrics:
        return model
    step = int((model.tags or {}).get(TAG_STEP, 0))
    logger.info("checkpoint step %d: completing its record %s (its writer stopped after creating it)", step,
                model.model_id)
    list_as_output(tr, model.model_id, step)
    tr.client().log_batch(tr.run_id, metrics=_metrics(own, step, model.model_id))
    return model


@tracking_call("recording checkpoints")
def record_checkpoints(tr: TrackingRun, events: list[CheckpointEvent]) -> list[CheckpointRecord]:
    """Records for many checkpoints at once (a resumed run catching up): one listing, then only the
    missing records are created and the half-written ones completed."""
    whole = (_completed(tr, m) for m in _one_per_checkpoint(tr, _search(tr)))
    existing = {r.uri: r for r in map(_record_from_model, whole)}
    return [existing.get(e.checkpoint_uri or "") or record_checkpoint(tr, e) for e in events]


def _model_id(record: CheckpointRecord) -> str:
    if not record.model_id:
        raise ValueError(f"checkpoint step {record.step} has no MLflow record to write to")
    return record.model_id


@tracking_call("writing validation metrics")
def merge_validation(tr: TrackingRun, record: CheckpointRecord, metrics: dict[str, float],
                     dataset: DatasetDigest | None = None) -> CheckpointRecord:
    """Attach validation metrics to the checkpoint's model (and the run, by step); status validated.

    `dataset`, the validation data they were measured on, goes with each metric and, as its digest,
    on the record (`podium.data.val.digest`): promotion compares numbers measured on the same data.
    The status is set only once the metrics are written, and in the same request as podium's exact
    copy of them: a write that fails leaves the checkpoint pending (validated again when the run
    resumes), never validated without metrics."""
    from mlflow.entities import LoggedModelStatus

    client = tr.client()
    model_id = _model_id(record)
    client.log_batch(tr.run_id, metrics=_metrics(metrics, record.step, model_id, dataset))
    merged = {**record.metrics, **metrics}
    now = time.time()
    tags = {TAG_STATUS: VALIDATED, TAG_VALIDATED_AT: repr(now), TAG_METRICS: encode_metrics(merged)}
    if dataset:
        tags.update({TAG_VAL_DIGEST: dataset.digest, TAG_VAL_DATA: dataset.uri[:MAX_TAG]})
    client.set_logged_model_tags(model_id, tags)
    client.finalize_logged_model(model_id, LoggedModelStatus.READY)
    return CheckpointRecord(step=record.step, uri=record.uri, status=VALIDATED, metrics=merged,
                            model_id=record.model_id, run_name=record.run_name, validated_at=now,
                            val_digest=dataset.digest if dataset else None)


@tracking_call("recording a skipped validation")
def mark_skipped(tr: TrackingRun, record: CheckpointRecord, note: str) -> CheckpointRecord:
    """Record that a checkpoint is not validated, and why (its report said validation=False); it is
    never promoted. The LoggedModel itself is complete (READY); `podium.status` says skipped."""
    from mlflow.entities import LoggedModelStatus

    client = tr.client()
    model_id = _model_id(record)
    client.set_logged_model_tags(model_id, {TAG_STATUS: SKIPPED, TAG_NOTE: note[:MAX_TAG]})
    client.finalize_logged_model(model_id, LoggedModelStatus.READY)
    return CheckpointRecord(step=record.step, uri=record.uri, status=SKIPPED, metrics=record.metrics,
                            model_id=record.model_id, run_name=record.run_name, note=note)


@tracking_call("recording a deleted checkpoint")
def mark_deleted(tr: TrackingRun, record: CheckpointRecord, why: str) -> CheckpointRecord:
    """Record that a checkpoint's files were deleted from storage, and why; its record, metrics and verdict stay."""
    tr.client().set_logged_model_tags(_model_id(record), {TAG_DELETED: why[:MAX_TAG]})
    return replace(record, deleted=why)


@tracking_call("recording a failed validation")
def mark_failed(tr: TrackingRun, record: CheckpointRecord, reason: str,
                metrics: dict[str, float] | None = None) -> CheckpointRecord:
    """Mark a checkpoint failed, with the reason (as plain text); it will never be promoted.

    `metrics`, what a validation returned that failed the checkpoint (a NaN loss), are kept with it,
    exactly."""
    from mlflow.entities import LoggedModelStatus

    reason = plain_text(reason)  # Ray's errors carry terminal colour codes
    client = tr.client()
    model_id = _model_id(record)
    merged = {**record.metrics, **(metrics or {})}
    if metrics:
        client.log_batch(tr.run_id, metrics=_metrics(metrics, record.step, model_id))
    now = time.time()
    client.set_logged_model_tags(model_id, {TAG_STATUS: FAILED, TAG_FAILURE: reason[:MAX_TAG],
                                            TAG_VALIDATED_AT: repr(now), TAG_METRICS: encode_metrics(merged)})
    client.finalize_logged_model(model_id, LoggedModelStatus.FAILED)
    return CheckpointRecord(step=record.step, uri=record.uri, status=FAILED, metrics=merged,
                            model_id=record.model_id, run_name=record.run_name, failure=reason, validated_at=now)


def record_verdict(tr: TrackingRun, record: CheckpointRecord, verdict: Verdict,
                   dataset: DatasetDigest | None = None) -> CheckpointRecord:
    """Write a decided verdict (`podium.core.verdict.decide_verdict`) onto the checkpoint's record: the one
    way verdicts reach MLflow. A verdict that is not new (kept, or still pending) writes nothing and
    returns the record as it is. `dataset`: the validation data a validated checkpoint's metrics were
    measured on."""
    if not verdict.to_record:
        return record
    if verdict.status == VALIDATED:
        return merge_validation(tr, record, dict(verdict.metrics), dataset)
    if verdict.status == SKIPPED:
        return mark_skipped(tr, record, verdict.reason or "not validated")
    return mark_failed(tr, record, verdict.reason or "failed", dict(verdict.metrics) or None)


@tracking_call("listing checkpoint records")
def list_records(tr: TrackingRun) -> list[CheckpointRecord]:
    """Every checkpoint record of the run, sorted by step (one paged search)."""
    return sorted((_record_from_model(m) for m in _one_per_checkpoint(tr, _search(tr))), key=lambda r: r.step)
