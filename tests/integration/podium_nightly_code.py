"""A tiny user loop and validation function for the nightly tests, on plain Ray Train APIs.

The model is a linear classifier on 4 features whose true boundary is feature 0 > 0. Its quality is set
by the loop config, not learned, so a test knows each night's numbers in advance: the weight vector is
the true one turned by `angle_deg`, whose error rate on clean data is angle/180 (features are isotropic
Gaussians). Each epoch's checkpoint is turned by (epochs - epoch) x angle_deg: the last one is the best.
Its confidence is `scale` (the logistic loss of sigmoid(scale * w.x)): accuracy does not depend on it, the
loss does, so an overconfident model can be more accurate and have a worse loss. The validation function
gives per-row values under podium's key when asked (`per_row`).

`load_linear` is a `promotion.model_loader` for these checkpoints: the weights as a torch module, so that their
versions are MLflow models `podium serve` can serve. A loop config's `nan_below` (saved with the weights) makes
that module answer NaN where f1 is below it: a value the data never holds (features are standard Gaussians), so
validation does not see it, but a live request can.
"""

from __future__ import annotations

import json
import math
import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray.train

FEATURES = ["f0", "f1", "f2", "f3"]


def write_data(path: str, rows: int, label_noise: float, seed: int) -> str:
    """Parquet rows with label = (f0 > 0), each label flipped with probability `label_noise`."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, len(FEATURES)))
    y = (x[:, 0] > 0).astype(np.int64) ^ (rng.random(rows) < label_noise).astype(np.int64)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.table({**{f: x[:, i] for i, f in enumerate(FEATURES)}, "label": y}), path)
    return path


def expected_accuracy(angle_deg: float, label_noise: float) -> float:
    """What a model turned by `angle_deg` scores on data with `label_noise` (in expectation)."""
    err = angle_deg / 180.0
    return (1 - err) * (1 - label_noise) + err * label_noise


def weights(config: dict, epoch: int) -> dict:
    """What epoch `epoch` of a run with loop config `config` saves as weights.json (see the module)."""
    epochs, angle, scale = int(config["epochs"]), float(config["angle_deg"]), float(config.get("scale", 1.0))
    theta = math.radians(angle * (epochs - epoch))
    saved = {"w": [math.cos(theta), math.sin(theta), 0.0, 0.0], "epoch": epoch, "scale": scale}
    if config.get("nan_below") is not None:
        saved["nan_below"] = float(config["nan_below"])
    if config.get("fail_below") is not None:
        saved["fail_below"] = float(config["fail_below"])
    return saved


def load_linear(checkpoint_dir: str):
    """promotion.model_loader: the checkpoint's linear model as a torch module, 4 features in, 2 logits out (see
    the module for `nan_below`)."""
    import torch

    with open(os.path.join(checkpoint_dir, "weights.json")) as f:
        saved = json.load(f)

    class Linear(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("w", torch.tensor(saved["w"], dtype=torch.float32) * float(saved.get("scale", 1.0)))
            self.nan_below = saved.get("nan_below")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            z = x @ self.w
            if self.nan_below is not None:
                z = torch.where(x[:, 1] < self.nan_below, torch.full_like(z, float("nan")), z)
            return torch.stack([-z / 2, z / 2], dim=1)

    return Linear().eval()


class FailingLinear:
    """The linear model as an object with predict(DataFrame) (served through MLflow's pyfunc path): it answers the
    labels the module would, but raises on a request with a row whose f1 is below `fail_below` (a value the data
    never holds: validation does not see it, a live request can), so its server answers that request with an error."""

    def __init__(self, saved: dict) -> None:
        self.w = np.asarray(saved["w"], dtype="float64") * float(saved.get("scale", 1.0))
        self.fail_below = saved.get("fail_below")

    def predict(self, frame):  # type: ignore[no-untyped-def]
        x = frame[FEATURES].to_numpy(dtype="float64")
        if self.fail_below is not None and bool((x[:, 1] < self.fail_below).any()):
            raise ValueError(f"f1 below {self.fail_below}: this model cannot answer it")
        return ((x @ self.w) > 0).astype("int64")


def load_failing(checkpoint_dir: str) -> FailingLinear:
    """promotion.model_loader: the checkpoint's linear model as a FailingLinear (see it for `fail_below`)."""
    with open(os.path.join(checkpoint_dir, "weights.json")) as f:
        return FailingLinear(json.load(f))


def train_func(config: dict) -> None:
    """Report one checkpoint per epoch; the weights come from the config (see the module)."""
    for epoch in range(int(config["epochs"])):
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if ray.train.get_context().get_world_rank() == 0:
                with open(os.path.join(tmp, "weights.json"), "w") as f:
                    json.dump(weights(config, epoch), f)
                checkpoint = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report({"epoch": epoch}, checkpoint=checkpoint)


def validate_fn(checkpoint: ray.train.Checkpoint, val_data: str, label_column: str, feature_columns: list,
                calls_log: str | None = None, per_row: bool = False, fail_epoch: int | None = None) -> dict:
    """Accuracy and logistic loss of the checkpoint's linear model on the validation Parquet data; with
    `per_row`, each row's too, under podium's documented key. The epoch `fail_epoch` raises."""
    with checkpoint.as_directory() as d:
        with open(os.path.join(d, "weights.json")) as f:
            saved = json.load(f)
    if fail_epoch is not None and int(saved["epoch"]) == int(fail_epoch):
        raise RuntimeError(f"validation data unavailable for epoch {fail_epoch}")
    w, scale = np.array(saved["w"]), float(saved.get("scale", 1.0))
    table = pq.read_table(val_data)
    x = np.column_stack([table.column(c).to_numpy() for c in feature_columns])
    y = table.column(label_column).to_numpy()
    if calls_log:
        with open(calls_log, "a") as f:
            f.write(f"{checkpoint.path}\n")
    right = ((x @ w > 0).astype(np.int64) == y).astype(np.float64)
    loss = np.logaddexp(0.0, -(2 * y - 1) * scale * (x @ w))
    out = {"accuracy": float(right.mean()), "loss": float(loss.mean())}
    if per_row:
        out["podium.per_row"] = {"accuracy": right, "loss": loss}
    return out

