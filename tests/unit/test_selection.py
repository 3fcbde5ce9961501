"""select_best and compare_with_champion: which checkpoint is best, and does its point value beat the champion's."""

from __future__ import annotations

import math

import pytest

from podium.core.promotion import compare_with_champion, select_best
from podium.core.records import FAILED, PENDING, VALIDATED, Champion, CheckpointRecord
from podium.core.verdict import judge_training, judge_validation


def rec(step: int, status: str = VALIDATED, **metrics: float) -> CheckpointRecord:
    return CheckpointRecord(step=step, uri=f"/ckpt/{step}", status=status, metrics=metrics)


def champ(value: float | None, metric: str = "val_loss", source: str | None = "/old") -> Champion:
    return Champion(version="v000001", step=1, metric=metric, value=value, source=source)


# --- select_best ---------------------------------------------------------------------------------

@pytest.mark.parametrize("mode, expected_step", [("min", 2), ("max", 3)])
def test_select_best_follows_mode(mode, expected_step):
    records = [rec(1, val_loss=0.5), rec(2, val_loss=0.1), rec(3, val_loss=0.9)]
    best, _ = select_best(records, "val_loss", mode)
    assert best.step == expected_step


@pytest.mark.parametrize("mode", ["min", "max"])
def test_select_best_tie_goes_to_later_step(mode):
    records = [rec(4, val_loss=0.2), rec(9, val_loss=0.2), rec(6, val_loss=0.2)]
    best, _ = select_best(records, "val_loss", mode)
    assert best.step == 9


def test_select_best_ignores_failed_and_pending():
    records = [rec(1, FAILED, val_loss=0.01), rec(2, PENDING, val_loss=0.02), rec(3, val_loss=0.5)]
    best, why = select_best(records, "val_loss", "min")
    assert best.step == 3
    assert "2 checkpoint(s) not eligible" in why


@pytest.mark.parametrize("metrics", [{"val_loss": math.nan}, {"val_loss": -math.inf}, {"val_loss": math.inf},
                                     {"accuracy": 0.9}], ids=["nan", "-inf", "inf", "missing"])
@pytest.mark.parametrize("mode", ["min", "max"])
def test_select_best_ignores_non_finite_or_missing_metric(metrics, mode):
    best, _ = select_best([rec(1, **metrics), rec(2, val_loss=0.7)], "val_loss", mode)
    assert best.step == 2


def test_metric_nobody_reports_names_it_and_the_reported_ones():
    best, why = select_best([rec(1, val_loss=0.3), rec(2, val_accuracy=0.8)], "f1", "max")
    assert best is None
    assert "'f1'" in why and "['val_accuracy', 'val_loss']" in why


def test_only_non_finite_values_gives_a_reason_naming_the_metric():
    best, why = select_best([rec(1, val_loss=math.nan), rec(2, val_loss=math.inf)], "val_loss", "min")
    assert best is None
    assert "NaN or infinite 'val_loss'" in why


def test_nothing_validated_gives_a_reason():
    best, why = select_best([rec(1, FAILED), rec(2, PENDING)], "val_loss", "min")
    assert best is None
    assert "none of the 2 checkpoints was validated" in why


def test_empty_list():
    assert select_best([], "val_loss", "min") == (None, "no checkpoints were recorded")


def test_invalid_mode_is_rejected():
    with pytest.raises(ValueError, match="'sideways'"):
        select_best([rec(1, val_loss=0.1)], "val_loss", "sideways")


# --- compare_with_champion ------------------------------------------------------------------------

def decide(value: float, champion: Champion | None, mode: str = "min", **kw):
    return compare_with_champion(rec(5, val_loss=value), champion, "val_loss", mode, **kw)


def test_first_promotion():
    decision = decide(0.4, None)
    assert decision.promote and decision.value == 0.4 and decision.candidate.step == 5
    assert "first promotion" in decision.reason


def test_always_promotes_a_worse_candidate():
    assert not decide(0.9, champ(0.1)).promote
    assert decide(0.9, champ(0.1), always=True).promote


@pytest.mark.parametrize("mode, value, champion_value", [("min", 0.29, 0.4), ("max", 0.51, 0.4)])
def test_improvement_must_be_strictly_more_than_min_delta(mode, value, champion_value):
    assert decide(value, champ(champion_value), mode, min_delta=0.1).promote
    assert not decide(value, champ(champion_value), mode, min_delta=0.2).promote


@pytest.mark.parametrize("mode", ["min", "max"])
def test_equal_value_is_not_promoted(mode):
    decision = decide(0.25, champ(0.25), mode)
    assert not decision.promote
    assert "not more than min_delta" in decision.reason


def test_champion_ranked_by_another_metric_is_not_comparable():
    decision = decide(0.1, champ(0.9, metric="accuracy"))
    assert not decision.promote
    assert "'accuracy'" in decision.reason and "not comparable" in decision.reason


def test_champion_ranked_in_the_other_direction_is_not_comparable_unless_replaced():
    # same metric name, opposite direction: a "better" number means nothing against it
    champion = Champion(version="v000003", step=1, metric="val_loss", value=0.9, source="/old", mode="max")
    decision = decide(0.1, champion, "min")
    assert not decision.promote
    assert "not comparable" in decision.reason and "(max)" in decision.reason and "--always-promote" in decision.reason
    assert decide(0.1, champion, "min", always=True).promote
    assert decide(0.1, Champion(version="v1", step=1, metric="val_loss", value=0.9, source="/old", mode="min")).promote


@pytest.mark.parametrize("value", [None, math.nan, math.inf])
def test_champion_without_finite_value_is_replaced(value):
    decision = decide(0.9, champ(value))
    assert decision.promote
    assert "no finite val_loss" in decision.reason


def test_candidate_already_champion_by_source_uri():
    decision = decide(0.1, champ(0.5, source="/ckpt/5"), always=True)
    assert not decision.promote
    assert "already the champion" in decision.reason


def test_nothing_to_promote_carries_the_selection_reason():
    decision = compare_with_champion(None, champ(0.5), "val_loss", "min", why_best="no checkpoints were recorded")
    assert not decision.promote and decision.candidate is None
    assert decision.reason == "nothing to promote: no checkpoints were recorded"


# --- verdicts: what a validation returned, what training reported --------------------------------

def test_finite_numbers_with_the_metric_are_validated():
    assert judge_validation({"val_loss": 0.3, "val_accuracy": 0.9}, {}, {"loss": 0.4}, "val_loss") is None
    assert judge_validation({"val_accuracy": 0.9}, {}, {"loss": 0.4}, "loss") is None  # ranked by a training metric


@pytest.mark.parametrize("value, shown", [(math.nan, "val_loss = nan"), (math.inf, "val_loss = inf"),
                                          (-math.inf, "val_loss = -inf")])
def test_a_non_finite_metric_fails_the_checkpoint_even_if_the_ranking_metric_is_finite(value, shown):
    # a model with NaN weights: its accuracy is a finite number, its loss is not
    reason = judge_validation({"val_loss": value, "val_accuracy": 0.25}, {}, {}, "val_accuracy")
    assert reason == f"validation returned non-finite metric(s): {shown}"


def test_a_string_metric_fails_the_checkpoint_naming_it():
    reason = judge_validation({}, {"score": "'high' (str)"}, {}, "score")
    assert reason == "validation returned non-numeric metric(s): score = 'high' (str)"


def test_a_missing_ranking_metric_fails_the_checkpoint_naming_what_was_returned():
    reason = judge_validation({"val_accuracy": 0.9}, {}, {"loss": 0.3}, "f1")
    assert reason == "validation returned no 'f1' (the promotion metric); it returned ['val_accuracy'], " \
                     "training reported ['loss']"


def test_a_diverged_training_loss_fails_the_checkpoint():
    assert judge_training({"loss": math.nan, "accuracy": 0.25, "epoch": 1.0}, 94) == \
        "training metric(s) not finite at step 94: loss = nan"
    assert judge_training({"loss": 0.3}, 94) is None


# --- withdrawn checkpoints -----------------------------------------------------------------------

def test_withdrawn_checkpoints_are_never_selected_and_the_reason_says_why():
    records = [rec(1, val_loss=0.5), rec(2, val_loss=0.1), rec(3, val_loss=0.3)]
    best, why = select_best(records, "val_loss", "min", withdrawn={"/ckpt/2": "served as v000003, rolled back"})
    assert best.step == 3
    assert "step 2 is withdrawn (served as v000003, rolled back)" in why
    tagged = [*records[:2], CheckpointRecord(step=3, uri="/ckpt/3", status=VALIDATED, metrics={"val_loss": 0.3},
                                             withdrawn="withdrawn from /srv (v000002)")]
    best, why = select_best(tagged, "val_loss", "min", withdrawn={"/ckpt/2": "rolled back"})
    assert best.step == 1 and "step 3 is withdrawn (withdrawn from /srv (v000002))" in why


def test_only_withdrawn_checkpoints_leave_nothing_to_promote():
    best, why = select_best([rec(2, val_loss=0.1)], "val_loss", "min", withdrawn={"/ckpt/2": "rolled back"})
    assert best is None and why == "no validated checkpoint is eligible; step 2 is withdrawn (rolled back)"


def test_nothing_validated_quotes_a_failure_reason():
    failed = CheckpointRecord(step=94, uri="/ckpt/94", status=FAILED, failure="training metric(s) not finite")
    best, why = select_best([failed], "val_loss", "min")
    assert best is None and why.endswith("(step 94: training metric(s) not finite)")
