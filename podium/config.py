"""Typed configuration of a podium run, and loading it from a file plus overrides.

Every layer reads it; it is turned into plain dicts only at the Ray boundary. Defaults are
stated here once (the CLI's help reads them from the model). Building a config has no side
effects.

Why one module of this size: the models are the configuration's one source of truth (the CLI's
defaults and the documentation's reference are read from them); each section's model sits beside the
checks of its fields.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote, unquote

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from podium.core.redaction import SECRET_KEY, has_password, redact_uri
from podium.errors import ConfigError

if TYPE_CHECKING:
    from podium.settings import PodiumSettings

BUILTIN_LOOP = "podium.training.loop:train_loop_per_worker"
BUILTIN_VALIDATE = "podium.training.validate:validate_checkpoint"
# podium <= 0.1 installed its packages as top-level `training`, `tasks`...: configs that name the
# built-ins by those paths keep working, with a warning
OLD_IMPORT_PATHS = {"training.loop:train_loop_per_worker": BUILTIN_LOOP,
                    "training.validate:validate_checkpoint": BUILTIN_VALIDATE}
IMPORT_PATH_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
RUN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
# a model name is also a folder name under <home>/serving and an MLflow registered model name
MODEL_NAME_RE = RUN_NAME_RE
DEFAULT_MODEL = "podium"
RUN_NAME_PLACEHOLDERS = {"date": "%Y%m%d", "datetime": "%Y%m%d-%H%M%S"}
# a `[storage]` table's location: userfs://<factory>[;<filesystem_kwargs as JSON, percent-encoded>]/<path>
USERFS_SCHEME = "userfs"
# the one key podium adds to a user loop's config (podium's facts); refused in train_loop_config
LOOP_CONFIG_PODIUM_KEY = "podium"
# settings of the built-in loop only: a user loop gets its own from train_loop_config
BUILTIN_LOOP_SETTINGS = ("epochs", "batch_size", "learning_rate", "hidden_size", "checkpoint_every_steps", "seed",
                         "shuffle", "shuffle_window_rows", "cache")


def expand_run_name(template: str, when: datetime) -> str:
    """Fill {date} / {datetime} in a run name (a scheduled run gets its own name each night)."""
    out = template
    for key, fmt in RUN_NAME_PLACEHOLDERS.items():
        out = out.replace("{" + key + "}", when.strftime(fmt))
    return out


class _Strict(BaseModel):
    # strict: a value of another type is refused, never coerced (TOML's `keep = true` would be 1, `keep = "2"` 2);
    # a whole number is still a number where one is expected (`learning_rate = 1`)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)


def _check_location(value: str) -> str:
    # a URI such as s3://KEY:SECRET@bucket would end up in Prefect parameters, logs and records
    if has_password(value):
        raise ValueError("credentials in a URI are not accepted (they would be logged); give them through "
                         "the environment, e.g. AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or an AWS profile")
    return value


def _check_import_path(value: str | None) -> str | None:
    if value in OLD_IMPORT_PATHS:
        warnings.warn(f"{value!r} is the import path of podium 0.1; it is now {OLD_IMPORT_PATHS[value]!r} "
                      "(the old path will stop working in a later release)", FutureWarning, stacklevel=2)
        return OLD_IMPORT_PATHS[value]
    if value is not None and not IMPORT_PATH_RE.match(value):
        raise ValueError(f"expected 'package.module:function', got {value!r}")
    return value


class StorageFilesystemConfig(_Strict):
    """`storage` as a table: checkpoints in a filesystem of your own (Ray Train's storage_filesystem)."""

    path: str = Field(min_length=1, description="Where checkpoints go inside your filesystem (Ray Train's "
                      "storage_path).")
    filesystem: str = Field(
        min_length=1, description="'package.module:function' returning a pyarrow.fs.FileSystem, called with "
        "filesystem_kwargs. Every process that reads or writes storage calls it (Ray's workers included), so the "
        "module must be importable there, as your training loop's is.")
    filesystem_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of the filesystem function: JSON values, no "
        "credentials (they travel in the storage location, which logs and records show).")

    @field_validator("filesystem")
    @classmethod
    def _check_filesystem(cls, v: str) -> str:
        return _check_import_path(v) or v

    @field_validator("filesystem_kwargs")
    @classmethod
    def _check_kwargs(cls, v: dict[str, Any]) -> dict[str, Any]:
        secret = sorted(k for k in v if SECRET_KEY.search(k))
        if secret:
            raise ValueError(f"{', '.join(secret)}: credentials are not accepted here (they would be logged); "
                             "let the filesystem function read them from the environment")
        try:
            json.dumps(v, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"expected JSON values ({exc})") from None
        return v

    def location(self) -> str:
        """The storage location podium passes around: userfs://<filesystem>[;<kwargs>]/<path>."""
        netloc = self.filesystem
        if self.filesystem_kwargs:
            netloc += ";" + quote(json.dumps(self.filesystem_kwargs, sort_keys=True, separators=(",", ":")), safe="")
        return f"{USERFS_SCHEME}://{netloc}/{self.path}".rstrip("/")


def parse_userfs_location(location: str) -> tuple[str, dict[str, Any], str]:
    """(filesystem function, its kwargs, the path inside the filesystem) of a userfs:// location."""
    rest = location[len(USERFS_SCHEME) + 3:] if location.lower().startswith(f"{USERFS_SCHEME}://") else ""
    netloc, _, path = rest.partition("/")
    factory, _, kwargs = netloc.partition(";")
    if not IMPORT_PATH_RE.match(factory):
        raise ValueError(f"{location!r}: expected {USERFS_SCHEME}://package.module:function/path")
    try:
        parsed = json.loads(unquote(kwargs)) if kwargs else {}
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise ValueError(f"{location!r}: the filesystem's kwargs after ';' are not a JSON object")
    return factory, parsed, path


class DataConfig(_Strict):
    """Where the Parquet data lives and which columns to use."""

    train: str = Field("", description="Training Parquet file or dataset directory (path or URI).")
    val: str = Field("", description="Validation Parquet file or dataset directory (path or URI).")
    label_column: str = Field("label", min_length=1, description="Integer class label column.")
    feature_columns: list[str] | None = Field(
        None, description="Numeric feature columns; default: every column but the label."
    )
    allow: list[Literal["non_finite_features", "unseen_labels", "schema_mismatch"]] = Field(
        default_factory=list, description="Data problems to report instead of refusing: NaN, infinite or null "
        "feature values; validation labels outside the training labels' range; validation columns that differ "
        "in type from training's, or that training has not.")
    ray_datasets: bool = Field(
        False, description="Hand your own loop Ray Datasets built from data.train and data.val: "
        "ray.train.get_dataset_shard('train') / ('val'), each split across the workers.")

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
    early_stop_patience: int | None = Field(
        None, ge=1, description="Stop training once this many validations in a row, in step order, did not "
        "improve the promotion metric (promotion.metric, promotion.mode) on the best so far by more than "
        "early_stop_min_delta. Ray Train is stopped (the checkpoints it saved stay), running validations finish, "
        "and the best is promoted as usual. For the built-in loop and your own alike. None: train every epoch.")
    early_stop_min_delta: float = Field(
        0.0, ge=0, description="The improvement on the best so far that counts as one (early stopping).")
    shuffle: Literal["none", "local", "global"] = Field(
        "local", description="Shuffling each epoch: 'local' (files in a new order, rows shuffled within windows "
        "of shuffle_window_rows), 'global' (a full shuffle of the dataset through Ray's object store, for data "
        "stored sorted) or 'none'.")
    shuffle_window_rows: int = Field(
        65536, ge=1, description="Rows each worker takes from Ray Data at once and shuffles ('local' shuffle).")
    cache: Literal["never", "auto", "always"] = Field(
        "never", description="'never': read the training data anew each epoch, streaming. 'always': read it "
        "once into Ray's object store (Dataset.materialize()) before training, so that epochs read nothing from "
        "storage (what does not fit spills to disk); 'auto': that when its columns, decoded, take at most a "
        "quarter of the object store (the Parquet footers tell).")
    torch_threads: int = Field(1, ge=1, description="torch threads per training/validation process.")
    standardize: bool = Field(True, description="Standardise every feature with the training data's mean and "
                              "standard deviation (built-in loop); kept in the checkpoint and the served model.")
    train_loop: str | None = Field(
        None, description="Your own train_loop_per_worker as 'package.module:function'."
    )
    train_loop_config: dict[str, Any] = Field(
        default_factory=dict, description="Your loop's train_loop_config: it gets exactly these keys, plus "
        f"'{LOOP_CONFIG_PODIUM_KEY}' (podium's facts: run name, data locations)."
    )
    loop_datasets: dict[str, str] = Field(
        default_factory=dict, description="Keys of your loop's config whose value is a Ray Dataset read from "
        "this Parquet location (ray.data.read_parquet), as Ray's guides pass a validation dataset."
    )

    @field_validator("train_loop")
    @classmethod
    def _check_train_loop(cls, v: str | None) -> str | None:
        return _check_import_path(v)

    @field_validator("loop_datasets")
    @classmethod
    def _check_datasets(cls, v: dict[str, str]) -> dict[str, str]:
        for location in v.values():
            _check_location(location)
        return v


class ScalingConfig(_Strict):
    """Training workers (Ray Train ScalingConfig)."""

    num_workers: int = Field(2, ge=1, description="Number of Ray Train workers.")
    use_gpu: bool = Field(False, description="One GPU per training worker.")
    cpus_per_worker: float = Field(1, gt=0, description="CPUs reserved per training worker.")
    data_cpus: float = Field(
        1, gt=0, description="CPUs Ray Data may use to read the training data while training runs (kept apart "
        "from the training workers' and the validations').")
    max_failures: int = Field(
        2, ge=-1, description="Worker-group restarts from the latest checkpoint after a failure (-1: unlimited)."
    )


class ValidationConfig(_Strict):
    """Validation tasks: the function, its resources, concurrency and retries."""

    fn: str = Field(
        BUILTIN_VALIDATE,
        description="Validation function '(checkpoint, **kwargs) -> dict of floats' as an import path.",
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra kwargs for the function.")
    concurrency: int = Field(2, ge=1, description="Validations running at once.")
    num_cpus: float = Field(1, ge=0, description="CPUs per validation task (Ray resource request).")
    num_gpus: float = Field(0, ge=0, description="GPUs per validation task (Ray resource request).")
    inner_cpus: float = Field(0, ge=0, description="CPUs the validation function's own Ray work takes while it "
                              "runs (a TorchTrainer's workers, map_batches actors and read tasks), on top of "
                              "num_cpus: reserved for every concurrent validation.")
    resources: dict[str, float] = Field(default_factory=dict, description="Custom Ray resources.")
    retries: int = Field(1, ge=0, description="Retries of a failed validation.")
    retry_delay_s: float = Field(2.0, ge=0, description="Delay between retries.")
    timeout_s: float = Field(600.0, gt=0, description="Timeout of one validation attempt, counted from the moment "
                             "it starts running (not its wait for a worker process or for resources).")

    @field_validator("fn")
    @classmethod
    def _check_fn(cls, v: str) -> str | None:
        return _check_import_path(v)


class ThresholdConfig(_Strict):
    """A bound a candidate's own metric must meet to be promoted (`promotion.thresholds`)."""

    min: float | None = Field(None, description="The metric must be at least this.")
    max: float | None = Field(None, description="The metric must be at most this.")

    @model_validator(mode="after")
    def _check_bounds(self) -> ThresholdConfig:
        if self.min is None and self.max is None:
            raise ValueError("expected min, max or both")
        for name, v in (("min", self.min), ("max", self.max)):
            if v is not None and not math.isfinite(v):
                raise ValueError(f"{name} = {v}: expected a finite number")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min = {self.min} is above max = {self.max}: no value could pass")
        return self


class GuardConfig(_Strict):
    """A metric that must not regress against the champion, measured on the same data (`promotion.guards`):
    exactly one limit, absolute or relative to the champion's value (0.01 = 1 %)."""

    max_increase: float | None = Field(None, ge=0, description="At most this much above the champion's value.")
    max_decrease: float | None = Field(None, ge=0, description="At most this much below the champion's value.")
    max_relative_increase: float | None = Field(
        None, ge=0, description="At most this fraction of the champion's value above it.")
    max_relative_decrease: float | None = Field(
        None, ge=0, description="At most this fraction of the champion's value below it.")

    @model_validator(mode="after")
    def _one_limit(self) -> GuardConfig:
        given = [k for k, v in self.model_dump().items() if v is not None]
        if len(given) != 1:
            raise ValueError(f"expected exactly one of max_increase, max_decrease, max_relative_increase, "
                             f"max_relative_decrease; got {given or 'none'}")
        if not math.isfinite(getattr(self, given[0])):
            raise ValueError(f"{given[0]}: expected a finite number")
        return self


class ShadowConfig(_Strict):
    """The shadow stage of a promotion (`promotion.rollout = "shadow"`): the candidate answers a copy of live
    requests beside the champion, which still answers them, and is promoted only if its answers meet these limits
    (see the Serving live page)."""

    requests: int = Field(200, ge=1, description="Live requests the candidate answers in shadow: the shadow ends "
                          "once the replicas of `podium serve` mirrored this many, or at duration_s.")
    duration_s: float = Field(600.0, gt=0, description="The longest a shadow lasts, in seconds: it is decided on the "
                              "requests mirrored by then.")
    max_error_rate: float = Field(0.0, ge=0, le=1, description="The largest share of mirrored requests the candidate "
                                  "may fail: an exception, an answer other than 200, or a NaN or infinite prediction.")
    max_latency_p95_ratio: float = Field(1.5, gt=0, description="The candidate's 95th percentile latency may be at "
                                         "most this multiple of the champion's, on the same requests.")
    min_agreement: float = Field(0.9, ge=0, le=1, description="The smallest share of predictions (rows) on which the "
                                 "candidate must give the champion's answer.")
    agreement_tolerance: float = Field(1e-6, ge=0, description="Numbers closer than this (absolute, or relative to "
                                       "the larger) count as the same answer; labels must be equal.")
    on_no_traffic: Literal["refuse", "promote"] = Field(
        "refuse", description="What a shadow that mirrored no request by its end means: the candidate is not "
        "promoted ('refuse'), or it is ('promote'); either is recorded with the reason.")

    @field_validator("duration_s", "max_latency_p95_ratio", "agreement_tolerance")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError(f"{v}: expected a finite number")
        return v


class WatchConfig(_Strict):
    """The watch after the switch (`[promotion.watch]`): for `duration_s` after a promotion made its version
    current, the replicas of `podium serve` count the new champion's live answers, and a limit broken against the
    previous champion's own numbers rolls it back on its own (see the Serving live page)."""

    duration_s: float = Field(600.0, gt=0, description="How long the new champion is watched after the switch, in "
                              "seconds; a promotion whose watch passed is final.")
    max_error_rate_increase: float = Field(0.0, ge=0, le=1, description="How far the new champion's share of failed "
                                           "live requests (an answer other than 200) may rise above the previous "
                                           "champion's, as the same replicas counted it.")
    max_latency_p95_ratio: float = Field(2.0, gt=0, description="The new champion's 95th percentile latency, as the "
                                         "replicas measure it, may be at most this multiple of the previous "
                                         "champion's (not judged where the replicas have no number of it).")
    min_requests: int = Field(20, ge=1, description="Live requests the new champion must have answered before a "
                              "limit is judged: fewer by the end of the watch, and it passes, saying so.")

    @field_validator("duration_s", "max_latency_p95_ratio")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError(f"{v}: expected a finite number")
        return v


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
    rescore: Literal["refuse", "stored"] = Field(
        "refuse", description="The champion is scored again on the candidate's validation data when its number was "
        "measured on other data (one validation). If it cannot be (its format or the validation function changed): "
        "'refuse' to promote, or compare with its 'stored' number, saying so.")
    registered_model: str = Field("", description="MLflow registered model name (default: the model name).")
    alias: str = Field("champion", min_length=1, description="MLflow alias moved to the promoted version: the serving "
                       "location's own (a second serving location of the model takes another, e.g. 'canary'); a "
                       "candidate awaiting approval waits under 'challenger' beside 'champion', '<alias>-challenger' "
                       "beside any other.")
    thresholds: dict[str, ThresholdConfig] = Field(
        default_factory=dict, description="Bounds the candidate's own metrics must meet, every one, to be promoted "
        "(the first promotion included), e.g. val_accuracy = { min = 0.9 }. A missing or NaN metric fails.")
    guards: dict[str, GuardConfig] = Field(
        default_factory=dict, description="Metrics that must not regress against the champion, measured on the "
        "same validation data (re-scored like the promotion metric), e.g. val_loss = { max_increase = 0.01 }.")
    confidence: float | None = Field(
        None, gt=0, lt=1, description="Promote only when the lower bound of a paired bootstrap interval at this "
        "level (e.g. 0.95) of the candidate's gain over the champion, row by row on the same validation rows, is "
        "above min_delta. Needs per-row values from the validation function (the built-in gives them): see "
        "confidence_without_rows.")
    confidence_without_rows: Literal["refuse", "point"] = Field(
        "refuse", description="What promotion.confidence does when the validation function gives no per-row values "
        "for the promotion metric: 'refuse' to promote (a validation function that takes no per_row argument is "
        "refused before training), or compare the 'point' values, saying so in the decision.")
    approval: Literal["none", "required"] = Field(
        "none", description="'required': a candidate that passes every check waits for a person's decision under "
        "the MLflow alias 'challenger'; the flow run pauses with a form in the Prefect UI, and `podium approve` / "
        "`podium reject` answer from the project folder. 'none': promote unattended.")
    approval_timeout_s: float = Field(
        3600.0, gt=0, description="How long a candidate waits for a decision (approval 'required').")
    approval_on_timeout: Literal["reject", "approve"] = Field(
        "reject", description="What no decision within approval_timeout_s means: the candidate is not promoted "
        "('reject'), or it is ('approve'); either is recorded as the timeout's decision.")
    rollout: Literal["direct", "shadow"] = Field(
        "direct", description="How a candidate that passed every check replaces the champion: 'direct' (switched "
        "in at once) or 'shadow' (it first answers a copy of the live requests `podium serve` receives, beside the "
        "champion, and is promoted only if its errors, latency and agreement meet promotion.shadow). The first "
        "promotion of a location has no champion to shadow: it is direct.")
    shadow: ShadowConfig = Field(default_factory=ShadowConfig, description="The shadow stage's length and limits "
                                 "(promotion.rollout 'shadow').")
    watch: WatchConfig | None = Field(
        None, description="The watch after the switch: with a [promotion.watch] table, a promotion that replaced a "
        "champion watches the new one's live errors and latency for watch.duration_s and rolls it back on its own "
        "if a limit breaks. None (the default): a promotion is final at its switch.")
    model_loader: str | None = Field(
        None, description="For checkpoints not in podium's format: 'package.module:function' taking the checkpoint "
        "folder and returning a torch module (float32 features in, logits out) or an object with predict(DataFrame); "
        "podium builds the served MLflow model from it. Without one (and without promotion.model_class) such "
        "checkpoints are served as files: podium.load_promoted_model and mlflow.pyfunc cannot load them.")

    model_class: str | None = Field(
        None, description="'package.module:Class', the model's class, named once. Without promotion.model_loader, "
        "for a loop of your own that saves its module's state_dict() with torch.save: podium builds Class() (its "
        "arguments need defaults; checked before training) and loads the checkpoint's model.pt, or its only .pt / "
        ".pth file, into it (podium.training.loaders:state_dict); the champion is a served MLflow model. With a "
        "loader, it is handed to it as model_class=: the LightningModule for podium.training.loaders:lightning, "
        "the torch module for podium.training.loaders:sharded.")

    allow_files: bool = Field(
        False, description="Let a version served as files (a checkpoint podium builds no MLflow model from: neither "
        "model_class nor model_loader, nor podium's format) replace a champion that loads as an MLflow model. Without "
        "it such a promotion is refused, so that models:/<model>@<alias> keeps loading; see Promotion policy, "
        "A version served as files.")

    @field_validator("model_loader", "model_class")
    @classmethod
    def _check_loader(cls, v: str | None) -> str | None:
        # "" clears it: `podium promote --model-class ""` promotes a run recorded with a class without one
        return None if v == "" else _check_import_path(v)


    @field_validator("alias")
    @classmethod
    def _alias_mlflow_takes(cls, v: str) -> str:
        # MLflow's own rule for alias names, checked here rather than at the registration after a training
        if not re.fullmatch(r"[\w\-]+", v) or v.lower() == "latest" or re.fullmatch(r"[vV]\d+", v):
            raise ValueError("expected letters, digits, '_' and '-', not 'latest' nor 'v' and a number "
                             "(MLflow's aliases)")
        return v

    @field_validator("verify", mode="before")
    @classmethod
    def _verify_bool(cls, v: Any) -> Any:
        # podium <= 0.1 took a bool: true re-ran the validation on the copy, false checked hashes only
        if isinstance(v, bool):
            return "revalidate" if v else "hashes"
        return v


class CheckpointsConfig(_Strict):
    """What storage keeps of a run's checkpoints."""

    keep: int | None = Field(
        None, ge=1, description="Keep the K best validated checkpoints by the promotion metric, and always the "
        "newest (a resume continues from it) and every checkpoint still awaiting a verdict; delete the others from "
        "storage as verdicts arrive, during the run. A deleted checkpoint keeps its MLflow record and verdict, "
        "tagged podium.deleted. None: keep every checkpoint.")


class PipelineConfig(_Strict):
    """Everything one podium run needs. Locations left empty are filled from settings."""

    run_name: str = Field("podium-demo", description="Run name (Ray RunConfig name, MLflow run name).")
    model: str = Field(DEFAULT_MODEL, description="The model this run trains: names the MLflow experiment, the "
                       "registered model and the default serving location (<home>/serving/<model>).")
    experiment: str = Field("", description="MLflow experiment name (default: the model name).")
    storage: str = Field(
        "", description="Where Ray Train persists checkpoints: a path or URI, or a table naming a filesystem of "
        "your own, { path = \"checkpoints\", filesystem = \"mypkg.fs:make_fs\" } (path, filesystem, "
        "filesystem_kwargs: see Object storage, A filesystem of your own), kept as its userfs:// location.")
    serving: str = Field("", description="Serving location: promoted versions and the CURRENT pointer.")
    data: DataConfig = Field(default_factory=DataConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    scaling: ScalingConfig = Field(default_factory=ScalingConfig)
    validation: ValidationConfig = Field(default_factory=ValidationConfig)
    promotion: PromotionConfig = Field(default_factory=PromotionConfig)
    checkpoints: CheckpointsConfig = Field(default_factory=CheckpointsConfig)

    @model_validator(mode="before")
    @classmethod
    def _scope_to_model(cls, data: Any) -> Any:
        # what belongs to one model is named after it unless the config names it: experiment and
        # registered model (the serving location's default is filled by load_config, with the home)
        if not isinstance(data, dict):
            return data
        model = data.get("model") or DEFAULT_MODEL
        data = {**data, "experiment": data.get("experiment") or model}
        promotion = data.get("promotion", {})
        if isinstance(promotion, dict) and not promotion.get("registered_model"):
            data["promotion"] = {**promotion, "registered_model": model}
        elif isinstance(promotion, PromotionConfig) and not promotion.registered_model:
            data["promotion"] = promotion.model_copy(update={"registered_model": model})
        return data

    @field_validator("storage", mode="before")
    @classmethod
    def _storage_table(cls, v: Any) -> Any:
        # a table of your own filesystem becomes its location: every process (Ray workers, Prefect parameters,
        # records) gets the one string, from which podium.storage.backends.userfs rebuilds the filesystem
        if isinstance(v, dict):
            try:
                return StorageFilesystemConfig.model_validate(v).location()
            except ValidationError as err:
                raise ValueError("\n  ".join(line.strip() for line in
                                              format_validation_error(err, "storage.").splitlines()[1:])) from None
        if not isinstance(v, str):
            raise ValueError(f"expected a path or URI (a string), or a table {{ path, filesystem }}, got {type_name(v)}")
        return v

    @field_validator("storage", "serving")
    @classmethod
    def _check_uri(cls, v: str) -> str:
        return _check_location(v)

    @field_validator("model")
    @classmethod
    def _check_model(cls, v: str) -> str:
        if not MODEL_NAME_RE.match(v):
            raise ValueError("expected 1-100 characters of letters, digits, '_', '.', '-', starting with a letter "
                             "or digit (it names a folder and an MLflow registered model)")
        return v

    @field_validator("run_name")
    @classmethod
    def _check_run_name(cls, v: str) -> str:
        if not RUN_NAME_RE.match(expand_run_name(v, datetime(2000, 1, 1))):
            raise ValueError(
                "expected 1-100 characters of letters, digits, '_', '.', '-', starting with a letter or digit "
                "(placeholders {date} and {datetime} are filled from the run's scheduled start)"
            )
        return v

    def at(self, when: datetime) -> PipelineConfig:
        """This config with the run name's placeholders filled for a run starting at `when`."""
        return self.model_copy(update={"run_name": expand_run_name(self.run_name, when)})


# what a strict field expected, in words (pydantic's error types of a value of another type)
TYPE_EXPECTED = {"int_type": "expected a whole number", "float_type": "expected a number",
                 "bool_type": "expected true or false", "string_type": "expected a string"}


def type_name(value: Any) -> str:
    """What a configuration value is, in the words of TOML and JSON: 'a boolean', 'a string', 'a decimal number'."""
    names = {bool: "a boolean", str: "a string", int: "a whole number", float: "a decimal number", list: "a list",
             dict: "a table", type(None): "nothing (null)"}
    return names.get(type(value), f"a {type(value).__name__}")


def format_validation_error(err: ValidationError, prefix: str = "") -> str:
    """Render a pydantic error as one line per field: 'field = value: expected ...'."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if p != "__root__")
        field = f"{prefix}{loc}" if loc else prefix.rstrip(".") or "config"
        value = e.get("input")
        shown = repr(value) if not isinstance(value, dict) else "{...}"
        shown = redact_uri(shown)  # never echo credentials
        msg = TYPE_EXPECTED.get(e["type"]) or e["msg"].removeprefix("Value error, ")
        if e["type"] in TYPE_EXPECTED:
            msg = f"{msg}, got {type_name(value)}"
        if msg.startswith(f"{field}.") or e["type"] == "missing":  # a table's own lines; a missing key has no value
            lines.append(msg if msg.startswith(f"{field}.") else f"{field}: {msg}")
        else:
            lines.append(f"{field} = {shown}: {msg}")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def build_config(data: dict[str, Any]) -> PipelineConfig:
    """Validate a nested dict into a PipelineConfig, raising ConfigError with readable lines."""
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err)) from None


def load_config_file(path: str) -> dict[str, Any]:
    """A TOML or JSON config file as a nested dict; ConfigError if it is missing, unreadable or not a table."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--config = {path!r}: no such file")
    try:
        data = json.loads(p.read_text()) if p.suffix == ".json" else tomllib.loads(p.read_text())
    except (ValueError, OSError) as exc:  # JSONDecodeError and TOMLDecodeError are ValueErrors
        raise ConfigError(f"--config = {path!r}: cannot parse ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config = {path!r}: expected a table of settings (a JSON object), "
                          f"got a {type(data).__name__}")
    return data


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over` laid on top, nested tables merged key by key."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_config(path: str | None, overrides: dict[str, Any], settings: PodiumSettings) -> PipelineConfig:
    """The run's configuration: the file (if any), then `overrides` (nested, e.g. from flags), then
    podium's home for the locations left empty; validated (ConfigError names every bad field).

    The demo data fills `data` only where a built-in needs it: a run of your own loop and
    validation function has no data unless you give it."""
    given = load_config_file(path) if path else {}
    data = merge(given, overrides)
    check_shadow_rollout(given, data)
    data.setdefault("storage", settings.default_location("storage"))
    data.setdefault("serving", default_serving(settings, data.get("model")))
    data["data"] = dict(data.get("data") or {}) if isinstance(data.get("data", {}), dict) else data["data"]
    training, validation = data.get("training"), data.get("validation")
    builtins = (None, BUILTIN_LOOP, BUILTIN_VALIDATE, *OLD_IMPORT_PATHS)
    own_loop = isinstance(training, dict) and training.get("train_loop") not in builtins
    own_fn = isinstance(validation, dict) and validation.get("fn") not in builtins
    if isinstance(data["data"], dict):
        if not own_loop:
            data["data"].setdefault("train", str(settings.home_dir / "data" / "train.parquet"))
        if not (own_loop and own_fn):
            data["data"].setdefault("val", str(settings.home_dir / "data" / "val.parquet"))
    return build_config(data)


def _promotion(data: dict[str, Any]) -> dict[str, Any]:
    promotion = data.get("promotion")
    return promotion if isinstance(promotion, dict) else {}


def check_shadow_rollout(given: dict[str, Any], data: dict[str, Any]) -> None:
    """Refuse shadow limits that would have no effect: a `promotion.shadow` table (or a --shadow-* flag) where
    nothing asks for a shadow rollout, a mistake a run would otherwise ignore without a word. A config file that
    asks for it (`rollout = "shadow"`, with its limits) and a `--rollout direct` for one run is not one: the flag
    overrides the file on purpose. `given`: the config file; `data`: the file with the flags laid over it."""
    shadow, rollout = _promotion(data).get("shadow"), _promotion(data).get("rollout", field_default("promotion.rollout"))
    if shadow is None or rollout == "shadow" or _promotion(given).get("rollout") == "shadow":
        return
    if shadow == ShadowConfig().model_dump(mode="json"):
        return  # the defaults, as a dumped configuration holds them (a run's record, a rendered ConfigMap): no mistake
    raise ConfigError(f"invalid configuration:\n  promotion.shadow = {{...}}: the shadow stage's limits have no effect "
                      f"with promotion.rollout = {rollout!r}: expected promotion.rollout = \"shadow\" (--rollout "
                      "shadow) to shadow candidates, or no promotion.shadow")


def parse_assignment(text: str, field: str) -> tuple[str, Any]:
    """`KEY=VALUE` from the command line: VALUE is read as JSON (4, 0.1, true, [1, 2], "4"), else kept
    as a string. ConfigError names `field` when there is no key."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"{field} = {text!r}: expected KEY=VALUE")
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw
    return key.strip(), value


def load_table_file(path: str, field: str) -> dict[str, Any]:
    """A JSON or TOML file holding one table (e.g. a loop config); ConfigError names `field`."""
    try:
        return load_config_file(path)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("--config", field, 1)) from None


def default_serving(settings: PodiumSettings, model: Any = None) -> str:
    """The serving location of a model under podium's home: <home>/serving/<model>."""
    name = model if isinstance(model, str) and MODEL_NAME_RE.match(model) else DEFAULT_MODEL
    return str(Path(settings.default_location("serving")) / name)


def field_default(path: str) -> Any:
    """The default of a config field by its dotted path ('training.epochs' -> 5), or None if it has none."""
    model: type[BaseModel] = PipelineConfig
    *parents, leaf = path.split(".")
    for name in parents:
        model = model.model_fields[name].annotation  # type: ignore[assignment]
    info = model.model_fields[leaf]
    return None if info.is_required() else info.get_default(call_default_factory=True)
