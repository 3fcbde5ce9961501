"""The watch after the switch (`[promotion.watch]`): once a promotion made its version current in place of a
champion, the replicas of `podium serve` count the new champion's live answers and the previous one's; the
promotion reads their tallies every second and decides (`podium.core.watch.decide_watch`). A limit broken rolls
the new champion back at once, under the promotion lock (`podium.tasks.reconcile.settle_watch`): the history
record, the registry's tags and a Prefect event say why, and the promotion's outcome too. A watch that passed
leaves the promotion final, and says so.

The watch holds no lock while it waits: a rollback or another promotion may run meanwhile, and the watch then ends
(the champion it watched no longer serves). A stop asked for during the watch ends it without a verdict: the
promotion stands (its switch was the point of no return). A kill leaves the WATCH pointer: the next command settles
the watch on the numbers written by then (`podium.tasks.reconcile.settle_orphan_watch`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from podium.core.watch import (
    BROKE,
    WATCHING,
    Settled,
    Watched,
    WatchLimits,
    WatchOutcome,
    WatchVerdict,
    aggregate_watch,
    as_settled,
    decide_watch,
)
from podium.progress import say
from podium.serving.staged import this_process
from podium.serving.watch import end_watch, read_watch_tallies, start_watch
from podium.tasks.carry_out import PromotionOutcome
from podium.tasks.live import poll_live
from podium.tasks.plan import RunPlan
from podium.tasks.promote import origin, promotion_lock
from podium.tasks.reconcile import settle_watch
from podium.tracking.client import TrackingRun

WATCH_POLL_S = 1.0  # how often the tallies are read (the replicas write theirs at their own poll_s)


def is_watched(plan: RunPlan, outcome: PromotionOutcome) -> bool:
    """Whether a promotion's outcome is watched: `[promotion.watch]` given, and a version made current in place of
    a champion (the first promotion of a location has nothing to compare with)."""
    return (plan.config.promotion.watch is not None and outcome.promoted is not None
            and outcome.champion_before is not None and outcome.promoted.version != outcome.champion_before)


def watch_limits(plan: RunPlan) -> WatchLimits:
    """What the decision reads of `promotion.watch`."""
    w = plan.config.promotion.watch
    assert w is not None
    return WatchLimits(max_error_rate_increase=w.max_error_rate_increase,
                       max_latency_p95_ratio=w.max_latency_p95_ratio, min_requests=w.min_requests)


def watch_champion(plan: RunPlan, tracking: TrackingRun, outcome: PromotionOutcome,
                   stop_requested: Callable[[], bool] = lambda: False,
                   poll_s: float = WATCH_POLL_S) -> PromotionOutcome:
    """Watch the champion `outcome` made current for `promotion.watch.duration_s`; roll it back as soon as a limit
    breaks. The outcome's `watch` holds the verdict and its numbers, its reason what became of the promotion."""
    w, p = plan.config.promotion.watch, plan.config.promotion
    assert w is not None and outcome.promoted is not None and outcome.champion_before is not None
    version, previous = outcome.promoted.version, outcome.champion_before
    watched = Watched(f"{version}-{uuid.uuid4().hex[:8]}", version, previous, watch_limits(plan), plan.config.model)
    limits = watched.limits
    start_watch(plan.serving, watched, w.duration_s, this_process(tracking.run_name, flow_run_id=_flow_run_id()),
                run_name=tracking.run_name)
    say("watch: %s serves in place of %s; watched for %g s (promotion.watch): rolled back if a limit breaks",
        version, previous, w.duration_s)
    started = time.monotonic()
    polled = poll_live(plan.serving, lambda: aggregate_watch(read_watch_tallies(plan.serving, watched.watch_id)),
                       lambda n, over: decide_watch(n, limits, over).state != WATCHING, version, w.duration_s,
                       stop_requested, poll_s)
    # the verdict on the last numbers, however the poll ended (a rollback meanwhile: settle_watch says it ended)
    verdict = decide_watch(polled.numbers, limits, polled.over)
    stopped = polled.ended == "stopped"
    state: Settled
    if stopped:
        end_watch(plan.serving, watched.watch_id)
        verdict = WatchVerdict(WATCHING, f"its watch was stopped after {time.monotonic() - started:.0f} s with no "
                                         f"limit broken ({_said(verdict)}): the promotion stands",
                               verdict.numbers)
        said, state = verdict.reason, "stopped"
    else:
        with promotion_lock(plan.serving) as still_locked:
            state = as_settled(settle_watch(plan.serving, tracking.tracking_uri, p.registered_model, p.alias, watched,
                                            verdict, still_locked, origin()))
        said = (verdict.reason if state in ("rolled-back", "passed")
                else f"its watch ended after {time.monotonic() - started:.0f} s: {version} no longer serves "
                     "(a rollback or a promotion meanwhile)")
    if verdict.state == BROKE and state == "rolled-back":
        say("watch: %s %s; %s serves again", version, said, previous)
    else:
        say("watch: %s %s", version, said)
    record = WatchOutcome(verdict, state, said, round(time.monotonic() - started, 3), version, previous)
    return outcome.model_copy(update={"watch": record, "reason": f"{outcome.reason}; {said}"})


def _flow_run_id() -> str | None:
    return str(flow_run.id) if flow_run.id else None


def _said(verdict: WatchVerdict) -> str:
    return verdict.reason.removeprefix("watched: ")


@task(name="watch-champion", cache_policy=NO_CACHE)
def watch_champion_task(plan: RunPlan, tracking: TrackingRun, outcome: PromotionOutcome,
                        stop_requested: Callable[[], bool] = lambda: False) -> PromotionOutcome:
    """Watch the new champion on live traffic; roll it back if a limit of `promotion.watch` breaks."""
    return watch_champion(plan, tracking, outcome, stop_requested)
