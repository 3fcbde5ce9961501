"""podium with hundreds of checkpoints: does the per-checkpoint cost grow as the run accumulates records?

    python benchmarks/scale.py            # >= 300 checkpoints (a checkpoint every step), writes BENCHMARKS.md
    python benchmarks/scale.py --quick    # 52 checkpoints
    python benchmarks/scale.py --check    # exit 1 unless podium's own CPU per checkpoint stays flat

One real `podium run` (local Prefect server, MLflow on SQLite) of a tiny model with
`checkpoint_every_steps = 1` and a cheap validation, then, first 50 checkpoints against last 50:
  persisted → recorded    podium's Ray Train callback → the checkpoint's MLflow record exists
                          (the flow's loop: Prefect event, record-checkpoint task, its MLflow search + writes)
  validation overhead     the validate-step task run (Prefect start → end) minus the validation function's
                          own time (Ray task dispatch + MLflow merge)
  persisted → validated   end to end, including waiting behind earlier checkpoints (backlog)
podium's own CPU-seconds per checkpoint (its process with MLflow on SQLite, and its Prefect server, sampled
from /proc every 0.25 s), checkpoints 10-60 against the last 50; and, on the finished store: how many MLflow
API calls and SQL statements choosing the best checkpoint takes (`tasks.tracking.list_records`, what promotion
calls), how long, and the driver's peak RSS.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.workload import (
    Workload,
    fmt,
    machine_description,
    make_data,
    markdown_table,
    percentile,
    podium_config,
    update_markdown_section,
)

REPO = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    """Progress on stderr."""
    print(f"[scale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def workload(checkpoints: int) -> Workload:
    """A tiny job with one checkpoint per step: 52 steps per epoch (1,664 rows, batch 32)."""
    steps_per_epoch = 52
    epochs = max(1, -(-checkpoints // steps_per_epoch))
    return Workload("scale", train_rows=steps_per_epoch * 32, val_rows=256, epochs=epochs, hidden_size=16,
                    batch_size=32, checkpoint_every_steps=1, repeat=1)


def count_selection_queries(tracking_uri: str, experiment_id: str, run_id: str, run_name: str) -> dict[str, Any]:
    """MLflow API calls and SQL statements of list_records + select_best on the finished store, and time."""
    import sqlalchemy
    from mlflow.tracking import MlflowClient

    from podium.core.promotion import select_best
    from podium.tracking.client import TrackingRun
    from podium.tracking.records import list_records

    calls = {"api": 0, "sql": 0}
    original = MlflowClient.search_logged_models

    def counted(self, *a, **k):
        calls["api"] += 1
        return original(self, *a, **k)

    def on_sql(*_a, **_k):
        calls["sql"] += 1

    tr = TrackingRun(tracking_uri, experiment_id, run_id, run_name)
    list_records(tr)  # warm: engine created, migrations checked (podium's worker has this warm too)
    MlflowClient.search_logged_models = counted
    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "before_cursor_execute", on_sql)
    try:
        t = time.perf_counter()
        records = list_records(tr)
        best, _ = select_best(records, "val_loss", "min")
        seconds = time.perf_counter() - t
    finally:
        sqlalchemy.event.remove(sqlalchemy.engine.Engine, "before_cursor_execute", on_sql)
        MlflowClient.search_logged_models = original
    return {"records": len(records), "api_calls": calls["api"], "sql_statements": calls["sql"],
            "seconds": seconds, "best_step": best.step if best else None}


def window(rows: list[dict[str, Any]], key) -> dict[str, float | None]:
    """p50/p95 of key(row) over the rows."""
    vals = [v for v in (key(r) for r in rows) if v is not None]
    return {"p50": percentile(vals, 50), "p95": percentile(vals, 95), "n": len(vals)}


FLAT = 1.25  # podium's own CPU per checkpoint, the last 50 against checkpoints 10-60: at most this ratio


def own_cpu_per_checkpoint(run: dict[str, Any], rows: list[dict[str, Any]], first: int, last: int) -> float | None:
    """podium's own CPU-seconds per checkpoint (its process, MLflow on SQLite included, and its Prefect server)
    from checkpoint `first` persisted to checkpoint `last` persisted, in the samples run_podium kept."""
    from benchmarks.podium_run import cpu_between

    t0, t1 = rows[first]["persisted"], rows[last]["persisted"]
    if not t0 or not t1 or last <= first:
        return None
    parts = [cpu_between(run[k], t0, t1) for k in ("driver_cpu_samples", "server_cpu_samples")]
    return sum(parts) / (last - first) if None not in parts else None  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    """Run, measure, print, write BENCHMARKS.md."""
    p = argparse.ArgumentParser(description="podium with hundreds of checkpoints.")
    p.add_argument("--quick", action="store_true", help="52 checkpoints instead of 312")
    p.add_argument("--checkpoints", type=int, help="target number of checkpoints")
    p.add_argument("--concurrency", type=int, default=1, help="validation concurrency (default 1)")
    p.add_argument("--workdir", help="keep everything here (default: a temporary folder)")
    p.add_argument("--output", default=str(REPO / "BENCHMARKS.md"), help="markdown file to update ('' for none)")
    p.add_argument("--check", action="store_true", help=f"exit 1 unless podium's own CPU per checkpoint stays flat "
                   f"(the last 50 at most {FLAT}x checkpoints 10-60)")
    args = p.parse_args(argv)
    target = args.checkpoints or (52 if args.quick else 312)
    w = workload(target)
    tmp = None if args.workdir else tempfile.TemporaryDirectory(prefix="podium-scale-")
    work = Path(args.workdir or tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    from benchmarks import podium_run as pr

    loads = [os.getloadavg()[0]]  # the 1-minute load average, before and after the run
    try:
        train, val = make_data(w, str(work / "data"))
        home = str(work / "podium-home")
        api, server_s = pr.start_server(home)
        try:
            timing = str(work / "timing.jsonl")
            cfg = podium_config(w, run_name="bench-scale", train=train, val=val, storage=str(work / "storage"),
                                serving=str(work / "serving"), timing_log=timing, concurrency=args.concurrency)
            log(f"podium run: {w.epochs} epochs × 52 steps, a checkpoint every step")
            run = pr.run_podium(home, cfg, str(work))
            loads.append(os.getloadavg()[0])
            c = pr.collect(run, api, timing)
        finally:
            pr.stop_server(home)
        s = run["summary"]
        from mlflow.tracking import MlflowClient

        exp_id = MlflowClient(tracking_uri=s["tracking_uri"]).get_run(s["mlflow_run_id"]).info.experiment_id
        q = count_selection_queries(s["tracking_uri"], exp_id, s["mlflow_run_id"], s["run_name"])
        rows = c["rows"]
        vtasks = {int(t["name"].rsplit("-", 1)[1]): t for t in c["tasks"] if t["name"].startswith("validate-step-")}
        for r in rows:
            t = vtasks.get(r["step"])
            r["task"] = (t["end"] - t["start"]) if t and t.get("end") and t.get("start") else None
        first, last = rows[:50], rows[-50:]
        metrics = {
            "persisted → recorded": lambda r: (r["recorded"] - r["persisted"]) if r["persisted"] else None,
            "validation overhead (task − function)": lambda r: (r["task"] - (r["val_end"] - r["val_start"]))
            if r["task"] is not None and r["val_end"] else None,
            "validation function": lambda r: (r["val_end"] - r["val_start"]) if r["val_end"] else None,
            "persisted → validated (incl. backlog)": lambda r: (r["validated"] - r["persisted"])
            if r["validated"] and r["persisted"] else None,
        }
        table_rows = []
        for name, fn in metrics.items():
            a, b = window(first, fn), window(last, fn)
            table_rows.append([name, f"{fmt(a['p50'], 3)} / {fmt(a['p95'], 3)}", f"{fmt(b['p50'], 3)} / "
                               f"{fmt(b['p95'], 3)}"])
        early = own_cpu_per_checkpoint(run, rows, 10, min(60, len(rows) - 1))
        late = own_cpu_per_checkpoint(run, rows, max(len(rows) - 51, 0), len(rows) - 1)
        table_rows.append(["podium's own CPU-s (its process + Prefect server), checkpoints 10–60 / last 50",
                           fmt(early, 3), fmt(late, 3)])
        flat = early is not None and late is not None and late <= FLAT * early
        verdict = (f"podium's own CPU per checkpoint, the last 50 ≤ {FLAT}× checkpoints 10–60: "
                   + (f"{late / early:.2f}× [{'met' if flat else 'missed'}]" if early and late is not None
                      else "not measured"))
        log(verdict)
        train_task, flow = c["train"], c["flow"]
        m = machine_description()
        cmd = "python benchmarks/scale.py" + (" --quick" if args.quick else "") + \
              (f" --checkpoints {args.checkpoints}" if args.checkpoints else "")
        validated = sum(r["status"] == "validated" for r in rows)
        text = "\n".join([
            "## Hundreds of checkpoints (`benchmarks/scale.py`)", "",
            f"Command: `{cmd}`. Measured {time.strftime('%Y-%m-%d %H:%M %Z')} on {m['cpu']}, {m['cores']} cores "
            f"(1-minute load average {loads[0]:.2f} before the run, {loads[-1]:.2f} after); {m['versions']}; "
            f"podium at {m['revision']}. "
            f"One `podium run` of an MLP (hidden {w.hidden_size}) on {w.train_rows:,} rows, batch {w.batch_size}, "
            f"{w.epochs} epochs, `checkpoint_every_steps = 1`: **{len(rows)} checkpoints** ({validated} validated), "
            f"validation `repeat = 1` on {w.val_rows} rows, concurrency {args.concurrency}, one training "
            f"worker. Process wall {fmt(run['process_end'] - run['process_start'])} s, training task "
            f"{fmt(train_task['end'] - train_task['start'])} s, flow {fmt(flow['end'] - flow['start'])} s, "
            f"Prefect server start {fmt(server_s)} s (not counted).", "",
            markdown_table(["per checkpoint, seconds (p50 / p95)", "first 50", "last 50"], table_rows), "",
            f"Best-checkpoint selection on the finished store ({q['records']} records; "
            "`list_records` + `select_best`, as promotion runs them): "
            f"**{q['api_calls']} MLflow API call(s), {q['sql_statements']} SQL statements, "
            f"{q['seconds'] * 1000:.0f} ms**. "
            f"Driver (`podium run` process) peak RSS: **{run['peak_rss_mb']:.0f} MB**, "
            f"{fmt(run['driver_cpu_s'])} CPU-s. Prefect server CPU "
            f"during the run: {fmt(run['server_cpu_s'])} s. Last checkpoint → promotion done: "
            f"{fmt((c['promote']['end'] - max(r['persisted'] for r in rows if r['persisted'])) if c['promote'] else None)} s. "
            f"Goal: {verdict}.", "",
        ])
        print(text)
        if args.output:
            update_markdown_section(args.output, "scale", text)
        return 0 if flat or not args.check else 1
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
