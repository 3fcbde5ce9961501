"""The watch after the switch (`[promotion.watch]`): once a promotion made its version current in place of a
champion, the replicas of `podium serve` count the new champion's live answers and the previous one's; the
promotion reads their tallies every second and decides (`podium.core.live.decide_watch`). A limit broken rolls
the new champion back at once, under the promotion lock (`settle_watch`, here): the history
record, the registry's tags and a Prefect event say why, and the promotion's outcome too. A watch that passed
leaves the promotion final, and says so.

The watch holds no lock while it waits: a rollback or another promotion may run meanwhile, and the watch then ends
(the champion it watched no longer serves). A stop asked for during the watch ends it without a verdict: the
promotion stands (its switch was the point of no return). A kill leaves the WATCH pointer: the next command settles
the watch on the numbers written by then (`settle_orphan_watch`, here, which
`podium.tasks.promote.finish_cut_short` calls).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from podium.core.live import (
    LiveState,
    Watched,
    WatchLimits,
    WatchOutcome,
    WatchVerdict,
    aggregate_watch,
    decide_watch,
)
from podium.prefect_events import EVENT_ROLLED_BACK, emit_news, model_resource, news_related
from podium.progress import say
from podium.serving import layout
from podium.serving.live import end_watch, read_watch, read_watch_tallies, start_watch
from podium.serving.staged import is_alive, this_process
from podium.settings import current_user
from podium.tasks.carry_out import PromotionOutcome
from podium.tasks.live import poll_live
from podium.tasks.plan import RunPlan
from podium.tasks.reconcile import end_flow_run, origin, promotion_lock, switch_back
from podium.tracking import ledger
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
                       lambda n, over: decide_watch(n, limits, over).state != LiveState.WATCHING, version, w.duration_s,
                       stop_requested, poll_s)
    # the verdict on the last numbers, however the poll ended (a rollback meanwhile: settle_watch says it ended)
    verdict = decide_watch(polled.numbers, limits, polled.over)
    stopped = polled.ended == "stopped"
    state: LiveState
    if stopped:
        verdict = WatchVerdict(LiveState.WATCHING, f"its watch was stopped after {time.monotonic() - started:.0f} s with no "
                                         f"limit broken ({_said(verdict)}): the promotion stands",
                               verdict.numbers)
        said, state = verdict.reason, LiveState.STOPPED
        # the registered version says so too (`podium.watch = stopped`), as it says passed or rolled-back
        _record_watch(plan.serving, tracking.tracking_uri, p.registered_model, version, state, verdict)
        end_watch(plan.serving, watched.watch_id)
    else:
        with promotion_lock(plan.serving) as still_locked:
            state = settle_watch(plan.serving, tracking.tracking_uri, p.registered_model, p.alias, watched,
                                 verdict, still_locked, origin())
        said = (verdict.reason if state in (LiveState.ROLLED_BACK, LiveState.PASSED)
                else f"its watch ended after {time.monotonic() - started:.0f} s: {version} no longer serves "
                     "(a rollback or a promotion meanwhile)")
    if verdict.state == LiveState.BROKE and state == LiveState.ROLLED_BACK:
        say("watch: %s %s; %s serves again", version, said, previous)
    else:
        say("watch: %s %s", version, said)
    record = WatchOutcome(verdict, state, said, round(time.monotonic() - started, 3), version, previous)
    return outcome.model_copy(update={"watch": record, "reason": f"{outcome.reason}; {said}"})


def settle_watch(serving: str, tracking_uri: str, name: str, alias: str, watched: Watched,
                 verdict: WatchVerdict, still_locked: Callable[[], None], origin: dict[str, Any]) -> LiveState:
    """Carry out a watch's verdict, under the promotion lock: a limit broken rolls the watched version back to the
    champion it replaced (the history record says why), if it still serves; then its registered version is tagged
    with the outcome (`podium.watch`: rolled-back, passed, or ended when the champion changed meanwhile), the
    WATCH pointer goes, and a rollback is announced (`podium.serving.rolled-back`, the verdict in its payload).
    Returns what became of the watch (one of `SETTLED`)."""
    version, previous = watched.version, watched.previous
    current = (layout.read_pointer(serving) or {}).get("version")
    outcome = LiveState.PASSED
    back = None
    if current != version:
        outcome = LiveState.ENDED  # a rollback or a promotion meanwhile: the watched champion no longer serves
    elif verdict.state == LiveState.BROKE:
        back = switch_back(serving, tracking_uri, name, alias, still_locked, previous, verdict.reason,
                           {**origin, "watch": verdict.as_dict()})
        outcome = LiveState.ROLLED_BACK
    _record_watch(serving, tracking_uri, name, version, outcome, verdict)
    end_watch(serving, watched.watch_id)
    if back is not None and back.switched:
        model = watched.model or name
        emit_news(EVENT_ROLLED_BACK, model_resource(model), news_related(None, None, None, back.mlflow_version, name),
                  {"model": model, "registered_model": name, "from_version": back.from_version,
                   "to_version": back.to_version, "mlflow_version": back.mlflow_version, "withdrawn": back.withdrawn,
                   "reason": verdict.reason, "watch": verdict.as_dict()})
    return outcome


def _record_watch(serving: str, tracking_uri: str, name: str, version: str, outcome: LiveState,
                  verdict: WatchVerdict) -> None:
    """The watch's outcome on the registered version of the serving version it watched (one never registered: none)."""
    served = layout.read_version(serving, version)
    if served is not None:
        ledger.record_watch(tracking_uri, name, served.manifest.get("version_uid"), served.uri, outcome, verdict)


def settle_orphan_watch(serving: str, tracking_uri: str, name: str, alias: str) -> LiveState | None:
    """Settle a watch whose promoter is gone (seen from this host), on the numbers the replicas wrote by then: a
    limit broken rolls the watched champion back, else it is final (`settle_watch`); the promoter's flow run ends
    saying so. Returns the outcome's word; None when no watch was left. Call it under the promotion lock."""
    pointer = read_watch(serving)
    if pointer is None or is_alive(pointer.by) is not False:
        return None
    watched = pointer.watched
    numbers = aggregate_watch(read_watch_tallies(serving, watched.watch_id))
    verdict = decide_watch(numbers, watched.limits, over=True)
    cut = "its promoter ended during its watch, settled by the next command: "
    verdict = WatchVerdict(verdict.state, cut + verdict.reason, verdict.numbers, verdict.failed)
    origin = {"user": current_user(), "host": socket.gethostname(), "pid": os.getpid(),
              "command": "settled a watch its promoter left"}
    outcome = settle_watch(serving, tracking_uri, name, alias, watched, verdict, lambda: None, origin)
    version = watched.version
    said = (f"rolled back {version} to {watched.previous}: {verdict.reason}" if outcome == LiveState.ROLLED_BACK
            else f"{version}: {verdict.reason}" if outcome == LiveState.PASSED
            else f"ended the watch of {version}: it no longer serves")
    say("serving %s: %s", serving, said)
    flow_run_id = pointer.by.get("flow_run_id")
    if flow_run_id:
        end_flow_run(tracking_uri, str(flow_run_id), said)
    return outcome


def _flow_run_id() -> str | None:
    return str(flow_run.id) if flow_run.id else None


def _said(verdict: WatchVerdict) -> str:
    return verdict.reason.removeprefix("watched: ")


@task(name="watch-champion", cache_policy=NO_CACHE)
def watch_champion_task(plan: RunPlan, tracking: TrackingRun, outcome: PromotionOutcome,
                        stop_requested: Callable[[], bool] = lambda: False) -> PromotionOutcome:
    """Watch the new champion on live traffic; roll it back if a limit of `promotion.watch` breaks."""
    return watch_champion(plan, tracking, outcome, stop_requested)
