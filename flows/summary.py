"""The shared end of a flow: the run's records, the reports people read, and what the flow returns."""

from __future__ import annotations

import signal

from prefect.runtime import flow_run
from prefect.states import Completed, Failed, State
from pydantic import BaseModel

from podium import prefect_api
from podium.config import PipelineConfig
from podium.core.approval import VIA_UNASKED
from podium.core.early_stop import EarlyStop
from podium.core.numbers import format_number
from podium.core.promotion import Policy
from podium.core.records import CheckpointRecord
from podium.core.verdict import run_failure
from podium.errors import EXIT_FAILED, EXIT_OK, EndNotRecorded, RunEnded, UnfinishedRun
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
    # a stop (SIGINT, SIGTERM) that came after the switch of CURRENT: the promotion stood, the run is complete
    late_stop: str | None = None


def stopped_before_switch(signum: int) -> str:
    """What a promotion stopped before its point of no return (the switch of CURRENT) did: nothing."""
    return f"stopped before the switch: nothing was promoted ({signal.Signals(signum).name})"


def late_stop(signum: int | None, outcome: PromotionOutcome) -> str | None:
    """The line a run says when a stop (`signum`) came after its promotion switched CURRENT: the point of no return
    was passed, so the promotion stands and the run completes (exit 0, flow run Completed, MLflow run FINISHED).
    None without a stop, or when nothing was promoted (then the stop ends the run: `stopped_before_switch`)."""
    if signum is None or outcome.promoted is None:
        return None
    return (f"{signal.Signals(signum).name} after the switch: {outcome.promoted.version} promoted; "
            "the run is complete")


def run_shortfall(summary: RunSummary) -> str | None:
    """Why a run that reached its end did not do its work, whatever a scheduler would read from a Completed, or None:
    no checkpoint could be validated (podium.core.verdict.run_failure), or its candidate's approval could not be asked
    for (nothing was promoted, and no one decided that)."""
    failure = run_failure([r.status for r in summary.checkpoints])
    if failure:
        return f"{failure}. Each reason is on its MLflow record and in `podium status`"
    approval = summary.promotion.approval
    if approval and approval.via == VIA_UNASKED:
        return (f"{approval.reason}: nothing was promoted; `podium promote --run-name {summary.run_name}` asks "
                "again")
    return None


STATE_MESSAGE_CHARS = 1000  # what the Prefect UI shows of a state's message without scrolling, and more
END_PROBE_S = 5.0  # how long the flow's end waits for the Prefect server's /health


def outcome_in_words(summary: RunSummary) -> str:
    """What the run did, in one line: promoted (what, as which version), or not and why; stopped early, or not."""
    p = summary.promotion.promoted
    did = (f"promoted step {p.step} ({p.metric}={format_number(p.value)}) as {p.version}" if p and p.value is not None
           else f"promoted step {p.step} as {p.version}" if p else f"nothing promoted: {summary.promotion.reason}")
    watch = summary.promotion.watch  # the watch after the switch: final, or rolled back (podium.tasks.watch)
    did = f"{did}; {watch.reason}" if p and watch else did
    early = summary.stopped_early
    did = f"stopped early at step {early.step} ({early.reason}); {did}" if early else did
    return f"{did}; {summary.late_stop}" if summary.late_stop else did


class RunResult(BaseModel):
    """What a flow run of podium's returns to its caller (`podium run`, `podium promote`, Python): the run's summary,
    the promotion decision it carried out, why the run did not do its work (None: it did), and the exit code that
    implies for a command."""

    summary: RunSummary
    shortfall: str | None = None

    @property
    def decision(self) -> PromotionOutcome:
        """What promotion decided and did."""
        return self.summary.promotion

    @property
    def exit_code(self) -> int:
        """0: the run did its work; 1 (EXIT_FAILED): it reached its end without (`shortfall` says why)."""
        return EXIT_FAILED if self.shortfall else EXIT_OK


def run_result(summary: RunSummary) -> RunResult:
    """The result of a run that reached its end."""
    return RunResult(summary=summary, shortfall=run_shortfall(summary))


def final_state(summary: RunSummary) -> State:
    """The state the flow run ends in, its message what happened: Completed with the run's RunResult, or Failed when
    the run did not do its work (`run_shortfall`): calling the flow then raises UnfinishedRun, which holds the result.

    Where the Prefect server does not answer, the engine could not record either, and would raise its own error
    with the result lost: EndNotRecorded, which holds the result, is raised instead (the engine's error then names
    it as its context: `result_of` finds it)."""
    result = run_result(summary)
    link = prefect_api.link()
    # gone (it refuses connections), or silent for as long as a call of podium's own waits: a server that is only
    # slow (a busy machine) gets the end from the engine, which waits for it
    if not link.probe(timeout=END_PROBE_S, slow_down_s=prefect_api.CALL_DEADLINE_S) and link.down:
        raise EndNotRecorded(f"run {summary.run_name}: {outcome_in_words(summary)}; the Prefect server "
                             f"{link.api_url} did not answer to record the flow run's end", result)
    if result.shortfall:
        message = f"run {summary.run_name} failed: {result.shortfall}"
        return Failed(message=message[:STATE_MESSAGE_CHARS], data=UnfinishedRun(message, result))
    return Completed(message=outcome_in_words(summary)[:STATE_MESSAGE_CHARS], data=result)


def result_of(exc: BaseException) -> RunResult | None:
    """The result a flow that reached its end holds in `exc` (UnfinishedRun, EndNotRecorded) or in the errors it led
    to (Prefect's engine failing to record the end after EndNotRecorded); None if the flow did not reach its end."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:  # both links of each: a client's `raise ... from` sets the cause, the flow's error is a context
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, RunEnded) and isinstance(current.result, RunResult):
            return current.result
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]
    return None


def summarize_run(config: PipelineConfig, policy: Policy, tracking: TrackingRun, outcome: PromotionOutcome,
                  mlflow_ui: str | None, training_ended_at: float | None = None,
                  stopped_early: EarlyStop | None = None, late_stop: str | None = None) -> RunSummary:
    """Read the run's records back, publish the checkpoint table, promotion report and chart (Prefect
    artifacts, MLflow), and return the summary the flow ends with (`policy`: the plan's, whose metric and direction
    the reports show; `late_stop`: the line of a stop that came after the switch)."""
    records = list_records(tracking)
    mlflow_ui = mlflow_ui or PodiumSettings().mlflow_ui(tracking.tracking_uri)  # a deployment's run: as configured
    publish_reports(config.run_name, tracking, records, outcome, policy.metric, policy.mode,
                    tracking.run_url(mlflow_ui) if mlflow_ui else None)
    return RunSummary(run_name=config.run_name, tracking=tracking, checkpoints=records, promotion=outcome,
                      training_ended_at=training_ended_at, flow_run_id=str(flow_run.id) if flow_run.id else None,
                      stopped_early=stopped_early, late_stop=late_stop)
