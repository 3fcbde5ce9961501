"""The options of `podium run` and `podium promote`, and the configuration they set.

Each option names the config field it overrides; its default is read from the config model, stated there once.

The config model (pydantic, 0.03 s) loads with the parser: every command builds its options' defaults from it.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, NoReturn

from podium.cli.errors import CliError
from podium.config import PipelineConfig, field_default, load_config, load_table_file, parse_assignment
from podium.settings import PodiumSettings


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors are one sentence (`podium: --epochs = 'x': expected a whole number`,
    exit code 2) instead of the usage block: `--help` prints that."""

    def error(self, message: str) -> NoReturn:
        """Print the usage error as one line and exit with code 2."""
        flag, sep, what = message.removeprefix("argument ").partition(": ")
        if message.startswith("argument ") and sep:
            # a type's own message starts with the value it refused ('x': expected ...)
            message = f"{flag} = {what}" if what.startswith("'") else f"{flag}: {what}"
        self.exit(2, f"podium: {message} (`{self.prog} --help` lists the options)\n")


def whole_number(text: str) -> int:
    """An argparse type: an integer (a bad one is a usage error, exit code 2, saying what was expected)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number") from None


def number(text: str) -> float:
    """An argparse type: a number, e.g. 0.01 or 1e-3 (a bad one is a usage error, exit code 2)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number") from None


def comma_list(text: str) -> list[str]:
    """An argparse type: 'a, b,,c' -> ['a', 'b', 'c']."""
    return [c.strip() for c in text.split(",") if c.strip()]


def json_object(text: str) -> dict[str, Any]:
    """An argparse type: a JSON object (a bad one is a usage error, exit code 2, saying what was expected)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"threshold\": 0.5}}', got {text!r} "
                                         f"({exc})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"threshold\": 0.5}}', got a "
                                         f"{type(value).__name__}: {text!r}")
    return value


# (flag, config path, type, help). Every option of `run` and `promote`; `--help` prints them all.
OPTIONS: list[tuple[str, str, Callable[[str], Any] | None, str]] = [
    ("--run-name", "run_name", str, "Run name: Ray Train's RunConfig name and the MLflow run name. "
                                    "Running the same name again resumes it. {date} and {datetime} in it are filled "
                                    "with the command's start (UTC), e.g. nightly-{date}."),
    ("--model", "model", str, "The model this run trains: names the MLflow experiment, the registered model "
                              "and the default serving location (.podium/serving/<model>)."),
    ("--experiment", "experiment", str, "MLflow experiment name (default: the model name)."),
    ("--storage", "storage", str, "Where Ray Train persists checkpoints (path or URI; default: .podium/storage). "
                                  "A filesystem of your own is a [storage] table of --config, which this replaces."),
    ("--serving", "serving", str,
     "Serving location for promoted models (path or URI; default: .podium/serving/<model>)."),
    ("--train-data", "data.train", str, "Training Parquet file or directory (default: generated demo data)."),
    ("--val-data", "data.val", str, "Validation Parquet file or directory (default: generated demo data)."),
    ("--label-column", "data.label_column", str, "Integer label column."),
    ("--feature-columns", "data.feature_columns", comma_list,
     "Comma-separated feature columns (default: every column but the label)."),
    ("--allow-data", "data.allow", comma_list,
     "Comma-separated data problems to report instead of refusing: non_finite_features, unseen_labels, "
     "schema_mismatch."),
    ("--ray-datasets", "data.ray_datasets", None,
     "Hand your own loop Ray Datasets of --train-data/--val-data: ray.train.get_dataset_shard('train') / ('val')."),
    ("--epochs", "training.epochs", whole_number, "Epochs to train."),
    ("--batch-size", "training.batch_size", whole_number, "Per-worker batch size."),
    ("--learning-rate", "training.learning_rate", number, "Adam learning rate."),
    ("--no-standardize", "training.standardize", None,
     "Feed the built-in model raw features (default: standardised with the training data's statistics)."),
    ("--checkpoint-every-steps", "training.checkpoint_every_steps", whole_number,
     "Checkpoint every N steps instead of every epoch."),
    ("--early-stop-patience", "training.early_stop_patience", whole_number,
     "Stop training once this many validations in a row (in step order) did not improve the promotion metric on "
     "the best so far by more than --early-stop-min-delta; the saved checkpoints are validated and promoted as usual."),
    ("--early-stop-min-delta", "training.early_stop_min_delta", number,
     "How much a validation must improve on the best so far to count as an improvement (early stopping)."),
    ("--keep-checkpoints", "checkpoints.keep", whole_number,
     "Keep only the K best validated checkpoints in storage (and the newest, and those awaiting a verdict); the "
     "others are deleted as verdicts arrive, their MLflow records kept (default: keep all)."),
    ("--shuffle", "training.shuffle", str, "Shuffling each epoch (built-in loop): local, global or none."),
    ("--train-loop", "training.train_loop", str,
     "Your own train_loop_per_worker as 'package.module:function' (plain Ray Train APIs)."),
    ("--loop-config-file", "training.train_loop_config", None,
     "A JSON or TOML file whose table is your loop's train_loop_config (--loop-config overrides keys)."),
    ("--loop-config", "training.train_loop_config", None,
     "KEY=VALUE in your loop's train_loop_config (repeatable; VALUE is read as JSON, else a string)."),
    ("--loop-dataset", "training.loop_datasets", None,
     "KEY=PARQUET: a Ray Dataset read from PARQUET, put in your loop's config under KEY (repeatable)."),
    ("--num-workers", "scaling.num_workers", whole_number, "Ray Train workers."),
    ("--use-gpu", "scaling.use_gpu", None, "One GPU per training worker."),
    ("--data-cpus", "scaling.data_cpus", number, "CPUs Ray Data may use to read the training data."),
    ("--validate-fn", "validation.fn", str,
     "Validation function '(checkpoint, **kwargs) -> dict' as 'package.module:function'."),
    ("--validate-kwargs", "validation.kwargs", json_object, "Extra kwargs for the validation function, as JSON."),
    ("--concurrency", "validation.concurrency", whole_number, "Validations running at once."),
    ("--validation-cpus", "validation.num_cpus", number, "CPUs per validation task."),
    ("--validation-gpus", "validation.num_gpus", number, "GPUs per validation task."),
    ("--validation-inner-cpus", "validation.inner_cpus", number,
     "CPUs the validation function's own Ray work takes (a TorchTrainer, map_batches), per validation."),
    ("--validation-retries", "validation.retries", whole_number, "Retries of a failed validation."),
    ("--validation-timeout", "validation.timeout_s", number, "Seconds before a validation attempt is cancelled."),
    ("--metric", "promotion.metric", str, "Metric that ranks checkpoints."),
    ("--mode", "promotion.mode", str, "'min' or 'max': which direction of the metric is better."),
    ("--min-delta", "promotion.min_delta", number, "Margin by which the best must beat the champion."),
    ("--always-promote", "promotion.always", None, "Promote the best checkpoint even if it does not beat the champion."),
    ("--verify", "promotion.verify", str,
     "How the promoted copy is checked: hashes, load or revalidate (runs the validation again)."),
    ("--no-verify", "promotion.verify", None, "Check only the copy's sha256 hashes (same as --verify hashes)."),
    ("--registered-model", "promotion.registered_model", str, "MLflow registered model name (default: the model name)."),
    ("--alias", "promotion.alias", str,
     "MLflow alias the serving location's champion carries (default: champion); each serving location of a model "
     "has one of its own."),
    ("--model-loader", "promotion.model_loader", str,
     "For checkpoints not in podium's format: 'package.module:function' from the checkpoint folder to a torch "
     "module or an object with predict(DataFrame); podium serves and registers the MLflow model built from it."),
    ("--model-class", "promotion.model_class", str,
     "'package.module:Class', the model's class: alone, for a loop that saves its module's state_dict() (model.pt, "
     "or the one .pt/.pth file), podium loads it into Class() and serves an MLflow model; with --model-loader, "
     "handed to it (the LightningModule for podium.training.loaders:lightning)."),
    ("--allow-files", "promotion.allow_files", None,
     "Let a checkpoint served as files (no --model-class or --model-loader for its format) replace a champion that "
     "loads as an MLflow model; without it that promotion is refused."),
    ("--approval", "promotion.approval", str,
     "'required': a candidate that passes the gate waits for `podium approve` / `podium reject` or the Prefect "
     "UI's form; 'none': promote unattended."),
    ("--approval-timeout", "promotion.approval_timeout_s", number, "Seconds a candidate waits for a decision."),
    ("--approval-on-timeout", "promotion.approval_on_timeout", str,
     "What no decision in time means: reject or approve."),
    ("--rollout", "promotion.rollout", str,
     "'shadow': a candidate first answers a copy of the live requests `podium serve` receives, beside the champion, "
     "and is promoted only if it meets promotion.shadow's limits; 'direct': switched in at once."),
    ("--shadow-requests", "promotion.shadow.requests", whole_number, "Live requests a candidate in shadow answers."),
    ("--shadow-duration", "promotion.shadow.duration_s", number, "The longest a shadow lasts, in seconds."),
    ("--rescore", "promotion.rescore", str, "A champion that cannot be scored on the candidate's validation data: "
                                            "refuse, or compare with its stored number."),
]


def _set(tree: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for p in parents:
        tree = tree.setdefault(p, {})
    tree[leaf] = value


# options that take a KEY=VALUE or a file and build a table (see _table_overrides)
TABLE_OPTIONS = ("--loop-config-file", "--loop-config", "--loop-dataset")


def flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The config values the command line sets (nested by config path); flags left out are absent."""
    if getattr(args, "verify", None) is not None and getattr(args, "no_verify", None):
        raise CliError(f"--verify {args.verify} and --no-verify contradict each other: give one of them")
    flags: dict[str, Any] = {}
    for flag, path, _, _ in OPTIONS:
        value = getattr(args, flag[2:].replace("-", "_"), None)
        if value is None or flag in TABLE_OPTIONS:
            continue
        if flag == "--no-verify":
            value = "hashes"
        elif flag == "--no-standardize":
            value = False
        _set(flags, path, value)
    for path, table in _table_overrides(args).items():
        _set(flags, path, table)
    return flags


def _table_overrides(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The loop's config from --loop-config-file, then each --loop-config KEY=VALUE; the loop's
    datasets from --loop-dataset KEY=LOCATION. Laid over the config file's tables key by key."""
    loop: dict[str, Any] = {}
    if getattr(args, "loop_config_file", None):
        loop.update(load_table_file(args.loop_config_file, "--loop-config-file"))
    loop.update(parse_assignment(a, "--loop-config") for a in getattr(args, "loop_config", None) or [])
    datasets = dict(parse_assignment(a, "--loop-dataset") for a in getattr(args, "loop_dataset", None) or [])
    out = {}
    if loop:
        out["training.train_loop_config"] = loop
    if datasets:
        out["training.loop_datasets"] = {k: str(v) for k, v in datasets.items()}
    return out


def config_from_args(args: argparse.Namespace, settings: PodiumSettings) -> PipelineConfig:
    """Config file, then flags, then embedded defaults for empty locations; validated; the run name's
    placeholders filled for now."""
    config = load_config(args.config, flag_overrides(args), settings)  # ConfigError: exit 2 (podium.cli.errors)
    if "{" in config.run_name:  # {date} / {datetime}: this command's run, as a deployment's run gets its start's
        config = config.at(datetime.now(timezone.utc))
    return config


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least `minimum` (a bad value is a usage error, exit code 2)."""
    def parse(text: str) -> int:
        value = whole_number(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of at least {minimum}")
        return value
    return parse


def config_default(path: str) -> Any:
    return field_default(path)


def option_help(path: str, text: str) -> str:
    """An option's help, with the default from the config model (stated there, once)."""
    default = field_default(path) if "default:" not in text else None
    shown = default if not isinstance(default, bool) else None
    return f"{text} (default: {shown})" if shown not in (None, "", [], {}) else text


def add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML or JSON file with the run's configuration (flags override it).")
    for flag, path, typ, help_ in OPTIONS:
        if flag in ("--loop-config", "--loop-dataset"):
            p.add_argument(flag, action="append", metavar="KEY=VALUE", help=help_)
        elif flag == "--loop-config-file":
            p.add_argument(flag, metavar="FILE", help=help_)
        elif typ is None:
            p.add_argument(flag, action="store_true", default=None, help=help_)
        else:
            p.add_argument(flag, type=typ, default=None, help=option_help(path, help_))
    p.add_argument("--json", action="store_true", help="End by printing one JSON object with the outcome.")
    p.add_argument("--quiet", action="store_true", help="No progress lines.")


# what a command that reads a run (`status`, `ui`) takes: which run, and where its model serves; no training flag
READ_OPTIONS = ("run_name", "model", "experiment", "storage", "serving", "promotion.registered_model",
                "promotion.alias")


def add_read_options(p: argparse.ArgumentParser) -> None:
    """The options of a command that reads a run (its config file, which run, where it serves, --json)."""
    p.add_argument("--config", help="TOML or JSON file with the run's configuration.")
    for flag, path, typ, help_ in OPTIONS:
        if path in READ_OPTIONS:
            p.add_argument(flag, type=typ or str, default=None, help=option_help(path, help_))
    p.add_argument("--json", action="store_true", help="Print the answer as one JSON object.")


def add_ray_address(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ray-address", help="Run on this existing Ray cluster, e.g. 10.0.0.5:6379 (sets RAY_ADDRESS; "
                                         "default: RAY_ADDRESS, else a local Ray).")


def use_ray_address(address: str | None) -> None:
    """Point Ray at an existing cluster; only effective before Ray is initialised in this process."""
    if address:
        os.environ["RAY_ADDRESS"] = address
