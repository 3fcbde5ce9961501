"""The shadow stage of a promotion (`promotion.rollout = "shadow"`): gather the replicas' tallies while the
candidate answers mirrored live requests, decide once (`podium.core.live.decide_shadow`), and hand the verdict
to the settlement (`podium.tasks.promote.settle_candidate`) or to the person who decides (`promotion.approval`).

The candidate was staged, verified, registered as the challenger and put in shadow under the promotion lock
(`podium.tasks.carry_out.TO_SHADOW`). The wait for traffic holds no lock: a rollback may run meanwhile, and the
settlement, under the lock again, refuses a candidate whose champion changed. A stop asked for during the shadow
withdraws the candidate, as one awaiting approval is withdrawn; a kill leaves its SHADOW pointer and staged copy
to the next command (`podium.tasks.reconcile.withdraw_orphans`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from podium import prefect_api
from podium.core.approval import Approval, shadowed, withdrawn
from podium.core.live import ShadowLimits, ShadowNumbers, aggregate, decide_shadow, shadow_has_answer, stopped_shadow
from podium.core.numbers import format_percent
from podium.progress import say
from podium.serving.live import end_shadow, read_tallies
from podium.tasks.live import poll_live
from podium.tasks.plan import RunPlan
from podium.tasks.promote import PromotionOutcome
from podium.tasks.report import artifact_key
from podium.tracking.client import TrackingRun

logger = logging.getLogger(__name__)

TALLY_POLL_S = 1.0  # how often the tallies are read (the replicas write theirs at their own poll_s)


def shadow_limits(plan: RunPlan) -> ShadowLimits:
    """What the decision reads of `promotion.shadow`."""
    s = plan.config.promotion.shadow
    return ShadowLimits(max_error_rate=s.max_error_rate, max_latency_p95_ratio=s.max_latency_p95_ratio,
                        min_agreement=s.min_agreement, on_no_traffic=s.on_no_traffic)


def watch_shadow(plan: RunPlan, outcome: PromotionOutcome, stop_requested: Callable[[], bool] = lambda: False,
                 poll_s: float = TALLY_POLL_S) -> PromotionOutcome:
    """Wait until the replicas mirrored `promotion.shadow.requests` requests to the candidate, or for
    `duration_s`, whichever comes first (sooner if every replica failed to load it, the champion changed or a
    stop was asked for); end the shadow and decide on the numbers. The outcome's `shadow` holds the verdict."""
    s, c = plan.config.promotion.shadow, outcome.awaiting
    assert c is not None and c.shadow_id is not None
    say("shadow: %s answers a copy of the live requests beside %s until %d request(s) or %g s (promotion.shadow)",
        c.version, outcome.champion_before, s.requests, s.duration_s)
    shadow_id = c.shadow_id  # a str, for the reader below
    try:
        polled = poll_live(plan.serving, lambda: aggregate(read_tallies(plan.serving, shadow_id)),
                           lambda n, _: shadow_has_answer(n, s.requests),
                           outcome.champion_before, s.duration_s, stop_requested, poll_s)
    finally:
        end_shadow(plan.serving, shadow_id)
    # a rollback meanwhile: compared with another champion, no need to wait
    changed = f"{outcome.champion_before} -> {polled.current}" if polled.ended == "moved" else None
    verdict = (stopped_shadow(polled.numbers) if polled.ended == "stopped"
               else decide_shadow(polled.numbers, shadow_limits(plan), changed))
    say("shadow: %s %s", c.version, verdict.reason)
    return outcome.model_copy(update={"shadow": verdict})


def shadow_decision(plan: RunPlan, outcome: PromotionOutcome) -> Approval | None:
    """What the shadow's verdict decides on the candidate: refused (or withdrawn) whatever else is configured;
    passed, promoted unless a person must approve it too (None: ask them, with the numbers)."""
    verdict = outcome.shadow
    assert verdict is not None
    if verdict.stopped:
        return withdrawn(verdict.reason)
    if not verdict.passed or not plan.policy.approval:
        return shadowed(verdict.passed, verdict.reason)
    return None


def shadow_markdown(run_name: str, outcome: PromotionOutcome, limits: ShadowLimits) -> str:
    """The shadow comparison, as the Prefect artifact shows it."""
    v, c = outcome.shadow, outcome.awaiting
    n = v.numbers if v is not None else ShadowNumbers()

    def ms(x: float | None) -> str:
        return "n/a" if x is None else f"{1000 * x:.1f} ms"

    ratio = n.latency_p95_ratio
    rows = [("requests mirrored", str(n.requests), ""),
            ("error rate", f"{format_percent(n.error_rate)} ({n.errors})", f"≤ {format_percent(limits.max_error_rate)}"),
            ("agreement", f"{format_percent(n.agreement)} of {n.rows} predictions", f"≥ {format_percent(limits.min_agreement)}"),
            ("latency p95", f"{ms(n.candidate_p95_s)} vs the champion's {ms(n.champion_p95_s)}"
             + (f" (x{ratio:.2f})" if ratio is not None else ""), f"≤ x{limits.max_latency_p95_ratio:g}"),
            ("replicas", str(n.replicas), "")]
    lines = [f"## Shadow of {c.version if c else 'the candidate'} ({run_name}) beside {outcome.champion_before}", "",
             f"**{'Passed' if v is not None and v.passed else 'Refused'}**: {v.reason if v is not None else ''}", "",
             "| | candidate | limit |", "|---|---|---|", *(f"| {a} | {b} | {lim} |" for a, b, lim in rows)]
    if n.error_examples:
        lines += ["", "Failures, first ones:", *(f"- `{e}`" for e in n.error_examples)]
    for why in n.not_loaded:
        lines += [f"- not loaded: {why}"]
    return "\n".join(lines)


@task(name="shadow-candidate", cache_policy=NO_CACHE)
def shadow_candidate_task(plan: RunPlan, tracking: TrackingRun, outcome: PromotionOutcome,
                          stop_requested: Callable[[], bool] = lambda: False) -> PromotionOutcome:
    """Shadow the candidate on live requests and decide on the comparison; the comparison as a Prefect artifact."""
    shadowed_outcome = watch_shadow(plan, outcome, stop_requested)
    key = artifact_key(tracking.run_name, "shadow")
    markdown = shadow_markdown(tracking.run_name, shadowed_outcome, shadow_limits(plan))
    prefect_api.call("the shadow comparison artifact", lambda: create_markdown_artifact(
        markdown=markdown, key=key, description=f"Shadow comparison of {tracking.run_name}'s candidate"), key=key)
    return shadowed_outcome
