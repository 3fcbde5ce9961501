"""Where the time before training goes: podium cold (a fresh home) and warm, against a bare TorchTrainer,
and optionally against another podium installation (before and after a change), in one interleaved run.

    python benchmarks/startup.py                          # this podium, cold and warm, 3 rounds
    python benchmarks/startup.py --before /tmp/old/.venv/bin/podium --repeats 5
    python benchmarks/startup.py --refusals --repeats 10  # only the refusal of a bad input, warm and fresh: seconds

The refusal: `podium run --train-data missing.parquet`, its time to exit 2 with its sentence, in the warm home and
in a fresh one (a new empty folder as HOME and PODIUM_HOME); nothing may start for it (checked: no home folder is
left where there was none).

The job is tiny (2 epochs of 4,000 rows, a cheap validation): what is measured is start-up and shutdown.
Per run: process wall; process start → flow start and flow start → training starts (the Prefect API:
flow run and `train-model` task run); the `connect-ray` task; and the CLI's own phases from the `startup`
block of `podium run --json` (absent from a podium that does not report them). The bare run is
benchmarks.variants (a). Nothing is pinned; other processes on the machine are measured
(benchmarks.guard.Monitor) and shown next to each figure, not refused: compare runs of one table only.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import podium_run as pr
from benchmarks.compare import run_variant_process, variant_spec
from benchmarks.guard import Monitor
from benchmarks.pinning import CoreSplit
from benchmarks.report import spread
from benchmarks.workload import (
    Workload,
    machine_description,
    make_data,
    markdown_table,
    podium_config,
    update_markdown_section,
)

REPO = Path(__file__).resolve().parent.parent
JOB = Workload("startup", train_rows=4_000, val_rows=1_000, epochs=2, hidden_size=32, repeat=1)
FIGURES = [("refusal (`--train-data missing.parquet`) → exit 2", "refusal"),
           ("process wall", "process_wall"), ("process start → training starts", "to_train"),
           ("process start → flow start", "to_flow"), ("flow start → training starts", "flow_to_train"),
           ("of which connect-ray", "connect_ray"), ("training → process exit", "after_train")]


def log(msg: str) -> None:
    """Progress on stderr."""
    print(f"[startup {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def podium_once(podium: str, home: str, tag: str, work: Path, train: str, val: str) -> dict[str, Any]:
    """One `podium run` of the tiny job under `home`; its start-up figures."""
    # one serving location per home: a second location of the model in a home's MLflow store would need an alias of
    # its own
    cfg = podium_config(JOB, run_name=f"startup-{tag}", train=train, val=val, storage=str(work / "storage"),
                        serving=str(Path(home) / "serving"), timing_log=None, concurrency=1)
    run = pr.run_podium(home, cfg, str(work), podium=podium)
    c = pr.collect(run, pr.server_url(home) or "", None)
    flow, train_task = c["flow"], c["train"]
    phases = run["summary"].get("startup", {}).get("phases", {})
    out = {"process_wall": run["process_end"] - run["process_start"],
           "to_train": train_task["start"] - run["process_start"], "to_flow": flow["start"] - run["process_start"],
           "flow_to_train": train_task["start"] - flow["start"],
           "connect_ray": (c["connect"]["end"] - c["connect"]["start"]) if c["connect"] else None,
           "after_train": run["process_end"] - train_task["end"]}
    out.update({f"cli: {name}": span[1] - span[0] for name, span in phases.items()})
    return out


REFUSAL = ["run", "--train-data", "missing.parquet"]
REFUSAL_SENTENCE = "data.train = 'missing.parquet': no such file or directory"


def refusal_once(podium: str, home: str, work: Path) -> dict[str, Any]:
    """`podium run --train-data missing.parquet` from `work` with `home` as HOME and PODIUM_HOME: seconds to its
    exit 2 (checked, with its sentence), and whether a home that did not exist was left behind."""
    existed = Path(home).exists()
    env = {**pr.podium_env(home), "HOME": home}
    began = time.monotonic()
    done = subprocess.run([podium, *REFUSAL], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - began
    if done.returncode != 2 or REFUSAL_SENTENCE not in done.stderr:
        raise RuntimeError(f"{podium} {' '.join(REFUSAL)}: exit {done.returncode}, expected 2 with "
                           f"{REFUSAL_SENTENCE!r}:\n{done.stderr[-2000:]}")
    return {"refusal": seconds, "left_home": not existed and Path(home).exists()}


def refusals(args: argparse.Namespace, installs: dict[str, str], work: Path) -> int:
    """--refusals: only the refusal, warm (a home used before) and fresh (a new empty one), interleaved; print the
    table (BENCHMARKS.md's start-up section gets the refusal's row from a full run)."""
    results: dict[str, list[float]] = {f"{name} {kind}": [] for name in installs for kind in ("warm", "fresh")}
    left: dict[str, int] = dict.fromkeys(results, 0)
    t0 = time.time()
    for name, podium in installs.items():  # the warm home: used once, its files and the interpreter's in the cache
        (work / f"home-warm-{name}").mkdir(parents=True, exist_ok=True)
        refusal_once(podium, str(work / f"home-warm-{name}"), work)
    with Monitor(CoreSplit(enabled=False)) as monitor:
        loads = []
        for r in range(args.repeats):
            for way in results:
                name, kind = way.split()
                home = work / (f"home-warm-{name}" if kind == "warm" else f"home-fresh-{name}-r{r + 1}")
                with monitor.window() as w:
                    once = refusal_once(installs[name], str(home), work)
                results[way].append(once["refusal"])
                left[way] += once["left_home"]
                loads.append(w.load_before[0])
    machine = machine_description()
    print(f"`podium run --train-data missing.parquet` to exit 2, seconds, median (min–max) of {args.repeats} "
          f"interleaved rounds ({time.time() - t0:.0f} s); machine: {machine['cpu']}, {machine['cores']} cores, "
          f"1-min load before {spread(loads, 1)}; podium at {machine['revision']}")
    print(markdown_table(["figure", *results], [["refusal → exit 2", *(spread(v, 2) for v in results.values())],
                                                ["fresh homes left behind", *(str(n) for n in left.values())]]))
    return 0


def bare_once(tag: str, work: Path, train: str, val: str) -> dict[str, Any]:
    """One bare TorchTrainer run of the tiny job (benchmarks.variants (a))."""
    spec = variant_spec("a", tag, work, JOB, train, val)
    out = run_variant_process("a", tag, spec, work, {})
    return {"process_wall": out["exit"] - out["launch"], "to_train": out["fit_start"] - out["launch"],
            "after_train": out["exit"] - out["fit_end"]}


def main(argv: list[str] | None = None) -> int:
    """Run the rounds; print the table; write the `startup` section of BENCHMARKS.md unless --no-write."""
    p = argparse.ArgumentParser(description="podium's start-up, cold and warm, against a bare TorchTrainer.")
    p.add_argument("--repeats", type=int, default=3, help="rounds, interleaved (default 3)")
    p.add_argument("--before", help="another installation's `podium` command to compare with (e.g. the main branch)")
    p.add_argument("--workdir", help="keep data, homes and logs here (default: a temporary folder, removed)")
    p.add_argument("--output", default=str(REPO / "BENCHMARKS.md"), help="markdown file to update")
    p.add_argument("--no-write", action="store_true", help="print only")
    p.add_argument("--refusals", action="store_true", help="only the refusal of a bad input, warm and fresh (printed)")
    args = p.parse_args(argv)
    tmp = None if args.workdir else tempfile.TemporaryDirectory(prefix="podium-startup-")
    work = Path(args.workdir or tmp.name)  # type: ignore[union-attr]
    work.mkdir(parents=True, exist_ok=True)
    installs = {"after": pr.PODIUM, **({"before": args.before} if args.before else {})}
    if args.refusals:
        try:
            return refusals(args, installs, work)
        finally:
            if tmp is not None:
                tmp.cleanup()
    ways = ["bare"] + [f"{name} {kind}" for name in installs for kind in ("warm", "cold")]
    results: dict[str, list[dict[str, Any]]] = {w: [] for w in ways}
    t0 = time.time()
    warm_homes = {name: str(work / f"home-warm-{name}") for name in installs}
    try:
        train, val = make_data(JOB, str(work / "data"))
        with Monitor(CoreSplit(enabled=False)) as monitor:
            for name, podium in installs.items():  # the warm homes: server up, store created, one run done
                podium_once(podium, warm_homes[name], f"{name}-prime", work, train, val)
            for r in range(args.repeats):
                for way in ways:
                    tag = f"{way.replace(' ', '-')}-r{r + 1}"
                    log(f"running {way} ({tag})")
                    with monitor.window() as w:
                        if way == "bare":
                            fig = bare_once(tag, work, train, val)
                        else:
                            name, kind = way.split()
                            home = warm_homes[name] if kind == "warm" else str(work / f"home-{tag}")
                            try:
                                fig = podium_once(installs[name], home, tag, work, train, val)
                                # the refusal in the same home: warm, or cold as it was (its server now up)
                                fresh = str(work / f"home-fresh-{tag}") if kind == "cold" else home
                                fig.update(refusal_once(installs[name], fresh, work))
                            finally:
                                if kind == "cold":
                                    pr.stop_server(home)
                    fig["foreign_cores"] = w.foreign_cores
                    fig["load"] = w.load_before[0]
                    results[way].append(fig)
        for name in installs:
            pr.stop_server(warm_homes[name])
        text = render(args, results, time.time() - t0)
        print(text)
        if not args.no_write:
            update_markdown_section(args.output, "startup", text)
            log(f"wrote {args.output}")
        return 0
    finally:
        if tmp is not None:
            tmp.cleanup()


def render(args: argparse.Namespace, results: dict[str, list[dict[str, Any]]], seconds: float) -> str:
    """The `startup` section: median (range) of each figure per way."""
    machine = machine_description()
    ways = list(results)
    names = [(label, key) for label, key in FIGURES]
    extra = sorted({k for figs in results.values() for f in figs for k in f if k.startswith("cli: ")})
    names += [(k, k) for k in extra] + [("other processes, cores", "foreign_cores"), ("1-min load before", "load")]
    rows = []
    for label, key in names:
        row = [label]
        for way in ways:
            vals = [f[key] for f in results[way] if f.get(key) is not None]
            row.append(spread(vals, 2) if vals else "–")
        rows.append(row)
    before = f" --before {args.before}" if args.before else ""
    return "\n".join([
        "## Start-up, cold and warm (`benchmarks/startup.py`)", "",
        f"Command: `python benchmarks/startup.py --repeats {args.repeats}{before}`. Measured "
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}, {seconds / 60:.0f} min, {args.repeats} interleaved rounds; "
        "median (min–max), seconds. "
        f"Machine: {machine['cpu']}, {machine['cores']} cores; {machine['versions']}; podium at {machine['revision']}.",
        "",
        f"Job: {JOB.train_rows:,} rows, {JOB.epochs} epochs, one worker, cheap validation. *warm*: the Prefect "
        "server up and the MLflow store created (by an earlier run); *cold*: a fresh home, no server, no database "
        "(the refusal: a new empty folder as HOME). "
        "*cli: …*: the phases `podium run --json` reports (seconds each; `prefect_server` and `ray` run in "
        "background threads, beside the others; `mlflow_check` checks the tracking URI without loading MLflow, "
        "which loads once training has started).", "",
        markdown_table(["figure"] + ways, rows),
    ])


if __name__ == "__main__":
    sys.exit(main())
