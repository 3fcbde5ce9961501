"""The watch after the switch under load, many times: good champions are never rolled back, bad ones always are.

    python benchmarks/watch_soak.py                          # 20 good promotions, 4 bad, a 10 s watch each
    python benchmarks/watch_soak.py --good 6 --bad 2 --watch-s 8 --write

Each promotion is a `podium promote` process (its imports, its Prefect flow run, the copy, the registry) plus its
watch: about 45-60 s on 2 shared cores, so the default 24 take about 25 minutes there.

One `podium serve` (its own Ray) serves a location while clients in threads post requests at a steady pace (half
of them carrying a value training never saw, f1 = -50). `podium promote --always-promote` then makes, again and
again, a new champion of one of two runs of the same model (the same weights, the same path: the fast path), each
watched with the default latency limit (`max_latency_p95_ratio = 2.0`, `max_error_rate_increase = 0`,
`min_requests = 20`); after every few good ones, a bad one, each a run of its own (a checkpoint its watch rolled
back is withdrawn): a model that raises on the unseen rows (MLflow's pyfunc path), or the same linear model about
three times slower (work added to its forward: the fast path, like with like). Each promotion's watch must end
`passed` for a good one and `rolled-back` for a bad one, and no request a good version answered may fail, across
every switch and rollback. No training: the runs' checkpoints are made and validated as the tests make them
(tests/helpers/checkpoints.make_trained_run).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.workload import load_average, machine_description, update_markdown_section

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
sys.path[:0] = [str(TESTS), str(TESTS / "integration")]

MODEL = "soak-model"
SLOW_CODE = '''
import json, os


def load_slow(checkpoint_dir):
    """The nightly linear model with work added to its forward that changes no answer: a chain of 1024-wide
    layers (PODIUM_SOAK_SLOW_LAYERS, default 40: about three times the replica's usual time per request under the
    soak's load). Work, not a sleep: the served model is the forward as `torch.export` traced it, which keeps the
    tensor operations and drops a Python `time.sleep`."""
    import torch

    with open(os.path.join(checkpoint_dir, "weights.json")) as f:
        saved = json.load(f)
    layers = int(os.environ.get("PODIUM_SOAK_SLOW_LAYERS", "40"))

    class SlowLinear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("w", torch.tensor(saved["w"], dtype=torch.float32))
            self.register_buffer("m", torch.randn(1024, 1024, generator=torch.Generator().manual_seed(0)) / 32)

        def forward(self, x):
            h = x.new_ones(x.shape[0], 1024)
            for _ in range(layers):
                h = torch.tanh(h @ self.m)
            z = x @ self.w + 0.0 * h.sum(dim=1)
            return torch.stack([-z / 2, z / 2], dim=1)

    return SlowLinear().eval()
'''


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def config(root: Path, run: str, loop: dict, loader: str, watch_s: float) -> Path:
    from podium_nightly_code import FEATURES

    doc = {"run_name": run, "model": MODEL, "storage": str(root / "storage"), "serving": str(root / "serving"),
           "data": {"train": str(root / "train.parquet"), "val": str(root / "val.parquet"),
                    "feature_columns": list(FEATURES)},
           "training": {"train_loop": "podium_nightly_code:train_func", "train_loop_config": {"epochs": 1, **loop}},
           "scaling": {"num_workers": 1}, "validation": {"fn": "podium_nightly_code:validate_fn"},
           "promotion": {"metric": "accuracy", "mode": "max", "verify": "hashes", "model_loader": loader,
                         "watch": {"duration_s": watch_s, "min_requests": 20, "max_error_rate_increase": 0.0,
                                   "max_latency_p95_ratio": 2.0}}}
    path = root / f"{run}.json"
    path.write_text(json.dumps(doc))
    return path


def start_clients(url: str, clients: int, pause_s: float):
    """Closed-loop clients (tests/helpers/live.py's Load), pausing `pause_s` between requests, alternating a row the
    model has seen and one far from it."""
    from helpers.live import Load
    from podium_nightly_code import FEATURES

    rows = [[[0.5, 0.2, -0.1, 1.0], [0.1, -50.0 if unseen else -0.7, 0.0, 0.2]] for unseen in (False, True)]
    seen, unseen = (json.dumps({"dataframe_split": {"columns": list(FEATURES), "data": r}}).encode() for r in rows)
    return Load(url, seen, clients=clients, pause_s=pause_s, other_body=unseen)


def promote(env: dict[str, str], path: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "podium.cli", "promote", "--json", "--always-promote", "--config",
                           str(path)], env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"podium promote exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--good", type=int, default=20, help="good promotions (default: %(default)s)")
    parser.add_argument("--bad", type=int, default=4, help="bad promotions, alternately failing and slow")
    parser.add_argument("--watch-s", type=float, default=10.0, help="each promotion's watch, in seconds")
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--pause-ms", type=float, default=10.0, help="each client's pause between requests")
    parser.add_argument("--write", action="store_true", help="write the result into BENCHMARKS.md")
    args = parser.parse_args()

    from helpers.checkpoints import make_trained_run
    from helpers.live import serving
    from helpers.servers import free_port
    from podium_nightly_code import write_data

    from podium.services import ensure_prefect_server, prepare_mlflow, stop_prefect_server

    root = Path(tempfile.mkdtemp(prefix="podium-watch-soak-"))
    (root / "code").mkdir()
    (root / "code" / "soak_code.py").write_text(SLOW_CODE)
    sys.path.insert(0, str(root / "code"))  # the runs are planned here too: their loader must import
    write_data(str(root / "train.parquet"), 100, 0.0, seed=1)
    write_data(str(root / "val.parquet"), 400, 0.1, seed=2)
    tracking_uri = f"sqlite:///{root / 'mlflow.db'}"
    prepare_mlflow(tracking_uri)
    api = ensure_prefect_server(root / "prefect-home", free_port())
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    env.update({"PODIUM_HOME": str(root / "home"), "PREFECT_API_URL": api, "MLFLOW_TRACKING_URI": tracking_uri,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(root / "code"), str(TESTS / "integration"),
                                                              os.environ.get("PYTHONPATH")]))})
    os.environ.update({k: env[k] for k in ("PODIUM_HOME", "PREFECT_API_URL", "MLFLOW_TRACKING_URI")})
    plan: list[str] = []
    every = max(1, args.good // max(1, args.bad))
    for i in range(args.good):
        plan.append(("good-a", "good-b")[i % 2])
        bad = sum(not p.startswith("good") for p in plan)
        if args.bad and (i + 1) % every == 0 and bad < args.bad:
            # a run of its own for each bad promotion: a checkpoint its watch rolled back is withdrawn, never
            # promoted again (podium.serving.layout.withdrawn_checkpoints)
            plan.append(f"{('failing', 'slow')[bad % 2]}-{bad // 2 + 1}")
    good = ({"angle_deg": 10.0}, "podium_nightly_code:load_linear")
    bad_runs = {"failing": ({"angle_deg": 10.0, "fail_below": -8.0}, "podium_nightly_code:load_failing"),
                "slow": ({"angle_deg": 10.0}, "soak_code:load_slow")}
    runs = {"champion": ({"angle_deg": 40.0}, "podium_nightly_code:load_linear"), "good-a": good, "good-b": good,
            **{run: bad_runs[run.split("-")[0]] for run in plan if not run.startswith("good")}}
    paths = {run: config(root, run, loop, loader, args.watch_s) for run, (loop, loader) in runs.items()}
    for path in paths.values():
        make_trained_run(json.loads(path.read_text()), tracking_uri)
    first = promote(env, paths["champion"])
    log(f"champion {first['promoted']['version']} serves")
    results: list[tuple[str, str, dict]] = []
    started = time.monotonic()
    try:
        with serving(str(root / "serving"), env, "--num-cpus", "0") as served, \
                start_clients(served.url, args.clients, args.pause_ms / 1000) as clients:
            for run in plan:
                out = promote(env, paths[run])
                if out["promoted"] is None:  # nothing promoted: the run's own words say why
                    raise RuntimeError(f"{run} was not promoted: {out.get('reason')}")
                watch = out["watch"] or {}
                results.append((run, out["promoted"]["version"], watch))
                log(f"{run}: {out['promoted']['version']} {watch.get('state')}: {watch.get('reason', '')[:300]}")
            time.sleep(2)
    finally:
        stop_prefect_server(root / "prefect-home")
    wall = time.monotonic() - started
    bad_versions = {version for run, version, _ in results if not run.startswith("good")}
    statuses = Counter((answer.version, answer.status) for answer in list(clients.answers))
    good_failed = sum(n for (version, status), n in statuses.items()
                      if version not in bad_versions and status != 200)
    answered = sum(statuses.values())
    outcomes = []
    for kind in ("good", "failing", "slow"):
        mine = [w for run, _, w in results if run.startswith(kind)]
        if not mine:
            continue
        states = Counter(w.get("state") for w in mine)
        expected = "passed" if kind == "good" else "rolled-back"
        ratios = sorted(w["latency_p95_ratio"] for w in mine if w.get("latency_p95_ratio") is not None)
        seconds = sorted(w.get("seconds", 0.0) for w in mine)
        otherwise = ", ".join(f"{s} {n}" for s, n in sorted(states.items()) if s != expected)
        outcomes.append(f"{kind}: {states[expected]} of {len(mine)} {expected}{f' ({otherwise})' if otherwise else ''}, "
                        f"latency p95 ratio {f'{ratios[0]:.2f}–{ratios[-1]:.2f}' if ratios else 'n/a'}, watch "
                        f"{seconds[len(seconds) // 2]:.1f} s ({seconds[0]:.1f}–{seconds[-1]:.1f})"
                        + (f", {spared} with a p95 above the limit's line not held against it (too few requests "
                           "above it for the numbers to support a difference)"
                           if (spared := sum("not held against it" in w.get("reason", "") for w in mine)) else ""))
    machine = machine_description()
    body = "\n".join([  # lines, not a table: BENCHMARKS.md keeps to 250 lines
        "## The watch under load, many times (`benchmarks/watch_soak.py`)",
        f"`python benchmarks/watch_soak.py --good {args.good} --bad {args.bad} --watch-s {args.watch_s:g}`: one "
        f"`podium serve`, {args.clients} closed-loop clients pausing {args.pause_ms:g} ms, `podium promote "
        "--always-promote` of a good run again and again with the default watch limits (latency p95 ×2.0, no "
        "error-rate increase, 20 requests), a bad one, a run of its own (failing on some rows, or about 3× slower "
        "on the same path: work added to its forward) after "
        f"every {every}. {machine.get('cpu', '')}; {machine.get('cores', '')} cores, shared; {load_average()}.",
        f"- Promotions, {'; '.join(outcomes)}.",
        f"- {answered} requests answered in {wall:.0f} s; requests a good version answered that failed: "
        f"{good_failed}, across {len(results)} switches and "
        f"{sum(w.get('state') == 'rolled-back' for _, _, w in results)} rollback(s) by the watch.",
    ])
    print(body)
    if args.write:
        update_markdown_section(ROOT / "BENCHMARKS.md", "watch-soak", body)
    ok = all((w.get("state") == "passed") == (run.startswith("good")) for run, _, w in results) and not good_failed
    return 0 if ok else 1


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
