"""Gather: everything a promotion decision is made from (`podium.core.promotion.Evidence`), and all the I/O it takes.

Under the serving location's promotion lock, once what a command cut short is finished
(`podium.tasks.promote.finish_cut_short`, which the promotion calls first), `gather_evidence` only reads: it picks
the best of the run's checkpoint records, reads the champion, and measures what the decision asks for
(`podium.core.promotion.missing_evidence`), in order:

- The same-data gate: a number measured on other validation data than the current one (by digest;
  `podium.core.comparison`) is measured again on it: in a nightly run that is the champion's, once, with the
  configured validation function on the same Ray resources as every validation. The re-score is recorded on
  the side's MLflow LoggedModel as an evaluation on that dataset. When the digests agree, nothing is validated
  again. A side that cannot be validated any more (its format or the validation function changed) is
  `promotion.rescore`'s decision: 'refuse', or compare with the 'stored' number, saying so.
- The loadable gate: whether the best checkpoint would be served as files (`served_as_files`: no model class or
  loader, not podium's format), asked only when the champion loads as an MLflow model.
- Confidence: the candidate and the champion validated once more for per-row values (`per_row`, returned
  under `podium.core.events.PER_ROW_KEY`). Those values stay in this process: they are never Prefect
  parameters, MLflow metrics or tags; only the interval they give is recorded.
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
import time
from typing import Any

from podium.config import PromotionConfig
from podium.core import records
from podium.core.comparison import needs_rescore, short
from podium.core.promotion import (
    CANDIDATE_AGAIN,
    CHAMPION_AGAIN,
    Evidence,
    Policy,
    Remeasured,
    RowValues,
    missing_evidence,
    rescore_failure,
    select_best,
)
from podium.core.records import Champion, CheckpointRecord
from podium.core.served import is_served_as_files
from podium.serving import layout
from podium.storage.fingerprint import DatasetDigest
from podium.storage.locations import fsspec_filesystem
from podium.tasks.plan import RunPlan
from podium.tasks.validate import validate
from podium.tracking.client import TrackingRun
from podium.tracking.datasets import record_rescore
from podium.training.promoted import CHECKPOINT_META

logger = logging.getLogger(__name__)
progress = logging.getLogger("podium.progress")


def gather_evidence(plan: RunPlan, tracking: TrackingRun, checkpoints: list[CheckpointRecord],
                    policy: Policy) -> Evidence:
    """The evidence for a decision on the run's `checkpoints` (call it under the promotion lock, once
    `podium.tasks.promote.finish_cut_short` brought the location and the registry in line): the best checkpoint,
    the champion, and what the decision asks to be measured; it moves nothing. Checkpoints a rollback withdrew from
    this serving location are left out (its history says which)."""
    p = plan.config.promotion
    best, why = select_best(checkpoints, policy.metric, policy.mode, layout.withdrawn_checkpoints(plan.serving))
    current = layout.read_current(plan.serving)
    data = plan.data.get("val")
    evidence = Evidence(best, why, champion_of(current), dict((current.manifest.get("metrics") or {}) if current else {}),
                        champion_digest(current) if current else None, data.uri if data else None,
                        data.digest if data else None,
                        # the loadable gate: asked only where it can refuse (a champion that loads)
                        candidate_files=(served_as_files(p, best) if best is not None and current is not None
                                         and not is_served_as_files(current.manifest.get("served_as")) else None),
                        champion_files=is_served_as_files(current.manifest.get("served_as")) if current else None)
    while (wanted := missing_evidence(evidence, policy)) is not None:
        assert evidence.best is not None and data is not None
        evidence = measure(plan, tracking, policy, evidence, wanted, current, data)
    return evidence


def measure(plan: RunPlan, tracking: TrackingRun, policy: Policy, evidence: Evidence, wanted: str,
            current: layout.PromotedVersion | None, data: DatasetDigest) -> Evidence:
    """`evidence` with what `wanted` names measured: the candidate or the champion re-scored, or per-row values."""
    best, champion = evidence.best, evidence.champion
    assert best is not None
    if wanted == CANDIDATE_AGAIN:
        again = measure_again(plan, tracking, policy.metric, f"step {best.step}", best.metrics[policy.metric],
                              best.val_digest, best.uri, best.step, best.model_id, data)
        return dataclasses.replace(evidence, candidate_again=again)
    assert champion is not None and current is not None
    served = served_checkpoint(current), champion.step or 0
    if wanted == CHAMPION_AGAIN:
        again = measure_again(plan, tracking, policy.metric, f"champion {champion.version}", champion.value,
                              evidence.champion_digest, *served, current.manifest.get("model_id"), data)
        return dataclasses.replace(evidence, champion_again=again)
    progress.info("confidence %g: validating step %d and the champion again for per-row values of %s",
                  policy.confidence, best.step, policy.metric)
    mine, why = per_row_values(plan, policy.metric, best.uri, best.step)
    theirs, why_theirs = per_row_values(plan, policy.metric, *served) if mine is not None else (None, "")
    return dataclasses.replace(evidence, rows=RowValues(mine, theirs, why, why_theirs))


def served_as_files(p: PromotionConfig, best: CheckpointRecord) -> bool | None:
    """Whether the promotion of `best` would serve its files (podium.tasks.package builds no MLflow model of it): no
    promotion.model_class or model_loader, and a checkpoint not in podium's format (no podium.json). None: its
    folder cannot be read now (the gate has nothing to say; the promotion itself will)."""
    if p.model_loader or p.model_class:
        return False
    try:
        fs, root = fsspec_filesystem(best.uri)
        if not fs.exists(root):
            return None  # gone (deleted, another store): the promotion's copy says so
        return not fs.exists(posixpath.join(root, CHECKPOINT_META))
    except Exception as exc:  # any store's error: the promotion's own copy says what is wrong with it
        logger.info("could not tell whether %s is in podium's format (%s)", best.uri, exc)
        return None


def read_champion(serving: str) -> Champion | None:
    """The current champion as the decision sees it."""
    return champion_of(layout.read_current(serving))


def champion_of(current: layout.PromotedVersion | None) -> Champion | None:
    """The champion a current serving version is (None: nothing is served)."""
    if current is None:
        return None
    m = current.manifest
    return Champion(version=current.version, step=m.get("step"), metric=m.get("metric", ""), value=m.get("value"),
                    source=m.get("source"), mode=m.get("mode"), run_name=m.get("run_name"))


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
    if current is not None and plan.policy.confidence is not None:
        return True  # confidence validates the candidate and the champion again for per-row values
    return current is not None and needs_rescore(champion_digest(current), digest)


def validate_again(plan: RunPlan, uri: str, step: int, per_row: bool = False) -> Any:
    """A checkpoint validated on the current validation data (a `ValidationResult`): the configured function,
    the same Ray resources, `validation.retries` retries `retry_delay_s` apart."""
    import ray

    # local: Ray Train's driver side loads only when promotion validates something
    from podium.tasks.train import connect_ray

    if not ray.is_initialized():  # inside the pipeline Ray is up; `podium promote` connects only now
        connect_ray(plan)
    v = plan.config.validation
    for attempt in range(v.retries + 1):
        try:
            return validate(plan, CheckpointRecord(step=step, uri=uri), uri=uri, per_row=per_row)
        except Exception as exc:
            if attempt == v.retries:
                raise
            logger.warning("validation of %s failed (%s); retrying in %g s", uri, exc, v.retry_delay_s)
            time.sleep(v.retry_delay_s)
    raise AssertionError("not reached")


def measure_again(plan: RunPlan, tracking: TrackingRun, metric: str, who: str, value: float | None,
                  digest: str | None, uri: str, step: int, model_id: str | None, data: DatasetDigest) -> Remeasured:
    """`who`'s checkpoint (at `uri`) validated on `data`, every metric it got recorded in MLflow; or why it could
    not be (`value` and `digest`: its stored number and the data it was measured on, for the progress lines;
    `metric`: the policy's)."""
    progress.info("%s was measured on other validation data (digest %s): re-scoring it on %s (digest %s)",
                  who, short(digest), data.uri, data.short)
    try:
        again = Remeasured(metrics=validate_again(plan, uri, step).metrics)
    except Exception as exc:
        return Remeasured(failure=f"{type(exc).__name__}: {exc}"[:500])
    failure = rescore_failure(again, metric)
    if failure or again.metrics is None:
        return Remeasured(failure=failure)
    record_rescore(tracking, who.removeprefix("champion ").replace(" ", "-"), model_id, step, dict(again.metrics), data)
    progress.info("%s re-scored: %s = %s (was %s on digest %s)", who, metric, again.metrics[metric], value,
                  short(digest))
    return again


def per_row_values(plan: RunPlan, metric: str, uri: str, step: int) -> tuple[Any, str]:
    """The promotion metric's (`metric`, the policy's) value on every validation row for one checkpoint, or (None,
    why not)."""
    try:
        rows = validate_again(plan, uri, step, per_row=True).per_row
    except Exception as exc:
        return None, f"its validation for per-row values failed ({type(exc).__name__}: {exc})"[:300]
    return rows_of(rows, metric)


def rows_of(per_row: dict[str, Any], metric: str) -> tuple[Any, str]:
    """`metric`'s per-row values from what a validation returned under `podium.per_row`, or (None, why not)."""
    if metric not in per_row:
        return None, (f"the validation function returned no per-row values for {metric!r} (under "
                      f"'podium.per_row'{', it gave ' + str(sorted(per_row)) if per_row else ''})")
    return per_row[metric], ""
