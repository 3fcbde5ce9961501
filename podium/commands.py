"""What each `podium` command does, once its arguments are parsed (see podium.cli)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from podium.cli import CliError, ServerUnreachable, config_from_args, tracking_outage_message
from podium.output import print_summary, summary_json
from podium.settings import PodiumSettings


def use_ray_address(address: str | None) -> None:
    """Point Ray at an existing cluster; only effective before Ray is initialised in this process."""
    if address:
        os.environ["RAY_ADDRESS"] = address


class _ProgressPrinter(logging.Handler):
    def __init__(self, stream: Any, start: float):
        super().__init__(logging.INFO)
        self.stream, self.start = stream, start

    def emit(self, record: logging.LogRecord) -> None:
        self.stream.write(f"[{time.monotonic() - self.start:7.1f}s] {record.getMessage()}\n")
        self.stream.flush()


def _quiet_libraries(log_file: Path) -> None:
    """Route library logs to a file: the terminal shows podium's progress lines."""
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "podium")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("TQDM_DISABLE", "1")
    # mlflow would add a stderr handler to its logger on import; without it, its records reach the file below
    # (and mlflow is imported when it is needed, not here)
    os.environ.setdefault("MLFLOW_CONFIGURE_LOGGING", "false")
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
    logging.getLogger("mlflow").setLevel(logging.INFO)  # the level mlflow's own configuration would set


class StartupClock:
    """When each start-up phase of a command ran, in seconds since the command started (`--json` reports it)."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.started_at = time.time()
        self.phases: dict[str, list[float]] = {}

    def record(self, name: str, began: float, ended: float | None = None) -> None:
        """A phase that ran from `began` to `ended` (time.monotonic(); default: now)."""
        self.phases[name] = [round(began - self.start, 3), round((ended or time.monotonic()) - self.start, 3)]

    def to_dict(self) -> dict[str, Any]:
        """The "startup" block of the JSON output."""
        return {"started_at": round(self.started_at, 3), "phases": self.phases}


def _prepare(config: Any, settings: PodiumSettings, clock: StartupClock | None = None,
             start_ray: bool = False) -> tuple[str, str]:
    """Preflight, then the servers at the same time: the Prefect server (checked or started) and, for a
    training run, Ray (started with the validation warm-up) in background threads, while this thread opens
    the MLflow store and loads what training needs. Returns (tracking_uri, api_url)."""
    clock = clock or StartupClock()
    began = time.monotonic()
    _maybe_make_demo_data(config, settings)
    from podium.config import ConfigError
    from podium.tasks.plan import plan_run

    try:
        plan = plan_run(config)  # before any server starts or anything trains
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    clock.record("preflight", began)
    from podium import services

    prefect = services.Background(services.ensure_prefect_server, settings.home_dir, settings.prefect_port,
                                  settings.prefect_api_url, name="podium-prefect-server")
    ray_start = None
    if start_ray:
        from podium.tasks.train import start_ray_early

        ray_start = start_ray_early(plan)
    tracking_uri = settings.resolved_tracking_uri()
    began = time.monotonic()
    from podium.tracking.client import apply_http_retry_defaults

    apply_http_retry_defaults()  # before the first MLflow request
    try:
        services.prepare_mlflow(tracking_uri)
    except services.ServiceError as exc:
        raise CliError(str(exc)) from None
    clock.record("mlflow_store", began)
    if ray_start is not None:
        began = time.monotonic()
        import torch  # noqa: F401  (TorchTrainer loads it when training starts; now it overlaps Ray's start)

        clock.record("import_torch", began)
        ray_start.wait()  # Ray Train may load from here on (see podium.training.cluster.start_early)
        clock.record("ray", ray_start.started, ray_start.ended)
    try:
        api_url = prefect.result()
    except services.ServiceError as exc:
        raise CliError(str(exc)) from None
    clock.record("prefect_server", prefect.started, prefect.ended)
    return tracking_uri, api_url


def _maybe_make_demo_data(config: Any, settings: PodiumSettings) -> None:
    default = settings.home_dir / "data"
    if config.data.train.startswith(str(default)) and not Path(config.data.train).exists():
        from podium.training.data import make_classification_data

        make_classification_data(str(default))


def run_flow(args: argparse.Namespace, which: str) -> int:
    """`podium run` / `podium promote`: the whole pipeline, or promotion alone, as a Prefect flow run."""
    use_ray_address(args.ray_address)
    settings = PodiumSettings()
    clock = StartupClock()
    start = clock.start
    config = config_from_args(args, settings)  # a bad flag fails here, before any library loads
    _quiet_libraries(settings.home_dir / "logs" / "podium.log")
    clock.record("config_and_logging", start)
    progress = logging.getLogger("podium.progress")
    if not args.quiet:
        progress.addHandler(_ProgressPrinter(sys.stderr if args.json else sys.stdout, start))
    progress.setLevel(logging.INFO)
    tracking_uri, api_url = _prepare(config, settings, clock, start_ray=which == "run")
    began = time.monotonic()
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from podium.services import ui_url
    from podium.tasks.plan import RunInProgress
    from podium.tracking.client import TrackingUnavailable

    progress.info("Prefect UI: %s", ui_url(api_url))
    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        if which == "run":
            from podium.flows.pipeline import train_validate_promote as flow_fn
        else:
            from podium.flows.promote import promote_run as flow_fn
        clock.record("import_flow", began)
        logging.getLogger("podium.startup").info("start-up phases (s since start): %s", clock.phases)
        try:
            summary = flow_fn.with_options(flow_run_name=f"{config.run_name}-{which}")(
                config=config, tracking_uri=tracking_uri, mlflow_ui=settings.mlflow_ui_url)
        except TrackingUnavailable as exc:
            raise ServerUnreachable(tracking_outage_message(exc, config.run_name, which)) from None
        except RunInProgress as exc:
            raise CliError(str(exc)) from None
    elapsed = time.monotonic() - start
    if args.json:
        out = summary_json(summary, config.serving)
        out["wall_time_s"] = round(elapsed, 1)
        out["prefect_ui"] = f"{ui_url(api_url)}/runs/flow-run/{summary.flow_run_id}"
        out["startup"] = clock.to_dict()
        print(json.dumps(out))
        return 0
    print_summary(summary, config, settings, tracking_uri, api_url, elapsed)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Checkpoints and champion of a run, from MLflow and the serving location."""
    settings = PodiumSettings()
    config = config_from_args(args, settings)
    from podium.tasks.promote import read_champion
    from podium.tracking.client import TrackingUnavailable
    from podium.tracking.records import list_records
    from podium.tracking.runs import find_tracking_run

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
        from podium.serving.layout import read_current

        current = read_current(config.serving)
        print(json.dumps({
            "run_name": config.run_name, "mlflow_run_id": tracking.run_id, "tracking_uri": tracking_uri,
            "checkpoints": [{"step": r.step, "uri": r.uri, "status": r.status, "metrics": r.metrics}
                            for r in records],
            "promoted": ({"version": champion.version, "uri": current.uri, "step": champion.step,
                          "metric": champion.metric, "value": champion.value,
                          "run_name": current.manifest.get("run_name")} if champion and current else None),
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
    from podium.serving.layout import ServingError
    from podium.tasks.promote import roll_back

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
    from podium.training.data import make_classification_data

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
