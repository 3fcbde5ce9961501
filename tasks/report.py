"""What people see: Prefect artifacts (checkpoint table, promotion report, chart, progress); on the MLflow run,
the report, the chart and the outcome."""

from __future__ import annotations

import base64
import logging
import math
import os
import re
import tempfile
from collections.abc import Sequence
from typing import Any, cast
from uuid import UUID

from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from podium import prefect_api
from podium.charts import Mark, figure_png, metric_figure
from podium.core.comparison import RESCORED, Comparison
from podium.core.numbers import format_number, format_signed
from podium.core.policy import LOADABLE, Check, interval_text
from podium.core.promotion import REFUSED_BY_POLICY
from podium.core.records import CheckpointRecord
from podium.core.served import files_note
from podium.tasks.promote import PromotionOutcome
from podium.tracking.client import MAX_TAG, TAG_REASON, TrackingRun, reaching_tracking
from podium.tracking.runs import tag_outcome

logger = logging.getLogger(__name__)


def artifact_key(run_name: str, what: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{run_name}-{what}".lower()).strip("-")


def _fmt(v: float | None) -> str:
    """A metric as people read it: 4 significant digits, everywhere podium shows one."""
    if v is None:
        return ""
    return format_number(v)


def checkpoint_rows(records: list[CheckpointRecord], champion_step: int | None) -> list[dict[str, str]]:
    """One row per checkpoint: step, status, every metric, and which one is the champion."""
    keys = sorted({k for r in records for k in r.metrics if k not in ("step", "epoch")})
    rows = []
    for r in records:
        row = {"step": str(r.step), "status": r.status, **{k: _fmt(r.metrics.get(k)) for k in keys},
               "champion": "★" if r.step == champion_step else "", "uri": r.uri}
        if r.failure:
            row["failure"] = r.failure[:200]
        rows.append(row)
    return rows


def _delta(value: float, base: float, mode: str) -> str:
    """'+0.0036 (+1.9%) worse': how far a value is from the reference, in its units and relatively."""
    d = value - base
    if d == 0:
        return "±0"
    better = d < 0 if mode == "min" else d > 0
    relative = f" ({100 * d / abs(base):+.2g}%)" if base else ""
    return f"{format_signed(d)}{relative} {'better' if better else 'worse'}"


def chart_marks(records: list[CheckpointRecord], metric: str,
                outcome: PromotionOutcome) -> tuple[Mark | None, Mark | None]:
    """(winner, reference): the promoted (else the best) checkpoint, and the champion it was measured against."""
    reference = None
    if outcome.champion_before and outcome.champion_before_value is not None:
        origin = f", run {outcome.champion_before_run}" if outcome.champion_before_run else ""
        reference = Mark(f"champion before this run ({outcome.champion_before}{origin})",
                         value=outcome.champion_before_value)
    if outcome.promoted:
        p = outcome.promoted
        return Mark(f"promoted as {p.version}", value=p.value, step=p.step), reference
    best = next((r for r in records if r.step == outcome.best_step), None)
    if best is None:
        return None, reference
    return Mark("best, not promoted", value=best.metrics.get(metric), step=best.step), reference


def chart_markdown(records: list[CheckpointRecord], metric: str, mode: str, outcome: PromotionOutcome,
                   png: bytes | None) -> str:
    """The chart (an embedded PNG: the Prefect UI renders data:image/ sources) and each checkpoint's
    value with its difference from the champion the run was measured against (else from the winner)."""
    winner, reference = chart_marks(records, metric, outcome)
    lines = [f"### {metric} per checkpoint ({'lower' if mode == 'min' else 'higher'} is better)", ""]
    if png:
        lines += [f"![{metric} per checkpoint](data:image/png;base64,{base64.b64encode(png).decode()})", ""]
    else:
        lines += [f"No checkpoint has a finite `{metric}` to draw.", ""]
    base = reference or winner
    versus = "champion before this run" if reference else "the winner"
    lines += [f"| step | status | {metric} | vs {versus}" + (f" ({format_number(base.value)})" if base and base.value is not None
                                                            else "") + " | |", "|---:|---|---:|---:|---|"]
    for r in records:
        v = r.metrics.get(metric)
        delta = ""
        if base is not None and base.value is not None and v is not None and math.isfinite(v):
            delta = _delta(v, base.value, mode)
        note = f"★ {winner.label}" if winner and r.step == winner.step else (r.failure or "")[:80]
        lines.append(f"| {r.step} | {r.status} | {_fmt(v)} | {delta} | {note} |")
    return "\n".join(lines)


def outcome_texts(run_name: str, records: list[CheckpointRecord], metric: str,
                  outcome: PromotionOutcome) -> tuple[str, str]:
    """(one line for the runs table, the run's description in markdown)."""
    p = outcome.promoted
    if p:
        line = (f"promoted step {p.step} as {p.version} ({p.metric} {_fmt(p.value)}"
                + (f", model version {p.mlflow_version})" if p.mlflow_version else ")"))
    elif outcome.best_step is not None and "it is already the champion" in outcome.reason:
        # promoting again (`podium promote`) found this run's winner in place: the run's outcome stands
        line = f"step {outcome.best_step} is the champion ({outcome.champion_before}), promoted earlier"
    elif outcome.reason.startswith(REFUSED_BY_POLICY):  # which checks refused it; the reason has their values
        line = "not promoted: " + outcome.reason.split(":", 1)[0]
    elif any(c.kind == LOADABLE and c.passed is False for c in outcome.checks):  # the loadable gate
        line = "not promoted: it would be served as files over a champion that loads as an MLflow model"
    else:
        line = "not promoted: " + outcome.reason.rsplit("; ", 1)[-1]
    rows = [f"| {r.step} | {r.status} | {_fmt(r.metrics.get(metric))} |"
            + (" ★" if (p and r.step == p.step) else "") for r in records]
    description = "\n".join([f"**{line[0].upper()}{line[1:]}**", "", f"Why: {outcome.reason}", "",
                             f"| step | status | {metric} |", "|---:|---|---:|", *rows])
    return line, description


def promotion_markdown(run_name: str, outcome: PromotionOutcome, tracking_url: str | None) -> str:
    """The promotion report: what was promoted and why, or why not."""
    lines = [f"# Promotion report: {run_name}", ""]
    if outcome.promoted:
        p = outcome.promoted
        lines += [f"**Promoted** step {p.step} as serving version `{p.version}` "
                  f"({p.metric} = {_fmt(p.value)}).", "",
                  f"- serving copy: `{p.uri}` ({files_note(p.served_as) or p.served_as})",
                  f"- source checkpoint (kept for resuming): `{p.checkpoint_uri}`",
                  f"- MLflow registered version: {p.model or ''} {p.mlflow_version}",
                  *([f"- load: `{p.load}`"] if p.load else []),
                  f"- previous champion: {outcome.champion_before or 'none'}"]
    else:
        lines += ["**Nothing promoted.**", ""]
    lines += ["", f"Reason: {outcome.reason}"]
    lines += comparison_markdown(outcome.comparison)
    lines += checks_markdown(outcome.checks)
    if outcome.promoted and outcome.promoted.provenance:
        lines += ["", f"## Lineage of {outcome.promoted.version}", ""] + lineage_lines(outcome.promoted.provenance)
    if tracking_url:
        lines += ["", f"MLflow run: {tracking_url}"]
    return "\n".join(lines)


def comparison_markdown(comparison: Comparison | None) -> list[str]:
    """A table of the numbers the decision compared and the validation data each was measured on."""
    if comparison is None:
        return []
    lines = ["", "## Compared on " + ("the same data" if comparison.same_data else "different data (see the note)"),
             "", f"Current validation data: `{comparison.data}`, digest `{comparison.digest}`", "",
             f"| | {comparison.metric} | measured on (digest) | how |", "|---|---|---|---|"]
    for m in (comparison.candidate, comparison.champion):
        if m is not None:
            how = m.how + (f" (before: {_fmt(m.stored_value)} on `{m.stored_digest}`)" if m.how == RESCORED else "")
            lines.append(f"| {m.who} | {_fmt(m.value)} | `{m.digest}` | {how} |")
    if comparison.note:
        lines += ["", f"Note: {comparison.note}"]
    return lines


def checks_markdown(checks: Sequence[Check]) -> list[str]:
    """The promotion policy's checks (thresholds, guards, confidence) as a table: both values, the limit,
    the bootstrap interval, and whether each held."""
    if not checks:
        return []
    lines = ["", "## Promotion policy", "", "| check | metric | rule | limit | candidate | champion | interval | result |",
             "|---|---|---|---:|---:|---:|---|---|"]
    for c in checks:
        interval = ""
        if c.interval:
            interval = f"{interval_text(c.interval)} at {c.level:g}, {c.rows} rows"
        result = {True: "holds", False: "**fails**", None: "not checked"}[c.passed]
        if c.note:
            result += f" ({c.note})"
        lines.append(f"| {c.kind} | {c.metric} | {c.rule} | {c.limit:g} | "
                     f"{format_number(c.candidate)} | {format_number(c.champion)} | {interval} | {result} |")
    return lines


def lineage_lines(prov: dict[str, Any]) -> list[str]:
    """A promoted version's lineage as markdown list items: data, MLflow, Prefect, code."""
    lines = [f"- {role} data: `{d.get('uri', '?')}` digest `{d.get('digest')}`" + (f", {d['rows']} rows" if "rows" in d
                                                                                  else "")
             for role, d in prov.get("datasets", {}).items()]
    lin = prov.get("lineage", {})
    ml, tags = lin.get("mlflow", {}), lin.get("tags", {})
    lines.append(f"- checkpoint `{lin.get('checkpoint')}` (step {lin.get('step')}); MLflow run {ml.get('run_name')} "
                 f"(`{ml.get('run_id')}`), LoggedModel `{ml.get('model_id')}`")
    if tags.get("podium.prefect.flow_run_id"):
        lines.append(f"- Prefect flow run {tags.get('podium.prefect.flow_run_name')} (`{tags['podium.prefect.flow_run_id']}`): "
                     f"{tags.get('podium.prefect.flow_run_url', '')}")
    if tags.get("podium.prefect.deployment"):
        lines.append(f"- deployment {tags['podium.prefect.deployment']}, started by "
                     f"{tags.get('podium.prefect.started_by', '?')}" + (f", schedule {tags['podium.prefect.schedule']}"
                                                                       if tags.get("podium.prefect.schedule") else ""))
    if tags.get("mlflow.source.git.commit"):
        lines.append(f"- code: {tags.get('podium.code.package')} at git commit `{tags['mlflow.source.git.commit']}`"
                     + (" (with uncommitted changes)" if tags.get("podium.code.git_dirty") == "true" else ""))
    return lines


def publish_reports(run_name: str, tracking: TrackingRun, records: list[CheckpointRecord],
                    outcome: PromotionOutcome, metric: str, mode: str, tracking_url: str | None) -> None:
    """Checkpoint table, promotion report and chart as Prefect artifacts; on the MLflow run, the report,
    the chart and the outcome (a tag the runs table can show, and the run's description)."""
    champion_step = outcome.promoted.step if outcome.promoted else None
    # Prefect artifacts mirror the run: bounded calls, held while the server is down (podium.prefect_api)
    rows, key = checkpoint_rows(records, champion_step), artifact_key(run_name, "checkpoints")
    prefect_api.call("the checkpoints artifact", lambda: create_table_artifact(
        table=rows, key=key, description=f"Checkpoints of {run_name} with training and validation metrics"), key=key)
    report = promotion_markdown(run_name, outcome, tracking_url)
    report_key = artifact_key(run_name, "promotion")
    prefect_api.call("the promotion report artifact", lambda: create_markdown_artifact(
        markdown=report, key=report_key, description=f"Promotion report of {run_name}"), key=report_key)
    winner, reference = chart_marks(records, metric, outcome)
    fig = metric_figure(records, metric, mode, f"{run_name}: {metric} per checkpoint", winner, reference)
    png = figure_png(fig) if fig else None  # drawn once, for the Prefect artifact and the MLflow run alike
    chart, chart_key = chart_markdown(records, metric, mode, outcome, png), artifact_key(run_name, "chart")
    prefect_api.call("the chart artifact", lambda: create_markdown_artifact(
        markdown=chart, key=chart_key, description=f"{metric} per checkpoint"), key=chart_key)
    line, description = outcome_texts(run_name, records, metric, outcome)
    with reaching_tracking(tracking.tracking_uri, "writing the promotion report and chart"):
        tracking.client().log_text(tracking.run_id, report, "podium/promotion_report.md")
        if png is not None:
            log_png(tracking, png, f"podium/{metric}_per_checkpoint.png")
    tag_outcome(tracking, line, description, {TAG_REASON: outcome.reason[:MAX_TAG]})


def log_png(tracking: TrackingRun, png: bytes, artifact_file: str) -> None:
    """PNG bytes drawn already as an artifact of the MLflow run (what `log_figure` would draw again)."""
    folder, name = os.path.split(artifact_file)
    with tempfile.TemporaryDirectory(prefix="podium-chart-") as tmp:
        path = os.path.join(tmp, name)
        with open(path, "wb") as f:
            f.write(png)
        tracking.client().log_artifact(tracking.run_id, path, folder or None)


class Progress:
    """A Prefect progress artifact for the run, updated as training and validation go on."""

    def __init__(self, run_name: str, total_epochs: int):
        self.total = max(total_epochs, 1)
        self.trained = 0.0
        self.validated = 0
        self.announced = 0
        self.id: UUID | None = None
        self.key = artifact_key(run_name, "progress")
        created = prefect_api.call("the progress artifact", lambda: create_progress_artifact(  # sync outside a loop
            progress=0.0, key=self.key, description="Training epochs done (validations follow)"))
        self.id = cast(UUID, created) if created is not None else None

    def update(self, *, epoch: float | None = None, validated: int | None = None) -> None:
        """Record progress: training by epoch, then validations."""
        before = (self.trained, self.validated)
        if epoch is not None:
            self.trained = min(float(epoch), float(self.total))
        if validated is not None:
            self.validated = validated
        if self.id is None or (self.trained, self.validated) == before:
            return  # the flow polls several times a second: one API call per actual change
        pct, artifact_id = 100.0 * self.trained / self.total, self.id
        description = f"{self.trained:g}/{self.total} epochs, {self.validated} validated"
        prefect_api.post("a progress update", lambda: update_progress_artifact(  # the loop goes on meanwhile
            artifact_id, progress=pct, description=description), key=self.key)

    def flush(self) -> None:
        """Wait (bounded) until the latest progress is written: before the flow's final reports."""
        prefect_api.link().flush()
