"""The shadow stage (`promotion.rollout = "shadow"`): the pure verdict on the replicas' tallies
(podium.core.live), its configuration, and a replica of `podium serve` mirroring live requests to a candidate in
shadow (podium.live.server.ChampionServer, called as Ray Serve calls it, on a real serving location)."""

# ruff: noqa: F811 (the fixtures `data` and `checkpoint` are tests/helpers/served.py's, imported by name)
from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
from helpers.served import _call, _plan, _promote, _rows, _second, _served, checkpoint, data  # noqa: F401 (fixtures)

from podium.config import build_config
from podium.core.approval import VIA_SHADOW, VIA_STOP, shadowed
from podium.core.live import (
    ShadowLimits,
    ShadowNumbers,
    ShadowVerdict,
    Watched,
    WatchLimits,
    aggregate,
    decide_shadow,
    p95,
    stopped_shadow,
)
from podium.core.traffic import Tally, VersionTraffic, WatchTally, compare_answers, counts_of
from podium.errors import ConfigError
from podium.live.server import VERSION_HEADER, ChampionServer
from podium.serving.layout import read_current
from podium.serving.live import (
    end_shadow,
    read_shadow,
    read_tallies,
    read_watch,
    start_shadow,
    start_watch,
    write_watch_tally,
)
from podium.serving.staged import this_process
from podium.serving.staging import stage_version
from podium.tasks.promote import Candidate, PromotionOutcome
from podium.tasks.reconcile import disagreements, end_orphan_shadow
from podium.tasks.shadow import shadow_decision, watch_shadow
from podium.tasks.watch import settle_orphan_watch

LIMITS = ShadowLimits(max_error_rate=0.0, max_latency_p95_ratio=1.5, min_agreement=0.9)


def _numbers(requests: int = 10, errors: int = 0, rows: int = 50, agreed: int = 50, champion_s: float = 0.010,
             candidate_s: float = 0.010) -> ShadowNumbers:
    return ShadowNumbers(requests=requests, errors=errors, rows=rows, agreed=agreed, champion_p95_s=champion_s,
                         candidate_p95_s=candidate_s, replicas=1)


def test_a_candidate_within_every_limit_passes_with_its_numbers_in_the_reason():
    verdict = decide_shadow(_numbers(agreed=48), LIMITS)
    assert verdict.passed and verdict.failed == ()
    assert "10 request(s), error rate 0.0 %, agreement 96.0 % of 50 prediction(s)" in verdict.reason


def test_values_equal_to_their_limits_pass():
    limits = ShadowLimits(max_error_rate=0.1, max_latency_p95_ratio=1.5, min_agreement=0.9)
    assert decide_shadow(_numbers(errors=1, agreed=45, candidate_s=0.015), limits).passed


@pytest.mark.parametrize("numbers, failed", [
    (_numbers(errors=1), "error rate 10.0 % (1 of 10) above max_error_rate 0.0 %"),
    (_numbers(candidate_s=0.016), "latency p95 x1.60 the champion's, above max_latency_p95_ratio 1.5"),
    (_numbers(agreed=44), "agreement 88.0 % with the champion, below min_agreement 90.0 %"),
    (_numbers(errors=10, rows=0, agreed=0), "agreement n/a with the champion"),  # answered nothing to compare
    (_numbers(champion_s=0.0, candidate_s=0.001), "latency p95 xinf"),
], ids=["errors", "latency", "agreement", "no-answer-to-compare", "instant-champion"])
def test_a_candidate_over_a_limit_is_refused_naming_the_limit(numbers, failed):
    verdict = decide_shadow(numbers, LIMITS)
    assert not verdict.passed and verdict.reason.startswith("refused by its shadow: ")
    assert any(failed in f for f in verdict.failed), verdict.failed


def test_a_shadow_with_no_traffic_ends_as_configured():
    refused = decide_shadow(ShadowNumbers(), LIMITS)
    assert not refused.passed and "no live request reached the shadow" in refused.reason
    assert "on_no_traffic = refuse" in refused.reason
    promoted = decide_shadow(ShadowNumbers(), ShadowLimits(on_no_traffic="promote"))
    assert promoted.passed and "on_no_traffic = promote" in promoted.reason


def test_a_candidate_no_replica_could_load_is_refused_whatever_no_traffic_says():
    numbers = ShadowNumbers(replicas=1, not_loaded=("r1: sha256 mismatch",))
    verdict = decide_shadow(numbers, ShadowLimits(on_no_traffic="promote"))
    assert not verdict.passed and "did not load in `podium serve`: r1: sha256 mismatch" in verdict.reason


def test_nan_or_infinite_predictions_are_failures_and_numbers_agree_within_the_tolerance():
    assert compare_answers({"predictions": [1.0, 2.0]}, {"predictions": [1.0, math.nan]}, 1e-6)[0] == (
        "a NaN or infinite prediction")
    assert compare_answers({"predictions": [[0.1, 0.9]]}, {"predictions": [[0.1, math.inf]]}, 1e-6)[0] is not None
    assert compare_answers({"predictions": [1.0, 2.0, 3.0]}, {"predictions": [1.0 + 1e-9, 2.5, 3.0]}, 1e-6) == (
        None, 3, 2)
    assert compare_answers({"predictions": ["a", "b"]}, {"predictions": ["a", "c"]}, 0.5) == (None, 2, 1)
    assert compare_answers({"predictions": [1, 2]}, {"predictions": [1]}, 0)[0] == "1 prediction(s) for the champion's 2"
    columns = {"predictions": {"label": [0, 1], "p": [0.2, 0.8]}}  # column-oriented answers compare row by row
    assert compare_answers(columns, {"predictions": {"label": [0, 0], "p": [0.2, 0.8]}}, 0) == (None, 2, 1)


def test_the_replicas_tallies_sum_and_their_latencies_pool_into_one_p95():
    a, b = Tally("s", "r1"), Tally("s", "r2")
    for _ in range(19):
        a.add(0.010, 0.011, None, 5, 5)
    b.add(0.010, 0.500, "answered 400: bad input", 0, 0)
    numbers = aggregate([a, b])
    assert (numbers.requests, numbers.errors, numbers.rows, numbers.agreed) == (20, 1, 95, 95)
    assert numbers.candidate_p95_s == 0.011 and numbers.error_examples == ("answered 400: bad input",)
    assert p95([]) is None and p95([3.0]) == 3.0
    assert Tally.from_dict({**a.as_dict(), "unknown": 1}) == a


def test_a_shadows_verdict_is_recorded_as_the_decision_on_the_candidate():
    decision = shadowed(False, "refused by its shadow: error rate 50.0 %")
    assert decision.via == VIA_SHADOW and decision.describe() == "refused by its shadow: error rate 50.0 %"
    assert decision.tags()["podium.approval"] == "shadow refused"


def test_a_stopped_shadow_is_stopped_in_a_word_not_refused():
    assert stopped_shadow(ShadowNumbers(requests=3)).outcome == "stopped"
    assert decide_shadow(ShadowNumbers(), ShadowLimits(on_no_traffic="refuse")).outcome == "refused"
    assert decide_shadow(ShadowNumbers(), ShadowLimits(on_no_traffic="promote")).outcome == "passed"


def test_the_shadow_config_is_checked_naming_the_field():
    config = build_config({"promotion": {"rollout": "shadow", "shadow": {"requests": 20, "duration_s": 5}}})
    assert config.promotion.rollout == "shadow" and config.promotion.shadow.requests == 20
    assert build_config({}).promotion.rollout == "direct"  # today's behaviour stays the default
    for bad, expected in [({"rollout": "canary"}, "promotion.rollout = 'canary': Input should be 'direct' or 'shadow'"),
                          ({"shadow": {"requests": 0}}, "promotion.shadow.requests = 0"),
                          ({"shadow": {"min_agreement": 1.5}}, "promotion.shadow.min_agreement = 1.5"),
                          ({"shadow": {"duration_s": math.inf}}, "promotion.shadow.duration_s = inf"),
                          ({"shadow": {"on_no_traffic": "wait"}}, "promotion.shadow.on_no_traffic = 'wait'")]:
        with pytest.raises(ConfigError) as err:
            build_config({"promotion": bad})
        assert expected in str(err.value)


def _stage_candidate(tmp_path: Path, plan, data):
    """A second version staged (not sealed) beside the champion, as a promotion in shadow leaves it."""
    served_2 = _second(tmp_path, data)
    return stage_version(plan.serving, served_2.files_uri, {"step": 9, "source": "/ckpt-9", **served_2.info},
                         served_2.content)


def _drained(server: ChampionServer) -> None:
    server._mirrors.submit(lambda: None).result()  # the mirrors run in order on one thread: all done after this
    server._follow_once()  # writes the tally


def test_a_replica_mirrors_requests_to_the_candidate_in_shadow_and_answers_with_the_champion(
        tmp_path, data, checkpoint):
    plan, served = _served(tmp_path, data, checkpoint[0])
    v1 = _promote(plan, served)
    server = ChampionServer(plan.serving, poll_s=3600, replica="r1")
    candidate = _stage_candidate(tmp_path, plan, data)
    start_shadow(plan.serving, "s1", candidate, v1.version, {}, requests=3, agreement_tolerance=1e-6)
    server._follow_once()
    assert _call(server, "GET", "/health")[2]["shadow"] == {"version": candidate.version, "shadow_id": "s1",
                                                            "requests": 0}
    for _ in range(4):  # one more than the shadow asked for: not mirrored
        status, headers, said = _call(server, "POST", "/invocations", _rows(data))
        assert status == 200 and headers[VERSION_HEADER.lower()] == v1.version and len(said["predictions"]) == 5
    assert _call(server, "POST", "/invocations", b'{"no": "rows"}')[0] == 400  # the champion's error: not mirrored
    _drained(server)
    [tally] = read_tallies(plan.serving, "s1")
    assert (tally.replica, tally.champion, tally.candidate) == ("r1", v1.version, candidate.version)
    assert (tally.requests, tally.errors, tally.rows) == (3, 0, 15) and 0 <= tally.agreed <= 15
    assert len(tally.champion_latency_s) == len(tally.candidate_latency_s) == 3

    assert end_shadow(plan.serving, "s1") and read_shadow(plan.serving) is None
    server._follow_once()
    assert _call(server, "GET", "/health")[2]["shadow"] is None
    _call(server, "POST", "/invocations", _rows(data))
    _drained(server)
    assert read_tallies(plan.serving, "s1")[0].requests == 3  # the shadow ended: nothing more mirrored


def test_a_candidate_that_fails_its_checks_is_not_shadowed_and_the_replica_says_why(tmp_path, data, checkpoint):
    plan, served = _served(tmp_path, data, checkpoint[0])
    v1 = _promote(plan, served)
    server = ChampionServer(plan.serving, poll_s=3600, replica="r1")
    candidate = _stage_candidate(tmp_path, plan, data)
    shutil.rmtree(Path(candidate.uri) / "data")  # its files damaged after it was staged
    start_shadow(plan.serving, "s2", candidate, v1.version, {}, requests=3)
    server._follow_once()
    assert "s2" in _call(server, "GET", "/health")[2]["shadow_refused"]
    assert _call(server, "POST", "/invocations", _rows(data))[1][VERSION_HEADER.lower()] == v1.version
    [tally] = read_tallies(plan.serving, "s2")
    assert tally.requests == 0 and tally.not_loaded and "missing" in tally.not_loaded
    assert not decide_shadow(aggregate([tally]), LIMITS).passed


def test_one_candidate_is_shadowed_at_a_time(tmp_path, data, checkpoint):
    plan, served = _served(tmp_path, data, checkpoint[0])
    v1 = _promote(plan, served)
    candidate = _stage_candidate(tmp_path, plan, data)
    start_shadow(plan.serving, "s3", candidate, v1.version, {"run_name": "first"})
    with pytest.raises(Exception, match="already in shadow"):
        start_shadow(plan.serving, "s4", candidate, v1.version, {})


def test_a_shadow_left_by_a_killed_promotion_is_ended_by_the_next_command_and_a_live_one_is_kept(
        tmp_path, data, checkpoint):
    plan, served = _served(tmp_path, data, checkpoint[0])
    v1 = _promote(plan, served)
    candidate = _stage_candidate(tmp_path, plan, data)
    start_shadow(plan.serving, "s5", candidate, v1.version, this_process("live"))
    assert end_orphan_shadow(plan.serving) is None and read_shadow(plan.serving) is not None  # its process runs
    end_shadow(plan.serving, "s5")
    gone = {**this_process("killed"), "pid": 2 ** 22 + 1}  # above Linux's largest process id: no such process
    start_shadow(plan.serving, "s6", candidate, v1.version, gone)
    assert any("SHADOW names" in d for d in disagreements(plan.serving, f"sqlite:///{tmp_path / 'mlflow.db'}",
                                                            "churn", "champion"))
    assert end_orphan_shadow(plan.serving) == candidate.version and read_shadow(plan.serving) is None


def test_a_watch_left_by_a_killed_promotion_is_settled_by_the_next_command_on_its_own_limits(
        tmp_path, data, checkpoint):
    """The WATCH pointer carries the watch (its limits included) for the next command: a limit broken on the numbers
    the replicas wrote rolls the watched champion back, and the pointer goes."""
    plan, served = _served(tmp_path, data, checkpoint[0])
    v1 = _promote(plan, served)
    v2 = _promote(plan, _second(tmp_path, data), step=9)
    gone = {**this_process("killed"), "pid": 2 ** 22 + 1}  # above Linux's largest process id: no such process
    limits = WatchLimits(max_error_rate_increase=0.0, min_requests=5)
    start_watch(plan.serving, Watched("w1", v2.version, v1.version, limits, "churn"), 60.0, gone)
    pointer = read_watch(plan.serving)
    assert pointer is not None and pointer.watched == Watched("w1", v2.version, v1.version, limits, "churn")
    failing, fine = VersionTraffic(), VersionTraffic()
    for i in range(10):
        failing.add(1.0, 500 if i < 5 else 200)
        fine.add(1.0, 200)
    write_watch_tally(plan.serving, WatchTally("w1", "r1", v2.version, v1.version, counts_of(failing),
                                               counts_of(fine)))
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert settle_orphan_watch(plan.serving, tracking_uri, "churn", "champion") == "rolled-back"
    assert read_current(plan.serving).version == v1.version and read_watch(plan.serving) is None
    assert settle_orphan_watch(plan.serving, tracking_uri, "churn", "champion") is None  # nothing left


def test_a_passed_shadow_is_handed_to_the_person_when_approval_is_required_and_a_refused_one_never_is(
        tmp_path, data):
    def outcome(passed: bool, stopped: bool = False) -> PromotionOutcome:
        verdict = stopped_shadow(_numbers()) if stopped else ShadowVerdict(passed, "numbers", _numbers())
        return PromotionOutcome(promoted=None, reason="", shadow=verdict)

    unattended, attended = _plan(tmp_path, data), _plan(tmp_path, data, approval="required")
    assert shadow_decision(attended, outcome(True)) is None  # the person decides, with the numbers
    refused = shadow_decision(attended, outcome(False))
    assert refused is not None and not refused.approved and refused.via == VIA_SHADOW
    passed = shadow_decision(unattended, outcome(True))
    assert passed is not None and passed.approved and passed.via == VIA_SHADOW
    stopped = shadow_decision(attended, outcome(False, stopped=True))
    assert stopped is not None and stopped.via == VIA_STOP


def test_a_shadow_ends_refused_as_soon_as_the_champion_changes_during_it(tmp_path, data, checkpoint):
    plan, served = _served(tmp_path, data, checkpoint[0], rollout="shadow")
    v1 = _promote(plan, served)
    candidate = _stage_candidate(tmp_path, plan, data)
    start_shadow(plan.serving, "s7", candidate, v1.version, this_process("run"))
    v3 = _promote(plan, served, step=7)  # another promotion (or a rollback) while the candidate was in shadow
    waiting = Candidate(version=candidate.version, uri=candidate.uri, manifest=candidate.manifest, mlflow_version=None,
                        step=9, value=0.9, checkpoint_uri="/ckpt-9", reason="better", shadow_id="s7")
    outcome = PromotionOutcome(promoted=None, reason="", champion_before=v1.version, awaiting=waiting)
    verdict = watch_shadow(plan, outcome, poll_s=0.05).shadow  # duration_s is 600 s: it ends long before
    assert verdict is not None and not verdict.passed and read_shadow(plan.serving) is None
    assert f"the champion changed during its shadow ({v1.version} -> {v3.version})" in verdict.reason


def test_a_shadow_during_which_the_champion_changed_is_refused_whatever_its_numbers():
    verdict = decide_shadow(_numbers(), LIMITS, champion_changed="v000002 -> v000001")
    assert not verdict.passed and "the champion changed during its shadow (v000002 -> v000001)" in verdict.reason
