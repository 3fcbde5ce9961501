"""train → validate every checkpoint as it lands → record in MLflow → promote the best."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import cast

from prefect import flow
from prefect.futures import PrefectConcurrentFuture
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner

from podium.config import PipelineConfig
from podium.flows.stream import CheckpointStream
from podium.flows.summary import RunSummary, summarize_run
from podium.flows.validation import ValidationQueue
from podium.tasks.lineage import record_lineage_task
from podium.tasks.plan import RunPlan, plan_run_task, run_lock
from podium.tasks.promote import promote_best_checkpoint_task
from podium.tasks.report import Progress, say
from podium.tasks.resume import Resume, check_resume_task
from podium.tasks.tracking import open_tracking_run_task, record_checkpoint_task
from podium.tasks.train import connect_ray_task, require_checkpoints, train_model
from podium.tracking.client import TrackingUnavailable
from podium.tracking.records import log_training_metrics
from podium.tracking.runs import close_tracking_run
from podium.training.events import TrainingRestart


# Enough threads for training plus any validation concurrency a config asks for;
# the ValidationQueue enforces the configured concurrency itself.
@flow(name="train-validate-promote", task_runner=ThreadPoolTaskRunner(max_workers=64),  # type: ignore[arg-type]
      log_prints=False)
def train_validate_promote(config: PipelineConfig, tracking_uri: str | None = None,
                           mlflow_ui: str | None = None) -> RunSummary:
    """Train on Ray Train, validate each checkpoint as soon as it is persisted, record it in MLflow,
    then promote the best checkpoint if it beats the current champion."""
    config = config.at(flow_run.scheduled_start_time or datetime.now(timezone.utc))  # fills {date} for nightly runs
    plan = plan_run_task(config)
    for warning in plan.data_warnings:
        say("data: %s (allowed by data.allow)", warning)
    with run_lock(plan):  # a second run of the same name is refused (RunInProgress), not interleaved
        say_resume(plan, check_resume_task(plan))  # a resume that would change the model's shape is refused here
        return _train_validate_promote(plan, tracking_uri, mlflow_ui)


def say_resume(plan: RunPlan, resume: Resume | None) -> None:
    """Tell what a resumed run continues from and which settings it changes (they take effect)."""
    if resume is None:
        return
    say("run %s resumes from step %d%s", plan.run_name, resume.from_step,
        f" (epoch {resume.from_epoch})" if resume.from_epoch is not None else "")
    for key, (was, now) in sorted(resume.changes.items()):
        say("  %s = %s (was %s): takes effect", key, now, was)
    if resume.from_epoch is not None and plan.config.training.epochs <= resume.from_epoch:
        say("  training.epochs = %d: the run is already at epoch %d, nothing more to train",
            plan.config.training.epochs, resume.from_epoch)


def _train_validate_promote(plan: RunPlan, tracking_uri: str | None, mlflow_ui: str | None) -> RunSummary:
    config = plan.config
    connect_ray_task(plan)
    tracking = open_tracking_run_task(tracking_uri, config.experiment, config.run_name,
                                      config.model_dump(mode="json"))
    say("run %s: MLflow run %s", config.run_name, tracking.run_id)
    record_lineage_task(plan, tracking)  # its data by digest, the flow run, deployment, schedule, code version
    stream = CheckpointStream()
    progress = Progress(config.run_name, config.training.epochs)
    validations = ValidationQueue(plan, tracking)
    seen: set[str] = set()
    reports = announced = restarts = 0
    try:
        validations.catch_up(seen)  # a resumed run: an earlier attempt's checkpoints still awaiting a verdict
        training = cast(PrefectConcurrentFuture,  # the flow's thread pool
                        train_model.submit(plan, stream.sink, validations.last_step))
        for events in stream.follow(training):
            for event in events:
                if isinstance(event, TrainingRestart):
                    restarts += 1
                    say("training restarted its workers (%d of at most %s): %s", event.restart,
                        config.scaling.max_failures if config.scaling.max_failures >= 0 else "unlimited", event.cause)
                    continue
                reports += 1
                if event.checkpoint_name is None:  # a report without a checkpoint
                    log_training_metrics(tracking, event)
                    continue
                if event.checkpoint_name in seen:
                    continue
                say("checkpoint step %d saved: %s", event.step, event.checkpoint_uri)
                seen.add(event.checkpoint_name)
                announced += 1
                validations.add(record_checkpoint_task(tracking, event), event.validation)
                progress.update(epoch=event.epoch)
            validations.pump()
            progress.update(validated=validations.validated)
        validations.catch_up(seen)  # persisted but never announced (an event lost with a crashed process)
        training_ended_at = training.result()  # failures surface here, after persisted checkpoints were queued
        records = validations.finish()
        progress.update(validated=validations.validated)
        require_checkpoints(plan, len(records), reports)
        say("training done: %d checkpoint(s) in the run, %d new in this attempt%s; %s", len(records),
            announced, f", {restarts} worker restart(s)" if restarts else "", validations.tally())
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
    summary = summarize_run(config, tracking, outcome, mlflow_ui, training_ended_at)
    close_tracking_run(tracking)
    return summary
