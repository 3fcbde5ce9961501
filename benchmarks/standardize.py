"""The built-in model on tabular data with mixed feature scales, against scikit-learn's standardised
logistic regression on the same split; and the served model's size against the checkpoint's.

    python benchmarks/standardize.py           # 4 datasets, podium with and without standardisation
    python benchmarks/standardize.py --quick   # wine and breast cancer only

Datasets (no download: scikit-learn ships the first two, the others are generated):
  wine            178 rows, 13 features from 0.1 (hue) to 1680 (proline), 3 classes
  breast_cancer   569 rows, 30 features from 0.001 to 4250 (area), 2 classes
  mixed_blobs     podium's demo data (Gaussian blobs, 4 classes) with each column scaled by 10^-3..10^4
                  and shifted: a problem a linear model solves, at scales that break a raw MLP
  mixed_clusters  scikit-learn's make_classification with 2 clusters per class (not linearly separable),
                  scaled the same way
Each is split 75/25, stratified, seed 0; the same Parquet files feed both sides. Baseline:
`make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000))` fitted on the training part.
podium: a real `podium run --json` of the built-in loop (defaults: 2 workers, batch 128, Adam 1e-2,
hidden 64), promoting by `val_accuracy` (max), once with its standardisation and once with
`--no-standardize` (the loop before it). The champion's accuracy is the value podium promoted.
scikit-learn is imported here only (a benchmark dependency, not podium's).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.podium_run import run_podium, start_server, stop_server
from benchmarks.workload import load_average, machine_description, markdown_table, update_markdown_section

# epochs and checkpoint cadence per dataset: small ones need more passes (a few steps per epoch)
DATASETS: dict[str, dict[str, Any]] = {
    "wine": {"epochs": 40, "batch_size": 32, "checkpoint_every_steps": 10},
    "breast_cancer": {"epochs": 30, "batch_size": 32, "checkpoint_every_steps": 20},
    "mixed_blobs": {"epochs": 5},
    "mixed_clusters": {"epochs": 8},
}


def _rescale(x: np.ndarray, seed: int) -> np.ndarray:
    """Each column times 10^k (k from -3 to 4) plus an offset of a few times its new scale."""
    rng = np.random.default_rng(seed)
    scales = 10.0 ** rng.uniform(-3, 4, x.shape[1])
    return x * scales + rng.normal(0, 5, x.shape[1]) * scales


def load_dataset(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Features and integer labels of a benchmark dataset."""
    from sklearn import datasets

    if name == "wine":
        return datasets.load_wine(return_X_y=True)
    if name == "breast_cancer":
        return datasets.load_breast_cancer(return_X_y=True)
    if name == "mixed_blobs":
        rng = np.random.default_rng(0)
        centers = rng.normal(0.0, 1.5, size=(4, 16))
        y = rng.integers(0, 4, size=30000)
        return _rescale(centers[y] + rng.normal(0.0, 2.0, size=(30000, 16)), 1), y
    if name == "mixed_clusters":
        x, y = datasets.make_classification(n_samples=20000, n_features=12, n_informative=8, n_redundant=2,
                                            n_classes=3, n_clusters_per_class=2, class_sep=1.0, random_state=0)
        return _rescale(x, 2), y
    raise ValueError(f"unknown dataset {name!r}")


def write_split(name: str, out: Path) -> tuple[str, str, float, dict[str, Any]]:
    """Train/val Parquet files of one dataset, and the standardised logistic regression's val accuracy."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = load_dataset(name)
    xtr, xva, ytr, yva = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    baseline = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000)).fit(xtr, ytr).score(xva, yva)
    paths = []
    for part, (xs, ys) in (("train", (xtr, ytr)), ("val", (xva, yva))):
        cols = {f"f{i:02d}": pa.array(xs[:, i].astype(np.float64)) for i in range(xs.shape[1])}
        cols["label"] = pa.array(ys.astype(np.int64))
        path = out / name / f"{part}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(cols), path)
        paths.append(str(path))
    spread = np.abs(x).mean(axis=0)
    facts = {"rows": len(y), "features": x.shape[1], "classes": int(y.max()) + 1,
             "scale_range": f"{spread.min():.2g}–{spread.max():.2g}"}
    return paths[0], paths[1], float(baseline), facts


def champion(home: Path, model: str) -> dict[str, Any]:
    """The serving manifest of the model's champion (v000001: each benchmark model is promoted once)."""
    return json.loads((home / "serving" / model / "versions" / "v000001" / "MANIFEST.json").read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="wine and breast cancer only")
    parser.add_argument("--workdir", help="keep data, homes and logs here")
    parser.add_argument("--output", default=str(Path(__file__).resolve().parent.parent / "BENCHMARKS.md"))
    args = parser.parse_args()
    names = ["wine", "breast_cancer"] if args.quick else list(DATASETS)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="podium-standardize-"))
    home = work / "home"
    start = time.time()
    start_server(str(home))
    rows, sizes = [], []
    try:
        for name in names:
            train, val, baseline, facts = write_split(name, work / "data")
            results = {}
            for variant, standardize in (("std", True), ("raw", False)):
                model = f"{name}-{variant}".replace("_", "-")
                config = {"run_name": model, "model": model, "storage": str(home / "storage"),
                          "data": {"train": train, "val": val},
                          "training": {**DATASETS[name], "standardize": standardize},
                          "promotion": {"metric": "val_accuracy", "mode": "max"}}
                out = run_podium(str(home), config, str(work))["summary"]
                results[variant] = out["promoted"]["value"]
                m = champion(home, model)
                if standardize:
                    sizes.append([name, f"{m['checkpoint_size_bytes'] / 1024:.1f} KiB", f"{m['size_bytes'] / 1024:.1f} KiB",
                                  f"{m['files']['data/model/model.pt2']['size'] / 1024:.1f} KiB"])
                print(f"{name} {variant}: val_accuracy {results[variant]:.4f} (LR {baseline:.4f})", flush=True)
            rows.append([name, str(facts["rows"]), str(facts["features"]), facts["scale_range"], f"{baseline:.4f}",
                         f"{results['std']:.4f}", f"{results['std'] - baseline:+.4f}", f"{results['raw']:.4f}"])
            if name == "mixed_blobs":  # the size ratio of a wider model (weights dominate both folders)
                config = {"run_name": "wide", "model": "wide", "storage": str(home / "storage"),
                          "data": {"train": train, "val": val}, "training": {"epochs": 1, "hidden_size": 512}}
                run_podium(str(home), config, str(work))
                m = champion(home, "wide")
                sizes.append([f"{name}, hidden 512", f"{m['checkpoint_size_bytes'] / 1024:.1f} KiB",
                              f"{m['size_bytes'] / 1024:.1f} KiB",
                              f"{m['files']['data/model/model.pt2']['size'] / 1024:.1f} KiB"])
    finally:
        stop_server(str(home))
    machine = machine_description()
    body = "\n".join([
        "## The built-in model on mixed-scale tabular data (`benchmarks/standardize.py`)", "",
        f"`python benchmarks/standardize.py{' --quick' if args.quick else ''}`, {time.time() - start:.0f} s, "
        f"{machine['cpu']}, {machine['cores']} cores, revision {machine['revision']}; {load_average()}.", "",
        "Validation accuracy on the same 75/25 split: scikit-learn's standardised logistic regression, and podium's "
        "champion (promoted by val_accuracy) with its standardisation and without it (`--no-standardize`, the loop "
        "before). Scale range: mean absolute value of the smallest and the largest feature.", "",
        markdown_table(["dataset", "rows", "features", "scale range", "LR (standardised)", "podium champion",
                        "vs LR", "podium, raw features"], rows), "",
        "Size of the champion as served (the MLflow model folder: `model.pt2` with the weights, the standardisation "
        "and the graph; MLmodel, signature, input example, environment files, the pyfunc loader) against the "
        "checkpoint it was built from (model weights, Adam state, metadata):", "",
        markdown_table(["dataset", "checkpoint", "served model", "of which model.pt2"], sizes),
    ])
    update_markdown_section(args.output, "standardize", body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
