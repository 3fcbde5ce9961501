"""One way's raw records turned into the figures of one table row (one repeat of one way)."""

from __future__ import annotations

from typing import Any

from benchmarks.workload import percentile, read_jsonl, uploaded_at

LABELS = {"a": "(a) training only", "d": "(d) podium", "d0": "(d0) podium, cheap validation, warm",
          "d1": "(d1) podium, cheap validation, first run in a fresh home", "b": "(b) inline validation (sync, rank 0)",
          "c": "(c) Ray Train async validation", "a2": "(a') training only, again",
          "f": "(f) training only, the validation looping on the other core (no Ray, no podium): the floor"}


def bare_rows(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Per checkpoint of (a)-(c): uploaded, announced (podium's callback), validation start/end, metrics."""
    events = read_jsonl(spec["log"])
    timings = {r["checkpoint"]: r for r in read_jsonl(spec["timing_log"]) if r["kind"] == "validation"}
    recorded = {r["checkpoint"]: r["t"] for r in events if r["kind"] == "recorded"}
    rows = []
    for e in events:
        if e["kind"] != "persisted" or not e.get("checkpoint_name"):
            continue
        name = e["checkpoint_name"]
        t = timings.get(name, {})
        rows.append({"step": e["step"], "uploaded": uploaded_at(e["checkpoint_uri"]), "announced": e["persisted_at"],
                     "val_start": t.get("start"), "val_end": t.get("end"), "metrics_at": recorded.get(name)})
    return sorted(rows, key=lambda r: r["step"])


def latency_stats(rows: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
    """Latency from the checkpoint being in storage to its metrics being recorded, and the part of it that
    is neither waiting for a free validation slot nor the validation function itself.

    Queue wait: validations taken in order, `concurrency` at a time: checkpoint i cannot start before
    checkpoint i-concurrency's validation ended; the time it waits for that is backlog, not overhead.
    """
    lat, excess, val, wait, announce = [], [], [], [], []
    for i, r in enumerate(rows):
        t0 = r.get("uploaded") or r.get("announced")
        if r.get("announced") and r.get("uploaded"):
            announce.append(r["announced"] - r["uploaded"])
        if t0 is None or r.get("metrics_at") is None:
            continue
        latency = r["metrics_at"] - t0
        q = 0.0
        if i >= concurrency and rows[i - concurrency].get("val_end") is not None:
            q = max(0.0, rows[i - concurrency]["val_end"] - t0)
        v = (r["val_end"] - r["val_start"]) if r.get("val_end") is not None else None
        lat.append(latency)
        wait.append(q)
        if v is not None:
            val.append(v)
            excess.append(latency - q - v)
    return {"n": len(lat), "lat_p50": percentile(lat, 50), "lat_p95": percentile(lat, 95),
            "excess_p50": percentile(excess, 50), "excess_p95": percentile(excess, 95),
            "val_p50": percentile(val, 50), "val_p95": percentile(val, 95),
            "announce_p50": percentile(announce, 50), "wait_max": max(wait) if wait else None,
            "last_wait": wait[-1] if wait else None}


def _last_checkpoint(rows: list[dict[str, Any]]) -> float | None:
    times = [r.get("uploaded") or r.get("announced") for r in rows]
    return max((t for t in times if t), default=None)


def summarize_bare(key: str, out: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """One table row for (a), (b), (c) or (a')."""
    rows = bare_rows(spec)
    loop_done = next((r["t"] for r in read_jsonl(spec["log"]) if r["kind"] == "loop_done"), None)
    last = _last_checkpoint(rows)
    s = {"label": LABELS[key], "checkpoints": len(rows), "train_wall": out["fit_end"] - out["fit_start"],
         "loop_wall": (loop_done - out["fit_start"]) if loop_done else None,
         "process_wall": out["exit"] - out["launch"], "startup": out["fit_start"] - out["launch"],
         "teardown": out["exit"] - out["fit_end"],
         "best_chosen": (out["best_chosen"] - last) if out.get("best_chosen") and last else None,
         "promoted": None, "best_step": out.get("best_step"), "rows": rows}
    s.update(latency_stats(rows, 1))
    if key == "f":  # no metrics are recorded (no latencies); its validations run back to back, counted here
        runs = [r["end"] - r["start"] for r in read_jsonl(spec["timing_log"])
                if r["kind"] == "validation" and r["end"] <= out["fit_end"]]
        s.update({"val_p50": percentile(runs, 50), "val_p95": percentile(runs, 95), "validations": len(runs)})
    return s


def cli_phases(run: dict[str, Any]) -> dict[str, float]:
    """Durations of the start-up phases `podium run --json` reports in its "startup" block (none from a
    podium that does not report them)."""
    block = run["summary"].get("startup") or {}
    return {name: span[1] - span[0] for name, span in (block.get("phases") or {}).items()}


def summarize_podium(key: str, run: dict[str, Any], c: dict[str, Any], concurrency: int) -> dict[str, Any]:
    """One table row for podium, from the servers' records (see benchmarks.podium_run)."""
    rows = [{"step": r["step"], "uploaded": uploaded_at(r["uri"]),
             "announced": r["persisted"] if r["persisted"] is not None else r["recorded"],
             "recorded": r["recorded"], "val_start": r["val_start"], "val_end": r["val_end"],
             "metrics_at": r["validated"]} for r in c["rows"]]
    last = _last_checkpoint(rows)
    last_validated = max((r["metrics_at"] for r in rows if r["metrics_at"]), default=None)
    train, promote, flow = c["train"], c["promote"], c["flow"]
    s = {"label": LABELS[key], "checkpoints": len(rows), "train_wall": train["end"] - train["start"],
         "loop_wall": None, "process_wall": run["process_end"] - run["process_start"],
         "best_chosen": (promote["start"] - last) if promote and last else None,
         "promoted": (promote["end"] - last) if promote and last else None,
         "best_step": (run["summary"].get("promoted") or {}).get("step"), "rows": rows,
         "phases": {"cli_to_flow": flow["start"] - run["process_start"],
                    "flow_to_train": train["start"] - flow["start"],
                    "train": train["end"] - train["start"],
                    "train_to_flow_end": flow["end"] - train["end"],
                    "flow_end_to_exit": run["process_end"] - flow["end"],
                    "connect_ray": (c["connect"]["end"] - c["connect"]["start"]) if c["connect"] else None,
                    "last_validated_to_promote": (promote["start"] - last_validated) if last_validated else None,
                    "promote": promote["end"] - promote["start"],
                    "verify": sum(v["end"] - v["start"] for v in c["verify"]) if c["verify"] else None,
                    "reports": flow["end"] - promote["end"],
                    "exit_after_json": run["process_end"] - run["json_printed"]},
         "cli_phases": cli_phases(run),
         "peak_rss_mb": run["peak_rss_mb"], "server_cpu_s": run["server_cpu_s"], "driver_cpu_s": run["driver_cpu_s"],
         "events_found": c["events_found"], "command": run["command"]}
    s["startup"] = s["phases"]["cli_to_flow"] + s["phases"]["flow_to_train"]
    s["teardown"] = s["phases"]["train_to_flow_end"] + s["phases"]["flow_end_to_exit"]
    s.update(latency_stats(rows, concurrency))
    return s
