"""When to stop training early: verdicts, in step order, that stopped improving. A pure function of records."""

from __future__ import annotations

from dataclasses import dataclass

from podium.core.numbers import finite, format_number
from podium.core.records import FAILED, PENDING, SKIPPED, CheckpointRecord


@dataclass(frozen=True)
class EarlyStop:
    """Training should stop: the step of the last verdict that made it so, and why, in words."""

    step: int
    reason: str


def early_stop(records: list[CheckpointRecord], metric: str, mode: str, patience: int,
               min_delta: float = 0.0, resumed_after: int | None = None) -> EarlyStop | None:
    """Stop once `patience` verdicts in a row, in step order, fail to improve on the best so far by more than
    `min_delta` (on `metric`, `mode` 'min' or 'max'); None while they have not.

    Verdicts are read in step order up to the first checkpoint still waiting for one (validations finish in
    any order; a later verdict counts only once every earlier step has its own). A failed validation, or one
    without a finite `metric`, neither improves nor breaks the count: it is passed over. Checkpoints the loop
    asked not to validate are passed over too.

    `resumed_after`: the step a resumed run continues from. The verdicts up to it (an earlier attempt's) set the
    best so far but do not count toward `patience`: a resume, after an early stop too, trains at least `patience`
    checkpoints more before it stops again (it stopped at once, with no new checkpoint, before).
    """
    if patience < 1:
        raise ValueError(f"patience = {patience}: expected at least 1")
    sign = 1.0 if mode == "min" else -1.0
    best: CheckpointRecord | None = None
    since: list[int] = []
    for record in sorted(records, key=lambda r: (r.step, r.uri)):
        if record.status == PENDING:
            return None  # an earlier verdict is still to come
        if record.status in (FAILED, SKIPPED) or not finite(record.metrics.get(metric)):
            continue
        value = record.metrics[metric]
        if best is None or sign * (best.metrics[metric] - value) > min_delta:
            best, since = record, []
            continue
        if resumed_after is not None and record.step <= resumed_after:
            continue  # the earlier attempt's plateau was acted on already
        since.append(record.step)
        if len(since) >= patience:
            steps = f"steps {since[0]}-{since[-1]}" if len(since) > 1 else f"step {since[0]}"
            by = f" by more than {format_number(min_delta)}" if min_delta else ""
            return EarlyStop(record.step, f"{len(since)} validation(s) in a row ({steps}) did not improve {metric} "
                                          f"on step {best.step}'s {format_number(best.metrics[metric])}{by}")
    return None
