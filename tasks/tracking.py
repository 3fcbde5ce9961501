"""Prefect tasks around the MLflow adapter (`podium.tracking`): one task per recording step."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from podium.core.events import CheckpointEvent
from podium.core.records import CheckpointRecord
from podium.tracking.client import TAG_FLOW_RUN, TrackingRun, resolve_tracking_uri
from podium.tracking.records import record_checkpoint, record_checkpoints
from podium.tracking.runs import find_tracking_run, open_tracking_run


@task(name="open-tracking-run", cache_policy=NO_CACHE)
def open_tracking_run_task(tracking_uri: str | None, experiment: str, run_name: str,
                           params: dict[str, Any]) -> TrackingRun:
    """Find or create the MLflow run of this podium run and log its configuration; the run is tagged with
    this flow run's id (`podium ui` links to it)."""
    tags = {TAG_FLOW_RUN: str(flow_run.id)} if flow_run.id else {}
    return open_tracking_run(resolve_tracking_uri(tracking_uri), experiment, run_name, params, set_tags=tags)


@task(name="record-checkpoint", task_run_name="record-step-{event.step}", cache_policy=NO_CACHE)
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
