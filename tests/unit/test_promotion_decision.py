"""The promotion decision over its whole table (`podium.core.promotion`), what it asks the gathering to measure,
and the named steps that carry it out."""

from __future__ import annotations

import dataclasses

import pytest

from podium.core.promotion import (
    AWAIT,
    CANDIDATE_AGAIN,
    CHAMPION_AGAIN,
    CURRENT,
    NOTHING,
    PER_ROW,
    PROMOTE,
    REFUSE,
    SHADOW,
    Evidence,
    Policy,
    Remeasured,
    RowValues,
    decide_promotion,
    missing_evidence,
)
from podium.core.records import VALIDATED, Champion, CheckpointRecord

TONIGHT, LAST_WEEK = "a" * 64, "b" * 64  # validation data digests
POLICY = Policy("accuracy", "max")


def best(accuracy: float = 0.9, digest: str | None = TONIGHT, **metrics: float) -> CheckpointRecord:
    return CheckpointRecord(step=5, uri="/ckpt/5", status=VALIDATED, metrics={"accuracy": accuracy, **metrics},
                            val_digest=digest)


def champion(value: float | None = 0.8, source: str = "/old", metric: str = "accuracy",
             mode: str | None = "max") -> Champion:
    return Champion(version="v000001", step=1, metric=metric, value=value, source=source, mode=mode)


def evidence(candidate: CheckpointRecord | None = None, held: Champion | None = None, digest: str | None = TONIGHT,
             **kw) -> Evidence:
    """Evidence on tonight's validation data; the champion measured on it too unless `champion_digest` says."""
    kw.setdefault("champion_digest", TONIGHT)
    kw.setdefault("champion_metrics", {"accuracy": held.value} if held and held.value is not None else {})
    return Evidence(candidate, "best of 3 validated checkpoint(s) by accuracy (max)", held,
                    data="/data/val.parquet" if digest else None, digest=digest, **kw)


CLEAR = [1.0] * 90 + [0.0] * 10  # a candidate right on 90 of 100 rows
WORSE = [1.0] * 80 + [0.0] * 20

# one row of the module's table each, first match wins: (evidence, policy, action, what the reason says)
TABLE = {
    "no eligible checkpoint": (
        Evidence(None, "no checkpoints were recorded", champion()), POLICY, NOTHING,
        "nothing to promote: no checkpoints were recorded"),
    "the best is already served": (
        evidence(best(), champion(source="/ckpt/5"), champion_digest=LAST_WEEK), POLICY, CURRENT,
        "it is already the champion (v000001)"),
    "the candidate could not be re-scored, rescore refuse": (
        evidence(best(digest=LAST_WEEK), champion(), candidate_again=Remeasured(failure="ValueError: format")),
        POLICY, REFUSE, "step 5 could not be re-scored on the current validation data /data/val.parquet"),
    "the champion could not be re-scored, rescore refuse": (
        evidence(best(), champion(), champion_digest=LAST_WEEK, champion_again=Remeasured(failure="gone")),
        POLICY, REFUSE, "champion v000001 could not be re-scored on the current validation data"),
    "no champion": (
        evidence(best(), None), POLICY, PROMOTE, "first promotion to this serving location"),
    "always": (
        evidence(best(0.5), champion()), dataclasses.replace(POLICY, always=True), PROMOTE,
        "promotion forced (always), champion v000001 had 0.8000"),
    "the champion was ranked by another metric": (
        evidence(best(), champion(metric="loss", mode="min")), POLICY, REFUSE, "not comparable, not promoted"),
    "the champion was ranked in the other direction": (
        evidence(best(), champion(mode="min")), POLICY, REFUSE, "not comparable, not promoted"),
    "the champion has no finite value": (
        evidence(best(), champion(value=float("nan"))), POLICY, PROMOTE, "champion v000001 has no finite accuracy"),
    "the gain is not more than min_delta": (
        evidence(best(0.85), champion()), dataclasses.replace(POLICY, min_delta=0.05), REFUSE,
        "is not more than min_delta 0.05"),
    "better than the champion": (
        evidence(best(), champion()), POLICY, PROMOTE, "better than champion v000001 (0.8000) by 0.1000"),
}


@pytest.mark.parametrize("row", list(TABLE))
def test_the_decision_table(row):
    found, policy, action, says = TABLE[row]
    decision = decide_promotion(found, policy)
    assert decision.action == action and says in decision.reason, decision.reason
    assert decision.promote == (action in (PROMOTE, AWAIT))
    assert missing_evidence(found, policy) is None, "the evidence of the table is complete"
    if found.data is not None and found.best is not None:
        assert decision.reason.endswith(decision.comparison.describe()), "the comparison ends every reason"


def test_the_table_is_the_module_docstring_and_the_architecture_page():
    import pathlib

    import podium.core.promotion as module

    page = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    for words in ("nothing to promote", "already the champion", "refused, naming the side", "promote: the first",
                  "refused: not comparable", "not more than `min_delta`"):
        assert words in module.__doc__ and words in page, words


# --- the rows' details: re-scores, checks, approval ----------------------------------------------

def test_a_refused_rescore_names_the_setting_that_would_compare_or_replace():
    refused = decide_promotion(*TABLE["the candidate could not be re-scored, rescore refuse"][:2])
    assert "promotion.rescore = 'stored' to compare with the stored number, or promotion.always" in refused.reason
    assert refused.value == 0.9 and refused.checks == () and refused.comparison.note == ""
    assert refused.comparison.champion is None, "the champion is not measured once the candidate refuses"


@pytest.mark.parametrize("side", ["candidate", "champion"])
def test_a_failed_rescore_with_stored_compares_the_stored_number_saying_so(side):
    stored = dataclasses.replace(POLICY, rescore="stored")
    if side == "candidate":
        found = evidence(best(digest=LAST_WEEK), champion(), candidate_again=Remeasured(failure="ValueError: x"))
        says = "step 5 could not be re-scored (ValueError: x): its stored number is used"
    else:
        found = evidence(best(), champion(), champion_digest=LAST_WEEK, champion_again=Remeasured(failure="gone"))
        says = "compared with its stored number (promotion.rescore = 'stored')"
    decision = decide_promotion(found, stored)
    assert decision.action == PROMOTE and says in decision.comparison.note and says in decision.reason


def test_a_rescored_champion_is_compared_by_its_number_on_tonights_data():
    # last week's data was easier: 0.95 there, 0.85 tonight; the candidate's 0.9 tonight beats it
    found = evidence(best(0.9), champion(0.95), champion_digest=LAST_WEEK,
                     champion_again=Remeasured({"accuracy": 0.85, "loss": 0.4}))
    decision = decide_promotion(found, POLICY)
    assert decision.action == PROMOTE and "better than champion v000001 (0.8500)" in decision.reason
    assert decision.comparison.rescored == ["champion v000001"] and decision.comparison.same_data
    assert decide_promotion(dataclasses.replace(found, champion_again=None), POLICY).action == REFUSE, \
        "a side not measured again is a failed re-score"


def test_a_rescored_candidate_is_compared_by_its_number_on_tonights_data():
    found = evidence(best(0.99, digest=LAST_WEEK), champion(0.8), candidate_again=Remeasured({"accuracy": 0.7}))
    decision = decide_promotion(found, POLICY)
    assert decision.action == REFUSE and "step 5 has accuracy = 0.7000" in decision.reason
    missing = dataclasses.replace(found, candidate_again=Remeasured({"loss": 0.1}))
    assert "the validation function returned no 'accuracy' (it returned ['loss'])" in \
        decide_promotion(missing, POLICY).reason


@pytest.mark.parametrize(("policy", "action", "says"), [
    (dataclasses.replace(POLICY, thresholds={"accuracy": {"min": 0.95, "max": None}}), REFUSE,
     "refused by the promotion policy (threshold accuracy)"),
    (dataclasses.replace(POLICY, thresholds={"accuracy": {"min": 0.95, "max": None}}, always=True), PROMOTE,
     "reported, not blocking"),
    (dataclasses.replace(POLICY, guards={"loss": {"max_increase": 0.01}}), REFUSE,
     "refused by the promotion policy (guard loss)"),
    (dataclasses.replace(POLICY, thresholds={"accuracy": {"min": 0.5, "max": None}}), PROMOTE,
     "checks: threshold accuracy min 0.5: candidate 0.9000, holds"),
    (dataclasses.replace(POLICY, approval=True), AWAIT, "better than champion v000001"),
    (dataclasses.replace(POLICY, shadow=True), SHADOW, "better than champion v000001"),
    (dataclasses.replace(POLICY, shadow=True, approval=True), SHADOW, "better than champion v000001"),
    (dataclasses.replace(POLICY, approval=True, thresholds={"accuracy": {"min": 0.95, "max": None}}), REFUSE,
     "refused by the promotion policy"),
])
def test_the_policy_checks_refuse_a_promotion_unless_forced(policy, action, says):
    found = evidence(best(0.9, loss=0.5), champion(), champion_metrics={"accuracy": 0.8, "loss": 0.3})
    decision = decide_promotion(found, policy)
    assert decision.action == action and says in decision.reason, decision.reason


def test_a_guard_is_not_checked_against_a_champion_measured_on_other_data():
    guarded = dataclasses.replace(POLICY, guards={"loss": {"max_increase": 0.01}}, always=True)
    found = evidence(best(0.9, loss=0.5), champion(), champion_digest=LAST_WEEK, champion_metrics={"loss": 0.1})
    check = decide_promotion(found, guarded).checks[0]
    assert check.passed is None
    assert check.note == "champion v000001 was not measured on this validation data (promotion forced by promotion.always)"


def test_checks_without_known_validation_data_say_so_and_thresholds_still_hold():
    policy = dataclasses.replace(POLICY, thresholds={"accuracy": {"min": 0.95, "max": None}},
                                 guards={"loss": {"max_increase": 0.01}}, confidence=0.95)
    decision = decide_promotion(evidence(best(0.9, loss=0.5), None, digest=None), policy)
    assert decision.action == REFUSE and decision.comparison is None
    assert [c.passed for c in decision.checks] == [False, None, None]
    assert all(c.note == "the validation data is not known (data.val): no comparison on the same data"
               for c in decision.checks[1:])


@pytest.mark.parametrize(("rows", "without_rows", "action", "says"), [
    (RowValues(CLEAR, WORSE), "refuse", PROMOTE, "confidence 0.95 on accuracy: gain"),
    (RowValues(WORSE, WORSE), "refuse", REFUSE, "refused by the promotion policy (confidence accuracy)"),
    (RowValues(None, None, "no 'podium.per_row'"), "refuse", REFUSE, "step 5: no 'podium.per_row'"),
    (RowValues(CLEAR, None, "", "its validation failed"), "point", PROMOTE, "the champion: its validation failed"),
])
def test_confidence_decides_on_the_rows_of_both_sides(rows, without_rows, action, says):
    policy = dataclasses.replace(POLICY, confidence=0.95, confidence_without_rows=without_rows)
    found = evidence(best(0.9), champion(0.8), rows=rows)
    decision = decide_promotion(found, policy)
    assert decision.action == action and says in decision.reason, decision.reason


def test_confidence_is_not_made_when_the_point_values_already_refuse():
    policy = dataclasses.replace(POLICY, confidence=0.95)
    decision = decide_promotion(evidence(best(0.7), champion(0.8)), policy)
    assert decision.action == REFUSE and decision.checks[-1].passed is None
    assert decision.checks[-1].note == "the point values already refuse"


# --- what the decision asks the gathering to measure, in order ----------------------------------

def test_the_candidate_is_measured_again_first_then_the_champion_then_the_rows():
    policy = dataclasses.replace(POLICY, confidence=0.95)
    found = evidence(best(digest=LAST_WEEK), champion(), champion_digest=None)
    assert missing_evidence(found, policy) == CANDIDATE_AGAIN
    found = dataclasses.replace(found, candidate_again=Remeasured({"accuracy": 0.9}))
    assert missing_evidence(found, policy) == CHAMPION_AGAIN, "a champion whose data nobody recorded too"
    found = dataclasses.replace(found, champion_again=Remeasured({"accuracy": 0.8}))
    assert missing_evidence(found, policy) == PER_ROW
    assert missing_evidence(dataclasses.replace(found, rows=RowValues(CLEAR, WORSE)), policy) is None


def test_nothing_more_is_measured_once_a_failed_rescore_refuses():
    found = evidence(best(digest=LAST_WEEK), champion(), champion_digest=LAST_WEEK,
                     candidate_again=Remeasured(failure="gone"))
    assert missing_evidence(found, POLICY) is None
    assert missing_evidence(found, dataclasses.replace(POLICY, rescore="stored")) == CHAMPION_AGAIN


@pytest.mark.parametrize("found", [
    evidence(best(), champion(source="/ckpt/5"), champion_digest=LAST_WEEK),  # already the champion
    evidence(best(0.5), champion(), champion_digest=LAST_WEEK),  # always: nothing compared
    evidence(best(), champion(metric="loss"), champion_digest=LAST_WEEK),  # not comparable
])
def test_a_champion_not_compared_is_not_measured_again(found):
    assert missing_evidence(found, dataclasses.replace(POLICY, always=found.best.metrics["accuracy"] == 0.5)) is None


def test_per_row_values_only_when_a_compared_candidate_would_be_promoted():
    policy = dataclasses.replace(POLICY, confidence=0.95)
    assert missing_evidence(evidence(best(0.9), champion(0.8)), policy) == PER_ROW
    assert missing_evidence(evidence(best(0.7), champion(0.8)), policy) is None, "the point values refuse"
    assert missing_evidence(evidence(best(0.9), None), policy) is None, "no champion to compare"
    assert missing_evidence(evidence(best(0.9), champion(0.8)), POLICY) is None, "no confidence configured"
    assert missing_evidence(evidence(best(0.9), champion(0.8), digest=None), policy) is None, "data not known"


# --- carrying it out ------------------------------------------------------------------------------

def test_a_decision_is_carried_out_by_named_steps_in_order():
    from podium.tasks import carry_out

    def names(steps):
        return [s.__name__ for s in steps]

    assert names(carry_out.TO_PROMOTE) == ["stage", "verify", "seal", "switch", "alias"]
    assert names(carry_out.TO_AWAIT) == ["stage", "verify", "challenge"]
    assert names(carry_out.ONCE_APPROVED) == ["seal", "switch"]
    assert all(s.__doc__ for s in carry_out.TO_PROMOTE + carry_out.TO_AWAIT)
    # the stage the decision names is the sequence that runs: tasks/promote.py does not choose it again
    assert carry_out.SEQUENCES == {PROMOTE: carry_out.TO_PROMOTE, SHADOW: carry_out.TO_SHADOW,
                                   AWAIT: carry_out.TO_AWAIT}


@pytest.mark.parametrize(("approval", "action"), [(False, PROMOTE), (True, AWAIT)])
def test_the_first_promotion_of_a_shadowed_location_has_no_champion_to_shadow(approval, action):
    policy = dataclasses.replace(POLICY, shadow=True, approval=approval)
    assert decide_promotion(evidence(best(0.9), None), policy).action == action


def test_the_policy_is_read_from_the_promotion_settings_whole():
    """A check with a setting of its own adds it to `promotion` and `Policy` by one name: nothing reads it across."""
    from podium.config import PromotionConfig, build_config
    from podium.tasks.plan import promotion_policy

    derived = {"approval", "shadow"}
    names = {f.name for f in dataclasses.fields(Policy)} - derived
    assert names <= set(PromotionConfig.model_fields), names - set(PromotionConfig.model_fields)
    p = build_config({"promotion": {"metric": "accuracy", "mode": "max", "min_delta": 0.01, "rollout": "shadow",
                                    "thresholds": {"accuracy": {"min": 0.5}}, "allow_files": True}}).promotion
    policy = promotion_policy(p, approval=True)
    assert (policy.metric, policy.mode, policy.min_delta, policy.allow_files) == ("accuracy", "max", 0.01, True)
    assert policy.thresholds == {"accuracy": {"min": 0.5, "max": None}} and policy.approval and policy.shadow
