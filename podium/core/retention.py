"""Which checkpoints storage keeps when a run keeps only some: a pure function of records."""

from __future__ import annotations

from collections.abc import Collection

from podium.core.numbers import finite
from podium.core.promotion import Mode, ranking
from podium.core.records import PENDING, VALIDATED, CheckpointRecord


def checkpoints_to_delete(records: list[CheckpointRecord], metric: str, mode: Mode, keep: int,
                          needed: Collection[str] = ()) -> list[CheckpointRecord]:
    """The checkpoints a run keeping `keep` may delete now, by step.

    Kept: the `keep` best validated checkpoints by `metric` in `mode`'s direction (ties: the later step, as
    promotion breaks them), the newest checkpoint (a resume continues from it), every checkpoint still
    awaiting a verdict (a validation may be reading it), and those whose URI is in `needed` (a served
    version's source). Every other one not already deleted may go: failed, skipped, and validated ones
    outside the best.
    """
    if keep < 1:
        raise ValueError(f"keep = {keep}: expected at least 1")
    present = [r for r in records if not r.deleted]
    if not present:
        return []
    ranked = sorted((r for r in present if r.status == VALIDATED and finite(r.metrics.get(metric))),
                    key=ranking(metric, mode))
    newest = max(present, key=lambda r: (r.step, r.uri))
    kept = {r.uri for r in ranked[:keep]} | {newest.uri} | set(needed)
    kept |= {r.uri for r in present if r.status == PENDING}
    return sorted((r for r in present if r.uri not in kept), key=lambda r: (r.step, r.uri))
