"""What `podium run`, `promote`, `status` and `history` print: a human summary, or one JSON object."""

from __future__ import annotations

import os
import time
from typing import Any

from podium.core.approval import VIA_SHADOW, Approval
from podium.core.comparison import comparison_to_dict
from podium.core.numbers import format_number
from podium.core.served import files_note
from podium.services import ui_url
from podium.serving.history import current_switch, parse_switch


def champion_json(config: Any) -> dict[str, Any] | None:
    """The model's champion (the serving location's current version), as `--json` names it."""
    from podium.serving.layout import read_current
    from podium.serving.location import read_location

    current = read_current(config.serving)
    if current is None:
        return None
    m, location = current.manifest, read_location(config.serving)
    name, alias = ((location.registered_model, location.alias) if location
                   else (config.promotion.registered_model, config.promotion.alias))
    return {"model": m.get("model", config.model), "version": current.version, "uri": current.uri,
            "step": m.get("step"), "metric": m.get("metric"), "mode": m.get("mode"), "value": m.get("value"),
            "run_name": m.get("run_name"), "mlflow_run_id": m.get("mlflow_run_id"),
            "checkpoint": m.get("checkpoint", m.get("source")), "served_as": m.get("served_as", "files"),
            "mlflow_model": f"models:/{name}@{alias}", "load": m.get("load")}


def checkpoint_json(r: Any) -> dict[str, Any]:
    """One checkpoint's record as `--json` prints it; the optional keys only where they apply."""
    optional = {"failure": r.failure, "note": r.note, "withdrawn": r.withdrawn, "deleted": r.deleted}
    return {"step": r.step, "uri": r.uri, "status": r.status, "metrics": r.metrics, "validated_at": r.validated_at,
            **{k: v for k, v in optional.items() if v}}


def summary_json(summary: Any, serving: str, config: Any = None) -> dict[str, Any]:
    """The outcome of a run as the JSON object `--json` prints: `promoted` is what this run promoted
    (null when it promoted nothing), `champion` the model's champion now."""
    promoted, comparison, shadow = summary.promotion.promoted, summary.promotion.comparison, summary.promotion.shadow
    return {
        "run_name": summary.run_name,
        **({"model": config.model, "champion": champion_json(config)} if config is not None else {}),
        "mlflow_run_id": summary.tracking.run_id,
        "tracking_uri": summary.tracking.tracking_uri,
        "checkpoints": [checkpoint_json(r) for r in summary.checkpoints],
        "training_ended_at": summary.training_ended_at,
        "stopped_early": ({"step": summary.stopped_early.step, "reason": summary.stopped_early.reason}
                          if summary.stopped_early else None),
        "promoted": ({"version": promoted.version, "uri": promoted.uri, "step": promoted.step,
                      "metric": promoted.metric, "value": promoted.value,
                      "mlflow_version": promoted.mlflow_version, "served_as": promoted.served_as,
                      "load": promoted.load, **(promoted.provenance or {})} if promoted else None),
        "promotion_reason": summary.promotion.reason,
        "comparison": comparison_to_dict(comparison) if comparison is not None else None,
        # the shadow's verdict and numbers (promotion.rollout 'shadow')
        "shadow": shadow.as_dict() if shadow is not None else None,
        # the watch after the switch: passed or rolled back (promotion.watch)
        "watch": summary.promotion.watch.as_dict() if summary.promotion.watch is not None else None,
        # a SIGINT / SIGTERM that came after the switch of CURRENT: the promotion stands (podium.flows.summary)
        "late_stop": summary.late_stop,
        "serving": serving,
    }


def _metrics_text(metrics: dict[str, float]) -> str:
    """Metrics as people read them (`format_number`), the step and epoch left out."""
    return " ".join(f"{k}={format_number(v)}" for k, v in sorted(metrics.items()) if k not in ("step", "epoch"))


def print_status(config: Any, tracking: Any, records: list[Any], mine: Any, reason: str | None,
                 champion: dict[str, Any] | None, watch: dict[str, str] | None = None,
                 ended_by: str | None = None) -> None:
    """A run's checkpoints, what the run promoted and why (its watch, and who ended the run when its own command
    could not); then, apart, the model's champion and where it came from. One precision (4 significant digits)
    throughout."""
    print(f"run {config.run_name} (MLflow run {tracking.run_id}): {len(records)} checkpoints")
    for r in records:
        notes = [r.failure or "", "withdrawn" if r.withdrawn else "", "files deleted" if r.deleted else ""]
        note = f"  ({'; '.join(filter(None, notes))})" if any(notes) else ""
        print(f"  step {r.step:>7}  {r.status:<9} {_metrics_text(r.metrics)}{note}")
    m = mine.manifest if mine else {}
    print("this run promoted: " + (f"{mine.version} (step {m.get('step')}, {m.get('metric')}={format_number(m.get('value'))})"
                                   if mine else "nothing"))
    if reason:
        print(f"  why: {reason}")
    if watch:
        print(f"  watch: {watch['state']}: {watch['reason']}")
    if ended_by and ended_by != reason:
        print(f"  ended by another command: {ended_by}")
    print(f"champion of model {config.model} at {config.serving}: " + (
        f"{champion['version']} (step {champion['step']}, {champion['metric']}={format_number(champion['value'])}, "
        f"run {champion['run_name']}); {champion['mlflow_model']}" if champion else "none"))
    if champion and files_note(champion["served_as"]):
        print(f"  {files_note(champion['served_as'])}; load: {champion['load']}")


def embedded_store_uri(settings: Any) -> str:
    """The embedded MLflow store as MLFLOW_TRACKING_URI names it from here: relative to the current folder when it is
    under it (the project folder), as README.md writes it; else absolute."""
    store = os.path.join(settings.home_dir, "mlflow.db")
    relative = os.path.relpath(store)
    return f"sqlite:///{store if relative.startswith('..') else relative}"


def print_mlflow_links(tracking: Any, mlflow_ui: str, registered_model: str, metric: str) -> None:
    """Where to look in the MLflow UI: the experiment's runs, the run, its checkpoints, the champion."""
    print(f"MLflow UI:   {tracking.experiment_url(mlflow_ui)}   (runs, with their outcome)")
    print(f"             {tracking.run_url(mlflow_ui)}   (the run: description, logged models, chart)")
    print(f"             {tracking.chart_url(mlflow_ui, metric)}   (checkpoints side by side, the champion marked)")
    print(f"             {tracking.models_url(mlflow_ui)}   (each checkpoint's logged model)")
    print(f"             {tracking.registry_url(mlflow_ui, registered_model)}   (versions, @champion)", flush=True)


def print_summary(summary: Any, config: Any, settings: Any, tracking_uri: str, api_url: str, elapsed: float) -> None:
    """The outcome of a run in words, with links to where to look."""
    print()
    print(f"run {summary.run_name}: {len(summary.checkpoints)} checkpoints in {elapsed:.1f} s")
    if summary.stopped_early:
        print(f"stopped early at step {summary.stopped_early.step}: {summary.stopped_early.reason}")
    for r in summary.checkpoints:
        why = "; ".join(filter(None, [r.failure or r.note, "files deleted" if r.deleted else ""]))
        print(f"  step {r.step:>7}  {r.status:<9} {_metrics_text(r.metrics)}" + (f"  ({why})" if why else ""))
    p = summary.promotion.promoted
    if p:
        print(f"promoted step {p.step} ({p.metric}={format_number(p.value)}) as {p.version}: {p.uri}")
    else:
        print("nothing promoted")
    print(f"  why: {summary.promotion.reason}")
    if summary.late_stop:
        print(f"  {summary.late_stop}")
    registered = config.promotion
    watch = summary.promotion.watch
    if p and watch is not None and watch.state == "rolled-back":  # what serves now is the champion before it
        print(f"rolled back by its watch: {watch.previous} serves again, and @{registered.alias} names it")
        p = None
    if p and p.mlflow_version:
        print(f"  MLflow: models:/{registered.registered_model}@{registered.alias} = version {p.mlflow_version}")
    if p and p.load:
        print(f"  load:  {p.load}")
        if settings.tracking_uri is None:  # the embedded store: MLflow alone would look for ./mlflow.db
            print(f"         with MLFLOW_TRACKING_URI={embedded_store_uri(settings)}   (the embedded store)")
    if p:
        print(f"  lineage: podium lineage {p.version}" + (f" --serving {config.serving}" if config.serving else ""))
    print(f"Prefect UI:  {ui_url(api_url)}/runs/flow-run/{summary.flow_run_id}   (Artifacts tab: checkpoints, "
          "promotion report, chart)")
    mlflow_ui = settings.mlflow_ui(tracking_uri)
    if mlflow_ui:
        print_mlflow_links(summary.tracking, mlflow_ui, registered.registered_model, registered.metric)
    else:
        print(f"MLflow UI:   podium ui   (serves the MLflow UI on {tracking_uri} and prints the links)")
    if p and files_note(p.served_as):  # a checkpoint format podium cannot load: never suggest `mlflow models serve`
        print(f"Serving:     {config.serving}  (model {config.model}; {files_note(p.served_as)})")
    else:
        print(f"Serving:     {config.serving}  (model {config.model}; load with podium.load_promoted_model, or serve "
              f"with: mlflow models serve -m models:/{registered.registered_model}@{registered.alias} --env-manager local)")


def _started_by(origin: dict[str, Any]) -> str:
    if not origin:
        return "not recorded"
    what = origin.get("command") or ""
    if origin.get("flow_run"):
        what = f"flow run {origin['flow_run']} ({origin.get('flow')}" + (
            f", deployment {origin['deployment']})" if origin.get("deployment") else ")")
    who = f"{origin.get('user', '?')}@{origin.get('host', '?')} pid {origin.get('pid', '?')}"
    return f"{what}, {who}" if what else who


def approval_text(approval: dict[str, Any]) -> str:
    """A recorded decision on a candidate (podium.core.approval.Approval as data), with its time."""
    decided = Approval.from_dict(approval)
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(decided.at))
    return f"{decided.describe()} ({when})"


def served_note(serving: str, version: str | None) -> str:
    """'; served as files (name a --model-class ...)' when `version` at `serving` is served as files, else ''."""
    from podium.serving.layout import read_version

    found = read_version(serving, version) if version else None
    note = files_note(found.manifest.get("served_as")) if found else ""
    return f"; {note}" if note else ""


def print_rollback(serving: str, out: Any, alias: str) -> None:
    """What a rollback did: the switch (or none), where the MLflow alias points, and how the version now serving
    is served when it is its files."""
    alias = f"alias {alias} -> " + (f"version {out.mlflow_version}" if out.mlflow_version else "not moved")
    if not out.switched:
        print(f"serving {serving}: {out.to_version} is already current; {alias}{served_note(serving, out.to_version)}")
    else:
        withdrawn = f" ({out.withdrawn} withdrawn)" if out.withdrawn else ""
        print(f"serving {serving}: {out.from_version} -> {out.to_version}{withdrawn}; {alias}"
              f"{served_note(serving, out.to_version)}")


def print_history(serving: str, switches: list[dict[str, Any]], current: str | None, withdrawn: set[str]) -> None:
    """Every switch of a serving location's CURRENT, oldest first: when, what, why, and what started it."""
    if not switches:
        print(f"serving {serving}: nothing has been promoted")
        return
    print(f"serving {serving}: {len(switches)} switch(es), current {current}{served_note(serving, current)}")
    parsed = [parse_switch(s) for s in switches]
    made_current = current_switch(parsed, current)  # one line is current: the switch that put it in place
    for index, (s, switch) in enumerate(zip(switches, parsed)):
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(s.get("switched_at") or 0)))
        version, value = switch.version, s.get("value")
        what = f"run {s.get('run_name')} step {s.get('step')}" + (
            f", {s.get('metric')}={format_number(value)}" if isinstance(value, (int, float)) else "") + (
            f"; withdrew {switch.withdrawn}" if switch.withdrawn else "")
        marks = [m for m, on in (("current", index == made_current), ("withdrawn", version in withdrawn)) if on]
        print(f"  {when}  {switch.action:<8} {version}  {what}" + (f"  [{', '.join(marks)}]" if marks else ""))
        print(f"      why: {s.get('reason') or 'not recorded'}")
        print(f"      by:  {_started_by(dict(switch.origin))}")
        approval = dict(switch.origin.get("approval") or {})
        if approval:  # a shadow's verdict, where no person was asked, is the decision of a shadow
            decided = Approval.from_dict(approval)
            print(f"      {'shadow' if decided.via == VIA_SHADOW else 'approval'}: {approval_text(approval)}")
