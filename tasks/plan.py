"""Preflight: everything that can be checked before training starts, turned into a RunPlan."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, ConfigDict

from podium.config import (
    BUILTIN_LOOP,
    BUILTIN_LOOP_SETTINGS,
    BUILTIN_VALIDATE,
    LOOP_CONFIG_PODIUM_KEY,
    PipelineConfig,
    PromotionConfig,
    field_default,
)
from podium.core.policy import unknown_policy_metrics
from podium.core.promotion import Policy
from podium.core.redaction import redact_uri
from podium.errors import ConfigError, RunInProgress
from podium.imports import ImportPathError, resolve_callable
from podium.storage.backends import backend_for
from podium.storage.errors import StorageError
from podium.storage.fingerprint import DatasetDigest, dataset_digest
from podium.storage.lease import LeaseError, lease_wait_s, location_lock
from podium.storage.locations import join, normalize_location
from podium.storage.preflight import check_folder, check_location
from podium.training.data import DataSchemaError, DatasetInfo, inspect_dataset
from podium.training.validation_call import may_send_report_kwargs, missing_arguments, signature_problem

logger = logging.getLogger(__name__)

BUILTIN_METRICS = {"val_loss", "val_accuracy", "loss", "accuracy"}

# (location, label column, feature columns) -> the last inspection in this process and the digest of the
# data it inspected: `podium promote` of the latest run plans before anything starts and its flow plans again under
# the run's name, and the float columns' scan for NaN reads every row; the second plan reads none when the files are
# the same
_INSPECTED: dict[tuple[str, str, tuple[str, ...] | None], tuple[DatasetDigest, DatasetInfo]] = {}


def inspect_once(uri: str, label_column: str, feature_columns: list[str] | None) -> tuple[DatasetInfo, DatasetDigest | None]:
    """`inspect_dataset`, unless this process inspected the same files (same digest: the same bytes)
    before; with the data's digest, or None where it has none.

    The digest is taken before the scan, so files rewritten during it do not match what is kept. A location
    that cannot be read gets no digest here and fails in `inspect_dataset`, with its usual message."""
    key = (uri, label_column, tuple(feature_columns) if feature_columns is not None else None)
    digest = None
    with contextlib.suppress(Exception):
        check_location(uri, write=False)  # an unreachable endpoint fails at once, before the digest's retries
        digest = dataset_digest(uri)
    seen = _INSPECTED.get(key)
    if digest is not None and seen is not None and seen[0].digest == digest.digest:
        return seen[1], digest
    info = inspect_dataset(uri, label_column, feature_columns)
    if digest is not None:
        _INSPECTED[key] = (digest, info)
    return info, digest


class RunPlan(BaseModel):
    """A checked configuration plus the facts training and validation need; small, passed between tasks."""

    model_config = ConfigDict(frozen=True)

    config: PipelineConfig
    storage: str
    serving: str
    train_loop: str
    loop_config: dict[str, Any]  # what the training loop's config holds (Ray Datasets are added at the Ray boundary)
    validate_kwargs: dict[str, Any]  # podium's facts, offered to the validation function by parameter name
    data_warnings: list[str] = []  # data problems the config allows (data.allow): reported, not refused
    # 'train' and 'val': what the data is, by digest, when the run was planned (podium.storage.fingerprint)
    data: dict[str, DatasetDigest] = {}

    @property
    def run_name(self) -> str:
        """The run's name."""
        return self.config.run_name

    @property
    def policy(self) -> Policy:
        """What the promotion decides by (`promotion_policy`; `approval` as `promotion.approval` says). Past the
        plan, the promotion's settings are read from it, not from `config.promotion`."""
        return promotion_policy(self.config.promotion, approval=self.config.promotion.approval == "required")

    @property
    def data_facts(self) -> dict[str, Any]:
        """What podium read of the data (`val_data`, `feature_columns`, `num_classes`, ...): by name in the
        built-in loop's config, under its `podium` key in a loop of your own."""
        facts = self.loop_config.get(LOOP_CONFIG_PODIUM_KEY)
        return facts if isinstance(facts, dict) else self.loop_config


def promotion_policy(p: PromotionConfig, approval: bool) -> Policy:
    """What the decision reads of `promotion`, read whole: every field of `Policy` that `promotion` has by the same
    name (its tables as plain data), and the two it derives: `approval` (a person decides on a candidate before it
    is promoted) and `shadow` (`rollout` 'shadow': a candidate is shadowed before it replaces a champion). A check
    with a setting of its own adds the field to `promotion` and `Policy` alike, nothing here."""
    settings = p.model_dump()
    derived: dict[str, Any] = {"approval": approval, "shadow": p.rollout == "shadow"}
    read = {f.name: settings[f.name] for f in dataclasses.fields(Policy) if f.name in settings}
    return Policy(**{**read, **derived})


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


def check_no_file_in_the_way(uri: str, field: str) -> None:
    """Refuse a location where a file stands at it or above it, naming the field, before any folder is created."""
    try:
        check_folder(uri, field)
    except StorageError as exc:
        raise ConfigError(f"{field} = {redact_uri(uri)!r}: {exc.reason}") from None


def _is_torch_module(cls: type) -> bool:
    """Whether `cls` derives from torch.nn.Module, read from its MRO (torch is not imported here: the user's
    module that defines the class has loaded it)."""
    return any(f"{c.__module__}.{c.__qualname__}" == "torch.nn.modules.module.Module" for c in inspect.getmro(cls))


def model_class_errors(cfg: PipelineConfig, functions: dict[str, Callable[..., Any]]) -> list[str]:
    """`promotion.model_class` goes to a loader that takes it. Without a loader, podium's own
    (podium.training.loaders:state_dict) loads the checkpoint's state dict into `model_class()`: the class
    is built here once, so that one that cannot be is refused before anything starts."""
    p = cfg.promotion
    if not p.model_class:
        return []
    if not p.model_loader:
        if cfg.training.train_loop in (None, BUILTIN_LOOP):
            return [f"promotion.model_class = {p.model_class!r} is set with the built-in loop, whose checkpoints "
                    "podium serves as they are: expected a training.train_loop of your own, or no model_class"]
        cls = functions.get("promotion.model_class")
        if cls is None:  # not importable: said by the import check
            return []
        if not (inspect.isclass(cls) and _is_torch_module(cls)):
            return [f"promotion.model_class = {p.model_class!r} is not a torch.nn.Module class: podium builds it "
                    "with no arguments and loads the checkpoint's state dict into it (or name a "
                    "promotion.model_loader that takes model_class=)"]
        try:
            cls()
        except Exception as exc:  # the user's constructor: whatever it raises says why it cannot be built
            return [f"promotion.model_class = {p.model_class!r} cannot be built with no arguments "
                    f"({type(exc).__name__}: {exc}): podium builds it as {cls.__name__}() and loads the checkpoint's "
                    "state dict into it; give its arguments defaults, or name a promotion.model_loader of your own"]
        return []
    loader = functions.get("promotion.model_loader")
    if loader is not None and "model_class" not in inspect.signature(loader).parameters:
        return [f"promotion.model_loader = {p.model_loader!r} takes no model_class argument, but promotion.model_class "
                f"= {p.model_class!r} is set: expected a loader with a model_class parameter, or no model_class"]
    return []


def plan_run(config: PipelineConfig, before_data: Callable[[], None] | None = None) -> RunPlan:
    """Check data, import paths, the validation function's arguments and locations; raise ConfigError
    naming the field before any training.

    The checks that read no data come first (empty fields, import paths, the storage filesystem's, the model class,
    the loop's settings, the metrics the built-ins report); `before_data` is called once they pass, before the data
    is read: `podium run` writes the demo data there, so that a refusal of the settings writes nothing."""
    cfg = config
    train_loop = cfg.training.train_loop or BUILTIN_LOOP
    builtin_loop, builtin_fn = train_loop == BUILTIN_LOOP, cfg.validation.fn == BUILTIN_VALIDATE
    # the built-ins read podium's Parquet data; a loop and function of your own get it only if given
    needs = {"data.train": builtin_loop or cfg.data.ray_datasets,
             "data.val": builtin_loop or builtin_fn or cfg.data.ray_datasets}
    errors: list[str] = []
    for field, value in (("data.train", cfg.data.train), ("data.val", cfg.data.val),
                         ("storage", cfg.storage), ("serving", cfg.serving)):
        if not value and needs.get(field, True):
            errors.append(f"{field} is empty: expected a path or URI")
    functions: dict[str, Callable[..., Any]] = {}
    imports = [("training.train_loop", train_loop), ("validation.fn", cfg.validation.fn)]
    if cfg.promotion.model_loader:
        imports.append(("promotion.model_loader", cfg.promotion.model_loader))
    if cfg.promotion.model_class:
        imports.append(("promotion.model_class", cfg.promotion.model_class))
    # a filesystem of your own: importable before all else
    imports += [("storage.filesystem", path) for path in backend_for(cfg.storage).import_paths(cfg.storage)]
    for field, path in imports:
        if path in (BUILTIN_LOOP, BUILTIN_VALIDATE):
            continue  # podium's own, importable wherever podium is; importing them here would load torch
        try:
            functions[field] = resolve_callable(path, field)
        except ImportPathError as exc:
            errors.append(str(exc))
    errors += model_class_errors(cfg, functions)
    errors += loop_config_errors(cfg, builtin_loop)
    if builtin_loop and builtin_fn:  # a function of your own: checked on its first result (flows.validation)
        p = cfg.promotion
        errors += unknown_policy_metrics(p.metric, p.thresholds, p.guards, BUILTIN_METRICS,
                                         f"the built-in loop and validation report {sorted(BUILTIN_METRICS)}")
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))
    if before_data is not None:
        before_data()

    infos, digests = {}, {}
    for field, uri in (("data.train", cfg.data.train), ("data.val", cfg.data.val)):
        if not uri and not needs[field]:
            continue
        # data given to your own loop is inspected too, for the facts its config gets (feature columns, classes);
        # data that is not podium's tabular Parquet is yours to read: no facts, no error
        problem = errors.append if needs[field] else functools.partial(
            logger.info, "%s: no feature columns or classes for your loop (%s)", field)
        try:
            infos[field], digest = inspect_once(normalize_location(uri), cfg.data.label_column,
                                                cfg.data.feature_columns)
        except FileNotFoundError:
            problem(f"{field} = {uri!r}: no such file or directory")
        except (DataSchemaError, OSError) as exc:
            problem(f"{field}: {exc}")
        else:
            if digest is not None:
                digests[field.removeprefix("data.")] = digest
    data = describe_data(cfg, needs, errors, digests)
    warnings: list[str] = []
    if not errors and len(infos) == 2 and all(needs.values()):  # your loop reads your data as it will
        check_data(infos["data.train"], infos["data.val"], set(cfg.data.allow), errors, warnings)
    train_info = infos.get("data.train")
    if train_info is not None and train_info.num_rows < cfg.scaling.num_workers:  # Ray Train splits it equally
        errors.append(f"data.train = {cfg.data.train!r}: {train_info.num_rows} rows for scaling.num_workers = "
                      f"{cfg.scaling.num_workers}: expected at least one row per worker")
    feature_columns = next((i.feature_columns for i in infos.values()), cfg.data.feature_columns)
    facts = validation_facts(cfg, feature_columns)
    if not builtin_fn:  # podium's own takes what podium gives it
        errors += validation_fn_errors(cfg, functions["validation.fn"], functions.get("training.train_loop"), facts)
        errors += confidence_errors(cfg, functions["validation.fn"])
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))
    for uri, field in ((cfg.storage, "storage"), (cfg.serving, "serving")):  # before either is created
        check_no_file_in_the_way(uri, field)
    storage = check_writable(cfg.storage, "storage")
    serving = check_writable(cfg.serving, "serving")

    data_facts: dict[str, Any] = {key: value for key, value in (
        ("train_data", normalize_location(cfg.data.train) if cfg.data.train else None),
        ("val_data", normalize_location(cfg.data.val) if cfg.data.val else None),
        ("label_column", cfg.data.label_column),
        ("feature_columns", feature_columns),
        ("num_classes", max((i.num_classes for i in infos.values()), default=None)),
    ) if value is not None}
    if builtin_loop:  # podium's own loop: its typed settings and the data facts, by name
        loop_config = {**cfg.training.model_dump(exclude={"train_loop", "train_loop_config", "loop_datasets"}),
                       **data_facts,
                       "train_rows": infos["data.train"].num_rows}  # from the footers: steps per epoch, unread
    else:  # your loop: exactly your config, and podium's facts under one key of their own
        loop_config = {**cfg.training.train_loop_config,
                       LOOP_CONFIG_PODIUM_KEY: {"run_name": cfg.run_name, **data_facts}}
    for warning in warnings:  # the flow says them on the terminal, from the plan (`data_warnings`)
        logger.info("%s", warning)
    return RunPlan(config=cfg, storage=storage, serving=serving, train_loop=train_loop,
                   loop_config=loop_config, validate_kwargs=facts, data_warnings=warnings, data=data)


def check_data(tr: DatasetInfo, va: DatasetInfo, allow: set[str], errors: list[str], warnings: list[str]) -> None:
    """What breaks training, found before it starts: NaN/infinite/null features, validation labels the
    training data never has, validation columns that differ from training's. Each problem goes to
    `errors`, naming the column, or to `warnings` where `allow` (data.allow) names its kind."""
    def problem(kind: str, text: str) -> None:
        if kind in allow:
            warnings.append(text)
        else:
            errors.append(f"{text} (to train anyway: data.allow = [{kind!r}], or --allow-data {kind})")

    for field, info in (("data.train", tr), ("data.val", va)):
        for column, count in sorted(info.non_finite.items()):
            problem("non_finite_features", f"{field}: feature column {column!r} has {count} NaN, infinite or "
                                           f"null value(s) in {info.num_rows} rows: a model trained on them diverges")
    missing = [c for c in tr.feature_columns if c not in va.types]
    if missing:  # validation could not run at all: never allowed
        errors.append(f"data.val has no feature column(s) {missing}, which data.train has and the model reads")
    extra = [c for c in va.feature_columns if c not in tr.types]
    if extra:
        problem("schema_mismatch", f"data.val has column(s) {extra} that data.train has not (validation would "
                                   "ignore them)")
    for column in tr.feature_columns:
        if column in va.types and va.types[column] != tr.types[column]:
            problem("schema_mismatch", f"data.val: column {column!r} is {va.types[column]}, data.train has it "
                                       f"as {tr.types[column]}")
    if va.label_min < tr.label_min or va.label_max > tr.label_max:
        problem("unseen_labels", f"data.val: label column {tr.label_column!r} has values {va.label_min}.."
                                 f"{va.label_max}, outside data.train's {tr.label_min}..{tr.label_max}: the model "
                                 "never sees those classes in training")


def loop_config_errors(cfg: PipelineConfig, builtin_loop: bool) -> list[str]:
    """Settings that would not reach the loop that runs: the built-in loop's own settings with a
    loop of your own, your loop's config with the built-in loop, podium's reserved key."""
    t = cfg.training
    if builtin_loop:
        given = [f for f in ("train_loop_config", "loop_datasets") if getattr(t, f)]
        return [f"training.{f} = {{...}}: it is for a loop of your own (training.train_loop); the built-in loop "
                f"takes training.{', training.'.join(BUILTIN_LOOP_SETTINGS)}" for f in given]
    errors = [f"training.{f} = {getattr(t, f)!r}: a setting of the built-in loop; your loop "
              f"{t.train_loop!r} gets its settings from training.train_loop_config (e.g. --loop-config "
              f"{f}={json.dumps(getattr(t, f))})"
              for f in BUILTIN_LOOP_SETTINGS if getattr(t, f) != field_default(f"training.{f}")]
    clash = sorted({LOOP_CONFIG_PODIUM_KEY} & (set(t.train_loop_config) | set(t.loop_datasets)))
    clash += sorted(set(t.train_loop_config) & set(t.loop_datasets))
    errors += [f"training.train_loop_config: key {k!r} is given twice (podium's facts arrive under "
               f"{LOOP_CONFIG_PODIUM_KEY!r}; loop_datasets add keys of their own)" for k in clash]
    return errors


def validation_facts(cfg: PipelineConfig, feature_columns: list[str] | None) -> dict[str, Any]:
    """What podium offers a validation function by parameter name (the `step` is added per checkpoint)."""
    return {key: value for key, value in (
        ("val_data", normalize_location(cfg.data.val) if cfg.data.val else None),
        ("label_column", cfg.data.label_column),
        ("feature_columns", feature_columns),
        ("torch_threads", cfg.training.torch_threads),
        ("run_name", cfg.run_name),
    ) if value is not None}


def validation_fn_errors(cfg: PipelineConfig, fn: Callable[..., Any], train_loop: Callable[..., Any] | None,
                         facts: dict[str, Any]) -> list[str]:
    """A validation function that can never be called as podium calls it, naming what is missing."""
    field = f"validation.fn = {cfg.validation.fn!r}"
    problem = signature_problem(fn)
    if problem:
        return [f"{field}: {problem}"]
    missing = missing_arguments(fn, [*facts, "step", *cfg.validation.kwargs])
    if not missing or (train_loop is not None and may_send_report_kwargs(train_loop)):  # None: the built-in loop
        return []  # the loop may send them with each report (ValidationTaskConfig(fn_kwargs=...))
    return [f"{field} requires {', '.join(missing)}, which nothing fills: give them in validation.kwargs "
            "(--validate-kwargs), or send them from your loop with each report: ray.train.report(..., "
            "validation=ray.train.ValidationTaskConfig(fn_kwargs={...}))"]


def confidence_errors(cfg: PipelineConfig, fn: Callable[..., Any]) -> list[str]:
    """promotion.confidence with a validation function that cannot give per-row values (it takes no `per_row`
    argument), where the config does not accept point values instead (promotion.confidence_without_rows)."""
    p = cfg.promotion
    if p.confidence is None or p.confidence_without_rows == "point":
        return []
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature to read: its first per-row validation says
        return []
    if any(q.name == "per_row" or q.kind == q.VAR_KEYWORD for q in parameters):
        return []
    return [f"promotion.confidence = {p.confidence:g} needs per-row values, and validation.fn = {cfg.validation.fn!r} "
            "takes no per_row argument: give it one (podium passes per_row=True and reads the values under "
            "'podium.per_row'), or set promotion.confidence_without_rows = 'point' to compare point values"]


def describe_data(cfg: PipelineConfig, needs: dict[str, bool], errors: list[str],
                  known: dict[str, DatasetDigest] | None = None) -> dict[str, DatasetDigest]:
    """The digests of data.train and data.val (their files' bytes and Parquet footers, no row decoded), for the
    same-data gate and lineage; those in `known` (by role) were just taken. Data podium reads itself must
    be Parquet (`errors` says why not); data only your own loop reads may be anything: without a digest,
    promotion compares the numbers as stored."""
    data: dict[str, DatasetDigest] = {}
    for role, uri in (("train", cfg.data.train), ("val", cfg.data.val)):
        if not uri or any(e.startswith(f"data.{role}") for e in errors):
            continue
        if known and role in known:
            data[role] = known[role]
            continue
        try:
            data[role] = dataset_digest(uri)
        except (ValueError, OSError) as exc:
            if needs[f"data.{role}"]:
                errors.append(f"data.{role}: {exc}")
            else:
                logger.warning("data.%s has no digest (%s): promotion compares numbers on it as they were stored",
                               role, exc)
    return data


@task(name="plan-run", cache_policy=NO_CACHE)
def plan_run_task(config: PipelineConfig) -> RunPlan:
    """Preflight checks (data schema, import paths, writable locations) before anything is trained."""
    return plan_run(config)


@contextlib.contextmanager
def run_lock(plan: RunPlan, wait_s: float | None = None) -> Iterator[None]:
    """One process at a time per run name, for the whole train → validate → promote.

    Two runs of one name would train into the same Ray Train run folder and validate
    the same checkpoints. The lock is `<storage>/.podium-runs/<run name>.lock`: an
    flock on local storage (freed by the kernel when its process dies, so a rerun
    after a crash starts at once), a lease on an object store (a dead run's lease expires
    its TTL after its last renewal, PODIUM_S3_LEASE_TTL_S on S3: a rerun waits that long at most).
    """
    if wait_s is None:
        wait_s = lease_wait_s(plan.storage)
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(location_lock(join(plan.storage, ".podium-runs"), f"{plan.run_name}.lock", wait_s,
                                             f"run {plan.run_name!r}"))
        except LeaseError as exc:
            raise RunInProgress(f"{exc}: a run of the same name is in progress; wait for it to finish, "
                                "or give this one another run name") from None
        yield
