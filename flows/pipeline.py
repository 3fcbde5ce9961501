"""train → validate every checkpoint as it lands → record in MLflow → promote the best."""

from __future__ import annotations

from datetime import datetime, timezone

from pydantic import BaseModel
from prefect import flow
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner

from tasks.events import CheckpointStream
from tasks.plan import RunPlan, plan_run_task, run_lock
from tasks.promote import PromotionOutcome, promote_best_checkpoint_task
from tasks.report import Progress, publish_reports, say
from tasks.selection import CheckpointRecord
from tasks.tracking import (
    TrackingRun,
    TrackingUnavailable,
    close_tracking_run,
    list_records,
    log_training_metrics,
    open_tracking_run_task,
    record_checkpoint_task,
)
from tasks.train import connect_ray_task, train_model
from tasks.validate import ValidationQueue
from training.config import PipelineConfig


class RunSummary(BaseModel):
    """What a run produced: its records and the promotion outcome."""

    run_name: str
    tracking: TrackingRun
    checkpoints: list[CheckpointRecord]
    promotion: PromotionOutcome
    training_ended_at: float | None = None
    flow_run_id: str | None = None


# Enough threads for training plus any validation concurrency a config asks for;
# the ValidationQueue enforces the configured concurrency itself.
@flow(name="train-validate-promote", task_runner=ThreadPoolTaskRunner(max_workers=64), log_prints=False)
def train_validate_promote(config: PipelineConfig, tracking_uri: str | None = None,
                           mlflow_ui: str | None = None) -> RunSummary:
    """Train on Ray Train, validate each checkpoint as soon as it is persisted, record it in MLflow,
    then promote the best checkpoint if it beats the current champion."""
    config = config.at(flow_run.scheduled_start_time or datetime.now(timezone.utc))  # fills {date} for nightly runs
    plan = plan_run_task(config)
    with run_lock(plan):  # a second run of the same name is refused (RunInProgress), not interleaved
        return _train_validate_promote(plan, tracking_uri, mlflow_ui)


def _train_validate_promote(plan: RunPlan, tracking_uri: str | None, mlflow_ui: str | None) -> RunSummary:
    config = plan.config
    connect_ray_task(plan)
    tracking = open_tracking_run_task(tracking_uri, config.experiment, config.run_name,
                                      config.model_dump(mode="json"))
    say("run %s: MLflow run %s", config.run_name, tracking.run_id)
    stream = CheckpointStream()
    progress = Progress(config.run_name, config.training.epochs)
    validations = ValidationQueue(plan, tracking)
    seen: set[str] = set()
    try:
        validations.catch_up(seen)  # a resumed run: an earlier attempt's checkpoints still awaiting a verdict
        training = train_model.submit(plan, stream.sink)
        for events in stream.follow(training):
            for event in events:
                if not event.has_checkpoint:
                    log_training_metrics(tracking, event)
                    continue
                if event.checkpoint_name in seen:
                    continue
                say("checkpoint step %d saved: %s", event.step, event.checkpoint_uri)
                seen.add(event.checkpoint_name)
                validations.add(record_checkpoint_task(tracking, event))
                progress.update(epoch=event.epoch)
            validations.pump()
            progress.update(validated=validations.validated)
        validations.catch_up(seen)  # persisted but never announced (an event lost with a crashed process)
        training_ended_at = training.result()  # failures surface here, after persisted checkpoints were queued
        records = validations.finish()
        progress.update(validated=validations.validated)
        say("training done; %d checkpoints, %d validated, %d failed", len(records),
            sum(r.status == "validated" for r in records), sum(r.status == "failed" for r in records))
        outcome = promote_best_checkpoint_task(plan, tracking)
    except BaseException as exc:
        tracking_down = isinstance(exc, TrackingUnavailable)
        if tracking_down:  # nothing more can be recorded: verdicts not written stay pending for a resume
            say("%s; stopping (run it again once the server answers: it resumes)", exc)
        validations.wind_down(validate_queued=not tracking_down)
        if not tracking_down:
            try:
                close_tracking_run(tracking, failed=True)
            except TrackingUnavailable as close_exc:  # keep the original failure as the one raised
                say("%s", close_exc)
        raise
    finally:
        stream.close()
    records = list_records(tracking)
    publish_reports(config.run_name, tracking, records, outcome, config.promotion.metric, config.promotion.mode,
                    tracking.run_url(mlflow_ui) if mlflow_ui else None)
    close_tracking_run(tracking)
    return RunSummary(run_name=config.run_name, tracking=tracking, checkpoints=records, promotion=outcome,
                      training_ended_at=training_ended_at, flow_run_id=str(flow_run.id))
