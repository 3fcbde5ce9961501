"""The shared end of a flow: the run's records, the reports people read, and what the flow returns."""

from __future__ import annotations

from prefect.runtime import flow_run
from prefect.states import Completed, Failed, State
from pydantic import BaseModel

from podium.config import PipelineConfig
from podium.core.approval import VIA_UNASKED
from podium.core.early_stop import EarlyStop
from podium.core.numbers import format_number
from podium.core.records import CheckpointRecord
from podium.core.verdict import run_failure
from podium.settings import PodiumSettings
from podium.tasks.promote import PromotionOutcome
from podium.tasks.report import publish_reports
from podium.tracking.client import TrackingRun
from podium.tracking.records import list_records


class RunSummary(BaseModel):
    """What a run produced: its records and the promotion outcome."""

    run_name: str
    tracking: TrackingRun
    checkpoints: list[CheckpointRecord]
    promotion: PromotionOutcome
    training_ended_at: float | None = None
    flow_run_id: str | None = None
    stopped_early: EarlyStop | None = None  # training stopped because the validations stopped improving


# The summaries of flows that ran to their end in this process, by run name. A flow's return value
# reaches its caller through Prefect's engine, which raises instead when it cannot record the flow
# run's final state (the server is down): the CLI then reads what the run did from here.
_FINISHED: dict[str, RunSummary] = {}


def hand_off(summary: RunSummary) -> RunSummary:
    """Keep a finished run's summary for its caller in this process (see `finished_summary`); returns it."""
    _FINISHED[summary.run_name] = summary
    return summary


class UnfinishedRun(RuntimeError):
    """A run that ended without doing its work (`run_shortfall`): its flow run ended Failed, and calling the flow
    raises this. `summary` is what the run did (every checkpoint's record and reason, the promotion's outcome)."""

    def __init__(self, message: str, summary: RunSummary):
        super().__init__(message)
        self.summary = summary

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.summary))


def run_shortfall(summary: RunSummary) -> str | None:
    """Why a run that reached its end did not do its work, whatever a scheduler would read from a Completed, or None:
    no checkpoint could be validated (podium.core.verdict.run_failure), or its candidate's approval could not be asked
    for (nothing was promoted, and no one decided that)."""
    failure = run_failure([r.status for r in summary.checkpoints])
    if failure:
        return f"{failure}. Each reason is on its MLflow record and in `podium status`"
    approval = summary.promotion.approval
    if approval and approval.get("via") == VIA_UNASKED:
        return (f"{approval['reason']}: nothing was promoted; `podium promote --run-name {summary.run_name}` asks "
                "again")
    return None


STATE_MESSAGE_CHARS = 1000  # what the Prefect UI shows of a state's message without scrolling, and more


def outcome_in_words(summary: RunSummary) -> str:
    """What the run did, in one line: promoted (what, as which version), or not and why; stopped early, or not."""
    p = summary.promotion.promoted
    did = (f"promoted step {p.step} ({p.metric}={format_number(p.value)}) as {p.version}" if p and p.value is not None
           else f"promoted step {p.step} as {p.version}" if p else f"nothing promoted: {summary.promotion.reason}")
    early = summary.stopped_early
    return f"stopped early at step {early.step} ({early.reason}); {did}" if early else did


def final_state(summary: RunSummary) -> State:
    """The state the flow run ends in, its message what happened: Completed with what was promoted or why
    nothing was, or Failed when the run did not do its work (`run_shortfall`): calling the flow then raises
    UnfinishedRun, which holds the summary. `podium run` reads it either way (`hand_off`)."""
    hand_off(summary)
    shortfall = run_shortfall(summary)
    if shortfall:
        message = f"run {summary.run_name} failed: {shortfall}"
        return Failed(message=message[:STATE_MESSAGE_CHARS], data=UnfinishedRun(message, summary))
    return Completed(message=outcome_in_words(summary)[:STATE_MESSAGE_CHARS], data=summary)


def finished_summary(run_name: str) -> RunSummary | None:
    """The summary of a flow that ran to its end in this process, whatever Prefect recorded (taken once)."""
    return _FINISHED.pop(run_name, None)


def summarize_run(config: PipelineConfig, tracking: TrackingRun, outcome: PromotionOutcome,
                  mlflow_ui: str | None, training_ended_at: float | None = None,
                  stopped_early: EarlyStop | None = None) -> RunSummary:
    """Read the run's records back, publish the checkpoint table, promotion report and chart (Prefect
    artifacts, MLflow), and return the summary the flow ends with."""
    records = list_records(tracking)
    mlflow_ui = mlflow_ui or PodiumSettings().mlflow_ui(tracking.tracking_uri)  # a deployment's run: as configured
    publish_reports(config.run_name, tracking, records, outcome, config.promotion.metric, config.promotion.mode,
                    tracking.run_url(mlflow_ui) if mlflow_ui else None)
    return RunSummary(run_name=config.run_name, tracking=tracking, checkpoints=records, promotion=outcome,
                      training_ended_at=training_ended_at, flow_run_id=str(flow_run.id) if flow_run.id else None,
                      stopped_early=stopped_early)
