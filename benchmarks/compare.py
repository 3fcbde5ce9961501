"""The same training job, several ways: how much does validating every checkpoint cost, how fast do its
metrics arrive, and what does podium cost at start?

    python benchmarks/compare.py --repeats 3 --check   # the full run (about 25 min quiet), writes BENCHMARKS.md
    python benchmarks/compare.py --quick               # smaller job, writes BENCHMARKS.md
    python benchmarks/compare.py --smoke               # harness check: a tiny job, way (c) once, writes nothing

 (a) training only: TorchTrainer + podium.training.loop:train_loop_per_worker, no validation
 (d) podium: `podium run --json` against a local Prefect server and MLflow on SQLite, costly validation
 (d0) podium with the validation made cheap (repeat=1), warm server and store: its fixed overhead over (a)
 (d1) as (d0), but the first run in a fresh home: no server, no database (podium starts both)
 (b) validation inside the loop: rank 0 validates each checkpoint synchronously after reporting it
 (c) Ray Train's async validation: ValidationConfig(fn=...) + report(..., validation=ValidationTaskConfig)
 (a') (a) once more at the end of each round: how much the machine drifted over the round
 (f) (a) with the costly validation looping on the other core in a plain process from the first checkpoint
     on (no Ray, no podium): what validating beside training costs on this machine at the least

All train the same job with one Ray Train worker on one CPU and validate with the same function
(benchmarks.workload:validate_repeated) on one CPU, each in a fresh process with a fresh local Ray.

A measurement is refused rather than reported when its preconditions fail (benchmarks.guard): other
processes busy on the machine, the train worker not pinned to its core, the validation not costing what
calibration says, or results missing. Such a way is run again once, then reported "not measured" with
the reasons. `--repeats N` runs N interleaved rounds of every way; every figure is a median with its range.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/compare.py`: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import import_floor, report
from benchmarks.guard import Expectations, Monitor, check_attempt
from benchmarks.pinning import CoreSplit
from benchmarks.summaries import LABELS, summarize_bare, summarize_podium
from benchmarks.workload import (
    PRESETS,
    Workload,
    calibrate,
    loop_config,
    machine_description,
    make_data,
    podium_config,
    update_markdown_section,
    validate_kwargs,
    validation_cpu_s,
)

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS_MD = REPO / "BENCHMARKS.md"
PODIUM_WAYS = ("d", "d0", "d1")
CHEAP = ("d0", "d1")


def log(msg: str) -> None:
    """Progress on stderr."""
    print(f"[compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- running one attempt

def variant_spec(key: str, tag: str, work: Path, workload: Workload, train: str, val: str) -> dict[str, Any]:
    """Everything a bare-Ray-Train variant needs (written to JSON for its subprocess)."""
    timing = str(work / f"{tag}-timing.jsonl")
    return {"log": str(work / f"{tag}-events.jsonl"), "timing_log": timing, "run_name": f"bench-{tag}",
            "storage": str(work / "storage"), "loop_config": loop_config(workload, train, val),
            "validate_kwargs": validate_kwargs(workload, val, timing)}


def run_variant_process(key: str, tag: str, spec: dict[str, Any], work: Path, env: dict[str, str]) -> dict[str, Any]:
    """Run one variant in a fresh Python process (fresh Ray); its timestamps plus the process wall time."""
    spec_path, out_path = work / f"{tag}-spec.json", work / f"{tag}-out.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, **env,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "benchmarks.variants", "--variant", key[0], "--spec", str(spec_path),
           "--out", str(out_path)]
    started = time.time()
    with open(work / f"{tag}.log", "w") as logf:
        rc = subprocess.run(cmd, env=env, cwd=str(REPO), stdout=logf, stderr=subprocess.STDOUT).returncode
    ended = time.time()
    if rc != 0:
        tail = (work / f"{tag}.log").read_text()[-2000:]
        raise RuntimeError(f"variant {key} failed (exit {rc}); log tail:\n{tail}")
    out = json.loads(out_path.read_text())
    out["launch"], out["exit"] = started, ended
    return out


class Runner:
    """Runs the ways, each attempt inside the core split and a monitor window; keeps the warm server."""

    def __init__(self, args: argparse.Namespace, workload: Workload, work: Path, train: str, val: str,
                 split: CoreSplit, monitor: Monitor):
        self.args, self.workload, self.work, self.train, self.val = args, workload, work, train, val
        self.split, self.monitor = split, monitor
        self.home = str(work / "podium-home")
        self.api: str | None = None
        self.extras: dict[str, Any] = {}
        self.floor_validation_s: dict[int, float] = {}  # round -> (f)'s validation p50, once measured

    def expectations(self, key: str, r: int) -> Expectations:
        """What this way must show (see benchmarks.guard.check_attempt)."""
        calibrated = self.workload.calibration.get("validation_s")
        # the same validation as measured by the floor way (f) earlier in this round, where it ran beside the
        # same pinned training worker the ways (b), (c), (d) run it beside: the calibration's timing (a
        # validation beside a plain training loop) reads 1.5x lower than that on some days, which refused
        # (d) for its validation's cost when (f) in the same round cost the same
        reference = self.floor_validation_s.get(r, calibrated)
        source = "as (f) measured it in this round" if r in self.floor_validation_s else "calibrated"
        # a validation of less than half a second (the smoke job) is mostly fixed costs: nothing to hold it to.
        # (f) is not held to it: its validation only has to keep the other core busy from the first checkpoint
        # on, which it does back to back at whatever cost that core allows (1.3-1.9x calibrated, seen)
        costly = key in ("b", "c", "d") and calibrated is not None and calibrated >= 0.5
        return Expectations(epochs=self.workload.epochs, validates=key not in ("a", "a2", "f"), pinned=self.split.enabled,
                            max_foreign_cores=self.args.max_foreign_cpu, validation_s=reference if costly else None,
                            validation_source=source)

    def run_once(self, key: str, tag: str) -> dict[str, Any]:
        """One run of a way; its summary (raises if the run itself failed)."""
        pin_log = str(self.work / f"{tag}-pins.jsonl")
        env = self.split.env(pin_log)
        if key in PODIUM_WAYS:
            from benchmarks import podium_run as pr

            timing = str(self.work / f"{tag}-timing.jsonl")
            cfg = podium_config(self.workload, run_name=f"bench-{tag}", train=self.train, val=self.val,
                                storage=str(self.work / "storage"), serving=str(self.work / f"serving-{tag}"),
                                timing_log=timing, concurrency=1, repeat=1 if key in CHEAP else None)
            home = str(self.work / f"home-{tag}") if key == "d1" else self.home
            try:
                run = pr.run_podium(home, cfg, str(self.work), extra_env=env)
                api = pr.server_url(home) if key == "d1" else self.api
                c = pr.collect(run, api or "", timing)
            finally:
                if key == "d1":
                    pr.stop_server(home)
            return {**summarize_podium(key, run, c, 1), "val_total_s": validation_cpu_s(timing, cfg["serving"])}
        spec = variant_spec(key, tag, self.work, self.workload, self.train, self.val)
        return {**summarize_bare(key, run_variant_process(key, tag, spec, self.work, env), spec),
                "val_total_s": validation_cpu_s(spec["timing_log"])}

    def start_warm_server(self) -> None:
        """The warm ways' Prefect server: started once before the first round (its start-up is not part of any
        way), and left to finish its own background start-up work."""
        from benchmarks import podium_run as pr

        self.api, self.extras["server_start_s"] = pr.start_server(self.home)
        waited = pr.settle(pr.server_pid(self.home))
        log(f"warm Prefect server {self.api} up in {self.extras['server_start_s']:.1f} s, settled after {waited:.0f} s")

    def outcome(self, key: str, r: int) -> dict[str, Any]:
        """One repeat of a way: attempted, checked, attempted once more if it failed."""
        attempts = []
        for n in (1, 2):
            tag = f"{key}-r{r + 1}-{n}"
            probe, waited = self.monitor.wait_quiet(self.args.max_foreign_cpu, 3.0, self.args.quiet_wait)
            if probe.foreign_cores > self.args.max_foreign_cpu:
                reasons = [f"machine busy before the way (waited {waited:.0f} s): other processes used "
                           f"{probe.foreign_cores:.2f} cores ({probe.top_foreign()})"]
                attempts.append({"reasons": reasons, "window": probe.to_dict()})
                log(f"{tag}: not run: {reasons[0]}")
                continue
            log(f"running {LABELS[key]} ({tag})")
            summary, error = None, None
            with self.split, self.monitor.window(str(self.work / f"{tag}-pins.jsonl")) as w:
                try:
                    summary = self.run_once(key, tag)
                except Exception as exc:  # a failed run is a failed attempt, reported with the rest
                    error = f"run failed: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
                    (self.work / f"{tag}-error.txt").write_text(traceback.format_exc())  # the whole trace, kept
            if summary is not None:
                summary["machine_cpu_s"] = w.machine_cpu_s  # every process of the way, the whole machine's view
            reasons = check_attempt(summary, w, self.expectations(key, r), error)
            attempts.append({"reasons": reasons, "window": w.to_dict()})
            log(f"{tag}: {'measured' if not reasons else 'NOT a measurement: ' + '; '.join(reasons)} "
                f"(other processes {w.foreign_cores:.2f} cores, load {w.load_before[0]:.2f} → {w.load_after[0]:.2f}, "
                f"pinned {[p['pid'] for p in w.pins]}; busiest of ours: {w.top_ours()})")
            if not reasons:
                if key == "f" and summary and summary.get("val_p50"):
                    self.floor_validation_s[r] = summary["val_p50"]
                return {"summary": summary, "measured": True, "attempts": attempts}
        return {"summary": None, "measured": False, "attempts": attempts}

    def close(self) -> None:
        """Stop the warm Prefect server."""
        if self.api is not None:
            from benchmarks import podium_run as pr

            pr.stop_server(self.home)


def calibrate_checked(workload: Workload, train: str, val: str, split: CoreSplit, monitor: Monitor,
                      args: argparse.Namespace) -> str | None:
    """Calibrate on the training core while the machine is quiet; None, or why the calibration is not trusted."""
    reason = None
    given = workload.repeat
    for _ in (1, 2):
        workload.repeat = given
        monitor.wait_quiet(args.max_foreign_cpu, 3.0, args.quiet_wait)
        with monitor.window() as w:
            calibrate(workload, train, val, split.train if split.enabled else None,
                      split.other if split.enabled else None)
        spread = workload.calibration["epoch_spread"]
        if w.foreign_cores > args.max_foreign_cpu:
            reason = f"machine busy during calibration ({w.foreign_cores:.2f} cores: {w.top_foreign()})"
        elif spread > 0.10:
            reason = f"calibration unstable: two epoch estimates {spread:.0%} apart"
        else:
            return None
        log(f"calibration: {reason}; once more")
    return reason


# ---------------------------------------------------------------- reporting

def render(args: argparse.Namespace, workload: Workload, results: report.Results, extras: dict[str, Any]) -> str:
    """The BENCHMARKS.md section."""
    machine = machine_description()
    w = workload
    cal = w.calibration
    cmd = ("python benchmarks/compare.py" + (" --quick" if args.quick else "") + f" --repeats {args.repeats}"
           + (f" --variants {args.variants}" if args.variants else "") + (" --check" if args.check else ""))
    lines = [
        "## Training with per-checkpoint validation, several ways (`benchmarks/compare.py`)", "",
        f"Command: `{cmd}` (from the repository root, venv active). Measured {time.strftime('%Y-%m-%d %H:%M %Z')}, "
        f"{extras.get('seconds', 0) / 60:.0f} min in all; {args.repeats} rounds of every way, interleaved. Every "
        "figure is the median of the rounds, the range (min–max) in brackets; figures comparing two ways are "
        "taken within each round first.", "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']} RAM, {machine['os']}, "
        f"Python {machine['python']}; {machine['versions']}. No GPU. podium at {machine['revision']}.", "",
        f"Job: MLP (hidden {w.hidden_size}) on {w.train_rows:,} × {w.features} synthetic rows, batch "
        f"{w.batch_size}, {w.epochs} epochs, a checkpoint every epoch. Validation: "
        f"`benchmarks.workload:validate_repeated` evaluates {w.val_rows:,} rows `repeat = {w.repeat}` times; "
        f"calibrated on the training core before the first round: one epoch ≈ {cal.get('epoch_s')} s (two estimates "
        f"{cal.get('epoch_spread', 0):.0%} apart), one pass {cal.get('val_pass_s')} s, so `repeat` makes a validation "
        f"≈ {w.val_cost_epochs:g} epochs and a backlog builds when validations run one at a time. One whole "
        f"validation took {cal.get('validation_alone_s')} s alone and {cal.get('validation_s')} s on the other core "
        "next to a training loop on the training core (two busy cores slow each other); the latter is what the "
        "ways are checked against. (d0) and (d1) use `repeat = 1`. In every way the training data is read once "
        "into Ray's object store (`training.cache = always`) and features are not standardised "
        "(`training.standardize = false`): see `benchmarks/workload.py`.", "",
        f"Cores: {extras.get('cores')}. One Ray Train worker with 1 CPU and validation tasks with `num_cpus=1`, "
        "one at a time (Ray Train 2.60: `MAX_IN_FLIGHT_VALIDATIONS = 1`; podium: `validation.concurrency = 1`); "
        "torch uses 1 thread everywhere; Ray Train's controller polls every 0.25 s in all ways.", "",
        "Preconditions of every attempt (`benchmarks/guard.py`): other processes used at most "
        f"{args.max_foreign_cpu:.2f} cores on average, before (a 3 s probe, waited for up to {args.quiet_wait:.0f} s) "
        "and during the way; the train worker pinned itself to its core and, while it lived, no other process of the "
        "benchmark stayed allowed there; in (b), (c), (d) the validation's p50 within 0.67–1.5× of (f)'s in the same "
        "round (of the calibrated one where (f) was not measured); every checkpoint recorded (and validated). "
        "A failed attempt was rerun once, then reported not measured.", "",
        report.table(results), "",
    ]
    reasons = [(k, report.not_measured_reason(results, k)) for k in report.ORDER if k in results]
    lines += [f"- {LABELS[k]}: not measured: {why}" for k, why in reasons if why]
    lines += ["", "Definitions. *training wall*: TorchTrainer construction + `fit()` for (a)–(c) (in (c) `fit()` returns "
              "only after Ray Train ran every queued validation; *loop done*: the train loop itself finished); "
              "podium's `train-model` task run, which does not wait for validation. *× (a)*: against the mean of "
              "(a) and (a') of the same round. *ckpt→metrics*: from the checkpoint complete in storage (newest file "
              "mtime) to its metrics recorded ((b) rank 0 has them, (c) Ray Train's checkpoint manager merged them, "
              "(d) MLflow tag `podium.validated_at`). *beyond queue + validation*: that latency less the wait for the "
              "previous validation and less the validation function itself: what the orchestration adds. "
              "*callback delay*: upload → podium's Ray Train callback. *promotion done*: the "
              "`promote-best-checkpoint` task ends (copy, sha256, load check, CURRENT, registry alias).", "",
              "Start-up and the time outside training ((a) against podium warm and cold; podium's own phases from "
              "the Prefect API and from the `startup` block of `podium run --json`):", "",
              report.startup_table(results), "",
              "CPU over the whole machine (`/proc/stat`'s busy time during the way, less other processes' and this "
              "harness's own): every process a way starts, Ray's and the servers' included. The validation "
              "function's own seconds are taken out, and what is left is set against (f)'s for (d) and against "
              "(a)'s for (d0) and (d1), round by round:", "",
              report.cpu_table(results), "",
              *([f"The floor under podium's own CPU, what a driver doing what podium's does must import beyond a bare "
                 f"TorchTrainer driver (`benchmarks/import_floor.py`: Prefect, MLflow with its SQL store, "
                 f"`torch.export`'s tracing, matplotlib): "
                 f"{import_floor.describe(extras['import_floor'])}.", ""] if extras.get("import_floor") else []),
              "Goals:", "", report.goals_table(results), "", report.floor_line(results) or "", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- main

def compile_podium() -> None:
    """podium's bytecode, as an installed podium (or one run once) has it: where the environment sets
    PYTHONDONTWRITEBYTECODE, every process of a way would otherwise compile podium's modules anew."""
    for folder in ("podium", "flows", "tasks", "training", "deployments", "benchmarks"):
        compileall.compile_dir(str(REPO / folder), quiet=1)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; print the table; write BENCHMARKS.md unless --smoke; with --check, exit 1 unless
    every way was measured and every goal met (with the full job, the goal of benchmarks/scale.py too)."""
    p = argparse.ArgumentParser(description="podium vs bare Ray Train: training time, validation latency, start-up.")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="smaller job (5 epochs of 60k rows)")
    size.add_argument("--smoke", action="store_true",
                      help="harness check: tiny job, only (c) unless --variants, one repeat, writes no file")
    p.add_argument("--variants", help=f"which ways to run, e.g. a,d,d0 (default: {','.join(report.ORDER)}; "
                                      "with --smoke: c)")
    p.add_argument("--repeats", type=int, help="rounds of every way, interleaved (default 3; with --smoke 1)")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when a way was not measured or a goal was missed (for unattended runs)")
    p.add_argument("--max-foreign-cpu", type=float, default=0.10,
                   help="cores other processes may use on average before and during a way (default 0.10)")
    p.add_argument("--quiet-wait", type=float, default=120.0,
                   help="seconds to wait for the machine to go quiet before each attempt (default 120)")
    p.add_argument("--workdir", help="keep data, storage and logs here (default: a temporary folder, removed)")
    p.add_argument("--output", default=str(BENCHMARKS_MD), help="markdown file to update (default: BENCHMARKS.md)")
    p.add_argument("--write", action="store_true", help="with --smoke: write the section to --output anyway")
    p.add_argument("--no-pin", action="store_true",
                   help="do not give the training worker a core of its own (see benchmarks/pinning.py)")
    args = p.parse_args(argv)
    args.repeats = args.repeats or (1 if args.smoke else 3)
    if args.repeats < 1:
        p.error(f"--repeats = {args.repeats}: expected 1 or more")
    preset = "smoke" if args.smoke else "quick" if args.quick else "full"
    wanted = [v.strip() for v in (args.variants or ("c" if args.smoke else ",".join(report.ORDER))).split(",")
              if v.strip()]
    unknown = sorted(set(wanted) - set(LABELS))
    if unknown:
        p.error(f"--variants: unknown {unknown}; expected some of {sorted(LABELS)}")
    tmp = None if args.workdir else tempfile.TemporaryDirectory(prefix="podium-bench-")
    work = Path(args.workdir or tmp.name)  # type: ignore[union-attr]
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    compile_podium()
    split = CoreSplit(enabled=not args.no_pin)
    results: report.Results = {}
    try:
        with Monitor(split) as monitor:
            workload = PRESETS[preset]
            train, val = make_data(workload, str(work / "data"))
            failed = calibrate_checked(workload, train, val, split, monitor, args)
            log(f"workload {preset}: repeat={workload.repeat} {workload.calibration}; ways {wanted}, "
                f"{args.repeats} repeat(s)")
            runner = Runner(args, workload, work, train, val, split, monitor)
            runner.extras["cores"] = split.describe()
            if not failed and "d" in wanted and not args.smoke:  # in the quiet window, before any way
                runner.extras["import_floor"] = import_floor.measure(3)
                log(f"imports beyond a bare driver's: {import_floor.describe(runner.extras['import_floor'])}")
            if not failed and any(k in wanted for k in ("d", "d0")):
                runner.start_warm_server()
            try:
                for r in range(args.repeats):
                    for key in [k for k in report.ORDER if k in wanted]:
                        if failed:
                            reasons = [f"calibration not trusted: {failed}"]
                            results.setdefault(key, []).append(
                                {"summary": None, "measured": False, "attempts": [{"reasons": reasons}]})
                            continue
                        results.setdefault(key, []).append(runner.outcome(key, r))
            finally:
                runner.close()
        runner.extras["seconds"] = time.time() - t0
        report.print_summary(results)
        (work / "summaries.json").write_text(json.dumps(results, indent=1, default=str))
        if args.smoke:
            broken = [k for k, outs in results.items() for o in outs for a in o["attempts"]
                      if any(x.startswith(("run failed", "incomplete")) for x in a["reasons"])]
            if broken:
                log(f"smoke: the harness did not get complete results for {sorted(set(broken))}")
                return 1
        if not args.smoke or args.write:
            update_markdown_section(args.output, "compare", render(args, workload, results, runner.extras))
            log(f"wrote {args.output}")
        flat = True
        if args.check and not (args.smoke or args.quick):
            # the last goal: podium's own CPU per checkpoint flat from 10 to 300 checkpoints (its own section)
            from benchmarks import scale

            log("podium's own CPU per checkpoint over 312 checkpoints: benchmarks/scale.py --check")
            flat = scale.main(["--check", "--output", args.output, "--workdir", str(work / "scale")]) == 0
        log(f"done in {time.time() - t0:.0f} s (command: {' '.join(map(shlex.quote, sys.argv))})")
        if args.check and not (report.all_good(results) and flat):
            log("check: a way was not measured or a goal was missed")
            return 1
        return 0
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
