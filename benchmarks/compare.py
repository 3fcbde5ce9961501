"""The same training job, four ways: how much does validating every checkpoint cost, and how fast do
its metrics arrive?

    python benchmarks/compare.py            # full run (9-15 min here), writes BENCHMARKS.md
    python benchmarks/compare.py --quick    # smaller job (~6 min), writes BENCHMARKS.md
    python benchmarks/compare.py --smoke    # harness check (< 60 s): a tiny job, way (c) only, writes nothing

 (a) training only: TorchTrainer + podium.training.loop:train_loop_per_worker, no validation
 (b) validation inside the loop: rank 0 validates each checkpoint synchronously after reporting it
 (c) Ray Train's async validation: ValidationConfig(fn=...) + report(..., validation=ValidationTaskConfig)
 (d) podium: `podium run --json` against a local Prefect server it starts and MLflow on SQLite
 (d0) podium again with the validation made cheap (repeat=1): its fixed overhead over (a)
 (a') (a) once more at the end: how much the machine drifted over the run

All train the same job (same data, model, loop, checkpoint cadence) with one Ray Train worker on one
CPU and validate with the same function (benchmarks.workload:validate_repeated) on one CPU. Each runs
in a fresh process with a fresh local Ray.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/compare.py`: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.workload import (
    PRESETS,
    CoreSplit,
    calibrate,
    fmt,
    load_average,
    loop_config,
    machine_description,
    make_data,
    markdown_table,
    percentile,
    podium_config,
    read_jsonl,
    update_markdown_section,
    uploaded_at,
    validate_kwargs,
)

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS_MD = REPO / "BENCHMARKS.md"
LABELS = {"a": "(a) training only", "b": "(b) inline validation (sync, rank 0)",
          "c": "(c) Ray Train async validation", "d": "(d) podium", "d0": "(d0) podium, cheap validation",
          "a2": "(a') training only, again"}
# (a) first and last brackets the run (load drift); podium's runs come right after (a), so the ratios that
# the goals are about compare runs minutes apart, not a quarter of an hour
ORDER = ("a", "d", "d0", "b", "c", "a2")


def log(msg: str) -> None:
    """Progress on stderr."""
    print(f"[compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- running

def variant_spec(key: str, work: Path, workload, train: str, val: str) -> dict[str, Any]:
    """Everything a bare-Ray-Train variant needs (written to JSON for its subprocess)."""
    timing = str(work / f"{key}-timing.jsonl")
    return {"log": str(work / f"{key}-events.jsonl"), "timing_log": timing, "run_name": f"bench-{key}",
            "storage": str(work / "storage"), "loop_config": loop_config(workload, train, val),
            "validate_kwargs": validate_kwargs(workload, val, timing)}


def run_variant_process(key: str, spec: dict[str, Any], work: Path) -> dict[str, Any]:
    """Run one variant in a fresh Python process (fresh Ray); its timestamps plus the process wall time."""
    variant = key[0]
    spec_path, out_path = work / f"{key}-spec.json", work / f"{key}-out.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "benchmarks.variants", "--variant", variant, "--spec", str(spec_path),
           "--out", str(out_path)]
    started = time.time()
    with open(work / f"{key}.log", "w") as logf:
        rc = subprocess.run(cmd, env=env, cwd=str(REPO), stdout=logf, stderr=subprocess.STDOUT).returncode
    ended = time.time()
    if rc != 0:
        tail = (work / f"{key}.log").read_text()[-3000:]
        raise RuntimeError(f"variant {key} failed (exit {rc}); log tail:\n{tail}")
    out = json.loads(out_path.read_text())
    out["launch"], out["exit"] = started, ended
    return out


# ---------------------------------------------------------------- measuring

def bare_rows(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Per checkpoint of (a)-(c): uploaded, announced (podium's callback), validation start/end, metrics."""
    events = read_jsonl(spec["log"])
    timings = {r["checkpoint"]: r for r in read_jsonl(spec["timing_log"])}
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
    return s


def summarize_podium(label: str, run: dict[str, Any], c: dict[str, Any], concurrency: int) -> dict[str, Any]:
    """One table row for podium, from the servers' records (see benchmarks.podium_run)."""
    rows = [{"step": r["step"], "uploaded": uploaded_at(r["uri"]),
             "announced": r["persisted"] if r["persisted"] is not None else r["recorded"],
             "recorded": r["recorded"], "val_start": r["val_start"], "val_end": r["val_end"],
             "metrics_at": r["validated"]} for r in c["rows"]]
    last = _last_checkpoint(rows)
    last_validated = max((r["metrics_at"] for r in rows if r["metrics_at"]), default=None)
    train, promote, flow = c["train"], c["promote"], c["flow"]
    s = {"label": label, "checkpoints": len(rows), "train_wall": train["end"] - train["start"],
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
         "peak_rss_mb": run["peak_rss_mb"], "server_cpu_s": run["server_cpu_s"], "driver_cpu_s": run["driver_cpu_s"],
         "events_found": c["events_found"], "command": run["command"]}
    s["startup"] = s["phases"]["cli_to_flow"] + s["phases"]["flow_to_train"]
    s["teardown"] = s["phases"]["train_to_flow_end"] + s["phases"]["flow_end_to_exit"]
    s.update(latency_stats(rows, concurrency))
    return s


def baseline(summaries: dict[str, dict[str, Any]], key: str) -> float | None:
    """(a)'s value, averaged with (a')'s when both ran (the load drifts over a run of several minutes)."""
    vals = [summaries[k][key] for k in ("a", "a2") if k in summaries and summaries[k].get(key) is not None]
    return sum(vals) / len(vals) if vals else None


# ---------------------------------------------------------------- reporting

def table(summaries: dict[str, dict[str, Any]]) -> str:
    """The main comparison table (markdown)."""
    base = baseline(summaries, "train_wall")
    headers = ["way", "process wall s", "training wall s", "× (a)", "loop done s", "validation fn p50 s",
               "ckpt→metrics p50 / p95 s", "beyond queue + validation p50 / p95 s", "callback delay p50 s",
               "max queue wait s", "last ckpt → best chosen s", "last ckpt → promotion done s"]
    rows = []
    for key in ORDER:
        s = summaries.get(key)
        if not s:
            continue
        validated = s.get("n", 0) > 0
        rows.append([s["label"], fmt(s.get("process_wall")), fmt(s["train_wall"]),
                     fmt(s["train_wall"] / base, 2, "×") if base else "–", fmt(s.get("loop_wall")),
                     fmt(s.get("val_p50"), 2),
                     f"{fmt(s.get('lat_p50'), 2)} / {fmt(s.get('lat_p95'), 2)}" if validated else "–",
                     f"{fmt(s.get('excess_p50'), 2)} / {fmt(s.get('excess_p95'), 2)}" if validated else "–",
                     fmt(s.get("announce_p50"), 2), fmt(s.get("wait_max"), 1) if validated else "–",
                     fmt(s.get("best_chosen"), 1), fmt(s.get("promoted"), 1)])
    return markdown_table(headers, rows)


def fixed_overhead(summaries: dict[str, dict[str, Any]]) -> tuple[float, float] | None:
    """podium's fixed overhead: (d0) − (a) in process wall, and in process wall minus training wall
    (what it costs outside training; insensitive to the load drift that changes training times)."""
    d0 = summaries.get("d0")
    wall, outside = baseline(summaries, "process_wall"), None
    if d0 is None or wall is None:
        return None
    outside_a = [summaries[k]["process_wall"] - summaries[k]["train_wall"] for k in ("a", "a2") if k in summaries]
    outside = (d0["process_wall"] - d0["train_wall"]) - sum(outside_a) / len(outside_a)
    return d0["process_wall"] - wall, outside


def overhead_table(summaries: dict[str, dict[str, Any]]) -> str:
    """Where podium's fixed overhead goes: (a) against podium with cheap validation, phase by phase."""
    a, d0 = summaries["a"], summaries["d0"]
    p = d0["phases"]
    rows = [
        ["start-up: process start → training starts", fmt(a["startup"]), fmt(d0["startup"]),
         f"CLI imports, preflight, MLflow store, server check {fmt(p['cli_to_flow'])} s; flow start → "
         f"train task start {fmt(p['flow_to_train'])} s, of which connect-ray (Ray start) "
         f"{fmt(p['connect_ray'])} s"],
        ["training (TorchTrainer construction + fit)", fmt(a["train_wall"]), fmt(d0["train_wall"]), ""],
        ["after training → process exit", fmt(a["teardown"]), fmt(d0["teardown"]),
         f"last validation, promotion {fmt(p['promote'], 2)} s"
         + (f" (of which re-validating the copy {fmt(p['verify'], 2)} s)" if p.get("verify") else "")
         + f", reports {fmt(p['reports'])} s; flow end → exit {fmt(p['flow_end_to_exit'])} s"],
        ["**process wall**", fmt(a["process_wall"]), fmt(d0["process_wall"]), ""],
    ]
    return markdown_table(["phase", "(a) bare TorchTrainer s", "(d0) podium s", "podium detail"], rows)


def goals(summaries: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Each stated goal, the number measured, met or missed."""
    d = summaries.get("d")
    base = baseline(summaries, "train_wall")
    out = []

    def row(goal: str, value: str, ok: bool | None) -> None:
        out.append([goal, value, "–" if ok is None else ("met" if ok else "**missed**")])

    if base and d:
        r = d["train_wall"] / base
        row("podium training wall ≤ 1.05× (a)", f"{r:.2f}×", r <= 1.05)
    if d and d.get("excess_p95") is not None:
        e = d["excess_p95"]
        row("p95 ckpt→metrics ≤ validation + 1 s, within concurrency",
            f"p95 of (latency − queue wait − validation fn) = {e:.2f} s; raw p95 {d['lat_p95']:.1f} s with "
            f"validation p95 {d['val_p95']:.1f} s", e <= 1.0)
    if d and d.get("promoted") is not None and d.get("val_p50"):
        budget = d["val_p50"] + 3.0
        adj = d["promoted"] - (d.get("last_wait") or 0.0)
        row("last ckpt → promotion ≤ one validation + 3 s",
            f"{d['promoted']:.1f} s, {adj:.1f} s less the last checkpoint's queue wait; budget {budget:.1f} s",
            adj <= budget)
    fo = fixed_overhead(summaries)
    if fo:
        row("fixed overhead ≤ 10 s", f"{fo[1]:.1f} s outside training ((process − training wall), (d0) − (a)); "
            f"{fo[0]:.1f} s in process wall", fo[1] <= 10.0)
    return out


def render(args: argparse.Namespace, workload, machine: dict[str, str], loads: list[str],
           summaries: dict[str, dict[str, Any]], extras: dict[str, Any]) -> str:
    """The BENCHMARKS.md section."""
    cmd = "python benchmarks/compare.py" + (" --quick" if args.quick else "")
    w = workload
    lines = [
        "## Training with per-checkpoint validation, four ways (`benchmarks/compare.py`)", "",
        f"Command: `{cmd}` (from the repository root, venv active). Measured {time.strftime('%Y-%m-%d %H:%M %Z')}, "
        f"{extras.get('seconds', 0) / 60:.0f} min in all.", "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']} RAM, {machine['os']}, "
        f"Python {machine['python']}; {machine['versions']}. No GPU. podium at {machine['revision']}.", "",
        "Load (`uptime`, before and after each way; other jobs on the machine show here):", "",
        *[f"- {x}" for x in loads], "",
        f"Job: MLP (hidden {w.hidden_size}) on {w.train_rows:,} × {w.features} synthetic rows, batch "
        f"{w.batch_size}, {w.epochs} epochs, a checkpoint every epoch. Validation: "
        f"`benchmarks.workload:validate_repeated` evaluates {w.val_rows:,} validation rows "
        f"`repeat = {w.repeat}` times" + (
            f" (calibrated at the start: one epoch ≈ {w.calibration['epoch_s']} s, one validation pass ≈ "
            f"{w.calibration['val_pass_s']} s on one core, so one validation ≈ {w.val_cost_epochs:g} epochs: a "
            "little slower than training, so a backlog builds when validations run one at a time)."
            if w.calibration else "."), "",
        "Cores: one Ray Train worker with 1 CPU (`num_workers=1`, `resources_per_worker={CPU: 1}`) and "
        "validation tasks with `num_cpus=1`, one at a time: Ray Train 2.60 runs one validation at a time "
        "(`MAX_IN_FLIGHT_VALIDATIONS = 1` in `validation_manager.py`), and podium ran with "
        "`validation.concurrency = 1`. "
        + (f"CPU affinity (`benchmarks.workload.CoreSplit`, the same in every way): {extras['cores']}. So the "
           "training worker has a core to itself, and validation shares the other core with the orchestration "
           "(Ray's GCS, raylet and Train controller; in (d) also the `podium run` driver, the Prefect server and "
           "MLflow's SQLite writes). In (b) the validation runs inside the training worker, on its core. "
           if extras.get("cores", "").startswith("Ray Train") else
           "No CPU affinity was set (`--no-pin`): every process takes its CPU from both cores. ")
        + "torch uses 1 thread in every process. Ray Train's controller polls every 0.25 s in all "
        "ways (podium's `RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`).", "",
        table(summaries), "",
        "Definitions. *training wall*: TorchTrainer construction + `fit()` for (a)–(c) (in (c) `fit()` returns "
        "only after Ray Train has run every queued validation; *loop done* is when the train loop itself "
        "finished); podium's `train-model` task run (Prefect start → end), which does not wait for validation. "
        "*× (a)*: against the mean of (a) and (a'). *ckpt→metrics*: from the checkpoint being complete in "
        "storage (newest file mtime in its folder) to its validation metrics being recorded: (b) rank 0 has them, "
        "(c) Ray Train's checkpoint manager merged them (`benchmarks/instrument.py`), (d) MLflow tag "
        "`podium.validated_at`. *callback delay*: from the upload to podium's Ray Train callback "
        "(`CheckpointEvent.persisted_at`, the same `CheckpointAnnouncer` is installed in (a)–(c)). "
        "*beyond queue + validation*: latency minus the time the checkpoint waited for the previous validation "
        "to finish minus the validation function's own run time, i.e. what the orchestration adds. "
        "*best chosen*: (b)/(c) the driver has picked the best checkpoint after `fit()` returned; podium: the "
        "`promote-best-checkpoint` task starts. *promotion done*: that task ends (copy + sha256 check, "
        "loading the copy (`promotion.verify = \"load\"`), CURRENT pointer, MLflow registry version and alias).", "",
    ]
    d = summaries.get("d")
    if "a" in summaries and "d0" in summaries:
        fo = fixed_overhead(summaries)
        lines += ["Fixed overhead of podium over a bare TorchTrainer run: the same job with the validation made "
                  "cheap (`repeat = 1`), warm Prefect server, MLflow store already created by (d). "
                  f"Outside training podium spends {fo[1]:.1f} s more than (a); in process wall the "
                  f"difference is {fo[0]:.1f} s (training times drift with the load).", "",
                  overhead_table(summaries), ""]
    if d:
        lines += [f"podium (d): driver (`podium run` process) peak RSS {d['peak_rss_mb']:.0f} MB and "
                  f"{fmt(d['driver_cpu_s'])} CPU-s; the Prefect "
                  f"server used {fmt(d['server_cpu_s'])} CPU-s during the {fmt(d['process_wall'])} s run; "
                  f"`podium server start` (cold, not counted above) took {fmt(extras.get('server_start_s'))} s; "
                  f"the first run in a fresh home also creates the MLflow SQLite schema (CLI start → flow start "
                  f"{fmt(d['phases']['cli_to_flow'])} s in (d) against "
                  f"{fmt(summaries['d0']['phases']['cli_to_flow']) if 'd0' in summaries else '–'} s in (d0)). "
                  "Command: `PODIUM_HOME=$WORK/podium-home " +
                  d["command"].replace(str(extras.get("work", "")), "$WORK") + "`.", ""]
    g = goals(summaries)
    if g:
        lines += ["Goals (stock podium, (d) and (d0)):", "", markdown_table(["goal", "measured", ""], g), ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    """Run the comparison; print the table; write BENCHMARKS.md unless --smoke."""
    p = argparse.ArgumentParser(description="podium vs bare Ray Train: training time and validation latency.")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller job (5 epochs of 60k rows)")
    size.add_argument("--smoke", action="store_true",
                      help="harness check in < 60 s: tiny job, only (c) unless --variants, writes no file")
    p.add_argument("--variants", help="which ways to run, e.g. a,c,d (default: a,b,c,d,d0,a2; with --smoke: c)")
    p.add_argument("--workdir", help="keep data, storage and logs here (default: a temporary folder, removed)")
    p.add_argument("--output", default=str(BENCHMARKS_MD), help="markdown file to update (default: BENCHMARKS.md)")
    p.add_argument("--write", action="store_true", help="with --smoke: write the section to --output anyway")
    p.add_argument("--no-pin", action="store_true",
                   help="do not give the training worker a core of its own (see workload.CoreSplit)")
    args = p.parse_args(argv)
    preset = "smoke" if args.smoke else "quick" if args.quick else "full"
    # --smoke runs only (c): it exercises the most of the harness (the loop wrapper, the validation
    # function, Ray Train's validation API, the instrumentation, podium's callback, the statistics), and
    # each TorchTrainer run costs ~20-30 s of start-up here, so more than one would not fit in a minute.
    default = "c" if args.smoke else ",".join(ORDER)
    wanted = [v.strip() for v in (args.variants or default).split(",") if v.strip()]
    unknown = sorted(set(wanted) - set(LABELS))
    if unknown:
        p.error(f"--variants: unknown {unknown}; expected some of {sorted(LABELS)}")
    tmp = None if args.workdir else tempfile.TemporaryDirectory(prefix="podium-bench-")
    work = Path(args.workdir or tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    try:
        workload = PRESETS[preset]
        train, val = make_data(workload, str(work / "data"))
        calibrate(workload, train, val)
        log(f"workload {preset}: repeat={workload.repeat} {workload.calibration}; ways {wanted}")
        loads = [f"before: {load_average()}"]
        summaries: dict[str, dict[str, Any]] = {}
        extras: dict[str, Any] = {"work": str(work)}
        home = str(work / "podium-home")
        api = None
        pinning = CoreSplit(enabled=not args.no_pin)
        extras["cores"] = pinning.describe()
        try:
            for key in [k for k in ORDER if k in wanted]:
                log(f"running {LABELS[key]}")
                if key in ("d", "d0"):
                    from benchmarks import podium_run as pr

                    timing = str(work / f"{key}-timing.jsonl")
                    cfg = podium_config(workload, run_name=f"bench-{key}", train=train, val=val,
                                        storage=str(work / "storage"), serving=str(work / f"serving-{key}"),
                                        timing_log=timing, concurrency=1, repeat=1 if key == "d0" else None)
                    with pinning:
                        if api is None:  # the server inherits the non-training cores too
                            api, extras["server_start_s"] = pr.start_server(home)
                        run = pr.run_podium(home, cfg, str(work))
                    c = pr.collect(run, api, timing)
                    summaries[key] = summarize_podium(LABELS[key], run, c, 1)
                else:
                    spec = variant_spec(key, work, workload, train, val)
                    with pinning:
                        out = run_variant_process(key, spec, work)
                    summaries[key] = summarize_bare(key, out, spec)
                if pinning.enabled:
                    log(f"{key}: train worker processes pinned {pinning.pinned} (pid: s after start)")
                    if not pinning.pinned:
                        log(f"{key}: WARNING no Ray Train worker was seen: training was not pinned")
                    extras.setdefault("pinned", {})[key] = len(pinning.pinned)
                    pinning.pinned.clear()
                loads.append(f"after {key}: {load_average()}")
        finally:
            if api is not None:
                from benchmarks import podium_run as pr

                pr.stop_server(home)
        extras["seconds"] = time.time() - t0
        print(table(summaries))
        for g in goals(summaries):
            print(f"  {g[0]}: {g[1]} [{g[2].strip('*')}]")
        if args.smoke:
            incomplete = [k for k, s in summaries.items() if s["checkpoints"] < workload.epochs
                          or (k not in ("a", "a2") and s.get("n", 0) < workload.epochs)]
            if incomplete:
                log(f"smoke: incomplete results for {incomplete}")
                return 1
        if not args.smoke or args.write:
            text = render(args, workload, machine_description(), loads, summaries, extras)
            update_markdown_section(args.output, "compare", text)
            (work / "summaries.json").write_text(json.dumps(summaries, indent=1, default=str))
            log(f"wrote {args.output}")
        log(f"done in {time.time() - t0:.0f} s (command: {' '.join(map(shlex.quote, sys.argv))})")
        return 0
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
