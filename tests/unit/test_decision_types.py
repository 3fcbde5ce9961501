"""The promotion decision and its parts travel as core types (podium.core): a Decision tagged by its action, the
Comparison, each Check, the Approval and the ShadowVerdict. As data (the attempt record, `--json`, the manifest,
the Prefect event) each keeps the plain form it always had, and what is read back is the same value again."""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace
from typing import get_args

import pytest

from podium.cli.output import summary_json
from podium.core.approval import VIA_SHADOW, Approval, answered, shadowed, timed_out, unasked, withdrawn
from podium.core.comparison import RESCORED, STORED, Comparison, Measure, comparison_from_dict, comparison_to_dict
from podium.core.live import (
    STOPPED,
    LiveState,
    ShadowNumbers,
    ShadowVerdict,
    WatchNumbers,
    WatchOutcome,
    WatchVerdict,
    stopped_shadow,
)
from podium.core.policy import (
    CONFIDENCE,
    GUARD,
    LOADABLE,
    THRESHOLD,
    Check,
    check_from_dict,
    check_to_dict,
)
from podium.core.promotion import AWAIT, CURRENT, NOTHING, PROMOTE, REFUSE, SHADOW, Action, Decision
from podium.tasks.carry_out import PromotionOutcome

CHECKS = (
    Check(THRESHOLD, "accuracy", "min", 0.5, True, 0.81),
    Check(THRESHOLD, "accuracy", "max", 0.99, False, None, note="the candidate has no finite accuracy (nan)"),
    Check(GUARD, "loss", "max_relative_increase", 0.1, None, 0.2, None, note="no champion to compare"),
    Check(CONFIDENCE, "accuracy", "lower bound > min_delta", 0.0, False, 0.81, 0.8, interval=(-0.004, 0.011),
          level=0.95, rows=200),
    Check(LOADABLE, "", "an MLflow model", 0.0, False, note="not promoted: step 5 would be served as files"),
)
COMPARISON = Comparison(
    "accuracy", "/data/val.parquet", "d" * 64,
    Measure("step 5", 0.81, "d" * 64, "validated"),
    Measure("champion v000002", 0.79, "d" * 64, RESCORED, stored_value=0.8, stored_digest="e" * 64),
    note="step 5 could not be re-scored (gone): its stored number is used",
)
NUMBERS = ShadowNumbers(requests=120, errors=1, rows=600, agreed=590, champion_p95_s=0.004, candidate_p95_s=0.005,
                        replicas=2, error_examples=("HTTP 500",), not_loaded=("replica b: no module torch",))
VERDICTS = (
    ShadowVerdict(True, "passed its shadow: 120 request(s)", NUMBERS),
    ShadowVerdict(False, "refused by its shadow: error rate 0.8 %", NUMBERS, ("error rate 0.8 % above 0.0 %",)),
    ShadowVerdict(False, "no live request reached the shadow", ShadowNumbers(), ("no traffic",)),
    stopped_shadow(NUMBERS),
)
APPROVALS = (
    answered("approve", "beats last week's", "ana (podium approve)", at=100.0),
    answered("reject", "too slow", "", at=101.5),
    timed_out(3, "reject", at=102.0),
    withdrawn("the run was stopped", at=103.0),
    unasked("Prefect did not take the pause", at=104.0),
    shadowed(True, "passed its shadow: 120 request(s)", at=105.0),
)


def _json(data: object) -> object:
    """Through JSON and back, as the attempt record, the manifest and the Prefect event carry it."""
    return json.loads(json.dumps(data))


def test_a_decision_is_tagged_by_one_of_six_actions_naming_the_next_stage():
    actions = (NOTHING, CURRENT, REFUSE, PROMOTE, SHADOW, AWAIT)
    assert set(get_args(Action)) == set(actions)
    assert [Decision(a, "why").promote for a in actions] == [False, False, False, True, True, True]
    assert [Decision(a, "why").held for a in actions] == [False, False, False, False, True, True]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: f"{c.kind}-{c.rule}")
def test_a_check_read_back_from_its_data_is_the_same_check(check):
    data = check_to_dict(check)
    assert data["text"] == check.describe() and set(data) == {f.name for f in dataclasses.fields(Check)} | {"text"}
    assert check_from_dict(_json(data)) == check


def test_a_comparison_read_back_from_its_data_is_the_same_comparison():
    data = comparison_to_dict(COMPARISON)
    assert data["champion"]["how"] == RESCORED and data["candidate"]["digest"] == "d" * 64
    assert comparison_from_dict(_json(data)) == COMPARISON
    alone = dataclasses.replace(COMPARISON, champion=None, note="")
    assert comparison_from_dict(_json(comparison_to_dict(alone))) == alone
    assert dataclasses.replace(COMPARISON.champion, how=STORED).how == "stored"


@pytest.mark.parametrize("approval", APPROVALS, ids=lambda a: a.via)
def test_an_approval_read_back_from_its_data_is_the_same_decision(approval):
    data = approval.as_dict()
    assert set(data) == {"approved", "by", "reason", "at", "via"}
    assert Approval.from_dict(_json(data)) == approval


@pytest.mark.parametrize("verdict", VERDICTS, ids=["passed", "refused", "no-traffic", "stopped"])
def test_a_shadow_verdict_read_back_from_its_data_is_the_same_verdict(verdict):
    data = verdict.as_dict()
    numbers = {"requests", "errors", "rows", "agreed", "champion_p95_s", "candidate_p95_s", "replicas",
               "error_examples", "not_loaded", "error_rate", "agreement", "latency_p95_ratio"}
    # a stopped shadow's data says so and names no failed limit; any other's lists the limits it failed
    assert set(data) == ({"passed", "stopped", "reason"} if verdict.stopped else {"passed", "reason", "failed"}) | numbers
    assert ShadowVerdict.from_dict(_json(data)) == verdict


def test_a_stopped_shadow_is_not_passed_and_says_why():
    verdict = stopped_shadow(NUMBERS)
    assert verdict.as_dict()["stopped"] is True and not verdict.passed and verdict.reason == STOPPED


def _outcome() -> PromotionOutcome:
    return PromotionOutcome(promoted=None, reason="step 5 ... refused by its shadow", best_step=5,
                            champion_before="v000002", comparison=COMPARISON, checks=CHECKS,
                            approval=shadowed(False, VERDICTS[1].reason, at=7.0), shadow=VERDICTS[1])


def test_an_outcome_as_data_keeps_each_part_s_own_plain_form():
    data = _outcome().model_dump(mode="json")  # the attempt record under <serving>/attempts/
    assert data["comparison"] == comparison_to_dict(COMPARISON)
    assert data["checks"] == _json([check_to_dict(c) for c in CHECKS])  # an interval as a list, as ever
    assert data["approval"] == {"approved": False, "by": "podium", "reason": VERDICTS[1].reason, "at": 7.0,
                                "via": VIA_SHADOW}
    assert data["shadow"] == VERDICTS[1].as_dict()
    empty = PromotionOutcome(promoted=None, reason="nothing to promote").model_dump(mode="json")
    assert (empty["comparison"], empty["checks"], empty["approval"], empty["shadow"]) == (None, [], None, None)


def test_an_outcome_read_back_from_its_attempt_record_is_the_same_outcome():
    outcome = _outcome()
    again = PromotionOutcome.model_validate(_json(outcome.model_dump(mode="json")))
    assert again == outcome and isinstance(again.checks[3], Check) and again.checks[3].interval == (-0.004, 0.011)
    assert isinstance(again.shadow, ShadowVerdict) and math.isclose(again.shadow.numbers.agreement or 0, 590 / 600)


def test_json_output_keeps_its_keys_and_the_decision_s_parts_as_plain_data():
    tracking = SimpleNamespace(run_id="r1", tracking_uri="sqlite:///m.db")
    summary = SimpleNamespace(run_name="nightly", tracking=tracking, checkpoints=[], training_ended_at=None,
                              stopped_early=None, promotion=_outcome(), late_stop=None)
    out = summary_json(summary, "/serving")
    assert list(out) == ["run_name", "mlflow_run_id", "tracking_uri", "checkpoints", "training_ended_at",
                         "stopped_early", "promoted", "promotion_reason", "comparison", "shadow", "watch",
                         "late_stop", "serving"]
    assert out["comparison"] == comparison_to_dict(COMPARISON) and out["shadow"] == VERDICTS[1].as_dict()
    json.dumps(out)  # plain data throughout
    summary.promotion = PromotionOutcome(promoted=None, reason="nothing to promote")
    none = summary_json(summary, "/serving")
    assert (none["comparison"], none["shadow"], none["watch"]) == (None, None, None)


def test_a_watch_outcome_read_back_from_its_data_is_the_same_outcome():
    """The watch after the switch (podium.tasks.watch) in `--json` and the attempt record: its verdict's numbers
    beside what became of it, read back equal."""
    numbers = WatchNumbers(requests=43, errors=22, p95_ms=9.5, previous_requests=120, previous_errors=0,
                           previous_p95_ms=4.0, replicas=2)
    said = "rolled back by its watch: error rate 51.2 %"  # as data, one reason: what became of the promotion
    broke = WatchOutcome(WatchVerdict(LiveState.BROKE, said, numbers, ("error rate",)), LiveState.ROLLED_BACK, said,
                         2.2, "v000002", "v000001")
    passed = WatchOutcome(WatchVerdict(LiveState.PASSED, "final", WatchNumbers()), LiveState.PASSED, "final", 2.0,
                          "v000002", "v000001")
    for watch in (broke, passed):
        data = _json(watch.as_dict())
        assert data["state"] == watch.state and data["requests"] == watch.verdict.numbers.requests
        assert WatchOutcome.from_dict(data) == watch
        outcome = PromotionOutcome(promoted=None, reason="r", watch=watch)
        assert PromotionOutcome.model_validate(_json(outcome.model_dump(mode="json"))).watch == watch
