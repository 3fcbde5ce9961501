"""Early stopping by verdict: patience counted in step order, over the promotion metric."""

from __future__ import annotations

import pytest

from podium.core.early_stop import early_stop
from podium.core.records import FAILED, PENDING, SKIPPED, VALIDATED, CheckpointRecord


def _rec(step: int, value: float | None, status: str = VALIDATED) -> CheckpointRecord:
    metrics = {} if value is None else {"val_loss": value}
    return CheckpointRecord(step=step, uri=f"ckpt-{step}", status=status, metrics=metrics)


def test_patience_verdicts_without_improvement_stop_at_the_last_of_them():
    records = [_rec(0, 0.5), _rec(1, 0.4), _rec(2, 0.41), _rec(3, 0.4), _rec(4, 0.45)]
    stop = early_stop(records, "val_loss", "min", patience=3)
    assert stop is not None and stop.step == 4
    assert stop.reason == "3 validation(s) in a row (steps 2-4) did not improve val_loss on step 1's 0.4000"


def test_an_improvement_resets_the_count():
    records = [_rec(0, 0.5), _rec(1, 0.6), _rec(2, 0.6), _rec(3, 0.3), _rec(4, 0.35), _rec(5, 0.31)]
    assert early_stop(records, "val_loss", "min", patience=3) is None


def test_min_delta_makes_a_small_gain_no_improvement():
    records = [_rec(0, 0.5), _rec(1, 0.499), _rec(2, 0.4985)]
    assert early_stop(records, "val_loss", "min", patience=2) is None
    stop = early_stop(records, "val_loss", "min", patience=2, min_delta=0.01)
    assert stop is not None and stop.step == 2 and "by more than 0.01" in stop.reason


def test_max_mode_counts_a_larger_value_as_the_improvement():
    records = [_rec(0, 0.8), _rec(1, 0.9), _rec(2, 0.85)]
    assert early_stop(records, "val_loss", "max", patience=2) is None
    stop = early_stop([*records, _rec(3, 0.9)], "val_loss", "max", patience=2)
    assert stop is not None and stop.step == 3


def test_a_verdict_still_to_come_holds_the_later_ones_back():
    """Validations finish in any order: step 2's verdict counts only once step 1 has its own."""
    records = [_rec(0, 0.5), _rec(1, None, PENDING), _rec(2, 0.6), _rec(3, 0.6)]
    assert early_stop(records, "val_loss", "min", patience=2) is None
    records[1] = _rec(1, 0.7)
    stop = early_stop(records, "val_loss", "min", patience=2)
    assert stop is not None and stop.step == 2


def test_failed_skipped_and_non_finite_verdicts_are_passed_over():
    records = [_rec(0, 0.5), _rec(1, None, FAILED), _rec(2, None, SKIPPED), _rec(3, float("nan")), _rec(4, 0.6)]
    assert early_stop(records, "val_loss", "min", patience=2) is None
    stop = early_stop([*records, _rec(5, 0.55)], "val_loss", "min", patience=2)
    assert stop is not None and stop.step == 5


def test_patience_below_one_is_refused():
    with pytest.raises(ValueError, match="patience = 0"):
        early_stop([], "val_loss", "min", patience=0)


def test_a_resume_counts_patience_from_its_own_checkpoints_against_the_best_so_far():
    # a resume after an early stop with more epochs stopped again at once, with no new checkpoint
    earlier = [_rec(0, 0.5), _rec(1, 0.5)]
    assert early_stop(earlier, "val_loss", "min", patience=1) is not None
    assert early_stop(earlier, "val_loss", "min", patience=1, resumed_after=1) is None
    resumed = [*earlier, _rec(2, 0.55)]
    stop = early_stop(resumed, "val_loss", "min", patience=1, resumed_after=1)
    assert stop is not None and stop.step == 2 and "on step 0's 0.5000" in stop.reason
    assert early_stop([*earlier, _rec(2, 0.4), _rec(3, 0.45)], "val_loss", "min", patience=2, resumed_after=1) is None


def test_a_stop_asked_after_training_ended_on_its_own_is_no_early_stop():
    from podium.tasks.train import EarlyStopSwitch

    ended = EarlyStopSwitch()
    ended.ended_on_its_own()
    assert not ended.ask() and not ended.asked and not ended.too_late  # every epoch trained: nothing to stop
    late = EarlyStopSwitch()
    assert late.ask() and late.asked
    late.ended_on_its_own()  # the abort came after the last epoch
    assert late.too_late


def test_after_an_abort_the_checkpoint_folder_ray_train_never_registered_is_removed(tmp_path):
    import json

    from podium.training.raytrain import SNAPSHOT, remove_unregistered_checkpoints

    run = tmp_path / "run"
    for name in ("checkpoint_a", "checkpoint_b", "checkpoint_c", "checkpoint_d"):
        (run / name).mkdir(parents=True)
        (run / name / "weights.json").write_text("{}")
    assert remove_unregistered_checkpoints(str(tmp_path), "run") == []  # no snapshot: nothing to compare with
    (run / SNAPSHOT).write_text(json.dumps({"checkpoint_results": [{"checkpoint_dir_name": "checkpoint_a"}],
                                            "pending_training_results": [{"checkpoint_dir_name": "checkpoint_b"}]}))
    assert remove_unregistered_checkpoints(str(tmp_path), "run", announced={"checkpoint_c"}) == ["checkpoint_d"]
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint_a", "checkpoint_b", "checkpoint_c", SNAPSHOT]
