"""The watch after the switch, as pure decisions (podium.core.live) and as configuration (promotion.watch)."""

from __future__ import annotations

import pytest

from podium.config import ConfigError, WatchConfig, build_config
from podium.core.live import LiveState, WatchLimits, aggregate_watch, decide_watch
from podium.core.traffic import Traffic, WatchTally, counts_of


def _tally(replica: str, new: list[tuple[float, int]], old: list[tuple[float, int]], new_fast: bool = True,
           old_fast: bool = True) -> WatchTally:
    traffic = Traffic()
    for ms, status in new:
        traffic.add("v000002", ms, status)
    for ms, status in old:
        traffic.add("v000001", ms, status)
    return WatchTally("w1", replica, "v000002", "v000001",
                      counts_of(traffic.versions.get("v000002"), len(new) if new_fast else 0),
                      counts_of(traffic.versions.get("v000001"), len(old) if old_fast else 0))


def test_the_replicas_watch_tallies_add_up_requests_errors_and_latency_and_a_client_s_4xx_is_not_an_error():
    numbers = aggregate_watch([_tally("a", [(3.0, 200)] * 10, [(3.0, 200)] * 30),
                               _tally("b", [(3.0, 200)] * 7 + [(3.0, 500)] * 2 + [(3.0, 400)], [(3.0, 400)])])
    assert (numbers.requests, numbers.errors, numbers.previous_requests, numbers.previous_errors) == (20, 2, 31, 0)
    assert numbers.replicas == 2 and numbers.latency_p95_ratio == pytest.approx(1.0)
    assert numbers.error_rate == pytest.approx(0.1) and numbers.client_errors == 1
    limits = WatchLimits(max_error_rate_increase=0.0, max_latency_p95_ratio=2.0, min_requests=10)
    clients = aggregate_watch([_tally("a", [(3.0, 200)] * 15 + [(3.0, 400)] * 15, [(3.0, 200)] * 30)])
    verdict = decide_watch(clients, limits, over=True)
    assert verdict.state == LiveState.PASSED and "15 bad request(s) from clients (4xx, not counted)" in verdict.reason, verdict


def test_one_slow_answer_among_a_few_does_not_roll_a_good_champion_back():
    """The issue's case: a p95 above twice the previous one's on a handful of requests, most as fast as before."""
    limits = WatchLimits(max_error_rate_increase=0.0, max_latency_p95_ratio=2.0, min_requests=20)
    numbers = aggregate_watch([_tally("a", [(17.0, 200)] * 27 + [(40.0, 200)] * 3, [(17.0, 200)] * 60)])
    assert numbers.latency_p95_ratio > 2.0, numbers  # the ratio alone would roll it back
    verdict = decide_watch(numbers, limits, over=True)
    assert verdict.state == LiveState.PASSED, verdict.reason
    assert "not held against it: 1 of 30 request(s) slower than 34.0 ms" in verdict.reason, verdict.reason


def test_a_champion_three_times_slower_is_rolled_back_as_soon_as_it_has_its_requests():
    limits = WatchLimits(max_error_rate_increase=0.0, max_latency_p95_ratio=2.0, min_requests=20)
    for jitter in (0.0, 1.0, 2.5):  # however its latencies spread, every request is past the line
        new = [(3 * (10.0 + jitter * (i % 3)), 200) for i in range(20)]
        old = [(10.0 + jitter * (i % 3), 200) for i in range(40)]
        verdict = decide_watch(aggregate_watch([_tally("a", new, old)]), limits, over=False)
        assert verdict.state == LiveState.BROKE and "of 20 request(s) slower than" in verdict.reason, verdict.reason


def test_the_fast_path_against_pyfunc_is_not_judged_on_latency_and_the_verdict_says_so():
    limits = WatchLimits(max_error_rate_increase=0.0, max_latency_p95_ratio=2.0, min_requests=20)
    pyfunc = aggregate_watch([_tally("a", [(30.0, 200)] * 30, [(3.0, 200)] * 30, new_fast=False)])
    assert not pyfunc.like_with_like and pyfunc.as_dict()["like_with_like"] is False
    verdict = decide_watch(pyfunc, limits, over=True)
    assert verdict.state == LiveState.PASSED and "the new champion answered mostly through MLflow's pyfunc code, the " \
        "previous one through the fast path (not like with like)" in verdict.reason, verdict.reason
    # too few answers of the previous champion to compare with: not judged either
    few = aggregate_watch([_tally("a", [(30.0, 200)] * 30, [(3.0, 200)] * 5)])
    assert "the previous champion has 5 request(s) to compare with" in decide_watch(few, limits, over=True).reason


def test_a_watch_breaks_on_an_error_rate_above_the_previous_champions_once_it_has_its_requests():
    limits = WatchLimits(max_error_rate_increase=0.05, max_latency_p95_ratio=10.0, min_requests=20)
    few = aggregate_watch([_tally("a", [(3.0, 500)] * 5, [(3.0, 200)] * 50)])
    assert decide_watch(few, limits, over=False).state == LiveState.WATCHING  # 5 requests: not judged yet
    many = aggregate_watch([_tally("a", [(3.0, 200)] * 15 + [(3.0, 500)] * 5, [(3.0, 200)] * 50)])
    verdict = decide_watch(many, limits, over=False)
    assert verdict.state == LiveState.BROKE and "error rate 25.0 % (5 of 20)" in verdict.reason, verdict.reason
    assert verdict.reason.startswith("rolled back by its watch")
    # the previous champion failed as often: no regression
    same = aggregate_watch([_tally("a", [(3.0, 200)] * 15 + [(3.0, 500)] * 5, [(3.0, 200)] * 30 + [(3.0, 500)] * 10)])
    assert decide_watch(same, limits, over=False).state == LiveState.WATCHING


def test_a_watch_breaks_on_latency_and_passes_at_its_end_otherwise():
    limits = WatchLimits(max_error_rate_increase=0.0, max_latency_p95_ratio=2.0, min_requests=10)
    slow = aggregate_watch([_tally("a", [(90.0, 200)] * 20, [(3.0, 200)] * 20)])
    verdict = decide_watch(slow, limits, over=False)
    assert verdict.state == LiveState.BROKE and "latency p95" in verdict.reason
    good = aggregate_watch([_tally("a", [(3.0, 200)] * 20, [(3.0, 200)] * 20)])
    assert decide_watch(good, limits, over=False).state == LiveState.WATCHING
    passed = decide_watch(good, limits, over=True)
    assert passed.state == LiveState.PASSED and passed.reason.startswith("final after its watch"), passed.reason
    quiet = decide_watch(aggregate_watch([]), limits, over=True)
    assert quiet.state == LiveState.PASSED and "fewer than min_requests" in quiet.reason
    # replicas that never counted the previous champion: its latency is not judged
    alone = aggregate_watch([_tally("a", [(900.0, 200)] * 20, [])])
    assert alone.latency_p95_ratio is None and decide_watch(alone, limits, over=True).state == LiveState.PASSED


def test_promotion_watch_is_off_unless_given_and_its_limits_are_checked():
    base = {"model": "m", "storage": "/tmp/s", "serving": "/tmp/v", "data": {"train": "a", "val": "b"}}
    assert build_config(base).promotion.watch is None
    on = build_config({**base, "promotion": {"watch": {"duration_s": 30}}}).promotion.watch
    assert on == WatchConfig(duration_s=30)
    with pytest.raises(ConfigError, match="promotion.watch.max_error_rate_increase"):
        build_config({**base, "promotion": {"watch": {"max_error_rate_increase": 2}}})
