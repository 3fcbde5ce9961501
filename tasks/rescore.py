"""The same-data gate in promotion: the candidate and the champion scored on the same validation data.

Before the decision, a number measured on other validation data than the current one (by digest;
`podium.core.comparison`) is measured again on it: in a nightly run that is the champion's, once, with the
configured validation function on the same Ray resources as every validation. The re-score is
recorded on the champion's MLflow LoggedModel as an evaluation on that dataset. When the digests
agree, nothing is validated again. A champion that cannot be validated any more (its format or the
validation function changed) is `promotion.rescore`'s decision: 'refuse', or compare with the
'stored' number, saying so.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from podium.core import records
from podium.core.comparison import AT_VALIDATION, RESCORED, STORED, Comparison, Measure, needs_rescore, rescored, short
from podium.core.policy import Check, check_to_dict
from podium.core.promotion import Decision, apply_checks, decide_promotion
from podium.core.records import Champion, CheckpointRecord
from podium.serving import layout
from podium.storage.fingerprint import DatasetDigest
from podium.tasks.plan import RunPlan
from podium.tasks.policy import policy_checks, validate_again
from podium.tracking.client import TrackingRun
from podium.tracking.datasets import record_comparison, record_rescore

logger = logging.getLogger(__name__)
progress = logging.getLogger("podium.progress")


def served_checkpoint(version: layout.PromotedVersion) -> str:
    """Where a champion's checkpoint can be validated: its served copy (immutable, verified) when the version
    serves the checkpoint's files, else (an MLflow model built from it) the checkpoint it came from."""
    m = version.manifest
    if layout.content_of(m) == "checkpoint":
        return version.uri
    return str(m.get("checkpoint") or m.get("source"))


def champion_digest(version: layout.PromotedVersion) -> str | None:
    """The digest of the validation data the champion's number was measured on (None: not recorded)."""
    val = (version.manifest.get("datasets") or {}).get("val") or {}
    return val.get("digest")


def promotion_needs_ray(plan: RunPlan, checkpoints: list[CheckpointRecord]) -> bool:
    """Whether promotion will validate anything (and so needs Ray): `verify = "revalidate"`, a validated
    checkpoint measured on other data than this run's validation data, a champion that was, or a champion
    to compare with under `promotion.confidence`. Errs on the
    side of yes: a local Ray kept up costs a few seconds at the end, one shut down under a re-score ends the run."""
    if plan.config.promotion.verify == "revalidate":
        return True
    val = plan.data.get("val")
    digest = val.digest if val else None
    if any(r.status == records.VALIDATED and needs_rescore(r.val_digest, digest) for r in checkpoints):
        return True
    try:
        current = layout.read_current(plan.serving)
    except Exception:  # a serving location promotion will refuse: it says why, with Ray or without
        return True
    if current is not None and plan.config.promotion.confidence is not None:
        return True  # confidence validates the candidate and the champion again for per-row values
    return current is not None and needs_rescore(champion_digest(current), digest)


def rescore(plan: RunPlan, uri: str, step: int) -> dict[str, float]:
    """Validate a checkpoint on the current validation data: the configured function, the same Ray
    resources, `validation.retries` retries `retry_delay_s` apart."""
    return validate_again(plan, uri, step).metrics


def _measure_again(plan: RunPlan, tracking: TrackingRun, m: Measure, uri: str, step: int, model_id: str | None,
                   data: DatasetDigest) -> tuple[Measure, str | None, dict[str, float] | None]:
    """`m` measured on `data` (recorded in MLflow) with every metric it got there, or `m` unchanged and why
    it could not be."""
    metric = plan.config.promotion.metric
    progress.info("%s was measured on other validation data (digest %s): re-scoring it on %s (digest %s)",
                  m.who, short(m.digest), data.uri, data.short)
    try:
        metrics = rescore(plan, uri, step)
    except Exception as exc:
        return m, f"{type(exc).__name__}: {exc}"[:500], None
    if metric not in metrics:
        return m, f"the validation function returned no {metric!r} (it returned {sorted(metrics)})", None
    record_rescore(tracking, m.who.removeprefix("champion ").replace(" ", "-"), model_id, step, metrics, data)
    progress.info("%s re-scored: %s = %s (was %s on digest %s)", m.who, metric, metrics[metric], m.value,
                  short(m.digest))
    return rescored(m, metrics[metric], data.digest), None, metrics


def _refusal(plan: RunPlan, best: CheckpointRecord, comparison: Comparison, who: str, failure: str) -> Decision:
    p = plan.config.promotion
    reason = (f"{who} could not be re-scored on the current validation data {comparison.data} (digest "
              f"{short(comparison.digest)}): {failure}. promotion.rescore = 'refuse': nothing promoted. Set "
              f"promotion.rescore = 'stored' to compare with the stored number, or promotion.always to replace it")
    return Decision(False, reason, best, best.metrics.get(p.metric), comparison)


def decide_on_same_data(plan: RunPlan, tracking: TrackingRun, best: CheckpointRecord | None, why: str,
                        champion: Champion | None) -> Decision:
    """`decide_promotion`, with both numbers measured on the current validation data (see the module)."""
    p = plan.config.promotion
    data = plan.data.get("val")
    digest = data.digest if data else None

    def finish(decision: Decision, comparison: Comparison | None = None) -> Decision:
        comparison = comparison or decision.comparison
        if comparison is not None:
            decision = dataclasses.replace(decision, reason=f"{decision.reason}; {comparison.describe()}",
                                           comparison=comparison)
        record_comparison(tracking, {"promote": decision.promote, "reason": decision.reason,
                                     "comparison": comparison_summary(decision), "checks": checks_summary(decision)})
        return decision

    if best is None or data is None:  # nothing to promote; or a plan that does not know its data (no gate)
        decision = decide_promotion(best, champion, p.metric, p.mode, p.min_delta, p.always, why)
        if best is not None and not _already_champion(champion, best):
            checks = policy_checks(plan, best, best.metrics, None, "the validation data is not known (data.val): "
                                   "no comparison on the same data")
            decision = apply_checks(decision, checks, p.always)
        return finish(decision)
    candidate = Measure(f"step {best.step}", best.metrics[p.metric], best.val_digest,
                        AT_VALIDATION if best.val_digest == digest else STORED)
    comparison = Comparison(p.metric, data.uri, digest, candidate)
    current = layout.read_current(plan.serving) if champion is not None else None
    compared = (champion is not None and current is not None and not p.always and champion.source != best.uri
                and champion.metric == p.metric and champion.mode in (None, p.mode))
    notes: list[str] = []
    candidate_metrics = best.metrics
    if needs_rescore(candidate.digest, digest):
        candidate, failure, again = _measure_again(plan, tracking, candidate, best.uri, best.step, best.model_id,
                                                   data)
        if failure and p.rescore == "refuse" and compared:
            return finish(_refusal(plan, best, dataclasses.replace(comparison, candidate=candidate),
                                   candidate.who, failure))
        if failure:
            notes.append(f"{candidate.who} could not be re-scored ({failure}): its stored number is used")
        candidate_metrics = {**best.metrics, **(again or {})}
    # the champion's metrics on this data, for the guards: stored when measured on it, else as re-scored
    held_metrics: dict[str, float] | None = None
    if current is not None and not needs_rescore(champion_digest(current), digest):
        held_metrics = dict(current.manifest.get("metrics") or {})
    if compared and champion is not None and current is not None:
        held = Measure(f"champion {champion.version}", champion.value, champion_digest(current), STORED)
        if needs_rescore(held.digest, digest):
            held, failure, again = _measure_again(plan, tracking, held, served_checkpoint(current),
                                                  champion.step or 0, current.manifest.get("model_id"), data)
            if failure and p.rescore == "refuse":
                comparison = dataclasses.replace(comparison, candidate=candidate, champion=held)
                return finish(_refusal(plan, best, comparison, held.who, failure))
            if failure:
                notes.append(f"{held.who} could not be re-scored ({failure}): compared with its stored number "
                             f"(promotion.rescore = 'stored')")
            held_metrics = again or dict(current.manifest.get("metrics") or {})
        champion = dataclasses.replace(champion, value=held.value)
        comparison = dataclasses.replace(comparison, champion=held)
    comparison = dataclasses.replace(comparison, candidate=candidate, note="; ".join(notes))
    if candidate.how == RESCORED and candidate.value is not None:
        best = dataclasses.replace(best, metrics={**best.metrics, p.metric: candidate.value})
    decision = decide_promotion(best, champion, p.metric, p.mode, p.min_delta, p.always, why)
    if not _already_champion(champion, best):
        decision = apply_checks(decision, _checks(plan, best, candidate_metrics, champion, current, held_metrics,
                                                  compared, decision.promote), p.always)
    return finish(decision, comparison)


def _already_champion(champion: Champion | None, best: CheckpointRecord) -> bool:
    return champion is not None and champion.source is not None and champion.source == best.uri


def _checks(plan: RunPlan, best: CheckpointRecord, candidate_metrics: dict[str, float], champion: Champion | None,
            current: layout.PromotedVersion | None, held_metrics: dict[str, float] | None, compared: bool,
            promoting: bool) -> list[Check]:
    """The policy's checks (`podium.tasks.policy`), saying why the champion is not compared when it is not."""
    p = plan.config.promotion
    if champion is None or current is None:
        why = "no champion to compare"
    elif held_metrics is None:
        why = (f"champion {champion.version} was not measured on this validation data"
               + (" (promotion forced by promotion.always)" if p.always else ""))
    else:
        why = ""
    rows_from = (served_checkpoint(current), champion.step or 0) if compared and current and champion else None
    why_no_rows = why or ("the point values already refuse" if not promoting
                          else "promotion forced by promotion.always" if p.always else "not compared")
    if rows_from is not None and not promoting:
        rows_from = None  # two validations would change nothing
    return policy_checks(plan, best, candidate_metrics, held_metrics, why, rows_from, why_no_rows)


def comparison_summary(decision: Decision) -> dict[str, Any] | None:
    """The decision's comparison as plain data (for the manifest and the outcome), or None."""
    return dataclasses.asdict(decision.comparison) if decision.comparison else None


def checks_summary(decision: Decision) -> list[dict[str, Any]]:
    """The policy's checks as plain data (for the manifest, the outcome and the MLflow record)."""
    return [check_to_dict(c) for c in decision.checks]
