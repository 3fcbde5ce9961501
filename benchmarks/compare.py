"""The same training job, four ways: how much does validating every checkpoint cost, and how fast do
its metrics arrive?

    python benchmarks/compare.py            # full run (~10 min here), writes BENCHMARKS.md
    python benchmarks/compare.py --quick    # smaller job (~5 min), writes BENCHMARKS.md
    python benchmarks/compare.py --smoke    # harness check (< 60 s): a tiny job, way (c) only, writes nothing

 (a) training only: TorchTrainer + training.loop:train_loop_per_worker, no validation
 (b) validation inside the loop: rank 0 validates each checkpoint synchronously after reporting it
 (c) Ray Train's async validation: ValidationConfig(fn=...) + report(..., validation=ValidationTaskConfig)
 (d) podium: `podium run --json` against a local Prefect server it starts and MLflow on SQLite
 (d0) podium again with the validation made cheap (repeat=1): its fixed overhead over (a)

All four train the same job (same data, model, loop, checkpoint cadence) with one Ray Train worker
on one CPU and validate with the same function (benchmarks.workload:validate_repeated) on one CPU.
(a), (b), (c) and (d) each run in a fresh process with a fresh local Ray.
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

from benchmarks.workload import (  # noqa: E402
    PRESETS,
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
    validate_kwargs,
)

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS_MD = REPO / "BENCHMARKS.md"
LABELS = {"a": "(a) training only", "b": "(b) inline validation (sync, rank 0)",
          "c": "(c) Ray Train async validation", "d": "(d) podium", "d0": "(d0) podium, cheap validation"}


def log(msg: str) -> None:
    """Progress on stderr."""
    print(f"[compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- running

def variant_spec(variant: str, work: Path, workload, train: str, val: str) -> dict[str, Any]:
    """Everything a bare-Ray-Train variant needs (written to JSON for its subprocess)."""
    timing = str(work / f"{variant}-timing.jsonl")
    return {"log": str(work / f"{variant}-events.jsonl"), "timing_log": timing, "run_name": f"bench-{variant}",
            "storage": str(work / "storage"), "loop_config": loop_config(workload, train, val),
            "validate_kwargs": validate_kwargs(workload, val, timing)}


def run_variant_process(variant: str, spec: dict[str, Any], work: Path) -> dict[str, Any]:
    """Run one variant in a fresh Python process (fresh Ray); its timestamps plus the process wall time."""
    spec_path, out_path = work / f"{variant}-spec.json", work / f"{variant}-out.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "benchmarks.variants", "--variant", variant, "--spec", str(spec_path),
           "--out", str(out_path)]
    started = time.time()
    with open(work / f"{variant}.log", "w") as logf:
        rc = subprocess.run(cmd, env=env, cwd=str(REPO), stdout=logf, stderr=subprocess.STDOUT).returncode
    ended = time.time()
    if rc != 0:
        raise RuntimeError(f"variant {variant} failed (exit {rc}); see {work / f'{variant}.log'}")
    out = json.loads(out_path.read_text())
    out["launch"], out["exit"] = started, ended
    return out


# ---------------------------------------------------------------- measuring

def bare_rows(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Per checkpoint: persisted (podium's callback), validation start/end, metrics recorded."""
    events = read_jsonl(spec["log"])
    timings = {r["checkpoint"]: r for r in read_jsonl(spec["timing_log"])}
    recorded = {r["checkpoint"]: r["t"] for r in events if r["kind"] == "recorded"}
    rows = []
    for e in events:
        if e["kind"] != "persisted" or not e.get("checkpoint_name"):
            continue
        name = e["checkpoint_name"]
        t = timings.get(name, {})
        rows.append({"step": e["step"], "persisted": e["persisted_at"], "val_start": t.get("start"),
                     "val_end": t.get("end"), "metrics_at": recorded.get(name)})
    return sorted(rows, key=lambda r: r["step"])


def latency_stats(rows: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
    """Latency from persisted to metrics recorded, and the part of it that is neither queueing nor validating.

    queue wait: with `concurrency` validations at a time taken in order, checkpoint i cannot start
    before checkpoint i-concurrency's validation ended; the time it waits for that is backlog, not overhead.
    """
    lat, excess, val, wait = [], [], [], []
    for i, r in enumerate(rows):
        if r.get("persisted") is None or r.get("metrics_at") is None:
            continue
        latency = r["metrics_at"] - r["persisted"]
        q = 0.0
        if i >= concurrency and rows[i - concurrency].get("val_end") is not None:
            q = max(0.0, rows[i - concurrency]["val_end"] - r["persisted"])
        v = (r["val_end"] - r["val_start"]) if r.get("val_end") is not None else None
        lat.append(latency)
        wait.append(q)
        if v is not None:
            val.append(v)
            excess.append(latency - q - v)
    return {"n": len(lat), "lat_p50": percentile(lat, 50), "lat_p95": percentile(lat, 95),
            "lat_max": max(lat) if lat else None,
            "excess_p50": percentile(excess, 50), "excess_p95": percentile(excess, 95),
            "val_p50": percentile(val, 50), "val_p95": percentile(val, 95),
            "wait_p50": percentile(wait, 50), "wait_max": max(wait) if wait else None,
            "last_wait": wait[-1] if wait else None}


def summarize_bare(variant: str, out: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """One table row for (a), (b) or (c)."""
    rows = bare_rows(spec)
    loop_done = next((r["t"] for r in read_jsonl(spec["log"]) if r["kind"] == "loop_done"), None)
    last = max((r["persisted"] for r in rows), default=None)
    s = {"label": LABELS[variant], "checkpoints": len(rows), "train_wall": out["fit_end"] - out["fit_start"],
         "loop_wall": (loop_done - out["fit_start"]) if loop_done else None,
         "process_wall": (out["exit"] - out["launch"]) if "launch" in out else None,
         "startup": out["fit_start"] - out.get("launch", out["process_start"]),
         "teardown": (out["exit"] - out["fit_end"]) if "exit" in out else None,
         "best_chosen": (out["best_chosen"] - last) if out.get("best_chosen") and last else None,
         "promoted": None, "best_step": out.get("best_step"), "rows": rows}
    if variant != "a":
        s.update(latency_stats(rows, 1))
    return s


def summarize_podium(label: str, run: dict[str, Any], c: dict[str, Any], concurrency: int) -> dict[str, Any]:
    """One table row for podium, from the servers' records (see benchmarks.podium_run)."""
    rows = [{"step": r["step"], "persisted": r["persisted"] if r["persisted"] is not None else r["recorded"],
             "recorded": r["recorded"], "val_start": r["val_start"], "val_end": r["val_end"],
             "metrics_at": r["validated"]} for r in c["rows"]]
    last = max((r["persisted"] for r in rows if r["persisted"]), default=None)
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
                    "reports": flow["end"] - promote["end"]},
         "peak_rss_mb": run["peak_rss_mb"], "server_cpu_s": run["server_cpu_s"],
         "events_found": c["events_found"], "command": run["command"]}
    s.update(latency_stats(rows, concurrency))
    return s


# ---------------------------------------------------------------- reporting

def table(summaries: dict[str, dict[str, Any]]) -> str:
    """The main comparison table (markdown)."""
    base = summaries.get("a", {}).get("train_wall")
    headers = ["way", "process wall s", "training wall s", "× (a)", "ckpts", "validation fn p50 s",
               "ckpt→metrics p50 / p95 s", "beyond queue+validation p50 / p95 s", "max queue wait s",
               "last ckpt → best chosen s", "last ckpt → promotion done s"]
    rows = []
    for key in ("a", "b", "c", "d", "d0"):
        s = summaries.get(key)
        if not s:
            continue
        ratio = (s["train_wall"] / base) if base else None
        rows.append([s["label"], fmt(s.get("process_wall")), fmt(s["train_wall"]), fmt(ratio, 2, "×"),
                     str(s["checkpoints"]), fmt(s.get("val_p50"), 2),
                     f"{fmt(s.get('lat_p50'), 2)} / {fmt(s.get('lat_p95'), 2)}" if key != "a" else "–",
                     f"{fmt(s.get('excess_p50'), 2)} / {fmt(s.get('excess_p95'), 2)}" if key != "a" else "–",
                     fmt(s.get("wait_max"), 1) if key != "a" else "–",
                     fmt(s.get("best_chosen"), 1), fmt(s.get("promoted"), 1)])
    return markdown_table(headers, rows)


def overhead_table(a: dict[str, Any], d0: dict[str, Any]) -> str:
    """Where podium's fixed overhead goes: (a) against podium with cheap validation, phase by phase."""
    p = d0["phases"]
    rows = [
        ["start-up: process start → training starts", fmt(a["startup"]),
         fmt(p["cli_to_flow"] + p["flow_to_train"]),
         f"CLI imports + preflight + MLflow store + server check {fmt(p['cli_to_flow'])} s; flow: plan, "
         f"connect-ray {fmt(p['connect_ray'])} s, open MLflow run: {fmt(p['flow_to_train'])} s"],
        ["training (TorchTrainer construct + fit)", fmt(a["train_wall"]), fmt(p["train"]), ""],
        ["after training → process exit", fmt(a["teardown"]), fmt(p["train_to_flow_end"] + p["flow_end_to_exit"]),
         f"last validations, promotion {fmt(p['promote'])} s (verify {fmt(p['verify'], 2)} s), reports "
         f"{fmt(p['reports'])} s, exit {fmt(p['flow_end_to_exit'])} s"],
        ["**total (process wall)**", fmt(a["process_wall"]), fmt(d0["process_wall"]),
         f"**overhead {fmt(d0['process_wall'] - a['process_wall'])} s**"],
    ]
    return markdown_table(["phase", "(a) bare TorchTrainer s", "(d0) podium s", "podium detail"], rows)


def goals(summaries: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Each stated goal, the number measured, met or missed."""
    a, d, d0 = summaries.get("a"), summaries.get("d"), summaries.get("d0")
    out = []

    def row(goal: str, value: str, ok: bool | None) -> None:
        out.append([goal, value, "–" if ok is None else ("met" if ok else "**missed**")])

    if a and d:
        r = d["train_wall"] / a["train_wall"]
        row("podium training wall ≤ 1.05× (a)", f"{r:.2f}×", r <= 1.05)
        e = d.get("excess_p95")
        row("p95 ckpt→metrics ≤ validation + 1 s (within concurrency)",
            f"p95 beyond queue+validation {fmt(e, 2)} s", e is not None and e <= 1.0)
        if d.get("promoted") is not None and d.get("val_p50"):
            budget = d["val_p50"] + 3.0
            adj = d["promoted"] - (d.get("last_wait") or 0.0)
            row("last ckpt → promotion ≤ one validation + 3 s",
                f"{d['promoted']:.1f} s raw, {adj:.1f} s without backlog wait; budget {budget:.1f} s",
                adj <= budget)
    if a and d0:
        o = d0["process_wall"] - a["process_wall"]
        row("fixed overhead ≤ 10 s", f"{o:.1f} s (process wall (d0) − (a))", o <= 10.0)
    return out


def render(args: argparse.Namespace, workload, machine: dict[str, str], loads: list[str],
           summaries: dict[str, dict[str, Any]], extras: dict[str, Any]) -> str:
    """The BENCHMARKS.md section."""
    cmd = "python benchmarks/compare.py" + (" --quick" if args.quick else "")
    w = workload
    lines = [
        "## Training with per-checkpoint validation, four ways (`benchmarks/compare.py`)", "",
        f"Command: `{cmd}` (from the repository root, venv active). Measured {time.strftime('%Y-%m-%d %H:%M %Z')}.",
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']} RAM, {machine['os']}, "
        f"Python {machine['python']}; {machine['versions']}. No GPU.", "",
        "Load (`uptime`, the machine was shared with other jobs):", "",
        *[f"- {x}" for x in loads], "",
        f"Job: MLP (hidden {w.hidden_size}) on {w.train_rows:,} × {w.features} synthetic rows, batch "
        f"{w.batch_size}, {w.epochs} epochs, a checkpoint every epoch. Validation: "
        f"`benchmarks.workload:validate_repeated` evaluates {w.val_rows:,} validation rows "
        f"`repeat = {w.repeat}` times (calibrated here: one epoch ≈ {w.calibration.get('epoch_s', '?')} s, "
        f"one validation pass ≈ {w.calibration.get('val_pass_s', '?')} s, so one validation ≈ "
        f"{w.val_cost_epochs:g} epochs: validation is a little slower than training and a backlog builds "
        "when validations run one at a time).", "",
        "Cores: one Ray Train worker with 1 CPU (`num_workers=1`, `resources_per_worker={CPU: 1}`), validation "
        "tasks with `num_cpus=1`, at most one at a time (Ray Train 2.60 runs one validation at a time, "
        "`MAX_IN_FLIGHT_VALIDATIONS = 1`; podium runs with `validation.concurrency = 1` so both use the "
        "second core and only it). The local Ray has 2 logical CPUs = the 2 cores. The drivers (podium's flow, "
        "the Prefect server, MLflow's SQLite writes, Ray's GCS/raylet) have no core of their own and "
        "share both. torch uses 1 thread in every process. Ray Train's controller polls every 0.25 s in all four "
        "(podium's setting, `RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`).", "",
        table(summaries), "",
        "Definitions. *training wall*: TorchTrainer construction + `fit()` for (a)–(c) (for (c) `fit()` "
        "returns only after Ray has run every queued validation); podium's `train-model` task run (Prefect "
        "start → end), which does not wait for validation. *ckpt→metrics*: from podium's Ray Train callback "
        "seeing the persisted checkpoint (`CheckpointEvent.persisted_at`; the same callback is installed in "
        "(a)–(c)) to the validation metrics being recorded: (b) rank 0 has them, (c) Ray Train's checkpoint "
        "manager merged them (instrumented, `benchmarks/instrument.py`), (d) MLflow tag `podium.validated_at`. "
        "*beyond queue+validation*: that latency minus the time the checkpoint waited for the previous "
        "validation to finish and minus the validation function's own run time: the orchestration cost. "
        "*best chosen*: (b)/(c) the driver has picked the best checkpoint after `fit()` returned; (d) the "
        "`promote-best-checkpoint` task starts. *promotion done*: that task ends (copy, sha256 check, "
        "re-validation of the copy, CURRENT pointer, MLflow registry alias).", "",
    ]
    d, d0, a = summaries.get("d"), summaries.get("d0"), summaries.get("a")
    if a and d0:
        lines += ["Fixed overhead of podium over a bare TorchTrainer run (same job, validation cheap: "
                  "`repeat = 1`; warm Prefect server, MLflow store already created):", "",
                  overhead_table(a, d0), ""]
    if d:
        lines += [f"podium (d): driver peak RSS {d['peak_rss_mb']:.0f} MB; the Prefect server used "
                  f"{fmt(d['server_cpu_s'])} CPU-s during the run ({fmt(d['process_wall'])} s); "
                  f"`podium server start` (cold) took {fmt(extras.get('server_start_s'))} s and is not "
                  "counted above. Command: `" + d["command"].replace(str(extras.get("work", "")), "$WORK") + "`.",
                  ""]
    g = goals(summaries)
    if g:
        lines += ["Goals:", "", markdown_table(["goal", "measured", ""], g), ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    """Run the comparison; print the table; write BENCHMARKS.md unless --smoke."""
    p = argparse.ArgumentParser(description="podium vs bare Ray Train: training time and validation latency.")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller job (5 epochs of 60k rows)")
    size.add_argument("--smoke", action="store_true",
                      help="harness check in < 60 s: tiny job, only (c) unless --variants, writes no file")
    p.add_argument("--variants", help="which ways to run, e.g. a,c,d (default: a,b,c,d,d0; with --smoke: c)")
    p.add_argument("--workdir", help="keep data, storage and logs here (default: a temporary folder, removed)")
    p.add_argument("--output", default=str(BENCHMARKS_MD), help="markdown file to update (default: BENCHMARKS.md)")
    args = p.parse_args(argv)
    preset = "smoke" if args.smoke else "quick" if args.quick else "full"
    # --smoke runs only (c): it exercises the most of the harness (the loop wrapper, the validation
    # function, Ray Train's validation API, the instrumentation, podium's callback, the statistics), and
    # each TorchTrainer run costs ~20-30 s of start-up here, so more than one would not fit in a minute.
    default = "c" if args.smoke else "a,b,c,d,d0"
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
        log(f"workload {preset}: repeat={workload.repeat} {workload.calibration}")
        loads = [f"before: {load_average()}"]
        summaries: dict[str, dict[str, Any]] = {}
        bare = [v for v in ("a", "b", "c") if v in wanted]
        specs = {v: variant_spec(v, work, workload, train, val) for v in bare}
        for v in bare:
            log(f"running {LABELS[v]}")
            summaries[v] = summarize_bare(v, run_variant_process(v, specs[v], work), specs[v])
            loads.append(f"after {v}: {load_average()}")
        extras: dict[str, Any] = {"work": str(work)}
        if any(v in wanted for v in ("d", "d0")):
            from benchmarks import podium_run as pr

            home = str(work / "podium-home")
            api, extras["server_start_s"] = pr.start_server(home)
            try:
                for key, repeat in (("d", None), ("d0", 1)):
                    if key not in wanted:
                        continue
                    log(f"running {LABELS[key]}")
                    timing = str(work / f"{key}-timing.jsonl")
                    cfg = podium_config(workload, run_name=f"bench-{key}", train=train, val=val,
                                        storage=str(work / "storage"), serving=str(work / f"serving-{key}"),
                                        timing_log=timing, concurrency=1, repeat=repeat)
                    run = pr.run_podium(home, cfg, str(work))
                    summaries[key] = summarize_podium(LABELS[key], run, pr.collect(run, api, timing), 1)
                    loads.append(f"after {key}: {load_average()}")
            finally:
                pr.stop_server(home)
        machine = machine_description()
        text = render(args, workload, machine, loads, summaries, extras)
        print(table(summaries))
        for g in goals(summaries):
            print(f"  {g[0]}: {g[1]} [{g[2].strip('*')}]")
        if args.smoke:
            missing = [v for v in bare if summaries[v]["checkpoints"] < workload.epochs
                       or (v != "a" and summaries[v].get("n", 0) < workload.epochs)]
            if missing:
                log(f"smoke: incomplete results for {missing}")
                return 1
        else:
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
