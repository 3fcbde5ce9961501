"""Typed configuration of a podium run.

It lives in the bottom layer because every layer reads it; it is turned into
plain dicts only at the Ray boundary. Building a config has no side effects.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

IMPORT_PATH_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
RUN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
RUN_NAME_PLACEHOLDERS = {"date": "%Y%m%d", "datetime": "%Y%m%d-%H%M%S"}


def expand_run_name(template: str, when: datetime) -> str:
    """Fill {date} / {datetime} in a run name (a scheduled run gets its own name each night)."""
    out = template
    for key, fmt in RUN_NAME_PLACEHOLDERS.items():
        out = out.replace("{" + key + "}", when.strftime(fmt))
    return out


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


USERINFO_RE = re.compile(r"^[a-z][a-z0-9+.-]*://[^/@]*:[^/@]*@", re.I)


def _check_location(value: str) -> str:
    # a URI such as s3://KEY:SECRET@bucket would end up in Prefect parameters, logs and records
    if USERINFO_RE.match(value or ""):
        raise ValueError("credentials in a URI are not accepted (they would be logged); give them through "
                         "the environment, e.g. AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or an AWS profile")
    return value


def _check_import_path(value: str | None) -> str | None:
    if value is not None and not IMPORT_PATH_RE.match(value):
        raise ValueError(f"expected 'package.module:function', got {value!r}")
    return value


class DataConfig(_Strict):
    """Where the Parquet data lives and which columns to use."""

    train: str = Field("", description="Training Parquet file or dataset directory (path or URI).")
    val: str = Field("", description="Validation Parquet file or dataset directory (path or URI).")
    label_column: str = Field("label", min_length=1, description="Integer class label column.")
    feature_columns: list[str] | None = Field(
        None, description="Numeric feature columns; default: every column but the label."
    )

    @field_validator("train", "val")
    @classmethod
    def _check_uri(cls, v: str) -> str:
        return _check_location(v)


class TrainingConfig(_Strict):
    """Hyperparameters of the built-in loop, and the checkpoint cadence."""

    epochs: int = Field(5, ge=1, description="Number of epochs.")
    batch_size: int = Field(128, ge=1, description="Per-worker batch size.")
    learning_rate: float = Field(1e-2, gt=0, description="Adam learning rate.")
    hidden_size: int = Field(64, ge=1, description="Width of the MLP's hidden layers.")
    checkpoint_every_steps: int | None = Field(
        None, ge=1, description="Checkpoint every N optimizer steps instead of every epoch."
    )
    seed: int = Field(0, description="Random seed.")
    torch_threads: int = Field(1, ge=1, description="torch threads per training/validation process.")
    train_loop: str | None = Field(
        None, description="Your own train_loop_per_worker as 'package.module:function'."
    )
    train_loop_config: dict[str, Any] = Field(
        default_factory=dict, description="Extra keys passed to the train loop's config dict."
    )

    @field_validator("train_loop")
    @classmethod
    def _check_train_loop(cls, v: str | None) -> str | None:
        return _check_import_path(v)


class ScalingConfig(_Strict):
    """Training workers (Ray Train ScalingConfig)."""

    num_workers: int = Field(2, ge=1, description="Number of Ray Train workers.")
    use_gpu: bool = Field(False, description="One GPU per training worker.")
    cpus_per_worker: float = Field(1, gt=0, description="CPUs reserved per training worker.")
    max_failures: int = Field(
        2, ge=-1, description="Worker-group restarts from the latest checkpoint after a failure (-1: unlimited)."
    )


class ValidationConfig(_Strict):
    """Validation tasks: the function, its resources, concurrency and retries."""

    fn: str = Field(
        "training.validate:validate_checkpoint",
        description="Validation function '(checkpoint, **kwargs) -> dict of floats' as an import path.",
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra kwargs for the function.")
    concurrency: int = Field(2, ge=1, description="Validations running at once.")
    num_cpus: float = Field(1, ge=0, description="CPUs per validation task (Ray resource request).")
    num_gpus: float = Field(0, ge=0, description="GPUs per validation task (Ray resource request).")
    resources: dict[str, float] = Field(default_factory=dict, description="Custom Ray resources.")
    retries: int = Field(1, ge=0, description="Retries of a failed validation.")
    retry_delay_s: float = Field(2.0, ge=0, description="Delay between retries.")
    timeout_s: float = Field(600.0, gt=0, description="Timeout of one validation attempt.")

    @field_validator("fn")
    @classmethod
    def _check_fn(cls, v: str) -> str:
        return _check_import_path(v)


class PromotionConfig(_Strict):
    """How the best checkpoint is chosen and when it replaces the champion."""

    metric: str = Field("val_loss", min_length=1, description="Metric that ranks checkpoints.")
    mode: Literal["min", "max"] = Field("min", description="'min' or 'max': which direction is better.")
    min_delta: float = Field(0.0, ge=0, description="Margin by which a candidate must beat the champion.")
    always: bool = Field(False, description="Promote the best checkpoint even if it does not beat the champion.")
    verify: Literal["hashes", "load", "revalidate"] = Field(
        "load", description="How the promoted copy is checked before it becomes current: 'hashes' (every file's "
        "sha256 against the source, always done), 'load' (also load the model from the copy, when it is podium's "
        "checkpoint format) or 'revalidate' (also run the validation function on the copy and compare the metric).")
    verify_tolerance: float = Field(1e-4, ge=0, description="Relative tolerance of the 'revalidate' comparison.")
    registered_model: str = Field("podium", min_length=1, description="MLflow registered model name.")
    alias: str = Field("champion", min_length=1, description="MLflow alias moved to the promoted version.")


    @field_validator("verify", mode="before")
    @classmethod
    def _verify_bool(cls, v: Any) -> Any:
        # podium <= 0.1 took a bool: true re-ran the validation on the copy, false checked hashes only
        if isinstance(v, bool):
            return "revalidate" if v else "hashes"
        return v


class PipelineConfig(_Strict):
    """Everything one podium run needs. Locations left empty are filled from settings."""

    run_name: str = Field("podium-demo", description="Run name (Ray RunConfig name, MLflow run name).")
    experiment: str = Field("podium", min_length=1, description="MLflow experiment name.")
    storage: str = Field("", description="Ray Train storage_path (path or URI).")
    serving: str = Field("", description="Serving location: promoted versions and the CURRENT pointer.")
    data: DataConfig = Field(default_factory=DataConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    scaling: ScalingConfig = Field(default_factory=ScalingConfig)
    validation: ValidationConfig = Field(default_factory=ValidationConfig)
    promotion: PromotionConfig = Field(default_factory=PromotionConfig)

    @field_validator("storage", "serving")
    @classmethod
    def _check_uri(cls, v: str) -> str:
        return _check_location(v)

    @field_validator("run_name")
    @classmethod
    def _check_run_name(cls, v: str) -> str:
        if not RUN_NAME_RE.match(expand_run_name(v, datetime(2000, 1, 1))):
            raise ValueError(
                "expected 1-100 characters of letters, digits, '_', '.', '-', starting with a letter or digit "
                "(placeholders {date} and {datetime} are filled from the run's scheduled start)"
            )
        return v

    def at(self, when: datetime) -> "PipelineConfig":
        """This config with the run name's placeholders filled for a run starting at `when`."""
        return self.model_copy(update={"run_name": expand_run_name(self.run_name, when)})


class ConfigError(ValueError):
    """Invalid configuration: names the field, the value and what was expected."""


def format_validation_error(err: ValidationError, prefix: str = "") -> str:
    """Render a pydantic error as one line per field: 'field = value: expected ...'."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if p != "__root__")
        field = f"{prefix}{loc}" if loc else prefix.rstrip(".") or "config"
        value = e.get("input")
        shown = repr(value) if not isinstance(value, dict) else "{...}"
        shown = re.sub(r"([a-z][a-z0-9+.-]*://)[^/@'\"]*@", r"\1***@", shown, flags=re.I)  # never echo credentials
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"{field} = {shown}: {msg}")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def build_config(data: dict[str, Any]) -> PipelineConfig:
    """Validate a nested dict into a PipelineConfig, raising ConfigError with readable lines."""
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None
