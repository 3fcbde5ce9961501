"""Preflight: everything that can be checked before training starts, turned into a RunPlan."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, ConfigDict

from podium.config import ConfigError, PipelineConfig
from podium.imports import ImportPathError, resolve_callable
from podium.redaction import redact_uri
from podium.storage.locations import normalize_location
from podium.storage.preflight import check_location
from podium.storage.s3 import StorageError
from podium.training.data import DataSchemaError, inspect_dataset

logger = logging.getLogger(__name__)

BUILTIN_LOOP = "podium.training.loop:train_loop_per_worker"
BUILTIN_VALIDATE = "podium.training.validate:validate_checkpoint"
BUILTIN_METRICS = {"val_loss", "val_accuracy", "loss", "accuracy"}


class RunPlan(BaseModel):
    """A checked configuration plus the facts training and validation need; small, passed between tasks."""

    model_config = ConfigDict(frozen=True)

    config: PipelineConfig
    storage: str
    serving: str
    train_loop: str
    loop_config: dict[str, Any]
    validate_kwargs: dict[str, Any]

    @property
    def run_name(self) -> str:
        """The run's name."""
        return self.config.run_name


def check_writable(uri: str, field: str) -> str:
    """Prove the location is writable before anything trains, leaving nothing behind; raise naming the field.

    Local folders are created; on S3 a probe object is written and removed (a
    missing bucket is reported, never created). Unreachable endpoints, rejected
    credentials and missing permissions fail here, with what to fix.
    """
    try:
        return check_location(uri, write=True)
    except StorageError as exc:
        raise ConfigError(f"{field} = {redact_uri(uri)!r}: {exc.reason}") from None


def plan_run(config: PipelineConfig) -> RunPlan:
    """Check data, import paths and locations; raise ConfigError naming the field before any training."""
    cfg = config
    errors: list[str] = []
    for field, value in (("data.train", cfg.data.train), ("data.val", cfg.data.val),
                         ("storage", cfg.storage), ("serving", cfg.serving)):
        if not value:
            errors.append(f"{field} is empty: expected a path or URI")
    train_loop = cfg.training.train_loop or BUILTIN_LOOP
    for field, path in (("training.train_loop", train_loop), ("validation.fn", cfg.validation.fn)):
        if path in (BUILTIN_LOOP, BUILTIN_VALIDATE):
            continue  # podium's own, importable wherever podium is; importing them here would load torch
        try:
            resolve_callable(path, field)
        except ImportPathError as exc:
            errors.append(str(exc))
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))

    infos = {}
    for field, uri in (("data.train", cfg.data.train), ("data.val", cfg.data.val)):
        try:
            infos[field] = inspect_dataset(normalize_location(uri), cfg.data.label_column, cfg.data.feature_columns)
        except FileNotFoundError:
            errors.append(f"{field} = {uri!r}: no such file or directory")
        except (DataSchemaError, OSError) as exc:
            errors.append(f"{field}: {exc}")
    if not errors:
        tr, va = infos["data.train"], infos["data.val"]
        if tr.feature_columns != va.feature_columns:
            errors.append(f"data.val: feature columns {va.feature_columns} differ from data.train's {tr.feature_columns}")
    builtin = train_loop == BUILTIN_LOOP and cfg.validation.fn == BUILTIN_VALIDATE
    if builtin and cfg.promotion.metric not in BUILTIN_METRICS:
        errors.append(f"promotion.metric = {cfg.promotion.metric!r}: the built-in loop and validation report "
                      f"{sorted(BUILTIN_METRICS)}")
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))
    storage = check_writable(cfg.storage, "storage")
    serving = check_writable(cfg.serving, "serving")

    tr = infos["data.train"]
    num_classes = max(tr.num_classes, infos["data.val"].num_classes)
    loop_config = {
        **cfg.training.model_dump(exclude={"train_loop", "train_loop_config"}),
        "train_data": normalize_location(cfg.data.train),
        "val_data": normalize_location(cfg.data.val),
        "label_column": cfg.data.label_column,
        "feature_columns": tr.feature_columns,
        "num_classes": num_classes,
        **cfg.training.train_loop_config,
    }
    validate_kwargs = {
        "val_data": normalize_location(cfg.data.val),
        "label_column": cfg.data.label_column,
        "feature_columns": tr.feature_columns,
        "torch_threads": cfg.training.torch_threads,
        "run_name": cfg.run_name,
        **cfg.validation.kwargs,
    }
    validate_kwargs.setdefault("config", dict(validate_kwargs))  # Ray's docs: validate_fn(checkpoint, config)
    return RunPlan(config=cfg, storage=storage, serving=serving, train_loop=train_loop,
                   loop_config=loop_config, validate_kwargs=validate_kwargs)


@task(name="plan-run", cache_policy=NO_CACHE)
def plan_run_task(config: PipelineConfig) -> RunPlan:
    """Preflight checks (data schema, import paths, writable locations) before anything is trained."""
    return plan_run(config)


class RunInProgress(RuntimeError):
    """Another process is running a run of the same name right now."""


@contextlib.contextmanager
def run_lock(plan: RunPlan, wait_s: float | None = None) -> Iterator[None]:
    """One process at a time per run name, for the whole train → validate → promote.

    Two runs of one name would train into the same Ray Train run folder and validate
    the same checkpoints. The lock is `<storage>/.podium-runs/<run name>.lock`: an
    flock on local storage (freed by the kernel when its process dies, so a rerun
    after a crash starts at once), an S3 lease otherwise (a dead run's lease expires
    PODIUM_S3_LEASE_TTL_S after its last renewal: a rerun waits that long at most).
    """
    from podium.storage.lease import LeaseError, location_lock
    from podium.storage.locations import is_s3, join
    from podium.storage.s3 import s3_settings

    if wait_s is None:
        wait_s = s3_settings().lease_ttl_s + 5 if is_s3(plan.storage) else 0.0
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(location_lock(join(plan.storage, ".podium-runs"), f"{plan.run_name}.lock", wait_s,
                                             f"run {plan.run_name!r}"))
        except LeaseError as exc:
            raise RunInProgress(f"{exc}: a run of the same name is in progress; wait for it to finish, "
                                "or give this one another run name") from None
        yield
