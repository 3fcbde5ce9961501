"""News of what podium decided, as Prefect events: a promotion, a refusal, a failed validation, a rollback.

Each event is about the model (`podium.model.<model>`), with the run, the checkpoint, the registered
version and the metrics as related resources and the decision's facts as payload; an automation
(`podium.deployments.definitions.news_automation`) forwards them to a webhook, Slack or any
Prefect notification block. Sending never fails the work it reports on.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from podium.core.approval import VIA_SHADOW, challenger_alias
from podium.core.policy import check_to_dict
from podium.core.records import CheckpointRecord
from podium.prefect_events import (
    EVENT_APPROVED,
    EVENT_AWAITING_APPROVAL,
    EVENT_PROMOTED,
    EVENT_REFUSED,
    EVENT_REJECTED,
    EVENT_ROLLED_BACK,
    EVENT_SHADOWING,
    EVENT_VALIDATION_FAILED,
    emit_news,
    model_resource,
    news_related,
)
from podium.tasks.plan import RunPlan
from podium.tasks.promote import PromotionOutcome
from podium.tasks.rollback import RollbackOutcome
from podium.tracking.client import TrackingRun


def promotion_news(plan: RunPlan, tracking: TrackingRun, outcome: PromotionOutcome) -> tuple[list[str], dict[str, Any]]:
    """The events of a promotion decision, and their payload: promoted or refused; a candidate awaiting approval
    or in shadow; approved (and promoted) or rejected, once a person or the timeout decided; promoted or refused
    by its shadow alone (the payload's `shadow`: the verdict and its numbers)."""
    p, cfg, policy = outcome.promoted, plan.config, plan.policy
    payload: dict[str, Any] = {
        "model": cfg.model, "registered_model": cfg.promotion.registered_model, "run_name": tracking.run_name,
        "mlflow_run_id": tracking.run_id, "reason": outcome.reason, "metric": policy.metric,
        "mode": policy.mode, "best_step": outcome.best_step, "champion_before": outcome.champion_before,
        "champion_before_value": outcome.champion_before_value, "champion_before_run": outcome.champion_before_run,
        "serving": plan.serving, "checks": [check_to_dict(c) for c in outcome.checks],
        "approval": outcome.approval.as_dict() if outcome.approval else None,
        "shadow": outcome.shadow.as_dict() if outcome.shadow else None}
    if p is not None:
        payload.update({"version": p.version, "mlflow_version": p.mlflow_version, "step": p.step, "value": p.value,
                        "uri": p.uri, "checkpoint_uri": p.checkpoint_uri})
    if outcome.awaiting is not None:
        c = outcome.awaiting
        payload.update({"version": c.version, "mlflow_version": c.mlflow_version, "step": c.step, "value": c.value,
                        "checkpoint_uri": c.checkpoint_uri, "alias": challenger_alias(policy.alias)})
        return [EVENT_SHADOWING if c.shadow_id and outcome.shadow is None else EVENT_AWAITING_APPROVAL], payload
    if outcome.approval is not None and outcome.approval.via != VIA_SHADOW:
        return ([EVENT_APPROVED, EVENT_PROMOTED] if p is not None else [EVENT_REJECTED]), payload
    return [EVENT_PROMOTED if p is not None else EVENT_REFUSED], payload


def announce_promotion(plan: RunPlan, tracking: TrackingRun, outcome: PromotionOutcome,
                       metrics: dict[str, float] | None = None) -> None:
    """Emit the decision's events (`promotion_news`; `metrics`: the candidate's)."""
    events, payload = promotion_news(plan, tracking, outcome)
    step = payload.get("step", outcome.best_step)
    for event in events:
        emit_news(event, model_resource(plan.config.model),
                  news_related(tracking.run_name, step, metrics, payload.get("mlflow_version"),
                               plan.config.promotion.registered_model), payload)


@task(name="announce-decision", cache_policy=NO_CACHE)
def announce_promotion_task(plan: RunPlan, tracking: TrackingRun, outcome: PromotionOutcome,
                            records: list[CheckpointRecord] | None = None) -> None:
    """The promotion decision as Prefect events, with the candidate's metrics where `records` hold them."""
    step = outcome.promoted.step if outcome.promoted else outcome.best_step
    metrics = next((r.metrics for r in records or [] if r.step == step), None)
    announce_promotion(plan, tracking, outcome, metrics)


def announce_failed_validation(plan: RunPlan, record: CheckpointRecord) -> None:
    """Emit `podium.validation.failed` for a checkpoint whose validation failed (after its retries)."""
    emit_news(EVENT_VALIDATION_FAILED, model_resource(plan.config.model),
              news_related(plan.config.run_name, record.step, record.metrics),
              {"model": plan.config.model, "run_name": plan.config.run_name, "step": record.step,
               "checkpoint_uri": record.uri, "failure": record.failure})


def announce_rollback(model: str, registered_model: str, outcome: RollbackOutcome, reason: str | None) -> None:
    """Emit `podium.serving.rolled-back` once serving went back to an earlier version."""
    emit_news(EVENT_ROLLED_BACK, model_resource(model),
              news_related(None, None, None, outcome.mlflow_version, registered_model),
              {"model": model, "registered_model": registered_model, "from_version": outcome.from_version,
               "to_version": outcome.to_version, "mlflow_version": outcome.mlflow_version,
               "withdrawn": outcome.withdrawn, "reason": reason})


@task(name="announce-rollback", cache_policy=NO_CACHE)
def announce_rollback_task(model: str, registered_model: str, outcome: RollbackOutcome, reason: str | None) -> None:
    """Announce a rollback that switched serving (`announce_rollback`)."""
    announce_rollback(model, registered_model, outcome, reason)
