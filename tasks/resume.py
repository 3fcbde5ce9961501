"""Resuming a run: what it was trained with, what this start changes, and a refusal where the model would change shape.

Running a run name again resumes it from its latest checkpoint (Ray Train keeps a run snapshot in
storage). The settings of each start are kept next to the run lock, in
`<storage>/.podium-runs/<run name>.json`. A new start is compared with them before training:
- settings that shape the model (the loop, the features, the label, the classes, the model size)
  cannot change: the checkpoint would not load into the new model, so the start is refused;
- the others (epochs, learning rate, ...) take effect; they are printed, and the MLflow run records
  the values in effect (`podium.tracking.runs.open_tracking_run`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.runtime import flow_run
from prefect.states import Crashed

from podium import prefect_api
from podium.errors import ConfigError
from podium.storage.documents import DocumentError, read_json, write_json
from podium.storage.locations import join
from podium.tasks.plan import RunPlan
from podium.tracking.client import TAG_FLOW_RUN, TrackingUnavailable, resolve_tracking_uri
from podium.tracking.runs import find_tracking_run, flatten_params, run_tags
from podium.training import raytrain

logger = logging.getLogger(__name__)

SHAPING = ("training.train_loop", "data.feature_columns", "data.label_column", "num_classes", "training.hidden_size")


@dataclass(frozen=True)
class Resume:
    """A start that continues a run: from which checkpoint, and the settings it changes (name -> (was, now))."""

    from_step: int
    from_epoch: int | None
    changes: dict[str, tuple[str | None, str]] = field(default_factory=dict)


def run_settings(plan: RunPlan) -> dict[str, Any]:
    """The settings of this start as its record keeps them: the model-shaping ones as resolved by the plan
    (the features of the data, the number of classes), and the whole configuration, flattened."""
    shape = {"training.train_loop": plan.train_loop,
             "data.feature_columns": list(plan.loop_config.get("feature_columns") or []),
             "data.label_column": plan.config.data.label_column,
             "num_classes": plan.loop_config.get("num_classes"),
             "training.hidden_size": plan.config.training.hidden_size}
    return {"shape": shape, "config": flatten_params(plan.config.model_dump(mode="json"))}


def compare_settings(before: dict[str, Any], now: dict[str, Any]) -> tuple[dict[str, tuple[Any, Any]],
                                                                          dict[str, tuple[str | None, str]]]:
    """(model-shaping settings that differ, other settings that differ), each as name -> (was, now)."""
    was_shape, was_config = before.get("shape") or {}, before.get("config") or {}
    shape = {k: (was_shape[k], v) for k, v in now["shape"].items() if k in was_shape and was_shape[k] != v}
    changes = {k: (was_config.get(k), v) for k, v in now["config"].items()
               if was_config.get(k) != v and k not in SHAPING and k not in ("run_name",)}
    return shape, changes


def _record(plan: RunPlan) -> str:
    return join(plan.storage, ".podium-runs", f"{plan.run_name}.json")


def check_resume(plan: RunPlan) -> Resume | None:
    """None for a fresh run (no persisted checkpoint yet); else the Resume, after checking that no
    setting which shapes the model changed since the run's last start (ConfigError naming each one)."""
    persisted = raytrain.persisted_checkpoints(plan.storage, plan.run_name)
    if not persisted:
        return None
    latest = max(persisted, key=lambda e: e.step)
    try:
        before = read_json(_record(plan))
    except DocumentError as exc:
        raise ConfigError(f"run {plan.run_name!r}: {exc}; remove it to resume without comparing settings") from None
    if before is None:
        logger.info("run %s has checkpoints but no record of its settings (%s): they are not compared",
                    plan.run_name, _record(plan))
        return Resume(latest.step, latest.epoch)
    shape, changes = compare_settings(before, run_settings(plan))
    if shape:
        lines = [f"{k} = {json.dumps(now)} (the run was trained with {json.dumps(was)})" for k, (was, now) in shape.items()]
        raise ConfigError(
            f"run {plan.run_name!r} resumes from its checkpoint at step {latest.step}, but this start changes "
            "settings that shape the model:\n  " + "\n  ".join(lines) + "\n"
            f"  A checkpoint cannot load into a model of another shape: start a new run (--run-name "
            f"{plan.run_name}-2), or keep these settings as they were.")
    return Resume(latest.step, latest.epoch, changes)


def remove_unregistered_checkpoints(plan: RunPlan, announced: Collection[str]) -> list[str]:
    """Once training was aborted (an early stop): remove the run's checkpoint folders that Ray Train never
    registered (the one being uploaded as the abort came: no record names it, Ray Train's snapshot does not, a
    resume never continues from it, and its files may be partial); never one of `announced` (the folder names
    this run recorded). Returns their folder names."""
    return raytrain.remove_unregistered_checkpoints(plan.storage, plan.run_name, announced)


def record_run_settings(plan: RunPlan) -> None:
    """Keep this start's settings for the next start to compare with (written before training, under the run lock)."""
    write_json(_record(plan), run_settings(plan))


@task(name="check-resume", cache_policy=NO_CACHE)
def check_resume_task(plan: RunPlan) -> Resume | None:
    """A run that resumes: refused if it would change the model's shape; otherwise what it changes, recorded."""
    resume = check_resume(plan)
    record_run_settings(plan)
    return resume


def mark_abandoned_flow_run(tracking_uri: str | None, experiment: str, run_name: str) -> str | None:
    """An earlier attempt of this run whose process died (SIGKILL, a lost machine) left its Prefect flow
    run Running: mark it Crashed, saying so. The earlier attempt is the flow run the MLflow run names
    (tag `podium.prefect_flow_run_id`); returns its id if it was marked. Bounded and skipped while the Prefect
    server does not answer (podium.prefect_api). A plain call, not a task: housekeeping of Prefect's own records,
    which the run's graph does not show (its log says when it marks one)."""



    try:
        earlier = run_tags(find_tracking_run(resolve_tracking_uri(tracking_uri), experiment, run_name)).get(TAG_FLOW_RUN)
    except (LookupError, TrackingUnavailable):
        return None  # a first start (or a store that does not answer: opening the run will say so)
    if not earlier or earlier == str(flow_run.id):
        return None

    def mark() -> bool:

        with get_client(sync_client=True) as client:
            state = client.read_flow_run(UUID(earlier)).state
            if state is None or state.is_final() or not (state.is_running() or state.is_pending()):
                return False
            client.set_flow_run_state(UUID(earlier), Crashed(
                message=f"its process stopped without ending it; found when run {run_name} was resumed by "
                        f"flow run {flow_run.id}"), force=True)
            return True

    if prefect_api.call("marking an abandoned flow run Crashed", mark):
        logger.info("flow run %s of an earlier attempt of %s was left running: marked Crashed", earlier, run_name)
        return earlier
    return None

