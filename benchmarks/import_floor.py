"""The floor under podium's own CPU: what a process that trains with Ray Train and does what podium's
`podium run` does (a Prefect flow, MLflow records in a SQLite store, a `torch.export` program, a chart) must
import beyond what a bare TorchTrainer driver imports, in a fresh interpreter, as CPU seconds.

    python benchmarks/import_floor.py [--repeats 3]

Each repeat is a fresh interpreter: it imports `ray.train.torch` (what the bare driver of way (a) imports),
then each group in turn, in the order podium's driver loads them; a group's figure is the CPU time
(`time.process_time`, every thread) its imports add to the ones before. compare.py runs it once, in the quiet
window before its first round, and writes it beside podium's own CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

# (group, the modules podium's run loads for it), in the order podium's driver loads them
GROUPS = [
    ("Prefect (flows, tasks, client)", ["prefect", "prefect.flows", "prefect.client.orchestration"]),
    ("MLflow (client)", ["mlflow", "mlflow.tracking"]),
    ("MLflow's SQL store (SQLAlchemy, Alembic)", ["mlflow.store.tracking.sqlalchemy_store"]),
    ("torch.export's tracing (the served model)", ["torch.export._trace"]),
    ("matplotlib, Agg (the chart)", ["matplotlib", "matplotlib.figure", "matplotlib.font_manager",
                                      "matplotlib.backends.backend_agg"]),
]

BARE = "bare driver (ray.train.torch, torch)"

CHILD = r"""
import importlib, json, sys, time
bare, groups = sys.argv[1], json.loads(sys.argv[2])
t = time.process_time()
import ray.train.torch
out = {bare: time.process_time() - t}
for name, modules in groups:
    t = time.process_time()
    for m in modules:
        importlib.import_module(m)
    out[name] = time.process_time() - t
print(json.dumps(out))
"""


def measure(repeats: int = 3) -> dict[str, list[float]]:
    """CPU seconds of each group's imports (and of the bare driver's), one value per fresh interpreter."""
    runs: dict[str, list[float]] = {}
    for _ in range(repeats):
        done = subprocess.run([sys.executable, "-c", CHILD, BARE, json.dumps(GROUPS)], capture_output=True, text=True,
                              timeout=300, check=True)
        for name, s in json.loads(done.stdout.strip().splitlines()[-1]).items():
            runs.setdefault(name, []).append(s)
    return runs


def floor_s(runs: dict[str, list[float]]) -> list[float]:
    """Per repeat, the imports beyond the bare driver's: the floor under podium's own CPU."""
    names = [name for name, _ in GROUPS]
    return [sum(runs[n][i] for n in names) for i in range(len(runs[names[0]]))]


def describe(runs: dict[str, list[float]]) -> str:
    """One line: the floor's median (range) and each group's median."""
    total = floor_s(runs)
    parts = ", ".join(f"{name} {statistics.median(runs[name]):.2f}" for name, _ in GROUPS)
    return (f"{statistics.median(total):.1f} CPU-s ({min(total):.1f}–{max(total):.1f}, {len(total)} fresh "
            f"interpreters) beyond the bare driver's own {statistics.median(runs[BARE]):.2f}: {parts}")


def main() -> None:
    """Print the floor."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    print(describe(measure(p.parse_args().repeats)))


if __name__ == "__main__":
    main()
