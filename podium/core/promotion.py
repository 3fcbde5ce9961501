"""Which checkpoint is best, and does it beat the champion? Pure functions of records, no side effects."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from podium.core.comparison import Comparison
from podium.core.numbers import finite, format_number
from podium.core.policy import Check
from podium.core.records import VALIDATED, Champion, CheckpointRecord

Mode = Literal["min", "max"]
REFUSED_BY_POLICY = "refused by the promotion policy"  # how a reason refused by a check starts


@dataclass(frozen=True)
class Decision:
    """The outcome of a promotion decision and the reason, in words for the report."""

    promote: bool
    reason: str
    candidate: CheckpointRecord | None = None
    value: float | None = None
    comparison: Comparison | None = None  # which numbers were compared, on which data (podium.core.comparison)
    checks: tuple[Check, ...] = ()  # thresholds, guards, confidence (podium.core.policy)


def ranking(metric: str, mode: Mode) -> Callable[[CheckpointRecord], tuple[float, int]]:
    """The sort key that puts the best checkpoint by `metric` first: `mode`'s direction, ties to the later step
    (it has seen more data). Promotion picks by it; retention keeps by it."""
    sign = 1.0 if mode == "min" else -1.0
    return lambda r: (sign * r.metrics[metric], -r.step)


def select_best(records: list[CheckpointRecord], metric: str, mode: Mode,
                withdrawn: Mapping[str, str] | None = None) -> tuple[CheckpointRecord | None, str]:
    """The best validated checkpoint by `metric` and why others were skipped.

    Failed and pending checkpoints, those whose metric is missing, NaN or infinite, withdrawn
    ones (`record.withdrawn`, or their URI in `withdrawn`: URI -> why) and those whose files were
    deleted (`record.deleted`, checkpoints.keep) are never chosen. Ties go to the later step (it
    has seen more data).
    """
    if mode not in ("min", "max"):
        raise ValueError(f"mode = {mode!r}: expected 'min' or 'max'")
    withdrawn = withdrawn or {}
    out = {r.step: r.withdrawn or withdrawn[r.uri] for r in records if r.withdrawn or r.uri in withdrawn}
    validated = [r for r in records if r.status == VALIDATED]
    eligible = [r for r in validated if finite(r.metrics.get(metric)) and r.step not in out and not r.deleted]
    out_note = "".join(f"; step {step} is withdrawn ({why})" for step, why in sorted(out.items()))
    if not eligible:
        if not records:
            return None, "no checkpoints were recorded"
        if not validated:
            failed = [r for r in records if r.failure]
            first = f" (step {failed[0].step}: {failed[0].failure})" if failed else ""
            return None, f"none of the {len(records)} checkpoints was validated successfully{first}"
        missing = [r.step for r in validated if metric not in r.metrics]
        if len(missing) == len(validated):
            known = sorted({k for r in validated for k in r.metrics})
            return None, f"no checkpoint reports the metric {metric!r}; reported metrics: {known}"
        gone = sum(bool(r.deleted) for r in validated)
        if out or gone:
            gone_note = f"; {gone} whose files were deleted (checkpoints.keep)" if gone else ""
            return None, f"no validated checkpoint is eligible{out_note}{gone_note}"
        return None, f"every validated checkpoint has a missing, NaN or infinite {metric!r}"
    best = min(eligible, key=ranking(metric, mode))
    deleted = sum(bool(r.deleted) for r in records)
    skipped = len(records) - len(eligible) - deleted
    note = (f"; {skipped} checkpoint(s) not eligible (failed, pending, withdrawn, or no finite {metric})"
            if skipped else "")
    note += f"; {deleted} whose files were deleted (checkpoints.keep)" if deleted else ""
    return best, f"best of {len(eligible)} validated checkpoint(s) by {metric} ({mode}){note}{out_note}"


def decide_promotion(
    best: CheckpointRecord | None,
    champion: Champion | None,
    metric: str,
    mode: Mode,
    min_delta: float = 0.0,
    always: bool = False,
    why_best: str = "",
) -> Decision:
    """Promote `best` if there is no champion, if `always`, or if it beats the champion by more than `min_delta`."""
    if best is None:
        return Decision(False, f"nothing to promote: {why_best}")
    value = best.metrics[metric]
    head = f"step {best.step} has {metric} = {format_number(value)}"
    if champion is None:
        return Decision(True, f"{head}; first promotion to this serving location", best, value)
    if champion.source is not None and champion.source == best.uri:
        return Decision(False, f"{head}; it is already the champion ({champion.version})", best, value)
    if always:
        return Decision(True, f"{head}; promotion forced (always), champion {champion.version} "
                              f"had {format_number(champion.value)}", best, value)
    if champion.metric != metric or (champion.mode is not None and champion.mode != mode):
        # another model, or another yardstick: the two numbers say nothing about each other
        return Decision(False, f"{head} ({mode}); champion {champion.version} was ranked by {champion.metric!r} "
                               f"({champion.mode or 'direction not recorded'}): not comparable, not promoted "
                               "(--always-promote, promotion.always, replaces it)", best, value)
    if champion.value is None or not finite(champion.value):
        return Decision(True, f"{head}; champion {champion.version} has no finite {metric}", best, value)
    gain = (champion.value - value) if mode == "min" else (value - champion.value)
    if gain > min_delta:
        return Decision(True, f"{head}, better than champion {champion.version} ({format_number(champion.value)}) by "
                              f"{format_number(gain)} > min_delta {min_delta:g}", best, value)
    return Decision(False, f"{head}; champion {champion.version} has {format_number(champion.value)}: improvement "
                           f"{format_number(gain)} is not more than min_delta {min_delta:g}", best, value)


def apply_checks(decision: Decision, checks: Sequence[Check], always: bool = False) -> Decision:
    """`decision` with the policy's checks: named in its reason (each with its values and limit) and, when
    one failed, a promotion refused, unless forced (`always`): then they are reported and do not block."""
    if not checks:
        return decision
    failed = [c for c in checks if c.passed is False]
    listed = "; ".join(c.describe() for c in checks)
    if decision.promote and failed and not always:
        names = ", ".join(f"{c.kind} {c.metric}" for c in failed)
        reason = f"{REFUSED_BY_POLICY} ({names}): {decision.reason}; checks: {listed}"
        return dataclasses.replace(decision, promote=False, reason=reason, checks=tuple(checks))
    if decision.promote and failed:
        reason = f"{decision.reason}; checks (promotion forced by promotion.always: reported, not blocking): {listed}"
    else:
        reason = f"{decision.reason}; checks: {listed}"
    return dataclasses.replace(decision, reason=reason, checks=tuple(checks))
