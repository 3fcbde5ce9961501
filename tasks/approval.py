"""A person's approval of a candidate (`promotion.approval = "required"`): the flow run pauses with a typed
form in the Prefect UI (`pause_flow_run(wait_for_input=...)`), and whoever answers it, there or with
`podium approve` / `podium reject`, decides whether the candidate waiting under the `challenger` alias becomes
the champion (`podium.tasks.promote.settle_candidate`).
"""

from __future__ import annotations

import contextvars
import logging
import math
import threading
from collections.abc import Callable
from typing import Literal

from prefect.client.orchestration import get_client
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from prefect.runtime import flow_run
from prefect.states import Running
from pydantic import Field

from podium.core.approval import Approval, answered, challenger_alias, timed_out, unasked, withdrawn
from podium.core.numbers import format_number
from podium.progress import say
from podium.tasks.plan import RunPlan
from podium.tasks.promote import PromotionOutcome
from podium.tracking.client import TrackingRun

logger = logging.getLogger(__name__)

POLL_S = 2  # how often the paused run asks Prefect whether it was answered (Prefect's default is 10 s)


class ApprovalInput(RunInput):
    """A decision on a candidate awaiting approval: the form of the paused flow run in the Prefect UI."""

    decision: Literal["approve", "reject"] = Field(
        description="approve: the candidate becomes the champion; reject: it is not promoted.")
    reason: str = Field(min_length=1, description="Why: kept in the serving history, the manifest and the "
                        "registered version's tags.")
    by: str = Field("", description="Who decides (your name).")


def approval_form(plan: RunPlan, tracking: TrackingRun, outcome: PromotionOutcome, mlflow_ui: str | None) -> str:
    """What the person deciding sees above the form: the candidate, the champion, every check, the links."""
    p, c = plan.config.promotion, outcome.awaiting
    assert c is not None
    champion = (f"{outcome.champion_before} ({p.metric} = {format_number(outcome.champion_before_value)}, run "
                f"{outcome.champion_before_run})" if outcome.champion_before else "none (this is the first promotion)")
    lines = [f"## Promote step {c.step} of run {tracking.run_name}?", "",
             f"- **Candidate**: step {c.step}, {p.metric} = {format_number(c.value)} ({p.mode}), staged as serving "
             f"{c.version}, MLflow `{p.registered_model}` v{c.mlflow_version} @{challenger_alias(p.alias)}",
             f"- **Champion**: {champion}", f"- **Decision so far**: {c.reason}"]
    lines += [f"- {check.describe()}" for check in outcome.checks]
    if outcome.shadow:
        lines.append(f"- **Shadow**: {outcome.shadow.reason}")
    if mlflow_ui:  # what deciding needs first: this candidate, and every checkpoint against the champion
        candidate = (f"[the candidate's metrics]({tracking.logged_model_url(mlflow_ui, c.model_id)}) · "
                     if c.model_id else "")
        lines += ["", f"{candidate}[{p.metric} of every checkpoint, the champion marked]"
                      f"({tracking.chart_url(mlflow_ui, p.metric)}) · [MLflow run]({tracking.run_url(mlflow_ui)})"
                      f" · [registered model]({tracking.registry_url(mlflow_ui, p.registered_model)})"]
    lines += ["", f"Without a decision in {p.approval_timeout_s:g} s: {p.approval_on_timeout}. From the project "
                  f"folder: `podium approve --run-name {tracking.run_name} --reason \"...\"` or `podium reject ...`."]
    return "\n".join(lines)


def await_approval(plan: RunPlan, tracking: TrackingRun, outcome: PromotionOutcome, mlflow_ui: str | None = None,
                   stop_requested: Callable[[], bool] = lambda: False) -> Approval:
    """Pause the flow run until a person decides on the candidate (the Prefect UI's form, `podium approve` or
    `podium reject`), at most `promotion.approval_timeout_s`; then what the timeout means. A stop asked for
    meanwhile (`stop_requested`) withdraws the candidate (not promoted); a pause Prefect refuses or stops answering
    leaves it undecided (not promoted either, and the run failed: podium.core.approval.unasked)."""
    p, c = plan.config.promotion, outcome.awaiting
    assert c is not None
    # the serving version first (what `podium history` and CURRENT name), the registry's own number beside it
    say("awaiting approval: step %d (%s = %s) waits as serving version %s (registered %s version %s @%s); decide in "
        "the Prefect UI or run `podium approve --run-name %s --reason \"...\"` (or `podium reject`); %s after %g s "
        "without a decision", c.step, p.metric, format_number(c.value), c.version, p.registered_model,
        c.mlflow_version, challenger_alias(p.alias), tracking.run_name,
        "rejected" if p.approval_on_timeout == "reject" else "approved", p.approval_timeout_s)
    form = ApprovalInput.with_initial_data(description=approval_form(plan, tracking, outcome, mlflow_ui))
    answer: dict[str, object] = {}
    done = threading.Event()

    def wait() -> None:
        try:
            answer["input"] = pause_flow_run(wait_for_input=form, timeout=max(1, math.ceil(p.approval_timeout_s)),
                                             poll_interval=POLL_S)
        except BaseException as exc:  # handed to the flow's thread below
            answer["error"] = exc
        finally:
            done.set()

    # a thread of its own (with the flow run's context), so that a stop asked for ends the wait
    threading.Thread(target=contextvars.copy_context().run, args=(wait,), name="podium-approval", daemon=True).start()
    while not done.wait(0.5):
        if stop_requested():
            return withdrawn("the run was stopped while the candidate awaited approval")
    error = answer.get("error")
    if error is None:
        given = answer["input"]
        assert isinstance(given, ApprovalInput)
        return answered(given.decision, given.reason, given.by)

    if isinstance(error, FlowPauseTimeout):
        resume_after_timeout(f"no decision within {p.approval_timeout_s:g} s: {p.approval_on_timeout}")
        return timed_out(p.approval_timeout_s, p.approval_on_timeout)
    logger.warning("the approval could not be asked for", exc_info=error)  # type: ignore[arg-type]
    return unasked(f"the approval could not be asked for ({type(error).__name__}: {error})"[:500])


def resume_after_timeout(message: str) -> None:
    """Put a flow run whose pause timed out back to Running (Prefect's server fails an expired pause): the run
    goes on to record that nothing was promoted, and ends Completed."""

    try:
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(flow_run.id, Running(message=message), force=True)
    except Exception:
        logger.warning("the flow run could not be set Running again after its pause timed out", exc_info=True)
