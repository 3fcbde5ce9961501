"""Retention by verdict: which checkpoints storage keeps when a run keeps only some."""

from __future__ import annotations

import pytest

from podium.core.promotion import select_best
from podium.core.records import FAILED, PENDING, SKIPPED, VALIDATED, CheckpointRecord
from podium.core.retention import checkpoints_to_delete


def _rec(step: int, value: float | None = None, status: str = VALIDATED, deleted: str | None = None) -> CheckpointRecord:
    return CheckpointRecord(step=step, uri=f"ckpt-{step}", status=status,
                            metrics={} if value is None else {"val_loss": value}, deleted=deleted)


def _steps(records: list[CheckpointRecord]) -> list[int]:
    return [r.step for r in records]


def test_the_k_best_and_the_newest_stay_the_rest_go():
    records = [_rec(0, 0.5), _rec(1, 0.2), _rec(2, 0.4), _rec(3, 0.3), _rec(4, 0.6)]
    assert _steps(checkpoints_to_delete(records, "val_loss", "min", keep=2)) == [0, 2]


def test_max_mode_and_ties_going_to_the_later_step_as_promotion_breaks_them():
    records = [_rec(0, 0.9), _rec(1, 0.9), _rec(2, 0.1), _rec(3, 0.5)]
    assert _steps(checkpoints_to_delete(records, "val_loss", "max", keep=1)) == [0, 2]


def test_checkpoints_awaiting_a_verdict_and_needed_ones_are_kept():
    records = [_rec(0, 0.1), _rec(1, None, PENDING), _rec(2, 0.5), _rec(3, 0.6), _rec(4, 0.7)]
    assert _steps(checkpoints_to_delete(records, "val_loss", "min", keep=1)) == [2, 3]
    assert _steps(checkpoints_to_delete(records, "val_loss", "min", keep=1, needed={"ckpt-2"})) == [3]


def test_failed_skipped_and_metricless_checkpoints_go_unless_newest():
    records = [_rec(0, 0.1), _rec(1, None, FAILED), _rec(2, None, SKIPPED), _rec(3, float("nan")), _rec(4, None, FAILED)]
    assert _steps(checkpoints_to_delete(records, "val_loss", "min", keep=3)) == [1, 2, 3]


def test_deleted_checkpoints_are_not_deleted_again():
    records = [_rec(0, 0.5, deleted="kept 1"), _rec(1, 0.2), _rec(2, 0.4)]
    assert _steps(checkpoints_to_delete(records, "val_loss", "min", keep=1)) == []


def test_keep_below_one_is_refused():
    with pytest.raises(ValueError, match="keep = 0"):
        checkpoints_to_delete([], "val_loss", "min", keep=0)


def test_promotion_never_picks_a_deleted_checkpoint_and_says_how_many_were():
    records = [_rec(0, 0.1, deleted="kept 1"), _rec(1, 0.2), _rec(2, 0.3)]
    best, why = select_best(records, "val_loss", "min")
    assert best is not None and best.step == 1
    assert "best of 2 validated checkpoint(s)" in why and "1 whose files were deleted (checkpoints.keep)" in why
