"""Early stopping by verdict on a job that plateaus: training time saved, and the champion's metric, against
running every epoch.

    python benchmarks/early_stop.py                 # 30 epochs, patience 3, min_delta 0.002, 3 rounds
    python benchmarks/early_stop.py --repeats 1 --epochs 20

Job: the built-in loop on podium's demo data (Gaussian blobs, 4 classes; 20,000 training rows, 5,000
validation rows), promoted by val_loss (min); its validation loss stops improving by more than min_delta after
a few epochs. Each round runs both variants in a fresh PODIUM_HOME, one after the other (the order alternates
between rounds), through the real `podium run --json`:
  to the end    every epoch
  early stop    --early-stop-patience P --early-stop-min-delta D
Reported per variant, median over the rounds with the range: checkpoints trained, training time (process start
to the end of training, `training_ended_at`), the command's wall time, the promoted val_loss and val_accuracy.
The machine's own noise moves the times; the checkpoint counts and the metrics it does not.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.podium_run import run_podium, start_server, stop_server
from benchmarks.workload import machine_description, markdown_table, update_markdown_section

REPO = Path(__file__).resolve().parent.parent


def _config(name: str, data: tuple[str, str], epochs: int, patience: int | None, min_delta: float) -> dict[str, Any]:
    training: dict[str, Any] = {"epochs": epochs}
    if patience is not None:
        training |= {"early_stop_patience": patience, "early_stop_min_delta": min_delta}
    return {"run_name": name, "data": {"train": data[0], "val": data[1]}, "training": training,
            "promotion": {"metric": "val_loss", "mode": "min"}}


def _one(home: str, work: str, name: str, data: tuple[str, str], epochs: int, patience: int | None,
         min_delta: float) -> dict[str, float]:
    out = run_podium(home, _config(name, data, epochs, patience, min_delta), work)
    summary = out["summary"]
    promoted = next(c for c in summary["checkpoints"] if c["step"] == summary["promoted"]["step"])
    return {"checkpoints": len(summary["checkpoints"]),
            "training_s": summary["training_ended_at"] - out["process_start"],
            "wall_s": out["process_end"] - out["process_start"],
            "val_loss": promoted["metrics"]["val_loss"], "val_accuracy": promoted["metrics"]["val_accuracy"],
            "stopped_at": (summary.get("stopped_early") or {}).get("step", -1)}


def _cell(values: list[float], fmt: str) -> str:
    med = statistics.median(values)
    return f"{med:{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})" if len(values) > 1 else f"{med:{fmt}}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--patience", type=int, default=3)
    p.add_argument("--min-delta", type=float, default=0.002)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(REPO / "BENCHMARKS.md"), help="where the table goes ('-': print only)")
    args = p.parse_args()

    from podium.training.data import make_classification_data

    variants = {"to the end": None, f"early stop (patience {args.patience}, min_delta {args.min_delta:g})": args.patience}
    results: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="podium-early-stop-") as tmp:
        data = make_classification_data(str(Path(tmp) / "data"), train_rows=20000, val_rows=5000)
        for r in range(args.repeats):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for i, variant in enumerate(order):
                home = str(Path(tmp) / f"home-{r}-{i}")
                start_server(home)
                try:
                    res = _one(home, tmp, f"es-{r}-{i}", data, args.epochs, variants[variant], args.min_delta)
                finally:
                    stop_server(home)
                results[variant].append(res)
                print(f"round {r + 1} {variant}: {res}", flush=True)
    rows = [[v, _cell([x["checkpoints"] for x in xs], ".0f"), _cell([x["training_s"] for x in xs], ".1f"),
             _cell([x["wall_s"] for x in xs], ".1f"), _cell([x["val_loss"] for x in xs], ".4f"),
             _cell([x["val_accuracy"] for x in xs], ".4f")] for v, xs in results.items()]
    base, early = (results[v] for v in variants)
    saved = [1 - e["training_s"] / b["training_s"] for b, e in zip(base, early)]
    machine = machine_description()
    body = "\n".join([
        "## Early stopping by verdict", "",
        f"`python benchmarks/early_stop.py --epochs {args.epochs} --patience {args.patience} --min-delta "
        f"{args.min_delta:g} --repeats {args.repeats}`: the built-in loop on the demo data (20,000/5,000 rows), "
        "promoted by val_loss; median over the rounds (range).", "",
        markdown_table(["variant", "checkpoints", "training s", "wall s", "promoted val_loss", "promoted val_accuracy"],
                       rows), "",
        f"Training time saved: {_cell([100 * s for s in saved], '.0f')} %. Machine: {machine.get('cpu', '?')}, "
        f"{machine.get('cores', '?')} cores.",
    ])
    print(body)
    if args.out != "-":
        update_markdown_section(args.out, "early-stop", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
