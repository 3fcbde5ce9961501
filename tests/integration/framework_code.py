"""Ray's Lightning and Transformers guides as a user copies them, on tabular data; nothing here knows podium.

- `lightning_train_func`: Ray's "Get started with PyTorch Lightning" loop (`RayDDPStrategy`,
  `RayLightningEnvironment`, `callbacks=[RayTrainReportCallback()]`, `prepare_trainer`, and the
  guide's resume from `ray.train.get_checkpoint()`), with the guide's image classifier swapped for
  a small one on the run's Parquet features. `RayTrainReportCallback()` says nothing of validation:
  in Ray 2.60 it passes `validation=False` to every report all the same.
- `transformers_train_func`: Ray's "Get started with Hugging Face Transformers" loop (`Trainer`,
  evaluation and saving every epoch, `RayTrainReportCallback`, `prepare_trainer`), with a tiny BERT
  built from a config (no download) classifying rows of token ids.
- A validation function for each, loading the checkpoint the framework's callback wrote.

The loops read podium's facts from `config["podium"]` (train_data, val_data, label_column,
feature_columns), as a user's loop run by podium with `--train-data`/`--val-data` does.
"""

from __future__ import annotations

import os
import tempfile

import lightning.pytorch as pl
import numpy as np
import pandas as pd
import ray.train
import ray.train.lightning
import torch
from torch import nn

# --- Lightning ------------------------------------------------------------------------------------


class TabularClassifier(pl.LightningModule):
    """The guide's LightningModule, on float32 features (16 in the tests' data) with 4 classes."""

    def __init__(self, num_features: int = 16, num_classes: int = 4, lr: float = 0.01):
        super().__init__()
        self.save_hyperparameters()
        self.model = nn.Sequential(nn.Linear(num_features, 32), nn.ReLU(), nn.Linear(32, num_classes))
        self.criterion = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self.criterion(self.forward(x), y)
        self.log("loss", loss, on_step=True, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.model.parameters(), lr=self.hparams.lr)


def _columns(path: str, label: str, features: list[str] | None) -> tuple[pd.DataFrame, list[str]]:
    """The data, and its feature columns: those given, else every column but the label."""
    df = pd.read_parquet(path)
    return df, features or [c for c in df.columns if c != label]


def _tabular(path: str, label: str, features: list[str] | None) -> tuple[torch.Tensor, torch.Tensor]:
    df, features = _columns(path, label, features)
    return torch.from_numpy(df[features].to_numpy(np.float32)), torch.from_numpy(df[label].to_numpy(np.int64))


def lightning_train_func(config: dict) -> None:
    facts = config["podium"]
    x, y = _tabular(facts["train_data"], facts["label_column"], facts.get("feature_columns"))
    model = TabularClassifier(num_features=x.shape[1], num_classes=int(y.max()) + 1)
    train_dataloader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=256, shuffle=True)

    trainer = pl.Trainer(
        max_epochs=config.get("epochs", 3),
        devices="auto",
        accelerator="auto",
        strategy=ray.train.lightning.RayDDPStrategy(),
        plugins=[ray.train.lightning.RayLightningEnvironment()],
        callbacks=[ray.train.lightning.RayTrainReportCallback()],
        # [1a] Optionally, disable the default checkpointing behavior
        # in favor of the `RayTrainReportCallback` above.
        enable_checkpointing=False,
    )
    trainer = ray.train.lightning.prepare_trainer(trainer)
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as ckpt_dir:
            ckpt_path = os.path.join(ckpt_dir, ray.train.lightning.RayTrainReportCallback.CHECKPOINT_NAME)
            trainer.fit(model, train_dataloaders=train_dataloader, ckpt_path=ckpt_path)
    else:
        trainer.fit(model, train_dataloaders=train_dataloader)


def _scores(logits: torch.Tensor, y: torch.Tensor) -> dict:
    return {"val_loss": nn.functional.cross_entropy(logits, y).item(),
            "val_accuracy": (logits.argmax(1) == y).float().mean().item()}


def validate_lightning(checkpoint: ray.train.Checkpoint, val_data: str, label_column: str,
                       feature_columns: list[str] | None = None) -> dict:
    x, y = _tabular(val_data, label_column, feature_columns)
    with checkpoint.as_directory() as d:
        model = TabularClassifier.load_from_checkpoint(os.path.join(d, "checkpoint.ckpt"), map_location="cpu")
    model.eval()
    with torch.no_grad():
        return _scores(model(x), y)


# --- Transformers ---------------------------------------------------------------------------------

VOCAB = 16


def token_rows(n: int, seed: int, length: int = 8) -> pd.DataFrame:
    """Rows of token ids; the label says whether most tokens are from the upper half of the vocabulary."""
    tokens = np.random.default_rng(seed).integers(0, VOCAB, size=(n, length))
    df = pd.DataFrame({f"tok_{i}": tokens[:, i] for i in range(length)})
    df["label"] = ((tokens >= VOCAB // 2).sum(axis=1) > length // 2).astype(np.int64)
    return df


def tiny_bert(num_tokens: int):
    from transformers import BertConfig, BertForSequenceClassification

    return BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=num_tokens, num_labels=2))


class TokenRows(torch.utils.data.Dataset):
    def __init__(self, path: str, label: str, features: list[str] | None):
        df, features = _columns(path, label, features)
        self.ids = torch.from_numpy(df[features].to_numpy(np.int64))
        self.labels = torch.from_numpy(df[label].to_numpy(np.int64))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def transformers_train_func(config: dict) -> None:
    from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer
    from transformers import Trainer, TrainingArguments

    facts = config["podium"]
    train = TokenRows(facts["train_data"], facts["label_column"], facts.get("feature_columns"))
    evaluation = TokenRows(facts["val_data"], facts["label_column"], facts.get("feature_columns"))
    model = tiny_bert(train.ids.shape[1])

    training_args = TrainingArguments(
        tempfile.mkdtemp(prefix="test_trainer-"), eval_strategy="epoch", save_strategy="epoch", report_to="none",
        num_train_epochs=config.get("epochs", 2), learning_rate=5e-3, per_device_train_batch_size=64,
        logging_strategy="epoch")
    trainer = Trainer(model=model, args=training_args, train_dataset=train, eval_dataset=evaluation)
    # [2] Report Metrics and Checkpoints to Ray Train
    callback = RayTrainReportCallback()
    trainer.add_callback(callback)
    # [3] Prepare Transformers Trainer
    trainer = prepare_trainer(trainer)
    trainer.train()


def validate_transformers(checkpoint: ray.train.Checkpoint, val_data: str, label_column: str,
                          feature_columns: list[str] | None = None) -> dict:
    from transformers import BertForSequenceClassification

    data = TokenRows(val_data, label_column, feature_columns)
    with checkpoint.as_directory() as d:
        model = BertForSequenceClassification.from_pretrained(os.path.join(d, "checkpoint")).eval()
    with torch.no_grad():
        return _scores(model(input_ids=data.ids).logits, data.labels)
