"""train → validate every checkpoint as it lands → record in MLflow → promote the best."""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import NoReturn, cast

from prefect import flow
from prefect.futures import PrefectConcurrentFuture
from prefect.runtime import flow_run
from prefect.states import Cancelled
from prefect.task_runners import ThreadPoolTaskRunner

from podium import prefect_api
from podium.charts import preload_charts
from podium.config import PipelineConfig
from podium.core.early_stop import EarlyStop, early_stop
from podium.core.events import TrainingRestart
from podium.core.verdict import run_failure
from podium.errors import RunStopped, TrackingUnavailable
from podium.flows.naming import context, flow_run_namer, podium_logs_at_info, run_config
from podium.flows.promote import promote_and_announce
from podium.flows.stop import LOST_EXIT, STOP_GRACE_S, StopRequest, exit_at_once, stop_on_signals
from podium.flows.stream import CheckpointStream
from podium.flows.summary import (
    RunResult,
    RunSummary,
    final_state,
    late_stop,
    stopped_before_switch,
    summarize_run,
)
from podium.flows.validation import PolicyCannotBeMet, ValidationQueue
from podium.progress import say
from podium.tasks.evidence import promotion_needs_ray
from podium.tasks.lineage import record_lineage_task
from podium.tasks.package import preload_packaging
from podium.tasks.plan import RunPlan, plan_run_task, run_lock
from podium.tasks.report import Progress
from podium.tasks.resume import (
    Resume,
    check_resume_task,
    mark_abandoned_flow_run,
    remove_unregistered_checkpoints,
)
from podium.tasks.retention import served_checkpoints
from podium.tasks.tracking import open_tracking_run_task, record_checkpoint_task
from podium.tasks.train import EarlyStopSwitch, connect_ray_task, require_checkpoints, train_model
from podium.tracking.client import TrackingRun
from podium.tracking.records import log_training_metrics
from podium.tracking.runs import close_tracking_run, tag_stopped_early
from podium.training import cluster
from podium.training.head import watching_head

logger = logging.getLogger(__name__)

TRAINING_START_WAIT_S = 30.0  # at most this long before the MLflow run opens anyway (a slow data plan)


# Enough threads for training plus any validation concurrency a config asks for;
# the ValidationQueue enforces the configured concurrency itself.
@flow(name="train-validate-promote", task_runner=ThreadPoolTaskRunner(max_workers=64),  # type: ignore[arg-type]
      flow_run_name=flow_run_namer("run"), log_prints=False)
def train_validate_promote(config: PipelineConfig, tracking_uri: str | None = None,
                           mlflow_ui: str | None = None, plan: RunPlan | None = None) -> RunResult:
    """Train on Ray Train, validate each checkpoint as soon as it is persisted, record it in MLflow,
    then promote the best checkpoint if it beats the current champion.

    `plan`: the run's plan (`podium.tasks.plan.plan_run` of `config`), made by a caller that checked the run before
    starting anything (`podium run`); without it (a deployment's run), the flow plans.

    Returns the run's RunResult; the flow run ends Completed, its message what was promoted or why nothing was. A
    run that did not do its work (none of its checkpoints could be validated, or its candidate's approval could not
    be asked for) ends Failed and raises `podium.errors.UnfinishedRun`, which holds the result."""
    podium_logs_at_info()
    config = run_config(config)  # the deployment's settings under the run's, {date} filled for nightly runs
    plan = plan if plan is not None else plan_run_task(config)
    for warning in plan.data_warnings:
        say("data: %s (allowed by data.allow)", warning)
    # Prefect mirrors the run and is not on its critical path: with its server down, the run goes on.
    # SIGINT / SIGTERM stop it cleanly: the flow run ends Cancelled, and running the same name resumes.
    with prefect_api.watching(), stop_on_signals() as stop, run_lock(plan):  # a second run of the name is refused
        resume = check_resume_task(context(plan))  # a resume that would change the model's shape is refused here
        say_resume(plan, resume)
        try:
            # a State returned ends the flow run in it: its message says what the run did
            summary = _train_validate_promote(plan, tracking_uri, mlflow_ui, stop, fresh=resume is None,
                                              resumed_after=resume.from_step if resume else None)
            # a stop after the switch: the promotion stands, and the run completes (exit 0, Completed, FINISHED),
            # saying so; decided here, after the reports were published (a signal while they were), not before
            return final_state(summary.model_copy(  # type: ignore[return-value]
                update={"late_stop": late_stop(stop.signum, summary.promotion)}))
        except RunStopped as exc:
            return Cancelled(message=str(exc))  # type: ignore[return-value]


def _close_unfinished(tracking: TrackingRun, status: str) -> None:
    """Mark the MLflow run of a run that ends unfinished (KILLED, FAILED); a server that does not answer is
    said, not raised (the run's own ending is what matters)."""
    try:
        close_tracking_run(tracking, status=status)
    except TrackingUnavailable as exc:
        say("%s", exc)


def _how_to_resume(plan: RunPlan, pending: int, once: str = "") -> str:
    """The end of a stopped run's last line: what is left, and the command that resumes it (`once` a
    condition holds)."""
    rerun = f"{once}, run" if once else "Run"
    return (f"{pending} checkpoint(s) left pending. {rerun} `podium run` again with the same --run-name "
            f"({plan.run_name}) to resume: training continues from its latest checkpoint and the pending "
            "checkpoints are validated")


def _stop_run(plan: RunPlan, tracking: TrackingRun, validations: ValidationQueue, stream: CheckpointStream,
              training: PrefectConcurrentFuture | None, stopped: RunStopped, promoting: bool = False) -> RunStopped:
    """Stop cleanly: running validations get STOP_GRACE_S to record their verdicts (the others stay
    pending), training is aborted (its persisted checkpoints stay), the MLflow run is marked KILLED.
    Returns the RunStopped to raise, its message the one line that says how to resume. `promoting`: the stop came
    once training and validation were done, before the promotion's switch (what it staged was withdrawn)."""
    left = validations.stop(STOP_GRACE_S)
    if training is not None and not stream.stop_training(training):
        logger.warning("training did not stop in time; Ray stops with this process")
    _close_unfinished(tracking, "KILLED")
    if promoting:
        message = (f"{stopped_before_switch(stopped.signum)}: {validations.tally()}. Run `podium run` again with "
                   f"the same --run-name ({plan.run_name}) to promote its best (or `podium promote --run-name "
                   f"{plan.run_name}`)")
    else:
        message = f"{stopped}: {validations.tally()}, {_how_to_resume(plan, len(left))}"
    logger.warning("%s", message)  # the flow run's Cancelled state says it too, and the CLI's last line
    return RunStopped(stopped.signum, message)


def _lose_run(plan: RunPlan, tracking: TrackingRun, validations: ValidationQueue, lost: str) -> NoReturn:
    """End the run and the process without its Ray cluster, before Ray's reconnect window ends it with
    nothing said: no call reaches Ray, the checkpoints without a verdict stay pending, the MLflow run is
    marked FAILED and the flow run Failed, and one line says how to resume (exit code 3)."""
    left = validations.leave_all()
    _close_unfinished(tracking, "FAILED")
    message = (f"{lost}: the run stopped with {validations.tally()}, "
               f"{_how_to_resume(plan, len(left), once='Once the cluster is back')}")
    prefect_api.record_flow_end(str(flow_run.id) if flow_run.id else None, message, failed=True)
    exit_at_once(message, LOST_EXIT)  # Prefect's engine would wait for the training thread, blocked in Ray


def say_resume(plan: RunPlan, resume: Resume | None) -> None:
    """Tell what a resumed run continues from and which settings it changes (they take effect)."""
    if resume is None:
        return
    say("run %s resumes from step %d%s", plan.run_name, resume.from_step,
        f" (epoch {resume.from_epoch})" if resume.from_epoch is not None else "")
    for key, (was, now) in sorted(resume.changes.items()):
        say("  %s = %s (was %s): takes effect", key, now, was)
    if plan.config.training.early_stop_patience is not None:
        say("  early stopping: the best so far stands; patience (%d) counts this start's checkpoints",
            plan.config.training.early_stop_patience)
    if resume.from_epoch is not None and plan.config.training.epochs <= resume.from_epoch:
        say("  training.epochs = %d: the run is already at epoch %d, nothing more to train",
            plan.config.training.epochs, resume.from_epoch)


def _open_tracking(plan: RunPlan, tracking_uri: str | None, stream: CheckpointStream,
                   training: PrefectConcurrentFuture | None) -> TrackingRun:
    """Open the run's MLflow run with its lineage, and mark a killed attempt's flow run Crashed. Training may
    be running already (a fresh run starts it first): if the MLflow run cannot be opened, training is stopped
    before the error is raised, its persisted checkpoints kept for a resume."""
    config = plan.config
    try:
        mark_abandoned_flow_run(tracking_uri, config.experiment, config.run_name)  # a killed attempt's flow run
        tracking = open_tracking_run_task(tracking_uri, config.experiment, config.run_name,
                                          config.model_dump(mode="json"))
        say("run %s: MLflow run %s", config.run_name, tracking.run_id)
        # its data by digest, the flow run, deployment, schedule, code version
        record_lineage_task(context(plan), context(tracking))
        return tracking
    except BaseException:
        if training is not None and not stream.stop_training(training):
            logger.warning("training did not stop in time; Ray stops with this process")
        stream.close()
        raise


def _stop_early_if_plateaued(plan: RunPlan, validations: ValidationQueue, stream: CheckpointStream,
                             training: PrefectConcurrentFuture | None, stopping: EarlyStopSwitch,
                             resumed_after: int | None) -> EarlyStop | None:
    """With training.early_stop_patience set: once that many verdicts in a row, in step order, did not improve on
    the best, stop Ray Train (its persisted checkpoints stay and are validated) and say so. Returns the stop; None
    when training ended on its own first (every epoch trained: not an early stop). A resume (`resumed_after`, the
    step it continues from) counts patience from its own checkpoints."""
    t, p = plan.config.training, plan.config.promotion
    if t.early_stop_patience is None or training is None or stopping.asked:
        return None
    verdict = early_stop(validations.records(), p.metric, p.mode, t.early_stop_patience, t.early_stop_min_delta,
                         resumed_after)
    if verdict is None or not stopping.ask():  # before the abort: the training task takes Ray Train's error for it
        return None
    say("stopping training early at step %d: %s", verdict.step, verdict.reason)
    if not stream.stop_training(training):
        logger.warning("training did not stop in time; Ray stops with this process")
    if stopping.too_late:
        say("training had trained every epoch before it could be stopped: not stopped early")
        return None
    return verdict


def _train_validate_promote(plan: RunPlan, tracking_uri: str | None, mlflow_ui: str | None,
                            stop: StopRequest, fresh: bool, resumed_after: int | None = None) -> RunSummary:
    config = plan.config
    connect_ray_task(context(plan))
    stream = CheckpointStream()
    training: PrefectConcurrentFuture | None = None
    stopping_early = EarlyStopSwitch()
    stopped_early: EarlyStop | None = None
    if fresh:  # nothing persisted, nothing to catch up: training starts now, and the MLflow run opens meanwhile
        fitting = threading.Event()
        training = cast(PrefectConcurrentFuture,  # the flow's thread pool
                        train_model.submit(context(plan), stream.sink, 0, fitting, stopping_early))
        training.wrapped_future.add_done_callback(lambda _: fitting.set())  # a task that ends before Ray Train
        # until training's own work in this process is done (the data's statistics, the datasets' plan):
        # MLflow's import and store would take the interpreter from it; Ray Train's start leaves it idle
        fitting.wait(TRAINING_START_WAIT_S)
    tracking = _open_tracking(plan, tracking_uri, stream, training)
    progress = Progress(config.run_name, config.training.epochs)
    validations = ValidationQueue(plan, tracking)
    served = served_checkpoints(plan, tracking.tracking_uri)  # checkpoints.keep never deletes a served one's source
    validations.check_stop = stop.check
    validations.stopping = lambda: stop.requested
    seen: set[str] = set()
    reports = announced = restarts = 0
    promoting = False  # training and validation done: a stop now comes before or after the promotion's switch
    watch = contextlib.ExitStack()  # while training and validations need Ray: losing its head ends the run cleanly
    watch.enter_context(watching_head(stop.lose))
    try:
        if training is None:  # a resumed run: an earlier attempt's checkpoints still awaiting a verdict, first
            validations.catch_up(seen)
            training = cast(PrefectConcurrentFuture,
                            train_model.submit(context(plan), stream.sink, validations.last_step, None,
                                              stopping_early))
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
                preload_packaging()  # what promotion and the reports will load, loaded while training goes on (once)
                preload_charts()
                validations.add(record_checkpoint_task(context(tracking), event), event.validation)
                progress.update(epoch=event.epoch)
            validations.pump()
            stopped_early = stopped_early or _stop_early_if_plateaued(plan, validations, stream, training,
                                                                      stopping_early, resumed_after)
            if fresh or announced:  # a resume's Ray Train checks its snapshot's checkpoints exist as it starts:
                validations.keep_best(served)  # nothing is deleted before it reported once (it has started then)
            progress.update(validated=validations.validated)
            stop.check()  # a stop asked for: here, with every announced checkpoint recorded
        validations.catch_up(seen)  # persisted but never announced (an event lost with a crashed process)
        training_ended_at = training.result()  # failures surface here, after persisted checkpoints were queued
        if stopped_early is not None:  # the checkpoint being uploaded when training was aborted: never registered
            for name in remove_unregistered_checkpoints(plan, seen):
                say("storage: removed %s: saved as training was stopped early, never registered by Ray Train "
                    "(no record; a resume would not continue from it)", name)
        records = validations.finish()
        watch.close()  # promotion needs no Ray
        if not promotion_needs_ray(plan, records):  # a re-score or a revalidation keeps Ray up
            stream.close()
            cluster.release_ray()  # a local Ray this command started shuts down while promotion runs
        progress.update(validated=validations.validated)
        require_checkpoints(plan, len(records), reports)
        say("training done: %d checkpoint(s) in the run, %d new in this attempt%s; %s", len(records),
            announced, f", {restarts} worker restart(s)" if restarts else "", validations.tally())
        if stopped_early is not None:
            tag_stopped_early(tracking, stopped_early.step, stopped_early.reason)
        promoting = True
        stop.check()
        # the promotion's point of no return is its switch of CURRENT: a stop before it withdraws the candidate
        # (RunStopped from its steps; the approval's or the shadow's withdrawal), one after it changes nothing
        outcome = promote_and_announce(plan, tracking, mlflow_ui, validations.records(), stop)
        if outcome.promoted is None:
            stop.check()  # a stop asked for while the candidate awaited approval or was in shadow (it was withdrawn)
        validations.keep_best(served_checkpoints(plan, tracking.tracking_uri))  # what promotion read is kept
    except RunStopped as exc:
        raise _stop_run(plan, tracking, validations, stream, training, exc, promoting) from None
    except BaseException as exc:
        if stop.lost is not None and isinstance(exc, Exception):  # ClusterLost, or a call that failed with Ray
            _lose_run(plan, tracking, validations, stop.lost)
        if stop.requested and isinstance(exc, Exception):  # what failed failed because of the stop (Ray signalled too)
            logger.info("after the stop was asked for: %s: %s", type(exc).__name__, exc)
            raise _stop_run(plan, tracking, validations, stream, training, RunStopped(stop.signum or 2),
                            promoting) from None
        validations.check_stop = lambda: None  # failing already: a stop asked for now changes nothing
        tracking_down = isinstance(exc, TrackingUnavailable)
        if tracking_down:  # nothing more can be recorded: verdicts not written stay pending for a resume
            say("%s; stopping (run it again once the server answers: it resumes)", exc)
        unmet = isinstance(exc, PolicyCannotBeMet)
        if unmet and training is not None and stopping_early.ask():  # no candidate could pass: stop training
            if not stream.stop_training(training):
                logger.warning("training did not stop in time; Ray stops with this process")
        validations.wind_down(validate_queued=not (tracking_down or unmet))
        if not tracking_down:
            try:
                close_tracking_run(tracking, failed=True)
            except TrackingUnavailable as close_exc:  # keep the original failure as the one raised
                say("%s", close_exc)
        raise
    finally:
        watch.close()
        stream.close()
    progress.flush()
    summary = summarize_run(config, plan.policy, tracking, outcome, mlflow_ui, training_ended_at, stopped_early)
    # a run no checkpoint of which could be validated did not do its work: its MLflow run says FAILED
    close_tracking_run(tracking, failed=run_failure([r.status for r in summary.checkpoints]) is not None)
    return summary
