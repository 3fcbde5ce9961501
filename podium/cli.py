"""The `podium` command: run, promote, status, make-data, server."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
import time
import tomllib
from pathlib import Path
from typing import Any, Callable

from podium.settings import PodiumSettings

# (flag, config path, type, help). Every option of `run` and `promote`; `--help` prints them all.
OPTIONS: list[tuple[str, str, Callable[[str], Any] | None, str]] = [
    ("--run-name", "run_name", str, "Run name: Ray Train's RunConfig name and the MLflow run name. "
                                    "Running the same name again resumes it."),
    ("--experiment", "experiment", str, "MLflow experiment name (default: podium)."),
    ("--storage", "storage", str, "Where Ray Train persists checkpoints (path or URI; default: .podium/storage)."),
    ("--serving", "serving", str, "Serving location for promoted models (path or URI; default: .podium/serving)."),
    ("--train-data", "data.train", str, "Training Parquet file or directory (default: generated demo data)."),
    ("--val-data", "data.val", str, "Validation Parquet file or directory (default: generated demo data)."),
    ("--label-column", "data.label_column", str, "Integer label column (default: label)."),
    ("--feature-columns", "data.feature_columns", lambda s: [c.strip() for c in s.split(",") if c.strip()],
     "Comma-separated feature columns (default: every column but the label)."),
    ("--epochs", "training.epochs", int, "Epochs to train (default: 5)."),
    ("--batch-size", "training.batch_size", int, "Per-worker batch size (default: 128)."),
    ("--learning-rate", "training.learning_rate", float, "Adam learning rate (default: 0.01)."),
    ("--checkpoint-every-steps", "training.checkpoint_every_steps", int,
     "Checkpoint every N steps instead of every epoch."),
    ("--train-loop", "training.train_loop", str,
     "Your own train_loop_per_worker as 'package.module:function' (plain Ray Train APIs)."),
    ("--num-workers", "scaling.num_workers", int, "Ray Train workers (default: 2)."),
    ("--use-gpu", "scaling.use_gpu", None, "One GPU per training worker."),
    ("--validate-fn", "validation.fn", str,
     "Validation function '(checkpoint, **kwargs) -> dict' as 'package.module:function'."),
    ("--validate-kwargs", "validation.kwargs", json.loads, "Extra kwargs for the validation function, as JSON."),
    ("--concurrency", "validation.concurrency", int, "Validations running at once (default: 2)."),
    ("--validation-cpus", "validation.num_cpus", float, "CPUs per validation task (default: 1)."),
    ("--validation-gpus", "validation.num_gpus", float, "GPUs per validation task (default: 0)."),
    ("--validation-retries", "validation.retries", int, "Retries of a failed validation (default: 1)."),
    ("--validation-timeout", "validation.timeout_s", float, "Seconds before a validation attempt is cancelled."),
    ("--metric", "promotion.metric", str, "Metric that ranks checkpoints (default: val_loss)."),
    ("--mode", "promotion.mode", str, "'min' or 'max': which direction of the metric is better (default: min)."),
    ("--min-delta", "promotion.min_delta", float, "Margin by which the best must beat the champion (default: 0)."),
    ("--always-promote", "promotion.always", None, "Promote the best checkpoint even if it does not beat the champion."),
    ("--verify", "promotion.verify", str,
     "How the promoted copy is checked: hashes, load (default) or revalidate (runs the validation again)."),
    ("--no-verify", "promotion.verify", None, "Check only the copy's sha256 hashes (same as --verify hashes)."),
    ("--registered-model", "promotion.registered_model", str, "MLflow registered model name (default: podium)."),
]


class CliError(Exception):
    """A user error: printed without a traceback, exit code 2."""

    exit_code = 2


class ServerUnreachable(CliError):
    """A server podium records to stopped answering during a run: printed without a traceback, exit
    code 3. The run can be resumed."""

    exit_code = 3


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


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_config_file(path: str) -> dict[str, Any]:
    """A TOML or JSON config file as a nested dict."""
    p = Path(path)
    if not p.exists():
        raise CliError(f"--config = {path!r}: no such file")
    try:
        if p.suffix == ".json":
            return json.loads(p.read_text())
        return tomllib.loads(p.read_text())
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise CliError(f"--config = {path!r}: cannot parse ({exc})") from None


def config_from_args(args: argparse.Namespace, settings: PodiumSettings):
    """Config file, then flags, then embedded defaults for empty locations; validated."""
    from training.config import ConfigError, build_config

    data = load_config_file(args.config) if args.config else {}
    flags: dict[str, Any] = {}
    for flag, path, _, _ in OPTIONS:
        value = getattr(args, flag[2:].replace("-", "_"), None)
        if value is None:
            continue
        if flag == "--no-verify":
            value = "hashes"
        _set(flags, path, value)
    data = _merge(data, flags)
    data.setdefault("storage", settings.default_location("storage"))
    data.setdefault("serving", settings.default_location("serving"))
    data.setdefault("data", {})
    data["data"].setdefault("train", str(settings.home_dir / "data" / "train.parquet"))
    data["data"].setdefault("val", str(settings.home_dir / "data" / "val.parquet"))
    try:
        return build_config(data)
    except ConfigError as exc:
        raise CliError(str(exc)) from None


def _add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML or JSON file with the run's configuration (flags override it).")
    for flag, _, typ, help_ in OPTIONS:
        if typ is None:
            p.add_argument(flag, action="store_true", default=None, help=help_)
        else:
            p.add_argument(flag, type=typ, default=None, help=help_)
    p.add_argument("--json", action="store_true", help="End by printing one JSON object with the outcome.")
    p.add_argument("--quiet", action="store_true", help="No progress lines.")


def _add_ray_address(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ray-address", help="Run on this existing Ray cluster, e.g. 10.0.0.5:6379 (sets RAY_ADDRESS; "
                                         "default: RAY_ADDRESS, else a local Ray).")


def use_ray_address(address: str | None) -> None:
    """Point Ray at an existing cluster; only effective before Ray is initialised in this process."""
    if address:
        os.environ["RAY_ADDRESS"] = address


class _ProgressPrinter(logging.Handler):
    def __init__(self, stream, start: float):
        super().__init__(logging.INFO)
        self.stream, self.start = stream, start

    def emit(self, record: logging.LogRecord) -> None:
        self.stream.write(f"[{time.monotonic() - self.start:7.1f}s] {record.getMessage()}\n")
        self.stream.flush()


def _quiet_libraries(log_file: Path) -> None:
    """Route library logs to a file: the terminal shows podium's progress lines."""
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "podium,tasks,training,flows")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("TQDM_DISABLE", "1")
    log_file.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(log_file)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    import prefect.logging.handlers  # configures Prefect's logging; its console handler is replaced below

    from prefect.logging.configuration import setup_logging

    setup_logging()
    for name in ("", "prefect"):
        lg = logging.getLogger(name)
        for h in list(lg.handlers):
            if isinstance(h, prefect.logging.handlers.PrefectConsoleHandler):
                lg.removeHandler(h)
    logging.getLogger().addHandler(handler)
    import mlflow  # noqa: F401  (mlflow adds a stderr handler to its logger on import)

    logging.getLogger("mlflow").handlers.clear()
    logging.getLogger("mlflow").propagate = True


def _prepare(config, settings: PodiumSettings):
    """Preflight, servers. Returns (tracking_uri, api_url)."""
    _maybe_make_demo_data(config, settings)
    from tasks.plan import plan_run
    from training.config import ConfigError

    try:
        plan_run(config)  # before any server starts or anything trains
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    from podium.services import ServiceError, ensure_prefect_server, prepare_mlflow

    tracking_uri = settings.resolved_tracking_uri()
    try:
        prepare_mlflow(tracking_uri)
        api_url = ensure_prefect_server(settings.home_dir, settings.prefect_port, settings.prefect_api_url)
    except ServiceError as exc:
        raise CliError(str(exc)) from None
    return tracking_uri, api_url


def _maybe_make_demo_data(config, settings: PodiumSettings) -> None:
    default = settings.home_dir / "data"
    if config.data.train.startswith(str(default)) and not Path(config.data.train).exists():
        from training.data import make_classification_data

        make_classification_data(str(default))


def _summary_json(summary, serving: str) -> dict[str, Any]:
    promoted = summary.promotion.promoted
    return {
        "run_name": summary.run_name,
        "mlflow_run_id": summary.tracking.run_id,
        "tracking_uri": summary.tracking.tracking_uri,
        "checkpoints": [{"step": r.step, "uri": r.uri, "status": r.status, "metrics": r.metrics,
                         "validated_at": r.validated_at, **({"failure": r.failure} if r.failure else {})}
                        for r in summary.checkpoints],
        "training_ended_at": summary.training_ended_at,
        "promoted": ({"version": promoted.version, "uri": promoted.uri, "step": promoted.step,
                      "metric": promoted.metric, "value": promoted.value,
                      "mlflow_version": promoted.mlflow_version} if promoted else None),
        "promotion_reason": summary.promotion.reason,
        "serving": serving,
    }


def _run_flow(args: argparse.Namespace, which: str) -> int:
    use_ray_address(args.ray_address)
    settings = PodiumSettings()
    start = time.monotonic()
    config = config_from_args(args, settings)  # a bad flag fails here, before any library loads
    _quiet_libraries(settings.home_dir / "logs" / "podium.log")
    progress = logging.getLogger("podium.progress")
    if not args.quiet:
        progress.addHandler(_ProgressPrinter(sys.stderr if args.json else sys.stdout, start))
    progress.setLevel(logging.INFO)
    from tasks.plan import RunInProgress
    from tasks.tracking import TrackingUnavailable, apply_http_retry_defaults

    apply_http_retry_defaults()  # before the first MLflow request (the store check in _prepare)
    tracking_uri, api_url = _prepare(config, settings)
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from podium.services import ui_url

    progress.info("Prefect UI: %s", ui_url(api_url))
    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        if which == "run":
            from flows.pipeline import train_validate_promote as flow_fn
        else:
            from flows.promote import promote_run as flow_fn
        try:
            summary = flow_fn.with_options(flow_run_name=f"{config.run_name}-{which}")(
                config=config, tracking_uri=tracking_uri, mlflow_ui=settings.mlflow_ui_url)
        except TrackingUnavailable as exc:
            raise ServerUnreachable(tracking_outage_message(exc, config.run_name, which)) from None
        except RunInProgress as exc:
            raise CliError(str(exc)) from None
    elapsed = time.monotonic() - start
    if args.json:
        out = _summary_json(summary, config.serving)
        out["wall_time_s"] = round(elapsed, 1)
        out["prefect_ui"] = f"{ui_url(api_url)}/runs/flow-run/{summary.flow_run_id}"
        print(json.dumps(out))
        return 0
    _print_human(summary, config, settings, tracking_uri, api_url, elapsed)
    return 0


def _print_human(summary, config, settings, tracking_uri, api_url, elapsed) -> None:
    from podium.services import ui_url

    print()
    print(f"run {summary.run_name}: {len(summary.checkpoints)} checkpoints in {elapsed:.1f} s")
    for r in summary.checkpoints:
        m = " ".join(f"{k}={v:.4g}" for k, v in sorted(r.metrics.items()) if k not in ("step", "epoch"))
        print(f"  step {r.step:>7}  {r.status:<9} {m}" + (f"  ({r.failure})" if r.failure else ""))
    p = summary.promotion.promoted
    if p:
        print(f"promoted step {p.step} ({p.metric}={p.value:.4g}) as {p.version}: {p.uri}")
    else:
        print("nothing promoted")
    print(f"  why: {summary.promotion.reason}")
    print(f"Prefect UI:  {ui_url(api_url)}/runs/flow-run/{summary.flow_run_id}   (Artifacts tab: checkpoints, "
          "promotion report, chart)")
    print(f"MLflow UI:   mlflow ui --backend-store-uri {tracking_uri}   then")
    print(f"             {summary.tracking.run_url(settings.mlflow_ui_url)}   (the run)")
    print(f"             {summary.tracking.models_url(settings.mlflow_ui_url)}   (checkpoints side by side)")
    print(f"Serving:     {config.serving}  (load with podium.load_promoted_model)")


def cmd_status(args: argparse.Namespace) -> int:
    """Checkpoints and champion of a run, from MLflow and the serving location."""
    settings = PodiumSettings()
    config = config_from_args(args, settings)
    from tasks.promote import read_champion
    from tasks.tracking import TrackingUnavailable, find_tracking_run, list_records

    tracking_uri = settings.resolved_tracking_uri()
    try:
        tracking = find_tracking_run(tracking_uri, config.experiment, config.run_name)
        records = list_records(tracking)
    except LookupError as exc:
        raise CliError(str(exc)) from None
    except TrackingUnavailable as exc:
        raise ServerUnreachable(str(exc)) from None
    champion = read_champion(config.serving)
    if args.json:
        from training.serving import read_current

        current = read_current(config.serving)
        print(json.dumps({
            "run_name": config.run_name, "mlflow_run_id": tracking.run_id, "tracking_uri": tracking_uri,
            "checkpoints": [{"step": r.step, "uri": r.uri, "status": r.status, "metrics": r.metrics}
                            for r in records],
            "promoted": ({"version": champion.version, "uri": current.uri, "step": champion.step,
                          "metric": champion.metric, "value": champion.value,
                          "run_name": current.manifest.get("run_name")} if champion else None),
        }))
        return 0
    print(f"run {config.run_name} (MLflow run {tracking.run_id}): {len(records)} checkpoints")
    for r in records:
        m = " ".join(f"{k}={v:.4g}" for k, v in sorted(r.metrics.items()) if k not in ("step", "epoch"))
        print(f"  step {r.step:>7}  {r.status:<9} {m}")
    print(f"champion at {config.serving}: " + (f"{champion.version} (step {champion.step}, "
                                               f"{champion.metric}={champion.value})" if champion else "none"))
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    """Point the serving location back at the previous champion; the MLflow alias follows."""
    settings = PodiumSettings()
    from tasks.promote import roll_back
    from training.serving import ServingError

    serving = args.serving or settings.default_location("serving")
    try:
        out = roll_back(serving, settings.resolved_tracking_uri(), args.registered_model, args.alias, args.to)
    except ServingError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print(json.dumps(out.model_dump()))
    else:
        print(f"serving {serving}: {out.from_version} -> {out.to_version}; "
              f"alias {args.alias} -> " + (f"version {out.mlflow_version}" if out.mlflow_version else "not moved"))
    return 0


def cmd_make_data(args: argparse.Namespace) -> int:
    """Write the deterministic synthetic dataset."""
    from training.data import make_classification_data

    out = args.out or str(PodiumSettings().home_dir / "data")
    train, val = make_classification_data(out, train_rows=args.train_rows, val_rows=args.val_rows,
                                          num_features=args.features, num_classes=args.classes, seed=args.seed)
    print(f"wrote {train}\nwrote {val}")
    return 0


def cmd_server(args: argparse.Namespace) -> int:
    """Start or stop the local Prefect server of the embedded defaults."""
    from podium.services import ensure_prefect_server, stop_prefect_server, ui_url

    settings = PodiumSettings()
    if args.action == "stop":
        print("stopped" if stop_prefect_server(settings.home_dir) else "no local server was running")
        return 0
    url = ensure_prefect_server(settings.home_dir, settings.prefect_port, settings.prefect_api_url)
    print(f"Prefect API: {url}\nPrefect UI:  {ui_url(url)}")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    """Become a Prefect process worker for podium's deployments; flow runs inherit its environment."""
    from podium.services import ServiceError, ensure_prefect_server

    settings = PodiumSettings()
    try:
        api_url = ensure_prefect_server(settings.home_dir, settings.prefect_port, settings.prefect_api_url)
    except ServiceError as exc:
        raise CliError(str(exc)) from None
    use_ray_address(args.ray_address)
    # flow runs start in a temporary folder: the embedded defaults must not resolve against it
    env = {**os.environ, "PREFECT_API_URL": api_url, "PODIUM_HOME": str(settings.home_dir)}
    cmd = [sys.executable, "-m", "prefect", "worker", "start", "--pool", args.pool, "--type", "process"]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    print(f"podium worker: pool {args.pool}, Prefect API {api_url}, Ray "
          f"{env.get('RAY_ADDRESS') or 'local (per flow run)'}", flush=True)
    os.execve(sys.executable, cmd, env)
    return 0  # not reached


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used to document the CLI)."""
    parser = argparse.ArgumentParser(
        prog="podium",
        description="Train on Ray Train, validate every checkpoint as it lands, record in MLflow, promote the best. "
                    "Embedded defaults keep everything under ./.podium; MLFLOW_TRACKING_URI, PREFECT_API_URL and "
                    "RAY_ADDRESS point it at real servers.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="Train, validate every checkpoint, promote the best.",
                         description="Train, validate every checkpoint as it lands, record in MLflow, promote.")
    _add_options(run)
    _add_ray_address(run)
    run.set_defaults(func=lambda a: _run_flow(a, "run"))
    promote = sub.add_parser("promote", help="Promote the best checkpoint of an existing run.",
                             description="Promote the best validated checkpoint of an existing run.")
    _add_options(promote)
    _add_ray_address(promote)
    promote.set_defaults(func=lambda a: _run_flow(a, "promote"))
    status = sub.add_parser("status", help="Checkpoints and champion of a run.")
    _add_options(status)
    status.set_defaults(func=cmd_status)
    rollback = sub.add_parser("rollback", help="Restore the previous champion at a serving location.",
                              description="Atomically point CURRENT back at the previous champion (or --to) "
                                          "and move the MLflow alias with it.")
    rollback.add_argument("--serving", help="Serving location (default: .podium/serving).")
    rollback.add_argument("--to", help="Version to restore, e.g. v000002 (default: the previous champion).")
    rollback.add_argument("--registered-model", default="podium", help="MLflow registered model (default: podium).")
    rollback.add_argument("--alias", default="champion", help="Alias to move (default: champion).")
    rollback.add_argument("--json", action="store_true", help="Print the outcome as JSON.")
    rollback.set_defaults(func=cmd_rollback)
    make = sub.add_parser("make-data", help="Write the synthetic demo dataset (Parquet).")
    make.add_argument("--out", help="Output folder or URI (default: .podium/data).")
    make.add_argument("--train-rows", type=int, default=24000, help="Training rows (default: 24000).")
    make.add_argument("--val-rows", type=int, default=6000, help="Validation rows (default: 6000).")
    make.add_argument("--features", type=int, default=16, help="Feature columns (default: 16).")
    make.add_argument("--classes", type=int, default=4, help="Classes (default: 4).")
    make.add_argument("--seed", type=int, default=0, help="Random seed (default: 0).")
    make.set_defaults(func=cmd_make_data)
    worker = sub.add_parser("worker", help="Run a Prefect process worker for podium's deployments.",
                            description="Run `prefect worker start --type process` for podium's work pool, with "
                                        "RAY_ADDRESS and PODIUM_HOME set for its flow runs. MLFLOW_TRACKING_URI "
                                        "and the other variables of this environment pass through.")
    worker.add_argument("--pool", default="podium", help="Work pool (default: podium; created if missing).")
    worker.add_argument("--ray-address", help="Ray cluster the flow runs use (sets RAY_ADDRESS).")
    worker.add_argument("--limit", type=int, help="Flow runs at once on this worker (default: no limit).")
    worker.set_defaults(func=cmd_worker)
    server = sub.add_parser("server", help="Start or stop the local Prefect server of the embedded defaults.")
    server.add_argument("action", choices=["start", "stop"])
    server.set_defaults(func=cmd_server)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `podium` console command."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CliError as exc:
        print(f"podium: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        # the output is written: spare the exit a last garbage collection over every loaded library
        # (measured at seconds with torch, ray, prefect and mlflow loaded)
        gc.freeze()


if __name__ == "__main__":
    sys.exit(main())
