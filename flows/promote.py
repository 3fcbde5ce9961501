"""Promotion alone, on a run that has already trained and validated."""

from __future__ import annotations

from prefect import flow
from prefect.states import Cancelled

from podium import prefect_api
from podium.config import PipelineConfig
from podium.core.records import CheckpointRecord
from podium.errors import RunStopped
from podium.flows.naming import context, flow_run_namer, podium_logs_at_info, run_config, whole
from podium.flows.stop import StopRequest, stop_on_signals
from podium.flows.summary import RunResult, final_state, late_stop, stopped_before_switch, summarize_run
from podium.tasks.approval import await_approval
from podium.tasks.carry_out import NO_STOP, StopPoint
from podium.tasks.news import announce_promotion_task
from podium.tasks.plan import RunPlan, plan_run_task
from podium.tasks.promote import PromotionOutcome, promote_best_checkpoint_task, settle_candidate_task
from podium.tasks.shadow import shadow_candidate_task, shadow_decision
from podium.tasks.tracking import find_tracking_run_task
from podium.tasks.watch import is_watched, watch_champion_task
from podium.tracking.client import TrackingRun


def promote_and_announce(plan: RunPlan, tracking: TrackingRun, mlflow_ui: str | None,
                         records: list[CheckpointRecord] | None = None,
                         stop: StopPoint = NO_STOP) -> PromotionOutcome:
    """Promote the best checkpoint if it beats the champion; with a shadow rollout, the candidate answers a copy of
    the live requests first; with approval required, it waits for a person's decision (the flow run pauses), after
    a shadow it passed. Each decision is announced as a Prefect event. The records only lend the announcement the
    candidate's metrics: passed as context, they draw no edge from every validation.

    `stop`: the flow's stop request. Asked for before the switch of CURRENT, it withdraws the candidate (during the
    carry-out's steps, the shadow or the wait for approval) and, in the steps, raises the flow's RunStopped; once
    CURRENT switched, the promotion runs to its end and the caller says the stop came after it (`late_stop`).

    With `[promotion.watch]`, a promotion that replaced a champion then watches it on live traffic and rolls it back
    if a limit breaks (`podium.tasks.watch`); the outcome's `watch` and reason say which."""
    outcome = promote_best_checkpoint_task(context(plan), context(tracking), context(stop))
    if outcome.awaiting is not None:
        announce_promotion_task(context(plan), context(tracking), whole(outcome), context(records))
        approval = None
        if outcome.awaiting.shadow_id is not None:
            outcome = shadow_candidate_task(context(plan), context(tracking), whole(outcome),
                                            context(lambda: stop.requested))
            approval = shadow_decision(plan, outcome)
        if approval is None:
            approval = await_approval(plan, tracking, outcome, mlflow_ui, lambda: stop.requested)
        outcome = settle_candidate_task(context(plan), context(tracking), whole(outcome), approval, context(stop))
    announce_promotion_task(context(plan), context(tracking), whole(outcome), context(records))
    if is_watched(plan, outcome):  # after the switch: a limit broken within the watch rolls it back
        outcome = watch_champion_task(context(plan), context(tracking), whole(outcome),
                                      context(lambda: stop.requested))
    return outcome


@flow(name="promote-run", flow_run_name=flow_run_namer("promote"), log_prints=False)
def promote_run(config: PipelineConfig, tracking_uri: str | None = None,
                mlflow_ui: str | None = None, plan: RunPlan | None = None) -> RunResult:
    """Promote the best validated checkpoint of an existing run if it beats the champion. `plan`: the run's plan,
    made by a caller that checked the run before starting anything (`podium promote`); without it, the flow plans.
    Returns the run's RunResult, as `train_validate_promote` does."""
    podium_logs_at_info()
    config = run_config(config)  # the deployment's settings under the run's, {date} filled for nightly runs
    # Prefect mirrors the promotion and is not on its critical path. SIGINT / SIGTERM before the switch of CURRENT
    # withdraw the candidate (its staged copy, its registry version and the challenger alias): the flow run ends
    # Cancelled, and the same command asks again. After the switch, the promotion is done: the flow run Completed
    with prefect_api.watching(), stop_on_signals() as stop:
        plan = plan if plan is not None else plan_run_task(config)
        tracking = find_tracking_run_task(tracking_uri, config.experiment, config.run_name)
        try:
            outcome = None if stop.requested else promote_and_announce(plan, tracking, mlflow_ui, stop=stop)
        except RunStopped:  # before the switch: what was staged is withdrawn
            outcome = None
        if outcome is None or (stop.requested and outcome.promoted is None):  # a promotion that ended stands
            return Cancelled(message=_stopped(stop, config.run_name))  # type: ignore[return-value]
        summary = summarize_run(config, plan.policy, tracking, outcome, mlflow_ui)
        # a State returned ends the flow run in it: its message says what the promotion did, and a stop after the
        # switch (decided once the reports were published: a signal while they were is said too)
        return final_state(summary.model_copy(  # type: ignore[return-value]
            update={"late_stop": late_stop(stop.signum, outcome)}))


def _stopped(stop: StopRequest, run_name: str) -> str:
    """The one line of a promotion stopped before its switch."""
    return (f"{stopped_before_switch(stop.signum or 2)}; `podium promote --run-name {run_name}` asks again")
