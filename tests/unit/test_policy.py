"""The promotion policy's pure part: thresholds, guards, the paired bootstrap, and how they fold into a decision."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from podium.config import build_config
from podium.core.events import PER_ROW_KEY, read_validation_result
from podium.core.policy import (
    bootstrap_interval,
    check_confidence,
    check_guards,
    check_thresholds,
    check_to_dict,
    interval_text,
    unknown_policy_metrics,
)
from podium.core.promotion import apply_checks, compare_with_champion
from podium.core.records import VALIDATED, Champion, CheckpointRecord
from podium.errors import ConfigError
from podium.tracking.datasets import fitted_json


def rec(**metrics: float) -> CheckpointRecord:
    return CheckpointRecord(step=5, uri="/ckpt/5", status=VALIDATED, metrics=metrics)


def test_a_threshold_names_the_metric_its_value_and_the_bound():
    [low, high] = check_thresholds({"val_accuracy": 0.8123, "val_loss": 0.25},
                                   {"val_accuracy": {"min": 0.9, "max": None}, "val_loss": {"min": None, "max": 0.3}})
    assert (low.metric, low.passed) == ("val_accuracy", False) and high.passed
    assert low.describe() == "threshold val_accuracy min 0.9: candidate 0.8123, FAILS"
    assert high.describe() == "threshold val_loss max 0.3: candidate 0.2500, holds"
    both = check_thresholds({"a": 0.5}, {"a": {"min": 0.5, "max": 0.5}})
    assert [c.passed for c in both] == [True, True], "a bound is inclusive"


@pytest.mark.parametrize("value", [None, math.nan, math.inf])
def test_a_missing_or_nan_threshold_metric_fails_naming_it(value):
    metrics = {} if value is None else {"val_accuracy": value}
    [c] = check_thresholds(metrics, {"val_accuracy": {"min": 0.9, "max": None}})
    assert c.passed is False and "no finite val_accuracy" in c.describe()


def test_guards_absolute_and_relative_against_the_champion():
    guards = {"val_loss": {"max_increase": 0.01}, "val_accuracy": {"max_decrease": 0.005},
              "latency": {"max_relative_increase": 0.10}}
    champion = {"val_loss": 0.30, "val_accuracy": 0.90, "latency": 10.0}
    held = check_guards({"val_loss": 0.305, "val_accuracy": 0.896, "latency": 10.9}, champion, guards)
    assert all(c.passed for c in held), [c.describe() for c in held]
    broken = {c.metric: c for c in check_guards({"val_loss": 0.32, "val_accuracy": 0.89, "latency": 11.5},
                                                champion, guards)}
    assert not any(c.passed for c in broken.values())
    assert broken["val_loss"].describe() == ("guard val_loss max_increase 0.01: candidate 0.3200, champion 0.3000, "
                                             "change +0.02000, FAILS")
    assert "change +1.500 (relative +0.1500), FAILS" in broken["latency"].describe()
    # an improvement never trips a guard
    assert all(c.passed for c in check_guards({"val_loss": 0.1, "val_accuracy": 0.99, "latency": 1.0}, champion, guards))


def test_guards_without_a_champion_do_not_block_and_say_why():
    [c] = check_guards({"val_loss": 0.3}, None, {"val_loss": {"max_increase": 0.01}})
    assert c.passed is None and "no champion to compare" in c.describe()
    [c] = check_guards({}, {"val_loss": 0.3}, {"val_loss": {"max_increase": 0.01}})
    assert c.passed is False, "a candidate without the guarded metric fails"
    [c] = check_guards({"val_loss": 0.3}, {}, {"val_loss": {"max_increase": 0.01}})
    assert c.passed is None and "champion has no finite val_loss" in c.note


def test_the_bootstrap_is_reproducible_and_covers_the_mean():
    rng = np.random.default_rng(1)
    gain = rng.normal(0.01, 0.1, size=500)
    low, high = bootstrap_interval(gain, 0.95)
    assert (low, high) == bootstrap_interval(gain, 0.95), "a fixed seed: the same rows, the same interval"
    assert low < gain.mean() < high
    assert high - low == pytest.approx(2 * 1.96 * gain.std() / math.sqrt(len(gain)), rel=0.15)
    assert bootstrap_interval(gain, 0.5)[0] > low, "a lower level, a narrower interval"
    assert interval_text((-0.004, 0.011)) == "[-0.004000, +0.01100]"


def _rows_differing(champion: np.ndarray, better: int, worse: int) -> np.ndarray:
    """The champion's per-row accuracy (1 right, 0 wrong) with `better` wrong rows made right, `worse` right wrong."""
    out = champion.copy()
    out[np.flatnonzero(champion == 0)[:better]] = 1.0
    out[np.flatnonzero(champion == 1)[:worse]] = 0.0
    return out


def test_confidence_refuses_a_difference_inside_the_noise_and_takes_a_clear_one():
    champion = (np.random.default_rng(2).random(200) < 0.80).astype(float)
    close = _rows_differing(champion, 7, 5)  # +0.01 on 200 rows: better by its point value, within the noise
    assert close.mean() - champion.mean() == pytest.approx(0.01)
    c = check_confidence("accuracy", "max", 0.95, 0.0, close, champion)
    assert c.passed is False and c.interval is not None and c.interval[0] <= 0 < c.interval[1]
    assert c.rows == 200 and interval_text(c.interval) in c.describe()
    clear = _rows_differing(champion, 30, 2)
    assert check_confidence("accuracy", "max", 0.95, 0.0, clear, champion).passed
    # 'min': the gain is the champion's loss minus the candidate's
    assert check_confidence("loss", "min", 0.95, 0.0, 1 - clear, 1 - champion).passed
    assert check_confidence("loss", "min", 0.95, 0.0, 1 - close, 1 - champion).passed is False
    assert check_confidence("accuracy", "max", 0.95, 0.5, clear, champion).passed is False, "above min_delta"


def test_confidence_without_per_row_values_refuses_unless_point_values_are_accepted():
    # a team that asked for a confidence gate got none, silently: the gate fell back to the point values
    c = check_confidence("accuracy", "max", 0.95, 0.0, None, [1.0], "step 3: the validation function returned none")
    assert c.passed is False and "no confidence without per-row values" in c.describe()
    assert "promotion.confidence_without_rows = 'refuse'" in c.note and "step 3: the validation" in c.note
    c = check_confidence("accuracy", "max", 0.95, 0.0, [1.0, 0.0], [1.0])
    assert c.passed is False and "cannot be paired" in c.note
    c = check_confidence("accuracy", "max", 0.95, 0.0, None, [1.0], "step 3: none", accept="point")
    assert c.passed is None and "compared point values (promotion.confidence_without_rows = 'point')" in c.describe()
    c = check_confidence("accuracy", "max", 0.95, 0.0, [1.0, 0.0], [1.0], accept="point")
    assert c.passed is None and "cannot be paired" in c.note
    refused = apply_checks(compare_with_champion(rec(accuracy=0.9), Champion(version="v000001", step=1, metric="accuracy",
                                                                        value=0.8, source="/old", mode="max"),
                                            "accuracy", "max"),
                           [check_confidence("accuracy", "max", 0.95, 0.0, None, None, "no rows")])
    assert not refused.promote and refused.reason.startswith("refused by the promotion policy (confidence accuracy)")


def test_a_policy_on_a_metric_nothing_reports_is_named_with_the_metrics_that_exist():
    known, says = {"val_loss", "val_accuracy"}, "the validation reports ['val_accuracy', 'val_loss']"
    assert unknown_policy_metrics("val_loss", {"val_accuracy"}, {"val_loss"}, known, says) == []
    assert unknown_policy_metrics("val_loss", {"val_acuracy": {}}, {"loss": {}}, known, says) == [
        "promotion.thresholds.val_acuracy: no such metric; the validation reports "
        "['val_accuracy', 'val_loss']",
        "promotion.guards.loss: no such metric; the validation reports ['val_accuracy', 'val_loss']"]
    assert unknown_policy_metrics("f1", {}, {}, known, "it")[0].startswith("promotion.metric = 'f1': no such metric")


def test_a_failed_check_refuses_unless_forced_and_a_first_promotion_keeps_its_thresholds():
    threshold = check_thresholds({"val_accuracy": 0.5}, {"val_accuracy": {"min": 0.9, "max": None}})
    first = compare_with_champion(rec(val_loss=0.4, val_accuracy=0.5), None, "val_loss", "min")
    refused = apply_checks(first, threshold)
    assert not refused.promote and refused.checks == tuple(threshold)
    assert refused.reason.startswith("refused by the promotion policy (threshold val_accuracy)")
    assert "threshold val_accuracy min 0.9: candidate 0.5000, FAILS" in refused.reason
    champion = Champion(version="v000001", step=1, metric="val_loss", value=0.9, source="/old", mode="min")
    forced = apply_checks(compare_with_champion(rec(val_loss=0.95, val_accuracy=0.5), champion, "val_loss", "min",
                                           always=True), threshold, always=True)
    assert forced.promote and "reported, not blocking" in forced.reason
    passing = check_thresholds({"val_accuracy": 0.95}, {"val_accuracy": {"min": 0.9, "max": None}})
    promoted = apply_checks(first, passing)
    assert promoted.promote and promoted.reason.endswith("checks: threshold val_accuracy min 0.9: candidate 0.9500, holds")
    assert apply_checks(first, []) == first
    assert json.loads(json.dumps(check_to_dict(threshold[0])))["text"] == threshold[0].describe()


@pytest.mark.parametrize(("promotion", "field", "says"), [
    ({"guards": {"val_loss": {"max_increase": 0.01, "max_decrease": 0.01}}}, "promotion.guards.val_loss",
     "exactly one of"),
    ({"guards": {"val_loss": {"max_increase": -0.01}}}, "promotion.guards.val_loss.max_increase", "greater than"),
    ({"guards": {"val_loss": {}}}, "promotion.guards.val_loss", "exactly one of"),
    ({"thresholds": {"val_accuracy": {"min": 0.9, "max": 0.8}}}, "promotion.thresholds.val_accuracy", "above max"),
    ({"thresholds": {"val_accuracy": {"minimum": 0.9}}}, "promotion.thresholds.val_accuracy.minimum", "Extra inputs"),
    ({"thresholds": {"val_accuracy": {}}}, "promotion.thresholds.val_accuracy", "expected min, max or both"),
    ({"confidence": 1.0}, "promotion.confidence", "less than 1"),
])
def test_an_invalid_policy_fails_early_naming_the_field(promotion, field, says):
    with pytest.raises(ConfigError) as err:
        build_config({"promotion": promotion})
    assert f"{field} = " in str(err.value) and says in str(err.value)


def test_per_row_values_travel_beside_the_metrics_not_as_metrics():
    result = read_validation_result({"val_loss": 0.3, PER_ROW_KEY: {"val_loss": np.array([0.2, 0.4])}})
    assert result.metrics == {"val_loss": 0.3} and not result.non_numeric
    assert list(result.per_row["val_loss"]) == [0.2, 0.4]
    wrong = read_validation_result({"val_loss": 0.3, PER_ROW_KEY: [0.2, 0.4]})
    assert PER_ROW_KEY in wrong.non_numeric and not wrong.per_row, "not a mapping: the verdict names it"


def test_a_record_too_long_for_a_tag_stays_json():
    record = {"promote": False, "reason": "x" * 5000, "comparison": None,
              "checks": [{"kind": "threshold", "text": "y" * 500}]}
    text = fitted_json(record, 4000)
    assert len(text) <= 4000 and json.loads(text)["checks"] == [{"kind": "threshold"}]


def test_the_built_in_validation_gives_per_row_values_when_asked(saved_checkpoint, write_parquet):
    import ray.train

    from podium.training.validate import validate_checkpoint

    rng = np.random.default_rng(0)
    val = write_parquet("val.parquet", a=rng.normal(size=40), b=rng.normal(size=40), c=rng.normal(size=40),
                        label=rng.integers(0, 2, size=40))
    checkpoint = ray.train.Checkpoint.from_directory(saved_checkpoint.directory)
    plain = validate_checkpoint(checkpoint, val)
    assert set(plain) == {"val_loss", "val_accuracy"}, "per-row values only when asked"
    rows = validate_checkpoint(checkpoint, val, per_row=True)
    assert {k: rows[k] for k in plain} == plain
    per_row = read_validation_result(rows).per_row
    assert per_row["val_loss"].shape == per_row["val_accuracy"].shape == (40,)
    assert per_row["val_loss"].mean() == pytest.approx(plain["val_loss"])
    assert per_row["val_accuracy"].mean() == pytest.approx(plain["val_accuracy"])


def test_the_built_in_evaluation_gives_per_row_values_whose_means_are_its_metrics():
    import torch

    from podium.training.model import evaluate_batches

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    batches = [(torch.randn(5, 3), torch.randint(0, 2, (5,))) for _ in range(3)]
    m = evaluate_batches(model, batches, per_row=True)
    assert m["loss_rows"].shape == m["accuracy_rows"].shape == (15,)
    assert m["loss_rows"].mean() == pytest.approx(m["loss"]) and m["accuracy_rows"].mean() == pytest.approx(m["accuracy"])
    assert set(evaluate_batches(model, batches)) == {"loss", "accuracy"}, "per-row values only when asked"


def test_the_report_and_the_runs_table_name_the_checks_that_refused():
    from podium.cli.provenance import version_lines
    from podium.tasks.promote import PromotionOutcome
    from podium.tasks.report import outcome_texts, promotion_markdown

    champion = (np.random.default_rng(2).random(200) < 0.80).astype(float)
    checks = [*check_thresholds({"accuracy": 0.805}, {"accuracy": {"min": 0.5, "max": None}}),
              check_confidence("accuracy", "max", 0.95, 0.0, _rows_differing(champion, 7, 5), champion)]
    champ = Champion(version="v000002", step=1, metric="accuracy", value=0.795, source="/old", mode="max")
    decision = apply_checks(compare_with_champion(rec(accuracy=0.805), champ, "accuracy", "max"), checks)
    outcome = PromotionOutcome(promoted=None, reason=decision.reason, best_step=5, champion_before="v000002",
                               checks=decision.checks)
    line, _ = outcome_texts("gate-3", [rec(accuracy=0.805)], "accuracy", outcome)
    assert line == "not promoted: refused by the promotion policy (confidence accuracy)"
    report = promotion_markdown("gate-3", outcome, None)
    assert "## Promotion policy" in report and "| threshold | accuracy | min | 0.5 | 0.8050 | none |  | holds |" in report
    assert f"| {interval_text(checks[1].interval)} at 0.95, 200 rows | **fails** |" in report
    lines = version_lines("v000003", {"step": 5, "checks": [check_to_dict(c) for c in outcome.checks]}, True)
    assert any(line.startswith("  checks:     threshold accuracy min 0.5: candidate 0.8050, holds") for line in lines)


def test_a_decision_on_a_candidate_says_who_how_and_why_and_silence_is_the_configured_default():
    from podium.core.approval import answered, timed_out, unasked, withdrawn

    by_cli = answered("approve", " beats last week's ", "ana@box (podium approve)", at=0.0)
    assert (by_cli.approved, by_cli.via, by_cli.reason) == (True, "podium approve", "beats last week's")
    assert by_cli.describe() == "approved by ana@box (podium approve): beats last week's"
    assert by_cli.tags()["podium.approval"] == "approved" and by_cli.tags()["podium.approval.at"] == "1970-01-01T00:00:00Z"
    in_ui = answered("reject", "too slow", "", at=0.0)
    assert in_ui.describe() == "rejected by someone in the Prefect UI: too slow" and in_ui.via == "the Prefect UI"
    assert timed_out(3, "reject").describe() == ("rejected on timeout: no decision within 3 s "
                                                 "(promotion.approval_on_timeout = reject)")
    assert timed_out(3, "approve").approved and not withdrawn("stopped").approved
    undecided = unasked("the approval could not be asked for (ConnectError: refused)", at=0.0)
    assert not undecided.approved and undecided.tags()["podium.approval"] == "undecided"
    assert undecided.describe() == "undecided: the approval could not be asked for (ConnectError: refused)"
    with pytest.raises(ValueError, match="expected 'approve' or 'reject'"):
        answered("maybe", "x", "ana")
