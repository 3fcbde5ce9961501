"""Promotion: pick the best checkpoint (pure), then copy, verify, switch the pointer, move the alias."""

from __future__ import annotations

import logging
import math
from typing import Any

from pydantic import BaseModel
from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.plan import RunPlan
from tasks.selection import Champion, CheckpointRecord, Decision, decide_promotion, select_best
from tasks.tracking import TrackingRun, list_records, register_champion
from tasks.train import connect_ray
from tasks.validate import validate
from training import serving as srv

logger = logging.getLogger(__name__)


class Promoted(BaseModel):
    """What was promoted: the serving version, where it is, and the metric that won."""

    version: str
    uri: str
    step: int
    metric: str
    value: float
    mlflow_version: str | None = None
    checkpoint_uri: str


class PromotionOutcome(BaseModel):
    """The decision in words, and the promoted version if there was one."""

    promoted: Promoted | None
    reason: str
    best_step: int | None = None
    champion_before: str | None = None


def read_champion(serving: str) -> Champion | None:
    """The current champion as the decision function sees it."""
    current = srv.read_current(serving)
    if current is None:
        return None
    m = current.manifest
    return Champion(version=current.version, step=m.get("step"), metric=m.get("metric", ""),
                    value=m.get("value"), source=m.get("source"))


def decide(plan: RunPlan, records: list[CheckpointRecord]) -> tuple[Decision, Champion | None]:
    """Best checkpoint of `records` against the serving location's champion (no side effects)."""
    p = plan.config.promotion
    best, why = select_best(records, p.metric, p.mode)
    champion = read_champion(plan.serving)
    return decide_promotion(best, champion, p.metric, p.mode, p.min_delta, p.always, why), champion


def check_copy(plan: RunPlan, record: CheckpointRecord, version: srv.PromotedVersion) -> None:
    """Run the validation function on the copied checkpoint; the recorded metric must come back."""
    p = plan.config.promotion
    expected = record.metrics[p.metric]
    connect_ray(plan)  # a no-op inside the pipeline; `podium promote` connects only when it promotes
    got = validate(plan, record, uri=version.uri).get(p.metric)
    if got is None or not math.isclose(got, expected, rel_tol=p.verify_tolerance, abs_tol=1e-9):
        raise srv.ServingError(f"promoted copy {version.uri} gives {p.metric} = {got}, but the checkpoint "
                               f"was recorded with {expected}: not promoted")


def promote(plan: RunPlan, tracking: TrackingRun, decision: Decision) -> Promoted:
    """Copy the chosen checkpoint into a new serving version, verify it, make it current, register it."""
    p = plan.config.promotion
    record = decision.candidate
    assert record is not None and decision.value is not None
    info: dict[str, Any] = {"run_name": tracking.run_name, "mlflow_run_id": tracking.run_id, "step": record.step,
                            "metric": p.metric, "mode": p.mode, "value": decision.value,
                            "metrics": record.metrics, "model_id": record.model_id}
    version = srv.stage_version(plan.serving, record.uri, info)
    if p.verify:
        check_copy(plan, record, version)
    srv.seal_version(plan.serving, version)
    srv.switch_current(plan.serving, version, decision.reason)
    mlflow_version = register_champion(
        tracking, record, version.uri, p.registered_model, p.alias,
        tags={"podium.serving_version": version.version, "podium.step": str(record.step),
              "podium.metric": p.metric, "podium.value": repr(decision.value)})
    logger.info("promoted step %d as %s (MLflow %s v%s @%s)", record.step, version.version,
                p.registered_model, mlflow_version, p.alias)
    return Promoted(version=version.version, uri=version.uri, step=record.step, metric=p.metric,
                    value=decision.value, mlflow_version=mlflow_version, checkpoint_uri=record.uri)


def promote_best_checkpoint(plan: RunPlan, tracking: TrackingRun) -> PromotionOutcome:
    """Decide on the run's records and promote if the decision says so."""
    decision, champion = decide(plan, list_records(tracking))
    promoted = promote(plan, tracking, decision) if decision.promote else None
    logger.info("promotion: %s", decision.reason)
    return PromotionOutcome(promoted=promoted, reason=decision.reason,
                            best_step=decision.candidate.step if decision.candidate else None,
                            champion_before=champion.version if champion else None)


@task(name="promote-best-checkpoint", cache_policy=NO_CACHE)
def promote_best_checkpoint_task(plan: RunPlan, tracking: TrackingRun) -> PromotionOutcome:
    """Promote the run's best checkpoint to the serving location if it beats the champion."""
    return promote_best_checkpoint(plan, tracking)
