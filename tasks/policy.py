"""The promotion policy's checks on a candidate (`podium.core.policy`), with the numbers they need.

Thresholds read the candidate's metrics; guards the candidate's and the champion's, measured on the same
validation data (the same-data gate, `podium.tasks.rescore`, provides them). Confidence needs each side's
value on every validation row: both are validated once more, asking the validation function for per-row
values (`per_row`, returned under `podium.core.events.PER_ROW_KEY`). Those values stay in this process:
they are never Prefect parameters, MLflow metrics or tags; only the interval they give is recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from podium.core.policy import CONFIDENCE, Check, check_confidence, check_guards, check_thresholds
from podium.core.records import CheckpointRecord
from podium.tasks.plan import RunPlan

logger = logging.getLogger(__name__)
progress = logging.getLogger("podium.progress")


def validate_again(plan: RunPlan, uri: str, step: int, per_row: bool = False) -> Any:
    """A checkpoint validated on the current validation data (a `ValidationResult`): the configured function,
    the same Ray resources, `validation.retries` retries `retry_delay_s` apart."""
    import time

    import ray

    # local: Ray Train's driver side loads only when promotion validates something
    from podium.tasks.train import connect_ray
    from podium.tasks.validate import validate

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


def per_row_values(plan: RunPlan, uri: str, step: int) -> tuple[Any, str]:
    """The promotion metric's value on every validation row for one checkpoint, or (None, why not)."""
    metric = plan.config.promotion.metric
    try:
        rows = validate_again(plan, uri, step, per_row=True).per_row
    except Exception as exc:
        return None, f"its validation for per-row values failed ({type(exc).__name__}: {exc})"[:300]
    if metric not in rows:
        return None, (f"the validation function returned no per-row values for {metric!r} (under "
                      f"'podium.per_row'{', it gave ' + str(sorted(rows)) if rows else ''})")
    return rows[metric], ""


def confidence_check(plan: RunPlan, best: CheckpointRecord, rows_from: tuple[str, int] | None,
                     why_no_rows: str) -> Check:
    """The paired bootstrap check of the candidate's gain over the champion (`promotion.confidence`), the
    champion validated from `rows_from` (its checkpoint's location and step); None: not made, `why_no_rows`."""
    p = plan.config.promotion
    assert p.confidence is not None
    if rows_from is None:
        return Check(CONFIDENCE, p.metric, "lower bound > min_delta", p.min_delta, None, level=p.confidence,
                     note=why_no_rows)
    progress.info("confidence %g: validating step %d and the champion again for per-row values of %s",
                  p.confidence, best.step, p.metric)
    mine, why = per_row_values(plan, best.uri, best.step)
    theirs, why_theirs = per_row_values(plan, *rows_from) if mine is not None else (None, "")
    why_not = f"step {best.step}: {why}" if mine is None else f"the champion: {why_theirs}"
    return check_confidence(p.metric, p.mode, p.confidence, p.min_delta, mine, theirs, why_not,
                            p.confidence_without_rows)


def policy_checks(plan: RunPlan, best: CheckpointRecord, candidate: Mapping[str, float],
                  champion: Mapping[str, float] | None, why_no_champion: str = "no champion to compare",
                  rows_from: tuple[str, int] | None = None, why_no_rows: str = "") -> list[Check]:
    """Every check `promotion` configures, on the candidate's metrics and the champion's (same data; None:
    none to compare, `why_no_champion` says why). Confidence validates the candidate and the champion
    (`rows_from`: its checkpoint and step) again for per-row values."""
    p = plan.config.promotion
    checks = check_thresholds(candidate, {k: t.model_dump() for k, t in p.thresholds.items()})
    checks += check_guards(candidate, champion, {k: g.model_dump() for k, g in p.guards.items()}, why_no_champion)
    if p.confidence is not None:
        checks.append(confidence_check(plan, best, rows_from, why_no_rows or why_no_champion))
    return checks
