"""Retention by verdict: storage keeps a run's best checkpoints, its newest and those awaiting a verdict."""

from __future__ import annotations

import logging
from collections.abc import Collection

from podium.core.records import CheckpointRecord
from podium.core.retention import checkpoints_to_delete
from podium.progress import say
from podium.serving.layout import read_history
from podium.serving.staged import staged_versions
from podium.storage.locations import fsspec_filesystem
from podium.tasks.plan import RunPlan
from podium.tracking.client import TrackingRun
from podium.tracking.records import mark_deleted
from podium.tracking.registry import location_uris

logger = logging.getLogger(__name__)


def keep_best_checkpoints(plan: RunPlan, tracking: TrackingRun, records: list[CheckpointRecord],
                          needed: Collection[str] = ()) -> list[CheckpointRecord]:
    """With checkpoints.keep set, delete from storage the checkpoints it no longer keeps (see
    podium.core.retention: the best by the promotion metric, the newest, those awaiting a verdict and those
    in `needed` stay) and mark their MLflow records deleted. Returns the records deleted now, marked."""
    keep, promotion = plan.config.checkpoints.keep, plan.config.promotion
    if keep is None:
        return []
    doomed = checkpoints_to_delete(records, promotion.metric, promotion.mode, keep, needed)
    why = f"kept the {keep} best by {promotion.metric} ({promotion.mode}) and the newest (checkpoints.keep = {keep})"
    deleted = []
    for record in doomed:
        try:
            fs, path = fsspec_filesystem(record.uri)
            if fs.exists(path):
                fs.rm(path, recursive=True)
        except OSError as exc:  # housekeeping: the run's work goes on, the next pass tries again
            say("storage: could not delete checkpoint step %d (%s): %s; it is kept for now", record.step, record.uri, exc)
            continue
        deleted.append(mark_deleted(tracking, record, why))  # after the files: a record never says more than is true
    if deleted:
        say("storage: deleted checkpoint(s) of step %s (%s)", ", ".join(str(r.step) for r in deleted), why)
    return deleted


def served_checkpoints(plan: RunPlan, tracking_uri: str | None = None) -> set[str]:
    """Every checkpoint a serving location of the model may serve again, which storage keeps: the source of each
    version in the history of the run's serving location and of every other location of its registered model
    (a rollback makes any earlier champion current again, and the gate re-scores the champion from its
    checkpoint), and the source of a candidate awaiting approval."""

    if plan.config.checkpoints.keep is None:
        return set()
    locations = {plan.serving}
    if tracking_uri:
        locations |= set(location_uris(tracking_uri, plan.config.promotion.registered_model))
    kept = set()
    for serving in locations:
        kept |= {str(doc["source"]) for doc in read_history(serving) if doc.get("source")}
        kept |= {str(s.mark["checkpoint"]) for s in staged_versions(serving) if s.mark.get("checkpoint")}
    return kept
