"""The `podium` command: run, promote, status, ui, rollback, history, worker, make-data, server.

Import paths given on the command line (`--train-loop`, `--validate-fn`) resolve from the current
directory first, as uvicorn and celery do: run podium from your repository's root.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from podium.settings import PodiumSettings

if TYPE_CHECKING:
    from podium.config import PipelineConfig


def comma_list(text: str) -> list[str]:
    """An argparse type: 'a, b,,c' -> ['a', 'b', 'c']."""
    return [c.strip() for c in text.split(",") if c.strip()]


# (flag, config path, type, help). Every option of `run` and `promote`; `--help` prints them all.
OPTIONS: list[tuple[str, str, Callable[[str], Any] | None, str]] = [
    ("--run-name", "run_name", str, "Run name: Ray Train's RunConfig name and the MLflow run name. "
                                    "Running the same name again resumes it."),
    ("--model", "model", str, "The model this run trains: names the MLflow experiment, the registered model "
                              "and the default serving location (.podium/serving/<model>)."),
    ("--experiment", "experiment", str, "MLflow experiment name (default: the model name)."),
    ("--storage", "storage", str, "Where Ray Train persists checkpoints (path or URI; default: .podium/storage)."),
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
    ("--epochs", "training.epochs", int, "Epochs to train."),
    ("--batch-size", "training.batch_size", int, "Per-worker batch size."),
    ("--learning-rate", "training.learning_rate", float, "Adam learning rate."),
    ("--no-standardize", "training.standardize", None,
     "Feed the built-in model raw features (default: standardised with the training data's statistics)."),
    ("--checkpoint-every-steps", "training.checkpoint_every_steps", int,
     "Checkpoint every N steps instead of every epoch."),
    ("--shuffle", "training.shuffle", str, "Shuffling each epoch (built-in loop): local, global or none."),
    ("--train-loop", "training.train_loop", str,
     "Your own train_loop_per_worker as 'package.module:function' (plain Ray Train APIs)."),
    ("--loop-config-file", "training.train_loop_config", None,
     "A JSON or TOML file whose table is your loop's train_loop_config (--loop-config overrides keys)."),
    ("--loop-config", "training.train_loop_config", None,
     "KEY=VALUE in your loop's train_loop_config (repeatable; VALUE is read as JSON, else a string)."),
    ("--loop-dataset", "training.loop_datasets", None,
     "KEY=PARQUET: a Ray Dataset read from PARQUET, put in your loop's config under KEY (repeatable)."),
    ("--num-workers", "scaling.num_workers", int, "Ray Train workers."),
    ("--use-gpu", "scaling.use_gpu", None, "One GPU per training worker."),
    ("--data-cpus", "scaling.data_cpus", float, "CPUs Ray Data may use to read the training data."),
    ("--validate-fn", "validation.fn", str,
     "Validation function '(checkpoint, **kwargs) -> dict' as 'package.module:function'."),
    ("--validate-kwargs", "validation.kwargs", json.loads, "Extra kwargs for the validation function, as JSON."),
    ("--concurrency", "validation.concurrency", int, "Validations running at once."),
    ("--validation-cpus", "validation.num_cpus", float, "CPUs per validation task."),
    ("--validation-gpus", "validation.num_gpus", float, "GPUs per validation task."),
    ("--validation-inner-cpus", "validation.inner_cpus", float,
     "CPUs the validation function's own Ray work takes (a TorchTrainer, map_batches), per validation."),
    ("--validation-retries", "validation.retries", int, "Retries of a failed validation."),
    ("--validation-timeout", "validation.timeout_s", float, "Seconds before a validation attempt is cancelled."),
    ("--metric", "promotion.metric", str, "Metric that ranks checkpoints."),
    ("--mode", "promotion.mode", str, "'min' or 'max': which direction of the metric is better."),
    ("--min-delta", "promotion.min_delta", float, "Margin by which the best must beat the champion."),
    ("--always-promote", "promotion.always", None, "Promote the best checkpoint even if it does not beat the champion."),
    ("--verify", "promotion.verify", str,
     "How the promoted copy is checked: hashes, load or revalidate (runs the validation again)."),
    ("--no-verify", "promotion.verify", None, "Check only the copy's sha256 hashes (same as --verify hashes)."),
    ("--registered-model", "promotion.registered_model", str, "MLflow registered model name (default: the model name)."),
    ("--model-loader", "promotion.model_loader", str,
     "For checkpoints not in podium's format: 'package.module:function' from the checkpoint folder to a torch "
     "module or an object with predict(DataFrame); podium serves and registers the MLflow model built from it."),
    ("--rescore", "promotion.rescore", str, "A champion that cannot be scored on the candidate's validation data: "
                                            "refuse, or compare with its stored number."),
]


# `podium run` / `podium promote` did all their work (trained, validated, recorded in MLflow, promoted),
# but the Prefect server stopped answering: the flow run's end (and what was held for it) is not in Prefect
NOT_RECORDED_EXIT = 4


class CliError(Exception):
    """A user error: printed without a traceback, exit code 2."""

    exit_code = 2


class ServerUnreachable(CliError):
    """A server podium records to stopped answering during a run: printed without a traceback, exit
    code 3. The run can be resumed."""

    exit_code = 3


class RunFailed(CliError):
    """The run ended without anything to promote for a reason podium can state (its loop never
    reported a checkpoint): printed without a traceback, exit code 1."""

    exit_code = 1


def tracking_outage_message(exc: Exception, run_name: str, command: str) -> str:
    """What to tell someone whose run stopped because the MLflow tracking server did not answer."""
    return (f"{exc}.\n"
            f"  The run {run_name!r} stopped. What MLflow already recorded is kept, and so are the checkpoints "
            "in storage.\n"
            f"  Once the server answers again, run the same `podium {command}` (same --run-name): it resumes, "
            "and checkpoints that already have a verdict are not validated again.")


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
    from podium.config import load_table_file, parse_assignment

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
    """Config file, then flags, then embedded defaults for empty locations; validated."""
    from podium.config import ConfigError, load_config

    try:
        return load_config(args.config, flag_overrides(args), settings)
    except ConfigError as exc:
        raise CliError(str(exc)) from None


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least `minimum` (a bad value is a usage error, exit code 2)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer of at least {minimum}, got {value}")
        return value
    return parse


def _default(path: str) -> Any:
    from podium.config import field_default

    return field_default(path)


def _help(path: str, text: str) -> str:
    """An option's help, with the default from the config model (stated there, once)."""
    from podium.config import field_default

    default = field_default(path) if "default:" not in text else None
    shown = default if not isinstance(default, bool) else None
    return f"{text} (default: {shown})" if shown not in (None, "", [], {}) else text


def _add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML or JSON file with the run's configuration (flags override it).")
    for flag, path, typ, help_ in OPTIONS:
        if flag in ("--loop-config", "--loop-dataset"):
            p.add_argument(flag, action="append", metavar="KEY=VALUE", help=help_)
        elif flag == "--loop-config-file":
            p.add_argument(flag, metavar="FILE", help=help_)
        elif typ is None:
            p.add_argument(flag, action="store_true", default=None, help=help_)
        else:
            p.add_argument(flag, type=typ, default=None, help=_help(path, help_))
    p.add_argument("--json", action="store_true", help="End by printing one JSON object with the outcome.")
    p.add_argument("--quiet", action="store_true", help="No progress lines.")


def _add_ray_address(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ray-address", help="Run on this existing Ray cluster, e.g. 10.0.0.5:6379 (sets RAY_ADDRESS; "
                                         "default: RAY_ADDRESS, else a local Ray).")


def use_current_directory() -> None:
    """Resolve import paths from the current directory first (as uvicorn and celery do), so that a
    user's `training.train:train_func` is found in the repository podium runs from."""
    cwd = os.getcwd()
    if sys.path[:1] != [cwd]:
        sys.path.insert(0, cwd)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used to document the CLI)."""
    from podium import commands

    parser = argparse.ArgumentParser(
        prog="podium",
        description="Train on Ray Train, validate every checkpoint as it lands, record in MLflow, promote the best. "
                    "Embedded defaults keep everything under ./.podium; MLFLOW_TRACKING_URI, PREFECT_API_URL and "
                    "RAY_ADDRESS point it at real servers. Import paths (--train-loop, --validate-fn) resolve from "
                    "the current directory first: run podium from your repository's root.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="Train, validate every checkpoint, promote the best.",
                         description="Train, validate every checkpoint as it lands, record in MLflow, promote.")
    _add_options(run)
    _add_ray_address(run)
    run.set_defaults(func=lambda a: commands.run_flow(a, "run"))
    promote = sub.add_parser("promote", help="Promote the best checkpoint of an existing run.",
                             description="Promote the best validated checkpoint of an existing run.")
    _add_options(promote)
    _add_ray_address(promote)
    promote.set_defaults(func=lambda a: commands.run_flow(a, "promote"))
    status = sub.add_parser("status", help="Checkpoints of a run (default: the latest), what it promoted, "
                                           "and the model's champion.")
    _add_options(status)
    status.set_defaults(func=commands.cmd_status)
    ui = sub.add_parser("ui", help="Links to a run (default: the latest) in the Prefect and MLflow UIs.",
                        description="Print links to a run (default: the latest) in the Prefect and MLflow UIs. "
                                    "Starts this home's Prefect server if needed, and an MLflow UI on the run's "
                                    "store unless PODIUM_MLFLOW_UI_URL or an `mlflow server` tracking URI says "
                                    "where one is; that one serves until Ctrl-C.")
    _add_options(ui)
    ui.set_defaults(func=commands.cmd_ui)
    rollback = sub.add_parser("rollback", help="Restore the previous champion at a serving location.",
                              description="Atomically point CURRENT back at the previous champion of the serving "
                                          "history (or --to) and move the MLflow alias with it. The version left "
                                          "is withdrawn: never promoted again unless named with --to. Each "
                                          "rollback goes one champion further back.")
    rollback.add_argument("--model", default=_default("model"),
                          help=_help("model", "The model whose champion to restore."))
    rollback.add_argument("--serving", help="Serving location (default: .podium/serving/<model>).")
    rollback.add_argument("--to", help="Version to restore, e.g. v000002 (default: the previous champion); a "
                                       "withdrawn version named here is served again.")
    rollback.add_argument("--reason", help="Why, in words: kept in the serving history and on the MLflow records.")
    rollback.add_argument("--registered-model", help="MLflow registered model (default: the model name).")
    rollback.add_argument("--alias", default=_default("promotion.alias"),
                          help=_help("promotion.alias", "Alias to move."))
    rollback.add_argument("--json", action="store_true", help="Print the outcome as JSON.")
    rollback.set_defaults(func=commands.cmd_rollback)
    history = sub.add_parser("history", help="The champions of a serving location: when, why, what started them.",
                             description="Every promotion and rollback of a serving location, oldest first, "
                                         "with the current and the withdrawn versions marked. Reads only.")
    history.add_argument("--serving", help="Serving location (default: .podium/serving).")
    history.add_argument("--json", action="store_true", help="Print the history as JSON.")
    history.set_defaults(func=commands.cmd_history)
    from podium import provenance

    lineage = sub.add_parser("lineage", help="Where a served version came from, or which runs and champions used a "
                                             "dataset (by digest).",
                             description=provenance.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    lineage.add_argument("what", help="A serving version (v000002) or a dataset digest (its first 8+ characters).")
    lineage.add_argument("--serving", help="Serving location (default: .podium/serving/<model>).")
    lineage.add_argument("--model", default=_default("model"), help=_help("model", "The model whose serving location to read."))
    lineage.add_argument("--json", action="store_true", help="Print the answer as JSON.")
    lineage.set_defaults(func=provenance.cmd_lineage)
    make = sub.add_parser("make-data", help="Write the synthetic demo dataset (Parquet).")
    make.add_argument("--out", help="Output folder or URI (default: .podium/data).")
    make.add_argument("--train-rows", type=at_least(1), default=24000, help="Training rows (default: 24000).")
    make.add_argument("--val-rows", type=at_least(1), default=6000, help="Validation rows (default: 6000).")
    make.add_argument("--features", type=at_least(1), default=16, help="Feature columns (default: 16).")
    make.add_argument("--classes", type=at_least(2), default=4, help="Classes (default: 4).")
    make.add_argument("--seed", type=int, default=0, help="Random seed.")
    make.set_defaults(func=commands.cmd_make_data)
    worker = sub.add_parser("worker", help="Run a Prefect process worker for podium's deployments.",
                            description="Run `prefect worker start --type process` for podium's work pool, with "
                                        "RAY_ADDRESS and PODIUM_HOME set for its flow runs. MLFLOW_TRACKING_URI "
                                        "and the other variables of this environment pass through.")
    worker.add_argument("--pool", default="podium", help="Work pool (default: podium; created if missing).")
    worker.add_argument("--ray-address", help="Ray cluster the flow runs use (sets RAY_ADDRESS).")
    worker.add_argument("--limit", type=int, help="Flow runs at once on this worker (default: no limit).")
    worker.set_defaults(func=commands.cmd_worker)
    server = sub.add_parser("server", help="Start or stop the local Prefect server of the embedded defaults.")
    server.add_argument("action", choices=["start", "stop"])
    server.set_defaults(func=commands.cmd_server)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `podium` console command."""
    args = build_parser().parse_args(argv)
    use_current_directory()
    try:
        return args.func(args)
    except CliError as exc:
        print(f"podium: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:  # Ctrl-C before a run started (or after it ended): nothing to stop cleanly
        print("podium: interrupted", file=sys.stderr)
        return 130
    finally:
        # the output is written: spare the exit a last garbage collection over every loaded library
        # (measured at seconds with torch, ray, prefect and mlflow loaded)
        gc.freeze()


if __name__ == "__main__":
    # `python -m podium.cli` runs this file as __main__: call the podium.cli module's main, whose error
    # classes are the ones podium.commands raises
    from podium.cli import main as _main

    sys.exit(_main())
