"""Small, real inputs shared by the unit tests: Parquet files, a demo dataset, a saved checkpoint."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

from podium.training.checkpoint import CheckpointMeta, save_checkpoint
from podium.training.data import make_classification_data
from podium.training.model import ModelSpec, build_model

SPEC = ModelSpec(in_features=3, num_classes=2, hidden_size=8)


@dataclass(frozen=True)
class SavedCheckpoint:
    directory: str
    model: nn.Module
    meta: CheckpointMeta

    @property
    def path(self) -> Path:
        return Path(self.directory)

    def outputs(self, model: nn.Module | None = None) -> torch.Tensor:
        """Outputs of `model` (default: the saved one) on a fixed input."""
        x = torch.linspace(-1, 1, 5 * SPEC.in_features).reshape(5, SPEC.in_features)
        with torch.no_grad():
            return (model or self.model).eval()(x)


@pytest.fixture
def saved_checkpoint(tmp_path: Path) -> SavedCheckpoint:
    """A checkpoint of a small MLP written by save_checkpoint."""
    torch.manual_seed(0)
    model = build_model(SPEC)
    meta = CheckpointMeta(model=SPEC, epoch=1, step=7, metrics={"val_loss": 0.5}, config={"epochs": 1},
                          feature_columns=["a", "b", "c"], label_column="label")
    directory = str(tmp_path / "checkpoint")
    save_checkpoint(directory, model, torch.optim.Adam(model.parameters()), meta)
    return SavedCheckpoint(directory, model, meta)


@pytest.fixture
def write_parquet(tmp_path: Path) -> Callable[..., str]:
    """write_parquet('x.parquet', label=[...], f0=[...]) -> path of a Parquet file under tmp_path."""

    def write(name: str, /, **columns: Any) -> str:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(columns), path)
        return str(path)

    return write


@pytest.fixture
def demo_data(tmp_path: Path) -> tuple[str, str]:
    """A tiny deterministic (train, val) pair: 3 features f00..f02, 3 classes."""
    return make_classification_data(str(tmp_path / "data"), train_rows=60, val_rows=30,
                                    num_features=3, num_classes=3, seed=0)
