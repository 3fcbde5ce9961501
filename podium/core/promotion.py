"""Which checkpoint is best, and does it replace the champion? Pure functions of records, no I/O.

`select_best` picks the candidate. `decide_promotion` is the promotion decision: one pure function of the
`Evidence` a promotion gathered (`podium.tasks.evidence`: the best checkpoint, the champion, the numbers
measured again on the current validation data, each side's per-row values) and the `Policy`
(`promotion.*`); `podium.tasks.promote` asks it once and carries its answer out (`podium.tasks.carry_out`).
`missing_evidence` tells the gathering what the decision still needs measured, in the order it needs it.

A side measured on other validation data than the current one (by digest) is re-scored on it first
(`podium.core.comparison`): the candidate when its checkpoint was validated on other data, the champion
when it is compared. The ladder, first match wins:

| what the evidence says                                                      | decision                           |
|-----------------------------------------------------------------------------|------------------------------------|
| no checkpoint is eligible (none validated, no finite metric, withdrawn...)  | nothing to promote                 |
| the best checkpoint is the one already served                               | already the champion (registry synced) |
| a compared side could not be re-scored, and `rescore = 'refuse'`            | refused, naming the side           |
| there is no champion                                                        | promote: the first promotion       |
| `always`                                                                    | promote: forced                    |
| the champion was ranked by another metric or direction                      | refused: not comparable            |
| the champion has no finite value of the metric                              | promote                            |
| the gain over the champion is not more than `min_delta`                     | refused                            |
| otherwise                                                                   | promote                            |

Then, except for the first three rows, the policy's checks (`podium.core.policy`) are made and named in
the reason: a threshold on the candidate's metrics; a guard against the champion's, when it was measured
on the same data; confidence, from both sides' per-row values, when a compared candidate would be promoted
(else not made, saying why). A check that fails turns a promotion into a refusal ("refused by the promotion
policy"), unless it is forced (`always`: reported, not blocking). The decision names the stage that comes
next: a promotion is direct (`PROMOTE`), shadowed first where `shadow` is set and there is a champion to shadow
(`SHADOW`), else held for a person's decision where `approval` is required (`AWAIT`). A side whose re-score
failed under `rescore = 'stored'` is compared by its stored number, saying so; the comparison
(`podium.core.comparison`) ends every reason when the current validation data is known.

Last, the loadable gate (`gate_files`): a candidate that would be served as files never replaces a champion that
loads as an MLflow model, forced or not, unless `allow_files` says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from podium.core.comparison import AT_VALIDATION as MEASURED_ON_THIS_DATA
from podium.core.comparison import (
    RESCORED,
    STORED,
    Comparison,
    Measure,
    comparison_to_dict,
    needs_rescore,
    rescored,
    short,
)
from podium.core.numbers import finite, format_number
from podium.core.policy import (
    CONFIDENCE,
    Check,
    WithoutRows,
    check_confidence,
    check_guards,
    check_served_as_model,
    check_thresholds,
    check_to_dict,
)
from podium.core.records import VALIDATED, Champion, CheckpointRecord

Mode = Literal["min", "max"]
REFUSED_BY_POLICY = "refused by the promotion policy"  # how a reason refused by a check starts

# what a decision says to do: the tag of a Decision (`Action`)
NOTHING: Final = "nothing to promote"  # no eligible checkpoint
CURRENT: Final = "already the champion"  # nothing to switch; the registry is brought in line with serving
REFUSE: Final = "refuse"  # a candidate that does not replace the champion
PROMOTE: Final = "promote"  # direct: stage, verify, seal, switch, alias (podium.tasks.carry_out.TO_PROMOTE)
SHADOW: Final = "shadow"  # stage, verify, register as the challenger, mirror live traffic to it; its shadow decides
#                           (promotion.rollout = 'shadow', a champion to shadow: TO_SHADOW)
AWAIT: Final = "await approval"  # stage, verify, register as the challenger; a person decides (promotion.approval:
#                                  TO_AWAIT)
Action = Literal["nothing to promote", "already the champion", "refuse", "promote", "shadow", "await approval"]

# what the decision may still need measured (`missing_evidence`), in this order
CANDIDATE_AGAIN, CHAMPION_AGAIN, PER_ROW = "candidate re-scored", "champion re-scored", "per-row values"


@dataclass(frozen=True)
class Decision:
    """The promotion decision, for the caller to carry out: what to do (`action`), the reason in words for the
    report, the candidate and its value, the comparison and every check of the policy."""

    action: Action  # NOTHING, CURRENT, REFUSE, PROMOTE, SHADOW or AWAIT: which stage comes next
    reason: str
    candidate: CheckpointRecord | None = None
    value: float | None = None
    comparison: Comparison | None = None  # which numbers were compared, on which data (podium.core.comparison)
    checks: tuple[Check, ...] = ()  # thresholds, guards, confidence (podium.core.policy)

    @property
    def promote(self) -> bool:
        """Whether the candidate goes on to replace the champion (at once, after its shadow, or once a person
        approves)."""
        return self.action in (PROMOTE, SHADOW, AWAIT)

    @property
    def held(self) -> bool:
        """Whether the candidate is staged as the challenger to wait for a decision (its shadow's, or a person's)."""
        return self.action in (SHADOW, AWAIT)


@dataclass(frozen=True)
class Policy:
    """What `promotion` configures for the decision (`podium.tasks.plan.promotion_policy` reads it from the
    configuration): the metric and its direction, the margin, the checks, and whether a person approves."""

    metric: str
    mode: Mode
    min_delta: float = 0.0
    always: bool = False
    rescore: Literal["refuse", "stored"] = "refuse"
    thresholds: Mapping[str, Mapping[str, float | None]] = field(default_factory=dict)
    guards: Mapping[str, Mapping[str, float | None]] = field(default_factory=dict)
    confidence: float | None = None
    confidence_without_rows: WithoutRows = "refuse"
    approval: bool = False  # promotion.approval = "required"
    shadow: bool = False  # promotion.rollout = "shadow": a candidate that replaces a champion is shadowed first
    allow_files: bool = False  # promotion.allow_files: files may replace a champion that loads (check_served_as_model)
    alias: str = "champion"  # the alias the champion holds, for the loadable gate's words


@dataclass(frozen=True)
class Remeasured:
    """A side validated again on the current validation data: every metric it returned, or why it could not be."""

    metrics: Mapping[str, float] | None = None
    failure: str | None = None


@dataclass(frozen=True)
class RowValues:
    """The promotion metric on every validation row of each side (`promotion.confidence`), or why not (a side
    whose values are None; the champion's are not asked for when the candidate's are missing)."""

    candidate: Any  # a sequence of floats or a numpy array
    champion: Any = None
    candidate_missing: str = ""
    champion_missing: str = ""


@dataclass(frozen=True)
class Evidence:
    """All a promotion decision is made from, gathered under the serving location's lock.

    `data`/`digest`: the current validation data (None: not known, so no same-data comparison). The champion's
    `champion_metrics` and `champion_digest` are those stored with it; the re-scores and the per-row values are
    what `missing_evidence` asked for (None: not measured)."""

    best: CheckpointRecord | None
    why_best: str = ""
    champion: Champion | None = None
    champion_metrics: Mapping[str, float] = field(default_factory=dict)
    champion_digest: str | None = None
    data: str | None = None
    digest: str | None = None
    candidate_again: Remeasured | None = None
    champion_again: Remeasured | None = None
    rows: RowValues | None = None
    # the loadable gate (podium.core.policy.check_served_as_model): whether the best checkpoint would be served as
    # files, and whether the champion is (None: not known, or nothing to say)
    candidate_files: bool | None = None
    champion_files: bool | None = None


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


def missing_evidence(evidence: Evidence, policy: Policy) -> str | None:
    """What the decision still needs measured, in order (CANDIDATE_AGAIN, CHAMPION_AGAIN, PER_ROW); None: decide.

    A side is re-scored when it was measured on other data than the current validation data: the candidate
    always, the champion when it is compared. Nothing more is measured once a failed re-score refuses
    (`rescore = 'refuse'`); per-row values only when confidence is configured and a compared candidate would be
    promoted by its point value (otherwise two validations would change nothing)."""
    e, p = evidence, policy
    if e.best is None or e.data is None:
        return None
    if e.candidate_again is None and needs_rescore(e.best.val_digest, e.digest):
        return CANDIDATE_AGAIN
    compared = _compared(e, p)
    if compared and p.rescore == "refuse" and rescore_failure(e.candidate_again, p.metric):
        return None
    if compared and e.champion_again is None and needs_rescore(e.champion_digest, e.digest):
        return CHAMPION_AGAIN
    if compared and p.rescore == "refuse" and rescore_failure(e.champion_again, p.metric):
        return None
    if p.confidence is not None and e.rows is None and compared:
        best, champion, _, _ = _on_this_data(e, p)
        if compare_with_champion(best, champion, p.metric, p.mode, p.min_delta, p.always).promote:
            return PER_ROW
    return None


def decide_promotion(evidence: Evidence, policy: Policy) -> Decision:
    """The promotion decision on `evidence` under `policy`: the table of this module, first match wins; then the
    loadable gate (`gate_files`)."""
    return gate_files(_decide(evidence, policy), evidence, policy)


def gate_files(decision: Decision, e: Evidence, p: Policy) -> Decision:
    """A promotion of a candidate that would be served as files over a champion that loads as an MLflow model is
    refused, unless `p.allow_files` (podium.core.policy.check_served_as_model); `always` does not pass it. A refusal
    is a decision like a policy's (nothing staged), its sentence first in the reason."""
    if not decision.promote or decision.candidate is None:
        return decision
    check = check_served_as_model(decision.candidate.step, e.candidate_files,
                                  e.champion.version if e.champion else None, e.champion_files, p.allow_files, p.alias)
    if check is None:
        return decision
    if check.passed is False:
        return dataclasses.replace(decision, action=REFUSE, reason=f"{check.note}; {decision.reason}",
                                   checks=(*decision.checks, check))
    return dataclasses.replace(decision, reason=f"{decision.reason}; {check.note}", checks=(*decision.checks, check))


def _decide(evidence: Evidence, policy: Policy) -> Decision:
    """The table of this module on `evidence`, first match wins."""
    e, p = evidence, policy
    if e.best is None or e.data is None:  # nothing to promote; or validation data not known: no comparison
        decision = compare_with_champion(e.best, e.champion, p.metric, p.mode, p.min_delta, p.always, e.why_best)
        if decision.action in (PROMOTE, REFUSE):
            note = "the validation data is not known (data.val): no comparison on the same data"
            decision = apply_checks(decision, policy_checks(p, decision.candidate.metrics if decision.candidate
                                                            else {}, None, note, None, note), p.always)
        return _awaiting(decision, p, e.champion)
    refused_by = _rescore_refusal(e, p)
    if refused_by is not None:
        who, failure, comparison = refused_by
        reason = (f"{who} could not be re-scored on the current validation data {comparison.data} (digest "
                  f"{short(comparison.digest)}): {failure}. promotion.rescore = 'refuse': nothing promoted. Set "
                  f"promotion.rescore = 'stored' to compare with the stored number, or promotion.always to replace it")
        return _compared_on(Decision(REFUSE, reason, e.best, e.best.metrics.get(p.metric)), comparison)
    best, champion, candidate_metrics, held_metrics = _on_this_data(e, p)
    decision = compare_with_champion(best, champion, p.metric, p.mode, p.min_delta, p.always, e.why_best)
    if decision.action != CURRENT:
        decision = apply_checks(decision, _checks(e, p, best, candidate_metrics, held_metrics, decision.promote),
                                p.always)
    return _awaiting(_compared_on(decision, _comparison(e, p)), p, e.champion)


def _awaiting(decision: Decision, policy: Policy, champion: Champion | None) -> Decision:
    """A promotion held for a decision: its shadow's (`SHADOW`; only a champion can be shadowed: the first promotion
    of a location is direct, or awaits a person), else a person's (`AWAIT`)."""
    if decision.action != PROMOTE:
        return decision
    if policy.shadow and champion is not None:
        return dataclasses.replace(decision, action=SHADOW)
    return dataclasses.replace(decision, action=AWAIT) if policy.approval else decision


def _compared_on(decision: Decision, comparison: Comparison) -> Decision:
    return dataclasses.replace(decision, reason=f"{decision.reason}; {comparison.describe()}", comparison=comparison)


def _compared(e: Evidence, p: Policy) -> bool:
    """Whether the candidate's number is compared with the champion's on the current data (the champion re-scored
    if need be): a champion of the same metric and direction that is not the candidate, unless forced."""
    c = e.champion
    return (e.best is not None and c is not None and not p.always and c.source != e.best.uri
            and c.metric == p.metric and c.mode in (None, p.mode))


def rescore_failure(again: Remeasured | None, metric: str) -> str | None:
    """Why a side was not measured again (None: it was, with `metric`, or it was not asked to be)."""
    if again is None:
        return None
    if again.failure or again.metrics is None:
        return again.failure or "it was not measured again"
    if metric not in again.metrics:
        return f"the validation function returned no {metric!r} (it returned {sorted(again.metrics)})"
    return None


def _side(e: Evidence, p: Policy, champion: bool) -> tuple[Measure, str | None, Mapping[str, float] | None]:
    """One side of the comparison on the current data: its measure, why its re-score failed, its re-scored metrics."""
    if champion:
        assert e.champion is not None
        m = Measure(f"champion {e.champion.version}", e.champion.value, e.champion_digest, STORED)
        again = e.champion_again
    else:
        assert e.best is not None
        m = Measure(f"step {e.best.step}", e.best.metrics[p.metric], e.best.val_digest,
                    MEASURED_ON_THIS_DATA if e.best.val_digest == e.digest else STORED)
        again = e.candidate_again
    if not needs_rescore(m.digest, e.digest):
        return m, None, None
    failure = rescore_failure(again or Remeasured(), p.metric)
    if failure or again is None or again.metrics is None:
        return m, failure, None
    return rescored(m, again.metrics[p.metric], e.digest), None, again.metrics


def _rescore_refusal(e: Evidence, p: Policy) -> tuple[str, str, Comparison] | None:
    """(whose re-score failed, why, the comparison so far) when a failed re-score refuses (`rescore = 'refuse'`)."""
    if p.rescore != "refuse" or not _compared(e, p):
        return None
    candidate, failure, _ = _side(e, p, champion=False)
    comparison = Comparison(p.metric, e.data, e.digest, candidate)
    if failure:
        return candidate.who, failure, comparison
    held, failure, _ = _side(e, p, champion=True)
    if failure:
        return held.who, failure, dataclasses.replace(comparison, champion=held)
    return None


def _comparison(e: Evidence, p: Policy) -> Comparison:
    """Which numbers were compared, on which data, and the re-scores that failed (`rescore = 'stored'`)."""
    candidate, failure, _ = _side(e, p, champion=False)
    notes = [f"{candidate.who} could not be re-scored ({failure}): its stored number is used"] if failure else []
    comparison = Comparison(p.metric, e.data, e.digest, candidate)
    if _compared(e, p):
        held, failure, _ = _side(e, p, champion=True)
        if failure:
            notes.append(f"{held.who} could not be re-scored ({failure}): compared with its stored number "
                         f"(promotion.rescore = 'stored')")
        comparison = dataclasses.replace(comparison, champion=held)
    return dataclasses.replace(comparison, note="; ".join(notes))


def _on_this_data(e: Evidence, p: Policy) -> tuple[CheckpointRecord, Champion | None, Mapping[str, float],
                                                   Mapping[str, float] | None]:
    """The candidate and the champion with their numbers on the current data (re-scored where they were), the
    candidate's metrics for the checks, and the champion's (None: not measured on this data)."""
    assert e.best is not None
    best, champion = e.best, e.champion
    candidate, _, again = _side(e, p, champion=False)
    candidate_metrics = {**best.metrics, **(again or {})}
    if candidate.how == RESCORED and candidate.value is not None:
        best = dataclasses.replace(best, metrics={**best.metrics, p.metric: candidate.value})
    held_metrics: Mapping[str, float] | None = None
    if champion is not None and not needs_rescore(e.champion_digest, e.digest):
        held_metrics = dict(e.champion_metrics)
    if champion is not None and _compared(e, p):
        held, _, again = _side(e, p, champion=True)
        if needs_rescore(e.champion_digest, e.digest):
            held_metrics = dict(again or e.champion_metrics)
        champion = dataclasses.replace(champion, value=held.value)
    return best, champion, candidate_metrics, held_metrics


def _checks(e: Evidence, p: Policy, best: CheckpointRecord, candidate_metrics: Mapping[str, float],
            held_metrics: Mapping[str, float] | None, promoting: bool) -> list[Check]:
    """The policy's checks on the current data, saying why the champion is not compared when it is not."""
    if e.champion is None:
        why = "no champion to compare"
    elif held_metrics is None:
        why = (f"champion {e.champion.version} was not measured on this validation data"
               + (" (promotion forced by promotion.always)" if p.always else ""))
    else:
        why = ""
    rows = (e.rows or RowValues(None, None, "no per-row values were measured")) \
        if _compared(e, p) and promoting else None
    why_no_rows = why or ("the point values already refuse" if not promoting
                          else "promotion forced by promotion.always" if p.always else "not compared")
    return policy_checks(p, candidate_metrics, held_metrics, why, rows, why_no_rows, best.step)


def policy_checks(p: Policy, candidate: Mapping[str, float], champion: Mapping[str, float] | None,
                  why_no_champion: str, rows: RowValues | None, why_no_rows: str, step: int = 0) -> list[Check]:
    """Every check `promotion` configures, on the candidate's metrics and the champion's (same data; None: none
    to compare, `why_no_champion` says why), and confidence from each side's per-row values (None: not made,
    `why_no_rows`)."""
    checks = check_thresholds(candidate, p.thresholds)
    checks += check_guards(candidate, champion, p.guards, why_no_champion)
    if p.confidence is None:
        return checks
    if rows is None:
        return [*checks, Check(CONFIDENCE, p.metric, "lower bound > min_delta", p.min_delta, None,
                               level=p.confidence, note=why_no_rows)]
    why_not = (f"step {step}: {rows.candidate_missing}" if rows.candidate is None
               else f"the champion: {rows.champion_missing}")
    return [*checks, check_confidence(p.metric, p.mode, p.confidence, p.min_delta, rows.candidate, rows.champion,
                                      why_not, p.confidence_without_rows)]


def compare_with_champion(
    best: CheckpointRecord | None,
    champion: Champion | None,
    metric: str,
    mode: Mode,
    min_delta: float = 0.0,
    always: bool = False,
    why_best: str = "",
) -> Decision:
    """The point values' part of `decide_promotion`: promote `best` if there is no champion, if `always`, or if
    it beats the champion by more than `min_delta`."""
    if best is None:
        return Decision(NOTHING, f"nothing to promote: {why_best}")
    value = best.metrics[metric]
    head = f"step {best.step} has {metric} = {format_number(value)}"
    if champion is None:
        return Decision(PROMOTE, f"{head}; first promotion to this serving location", best, value)
    if champion.source is not None and champion.source == best.uri:
        return Decision(CURRENT, f"{head}; it is already the champion ({champion.version})", best, value)
    if always:
        return Decision(PROMOTE, f"{head}; promotion forced (always), champion {champion.version} "
                                 f"had {format_number(champion.value)}", best, value)
    if champion.metric != metric or (champion.mode is not None and champion.mode != mode):
        # another model, or another yardstick: the two numbers say nothing about each other
        return Decision(REFUSE, f"{head} ({mode}); champion {champion.version} was ranked by {champion.metric!r} "
                                f"({champion.mode or 'direction not recorded'}): not comparable, not promoted "
                                "(--always-promote, promotion.always, replaces it)", best, value)
    if champion.value is None or not finite(champion.value):
        return Decision(PROMOTE, f"{head}; champion {champion.version} has no finite {metric}", best, value)
    gain = (champion.value - value) if mode == "min" else (value - champion.value)
    if gain > min_delta:
        return Decision(PROMOTE, f"{head}, better than champion {champion.version} ({format_number(champion.value)}) "
                                 f"by {format_number(gain)} > min_delta {min_delta:g}", best, value)
    return Decision(REFUSE, f"{head}; champion {champion.version} has {format_number(champion.value)}: improvement "
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
        return dataclasses.replace(decision, action=REFUSE, reason=reason, checks=tuple(checks))
    if decision.promote and failed:
        reason = f"{decision.reason}; checks (promotion forced by promotion.always: reported, not blocking): {listed}"
    else:
        reason = f"{decision.reason}; checks: {listed}"
    return dataclasses.replace(decision, reason=reason, checks=tuple(checks))


def comparison_summary(decision: Decision) -> dict[str, Any] | None:
    """The decision's comparison as plain data (for the manifest and the run tag), or None."""
    return comparison_to_dict(decision.comparison) if decision.comparison else None


def checks_summary(decision: Decision) -> list[dict[str, Any]]:
    """The policy's checks as plain data (for the manifest, the outcome and the MLflow record)."""
    return [check_to_dict(c) for c in decision.checks]
