"""Where a run and a promoted model come from: the Prefect flow run, deployment and schedule, the code, the data.

When a run starts, its datasets (by digest) become MLflow dataset inputs and its lineage becomes run
tags (`podium.prefect.*`, `mlflow.source.git.commit`, `podium.code.*`). A promotion copies them into
the serving version's manifest (`datasets`, `lineage`) and onto the registered model version, so
either end leads to the other: `podium lineage vN` and `podium lineage DIGEST`.
"""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
from typing import Any
from uuid import UUID

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.runtime import flow_run
from prefect.utilities.urls import url_for

from podium import prefect_api
from podium.core.promotion import Decision, comparison_summary
from podium.core.records import CheckpointRecord
from podium.core.redaction import redact_uri
from podium.core.version import __version__
from podium.tasks.plan import RunPlan
from podium.tracking.client import TrackingRun
from podium.tracking.datasets import lineage_tags, record_run_inputs
from podium.tracking.runs import run_tags

logger = logging.getLogger(__name__)

GIT_TIMEOUT_S = 5.0


def describe_start(created_by: Any, schedules: list[Any]) -> tuple[str, str]:
    """(what started a flow run, the schedule if one did) from its `created_by` and its deployment's schedules."""
    if created_by is None:
        return "a user or an API call", ""
    started = f"{(created_by.type or '').lower()} {created_by.display_value or ''}".strip()
    if created_by.type != "SCHEDULE":
        return started, ""
    for s in schedules:
        if s.id == created_by.id:
            sched = s.schedule
            cron, interval = getattr(sched, "cron", None), getattr(sched, "interval", None)
            return started, (f"cron '{cron}' ({getattr(sched, 'timezone', None) or 'UTC'})" if cron
                             else f"every {interval}" if interval else type(sched).__name__)
    return started, ""


def _started_by(flow_run_id: str, deployment_id: str) -> tuple[str, str]:
    """(what started the flow run, the schedule if it was one), from the Prefect API."""

    with get_client(sync_client=True) as client:
        created_by = client.read_flow_run(UUID(flow_run_id)).created_by
        schedules = client.read_deployment(UUID(deployment_id)).schedules if created_by else []
        return describe_start(created_by, schedules)


def prefect_lineage() -> dict[str, str]:
    """The current Prefect flow run (id, name, URL), and the deployment and schedule that started it."""

    try:
        flow_run_id = flow_run.id
        if not flow_run_id:
            return {}
        out = {"podium.prefect.flow_run_id": str(flow_run_id), "podium.prefect.flow_run_name": flow_run.name,
               "podium.prefect.flow": flow_run.flow_name,
               # the link the UI itself uses (runs/flow-run/<id>), on this server's UI
               "podium.prefect.flow_run_url": url_for("flow-run", obj_id=str(flow_run_id)) or ""}
        started_by = prefect_api.current_deployment()  # from the flow run's context, not the API
        if started_by:
            deployment_id, deployment_name = started_by
            # bounded, and skipped while the server is down (podium.prefect_api): lineage leaves out what it cannot ask
            asked = prefect_api.call("reading the flow run's origin", lambda: _started_by(str(flow_run_id),
                                                                                      deployment_id))
            started, schedule = asked if asked is not None else ("", "")
            out.update({"podium.prefect.deployment_id": deployment_id,
                        "podium.prefect.deployment": f"{flow_run.flow_name}/{deployment_name}",
                        "podium.prefect.started_by": started, "podium.prefect.schedule": schedule})
        return {k: str(v) for k, v in out.items() if v}
    except Exception:  # lineage is a record of facts: a question the API cannot answer leaves it out
        logger.warning("could not read the Prefect flow run's lineage", exc_info=True)
        return {}


def _git(folder: str, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", folder, *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def code_lineage(import_paths: list[str]) -> dict[str, str]:
    """The code version of the first of `import_paths` (the training loop) whose package is in a git
    checkout: MLflow's `mlflow.source.git.commit` and `repoURL`, and whether the checkout had changes."""
    out = {"podium.version": __version__}
    for path in import_paths:
        module_name = path.partition(":")[0]
        try:
            file = getattr(importlib.import_module(module_name), "__file__", None)
        except Exception:
            continue
        folder = os.path.dirname(os.path.abspath(file)) if file else None
        commit = _git(folder, "rev-parse", "HEAD") if folder else None
        if not folder or not commit:
            continue
        out.update({"mlflow.source.git.commit": commit, "podium.code.package": module_name.split(".")[0],
                    "podium.code.git_repo": _git(folder, "rev-parse", "--show-toplevel") or folder,
                    "podium.code.git_dirty": "true" if _git(folder, "status", "--porcelain", "--untracked-files=no")
                    else "false"})
        if remote := _git(folder, "config", "--get", "remote.origin.url"):
            out["mlflow.source.git.repoURL"] = redact_uri(remote)
        break
    return out


def record_lineage(plan: RunPlan, tracking: TrackingRun) -> dict[str, str]:
    """Record the run's datasets (MLflow dataset inputs) and lineage (run tags); returns the tags."""
    tags = {**prefect_lineage(), **code_lineage([plan.train_loop, plan.config.validation.fn])}
    record_run_inputs(tracking, plan.data, tags)
    return tags


@task(name="record-lineage", cache_policy=NO_CACHE)
def record_lineage_task(plan: RunPlan, tracking: TrackingRun) -> dict[str, str]:
    """Record where the run comes from: its data by digest, the flow run, deployment, schedule and code."""
    return record_lineage(plan, tracking)


def provenance(plan: RunPlan, tracking: TrackingRun, record: CheckpointRecord, decision: Decision) -> dict[str, Any]:
    """What a promoted version's manifest says about where it comes from: `datasets` (what it was trained
    on, and the validation data its number was measured on), `lineage` and `comparison`."""
    tags = lineage_tags(run_tags(tracking))
    datasets: dict[str, Any] = {}
    if "podium.data.train.digest" in tags:  # what the run recorded when it trained
        datasets["train"] = {"uri": tags.get("podium.data.train.uri"), "digest": tags["podium.data.train.digest"]}
    elif "train" in plan.data:
        datasets["train"] = plan.data["train"].summary()
    measured_on = decision.comparison.candidate.digest if decision.comparison else record.val_digest
    val = plan.data.get("val")
    if val is not None and val.digest == measured_on:
        datasets["val"] = val.summary()
    elif measured_on:
        datasets["val"] = {"digest": measured_on}
    lineage = {"checkpoint": record.uri, "step": record.step,
               "mlflow": {"tracking_uri": redact_uri(tracking.tracking_uri), "experiment_id": tracking.experiment_id,
                          "run_id": tracking.run_id, "run_name": tracking.run_name, "model_id": record.model_id},
               "tags": {k: v for k, v in tags.items() if not k.startswith("podium.data.")},
               "promoted_by": {k.removeprefix("podium.prefect."): v for k, v in prefect_lineage().items()
                               if k in ("podium.prefect.flow_run_id", "podium.prefect.flow_run_url")}}
    return {"datasets": datasets, "lineage": lineage, "comparison": comparison_summary(decision)}


def provenance_tags(manifest: dict[str, Any]) -> dict[str, str]:
    """Registry version tags from a manifest's provenance: the data digests, flow run and code version
    (none for a version promoted before podium recorded them)."""
    datasets = manifest.get("datasets") or {}
    out = {f"podium.data.{role}.digest": d["digest"] for role, d in datasets.items() if d.get("digest")}
    tags = (manifest.get("lineage") or {}).get("tags") or {}
    for key in ("podium.prefect.flow_run_id", "podium.prefect.flow_run_url", "podium.prefect.deployment",
                "mlflow.source.git.commit"):
        if tags.get(key):
            out[key] = tags[key]
    return out
