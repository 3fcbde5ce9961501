"""What `podium run`, `promote`, `status` and `history` print: a human summary, or one JSON object."""

from __future__ import annotations

import time
from typing import Any

from podium.services import ui_url
from podium.serving.history import parse_switch


def summary_json(summary: Any, serving: str) -> dict[str, Any]:
    """The outcome of a run as the JSON object `--json` prints."""
    promoted = summary.promotion.promoted
    return {
        "run_name": summary.run_name,
        "mlflow_run_id": summary.tracking.run_id,
        "tracking_uri": summary.tracking.tracking_uri,
        "checkpoints": [{"step": r.step, "uri": r.uri, "status": r.status, "metrics": r.metrics,
                         "validated_at": r.validated_at, **({"failure": r.failure} if r.failure else {}),
                         **({"note": r.note} if r.note else {})}
                        for r in summary.checkpoints],
        "training_ended_at": summary.training_ended_at,
        "promoted": ({"version": promoted.version, "uri": promoted.uri, "step": promoted.step,
                      "metric": promoted.metric, "value": promoted.value,
                      "mlflow_version": promoted.mlflow_version} if promoted else None),
        "promotion_reason": summary.promotion.reason,
        "serving": serving,
    }


def print_summary(summary: Any, config: Any, settings: Any, tracking_uri: str, api_url: str, elapsed: float) -> None:
    """The outcome of a run in words, with links to where to look."""
    print()
    print(f"run {summary.run_name}: {len(summary.checkpoints)} checkpoints in {elapsed:.1f} s")
    for r in summary.checkpoints:
        m = " ".join(f"{k}={v:.4g}" for k, v in sorted(r.metrics.items()) if k not in ("step", "epoch"))
        why = r.failure or r.note
        print(f"  step {r.step:>7}  {r.status:<9} {m}" + (f"  ({why})" if why else ""))
    p = summary.promotion.promoted
    if p:
        print(f"promoted step {p.step} ({p.metric}={p.value:.4g}) as {p.version}: {p.uri}")
    else:
        print("nothing promoted")
    print(f"  why: {summary.promotion.reason}")
    print(f"Prefect UI:  {ui_url(api_url)}/runs/flow-run/{summary.flow_run_id}   (Artifacts tab: checkpoints, "
          "promotion report, chart)")
    print(f"MLflow UI:   mlflow ui --backend-store-uri {tracking_uri}   then")
    print(f"             {summary.tracking.run_url(settings.mlflow_ui_url)}   (the run)")
    print(f"             {summary.tracking.models_url(settings.mlflow_ui_url)}   (checkpoints side by side)")
    print(f"Serving:     {config.serving}  ({serving_hint(config.serving)})")


def _started_by(origin: dict[str, Any]) -> str:
    if not origin:
        return "not recorded"
    what = origin.get("command") or ""
    if origin.get("flow_run"):
        what = f"flow run {origin['flow_run']} ({origin.get('flow')}" + (
            f", deployment {origin['deployment']})" if origin.get("deployment") else ")")
    who = f"{origin.get('user', '?')}@{origin.get('host', '?')} pid {origin.get('pid', '?')}"
    return f"{what}, {who}" if what else who


def print_history(serving: str, switches: list[dict[str, Any]], current: str | None, withdrawn: set[str]) -> None:
    """Every switch of a serving location's CURRENT, oldest first: when, what, why, and what started it."""
    if not switches:
        print(f"serving {serving}: nothing has been promoted")
        return
    print(f"serving {serving}: {len(switches)} switch(es), current {current}")
    for s in switches:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(s.get("switched_at") or 0)))
        switch = parse_switch(s)
        version, value = switch.version, s.get("value")
        what = f"run {s.get('run_name')} step {s.get('step')}" + (
            f", {s.get('metric')}={value:.6g}" if isinstance(value, (int, float)) else "") + (
            f"; withdrew {switch.withdrawn}" if switch.withdrawn else "")
        marks = [m for m, on in (("current", version == current), ("withdrawn", version in withdrawn)) if on]
        print(f"  {when}  {switch.action:<8} {version}  {what}" + (f"  [{', '.join(marks)}]" if marks else ""))
        print(f"      why: {s.get('reason') or 'not recorded'}")
        print(f"      by:  {_started_by(dict(switch.origin))}")


def serving_hint(serving: str) -> str:
    """How to load what the serving location holds: podium's loader for podium's checkpoint format,
    else the function that fetches the checkpoint for your own loader."""
    from podium.serving.layout import read_current
    from podium.training.checkpoint import META_FILE

    current = read_current(serving)
    if current is None or META_FILE in current.manifest.get("files", {}):
        return "load with podium.load_promoted_model"
    return ("not podium's checkpoint format: podium.serving.load.fetch_version(podium.serving.layout."
            f"read_current({serving!r}), local_dir) downloads and checks it; load it as your loop saved it")
