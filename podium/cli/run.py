"""`podium run` and `podium promote`: the plan (before anything starts: a bad input is refused in seconds), the
start-up (servers, Ray, logging, torch, side by side), then the flow run, and what its result is in exit codes.

The start-up's phases are timed (`StartupClock`) and reported in `--json`'s `startup` block.

Imports inside functions are on purpose (start-up): each phase loads its libraries when it runs, beside the
servers' start, and `podium --help` or a bad flag answers before any of them loads.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podium import prefect_api, services
from podium.cli import signals  # the command's signal handling: standard library only (0.005 s)
from podium.cli.errors import Refused, RunFailed, ServerUnreachable, tracking_outage_message
from podium.cli.options import config_from_args, use_ray_address
from podium.cli.output import print_summary, summary_json
from podium.cli.recorded import promote_settings
from podium.core.exits import exit_for_signal
from podium.errors import (
    EXIT_NOT_RECORDED,
    AliasTaken,
    ConfigError,
    NoCheckpointReported,
    RayClusterUnreachable,
    RunInProgress,
    ServiceError,
    ServingError,
    TrackingUnavailable,
    UnfinishedRun,
    UserCodeError,
)
from podium.flows import stop  # the run's stop request (STOP), which the command reads once the run ended
from podium.outages import is_unreachable
from podium.settings import PodiumSettings
from podium.tracking.client import apply_http_retry_defaults
from podium.tracking.runs import latest_run_name


class _ProgressPrinter(logging.Handler):
    def __init__(self, stream: Any, start: float):
        super().__init__(logging.INFO)
        self.stream, self.start = stream, start

    def emit(self, record: logging.LogRecord) -> None:
        self.stream.write(f"[{time.monotonic() - self.start:7.1f}s] {record.getMessage()}\n")
        self.stream.flush()


def quiet_command(settings: PodiumSettings) -> None:
    """A command that runs a flow in this process: the libraries' environment set, their records routed to the log
    file (`<home>/logs/podium.log`); the terminal is for the command's own lines."""
    log_file = settings.home_dir / "logs" / "podium.log"
    _library_environment(log_file)
    _quiet_libraries(log_file)


def _library_variables() -> None:
    """The environment variables podium's libraries read when they load, and Ray's processes when they start: set
    before the plan, which loads Prefect, and before Ray starts (its workers inherit them). Writes nothing."""
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "podium")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    prefect_api.bound_client_settings(os.environ)  # Prefect's client reads them when it is imported, below
    os.environ.setdefault("TQDM_DISABLE", "1")
    # mlflow would add a stderr handler to its logger on import; without it, its records reach the file below
    # (and mlflow is imported when it is needed, not here)
    os.environ.setdefault("MLFLOW_CONFIGURE_LOGGING", "false")


def _library_environment(log_file: Path) -> None:
    """The environment podium's libraries read when they load, and Ray's processes when they start: set
    before Ray starts (its workers inherit it) and before MLflow is imported; the log file's folder made."""
    _library_variables()
    log_file.parent.mkdir(parents=True, exist_ok=True)
    # Ray Data configures its logger with a console handler when it is imported (here and in the local
    # Ray's workers), and Ray's own logger above it has one too: Ray Data's configuration file sends its
    # records to the log file, and no further
    ray_data_logging = log_file.parent / "ray-data-logging.json"
    ray_data_logging.write_text(json.dumps({
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"podium": {"format": "%(asctime)s %(name)s %(levelname)s %(message)s"}},
        "handlers": {"file": {"class": "logging.FileHandler", "filename": str(log_file), "formatter": "podium"}},
        "loggers": {"ray.data": {"level": "INFO", "handlers": ["file"], "propagate": False}}}))
    os.environ.setdefault("RAY_DATA_LOGGING_CONFIG", str(ray_data_logging))


_log_handlers: dict[Path, logging.Handler] = {}


def _log_handler(log_file: Path) -> logging.Handler:
    """The one handler that writes this process's library records to `log_file`."""
    if log_file not in _log_handlers:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handler = _log_handlers[log_file] = logging.FileHandler(log_file)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    return _log_handlers[log_file]


def _ray_logs_to_file(log_file: Path) -> None:
    """Ray's driver-side records (its logger has a stderr handler of its own, and does not propagate) go to
    the log file: `ray.init`'s warnings are not podium's progress lines. Before Ray starts."""
    import ray  # noqa: F401  (its logging configuration is applied when it is imported)

    ray_logger = logging.getLogger("ray")
    for h in list(ray_logger.handlers):
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
            ray_logger.removeHandler(h)
    ray_logger.addHandler(_log_handler(log_file))


def _quiet_libraries(log_file: Path) -> None:
    """Route library logs to a file: the terminal shows podium's progress lines."""
    handler = _log_handler(log_file)
    import prefect.logging.handlers  # configures Prefect's logging; its console handler is replaced below
    from prefect.logging.configuration import setup_logging

    setup_logging()
    for name in ("", "prefect"):
        lg = logging.getLogger(name)
        for h in list(lg.handlers):
            if isinstance(h, prefect.logging.handlers.PrefectConsoleHandler):
                lg.removeHandler(h)
    logging.getLogger().addHandler(handler)
    # Prefect's log sender writes "--- Error logging to API ---" and the error to stderr for each batch the
    # server did not take, unless logging.raiseExceptions is off: the terminal is for progress lines, and an
    # outage of the server is said once (podium.prefect_api)
    logging.raiseExceptions = False
    logging.getLogger("podium").setLevel(logging.INFO)  # podium's own INFO records reach the file (root says WARNING)
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


@dataclass
class _Servers:
    """What a command started first, each in a background thread: the Prefect server (checked, or started),
    and for a training run Ray with the validation warm-up (podium.training.resources.start_ray_early)."""

    prefect: Any  # podium.services.Background
    ray: Any = None  # podium.training.cluster.EarlyStart


def _start_servers(config: Any, settings: PodiumSettings, which: str) -> _Servers:
    """Set the libraries' environment (Ray's processes inherit it), then start the servers in the background:
    the first thing a command does once its plan is made (`_plan`), so that they start while everything else
    loads. A check that fails after it (the tracking store, the serving location) ends the command, and a Ray it
    started with it."""
    log_file = settings.home_dir / "logs" / "podium.log"
    _library_environment(log_file)
    servers = _Servers(services.Background(services.ensure_prefect_server, settings.home_dir, settings.prefect_port,
                                           settings.prefect_api_url, name="podium-prefect-server"))
    if which == "run":
        from podium.training.resources import start_ray_early

        _ray_logs_to_file(log_file)
        servers.ray = start_ray_early(config)
    return servers


def _plan(config: Any, settings: PodiumSettings, clock: StartupClock, written: list[Path]) -> Any:
    """The run's plan (podium.tasks.plan.plan_run, which a deployment's run calls in its flow), made before any server
    or Ray starts: a bad path, column, import path or metric name is refused here (Refused: one sentence, exit 2),
    with nothing started or left behind. The flow takes the plan and does not plan again. The demo data is made
    where the run asks for it once the settings passed the plan's checks that read no data; a refusal after it (of
    the data itself) removes what it wrote. `written` gets what it wrote, for a later refusal to remove."""
    began = time.monotonic()
    from podium.tasks.plan import plan_run

    def demo_data() -> None:
        start = time.monotonic()
        written.extend(_maybe_make_demo_data(config, settings))
        clock.record("demo_data", start)

    try:
        plan = plan_run(config, before_data=demo_data)
    except ConfigError as exc:
        _remove_written(written)
        raise Refused(str(exc)) from None
    clock.record("plan", began)
    return plan


def _prepare(config: Any, settings: PodiumSettings, clock: StartupClock, servers: _Servers,
             mlflow_checked: tuple[float, float] | None = None) -> tuple[str, str]:
    """What must come before the flow, in this thread while the servers start in theirs (`_start_servers`):
    the tracking URI's check, the serving location's, and (for a training run) torch; then wait for the servers.
    Returns (tracking_uri, api_url). The plan came first (`_plan`); the resume check is the flow's own
    (`check_resume_task`), under the run's lock. `mlflow_checked`: when the command checked the tracking URI
    already (`podium promote`, as it read the run's settings: podium.cli.recorded.promote_settings), not again."""
    tracking_uri = settings.resolved_tracking_uri()
    began = time.monotonic()

    apply_http_retry_defaults()  # before the first MLflow request
    if mlflow_checked is None:
        try:
            services.check_mlflow(tracking_uri)  # the flow opens the store while training runs
        except ServiceError as exc:
            raise Refused(str(exc)) from None
        clock.record("mlflow_check", began)
    else:
        clock.record("mlflow_check", *mlflow_checked)
    _check_serving_location(config, tracking_uri)
    if servers.ray is not None:
        began = time.monotonic()
        import torch  # noqa: F401  (TorchTrainer loads it when training starts; now it overlaps Ray's start)

        # (torch.export's tracing, which promotion needs, loads while training runs: flows.pipeline)
        clock.record("import_torch", began)
        try:
            servers.ray.wait()
        except RayClusterUnreachable as exc:  # refused: the Prefect server this command started is stopped again
            raise Refused(str(exc)) from None
        clock.record("ray", servers.ray.started, servers.ray.ended)
    try:
        api_url = servers.prefect.result()
    except ServiceError as exc:
        raise Refused(str(exc)) from None
    clock.record("prefect_server", servers.prefect.started, servers.prefect.ended)
    return tracking_uri, api_url


def _check_serving_location(config: Any, tracking_uri: str) -> None:
    """Refuse, before anything runs, a promotion to a serving location that belongs to another registered model or
    alias, or under an alias another location of the model owns (podium.tasks.reconcile)."""
    from podium.tasks.reconcile import check_location_claim

    p = config.promotion
    try:
        check_location_claim(config.serving, tracking_uri, p.registered_model, p.alias)
    except (AliasTaken, ServingError) as exc:
        raise Refused(str(exc)) from None
    except TrackingUnavailable as exc:
        raise ServerUnreachable(str(exc)) from None


def _maybe_make_demo_data(config: Any, settings: PodiumSettings) -> list[Path]:
    """Write the demo data where the run reads it and it is missing; what did not exist before, parents first."""
    default = settings.home_dir / "data"
    if not (config.data.train.startswith(str(default)) and not Path(config.data.train).exists()):
        return []
    from podium.training.data import make_classification_data

    new = [p for p in (settings.home_dir, default) if not p.exists()]
    before = set(default.iterdir()) if default.is_dir() else set()
    make_classification_data(str(default))
    return new + sorted(set(default.iterdir()) - before)


def _remove_written(paths: list[Path]) -> None:
    """A refused command leaves nothing it wrote: `paths` (files and the folders made for them) removed, children
    first; a folder something else wrote into meanwhile stays."""
    for path in reversed(paths):
        with contextlib.suppress(OSError):
            path.rmdir() if path.is_dir() else path.unlink()


def run_flow(args: argparse.Namespace, which: str) -> int:
    """`podium run` / `podium promote`: the whole pipeline, or promotion alone, as a Prefect flow run."""
    use_ray_address(args.ray_address)
    settings = PodiumSettings()
    clock = StartupClock()
    config = config_from_args(args, settings)  # a bad flag fails here, before any library loads
    # Ctrl-C or a scheduler's SIGTERM before the run's own handler ends the command as an exception, not at once: a
    # server still starting in the background is stopped on the way out (main: abandon_starts)
    signals.stop_before_the_run(on_stuck=services.abandon_starts)
    progress = _progress(args, clock)
    progress.info("run %s: checking its data, code and settings before anything starts", config.run_name)
    _library_variables()  # the plan loads Prefect, which reads them
    mlflow_checked = None  # when the tracking URI was checked, if it was already
    if which == "promote":  # the run's own recorded settings, under the command's (podium.cli.recorded)
        config, mlflow_checked = promote_settings(args, config, settings)
    created = _missing_local_folders(config.storage, config.serving)  # the plan creates them: a refusal removes them
    written: list[Path] = []  # the demo data, where the plan wrote it: a refusal removes it
    try:
        plan = _plan(config, settings, clock, written)
    except Refused:
        _remove_if_empty(created)
        raise
    began = time.monotonic()
    # the plan loaded Prefect, whose console handler would print every record from here on (progress lines twice)
    _quiet_libraries(settings.home_dir / "logs" / "podium.log")
    clock.record("logging", began)
    progress.info("run %s: starting %s", config.run_name,
                  "the Prefect server and Ray" if which == "run" else "the Prefect server")
    servers = _start_servers(config, settings, which)
    try:
        return _run_started(args, which, settings, clock, config, plan, servers, mlflow_checked)
    except Refused:
        _stop_what_a_refusal_started(settings, servers)
        _remove_if_empty(created)
        _remove_written(written)
        raise


def _missing_local_folders(*locations: str) -> list[Path]:
    """The local folders among `locations` that do not exist yet."""
    return [Path(uri) for uri in locations if "://" not in uri and not os.path.exists(uri)]


def _remove_if_empty(folders: list[Path]) -> None:
    """A refused command leaves no folder it made: each of `folders` that is still empty is removed again."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            pass  # not there, or something was written to it: it stays


def _progress(args: argparse.Namespace, clock: StartupClock) -> logging.Logger:
    """podium's progress lines (the `podium.progress` logger) on the terminal from the command's first second:
    stdout, or stderr with --json; none with --quiet."""
    progress = logging.getLogger("podium.progress")
    if not args.quiet:
        progress.addHandler(_ProgressPrinter(sys.stderr if args.json else sys.stdout, clock.start))
    progress.setLevel(logging.INFO)
    return progress


def _stop_what_a_refusal_started(settings: PodiumSettings, servers: _Servers) -> None:
    """A refused command leaves no server behind: the Prefect server it started for this command (its start
    finished first, so that none is left starting) is stopped again. One it found running stays."""
    try:
        servers.prefect.result()
    except ServiceError:
        return
    if services.started_here(settings.home_dir):
        services.stop_prefect_server(settings.home_dir)
        logging.getLogger(__name__).info("refused: stopped the Prefect server this command started")


def _latest_run(config: Any, tracking_uri: str) -> Any:
    """`config` naming the model's latest run (what `podium status` shows when no --run-name is given)."""

    try:
        latest = latest_run_name(tracking_uri, config.experiment)
    except TrackingUnavailable as exc:
        raise ServerUnreachable(str(exc)) from None
    if latest is None:
        raise Refused(f"no podium run of model {config.model!r} to promote in MLflow experiment {config.experiment!r} "
                      f"at {tracking_uri}: give --run-name, or run `podium run` first")
    return config.model_copy(update={"run_name": latest})


def _run_started(args: argparse.Namespace, which: str, settings: PodiumSettings, clock: StartupClock, config: Any,
                 plan: Any, servers: _Servers, mlflow_checked: tuple[float, float] | None = None) -> int:
    """run_flow, once the servers are starting (`mlflow_checked`: when the tracking URI was checked already)."""
    start = clock.start
    clock.record("config_and_servers", start)
    tracking_uri, api_url = _prepare(config, settings, clock, servers, mlflow_checked)
    if which == "promote" and "run_name" not in config.model_fields_set:
        config = _latest_run(config, tracking_uri)  # the run `podium status` shows by default
        plan = plan if plan.run_name == config.run_name else None  # planned under another name: the flow plans

    began = time.monotonic()
    from prefect.settings import PREFECT_API_URL, temporary_settings

    logging.getLogger("podium.progress").info("Prefect UI: %s", services.ui_url(api_url))
    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        if which == "run":
            from podium.flows.pipeline import train_validate_promote as flow_fn
        else:
            from podium.flows.promote import promote_run as flow_fn
        from podium.flows.summary import late_stop  # loaded with the flow
        clock.record("import_flow", began)
        logging.getLogger("podium.startup").info("start-up phases (s since start): %s", clock.phases)
        signals.stop_if_signalled()  # a Ctrl-C or SIGTERM of the start-up that a library swallowed
        ended = _flow_result(flow_fn.with_options(flow_run_name=f"{config.run_name}-{which}"), config, plan,
                             tracking_uri, settings, which)
        if isinstance(ended, int):
            return ended  # stopped by a signal
        result, flow_end_recorded = ended
        summary, shortfall = result.summary, result.shortfall
        if not flow_end_recorded:  # the server may be back by now: then the CLI records the end itself
            flow_end_recorded = prefect_api.record_flow_end(
                summary.flow_run_id, f"run {config.run_name} failed: {shortfall}" if shortfall else f"{config.run_name}: done",
                failed=shortfall is not None)
        not_recorded = prefect_api.link().settle(flow_end_recorded)
    # a signal that came once the run's body ended (the flow run's end being recorded, the servers settled): the
    # command's own handler kept it (podium.cli.signals), and what it says is decided now, at the last moment
    summary = summary.model_copy(update={"late_stop": late_stop(stop.STOP.signum, summary.promotion)
                                         or summary.late_stop})
    elapsed = time.monotonic() - start
    if args.json:
        out = summary_json(summary, config.serving, config)
        out["wall_time_s"] = round(elapsed, 1)
        out["prefect_ui"] = f"{services.ui_url(api_url)}/runs/flow-run/{summary.flow_run_id}"
        out["startup"] = clock.to_dict()
        if getattr(args, "run_settings", None) is not None:  # `podium promote`: whose settings it used
            out["settings"] = args.run_settings
        if not_recorded:
            out["prefect_not_recorded"] = not_recorded
        print(json.dumps(out))
    else:
        print_summary(summary, config, settings, tracking_uri, api_url, elapsed)
    if summary.late_stop:  # the stop came after the point of no return: the work is done, exit 0 (docs/commands.md)
        print(f"podium: {summary.late_stop}", file=sys.stderr, flush=True)
    if shortfall:  # the summary above says what each checkpoint got; a scheduler reads the exit code
        unrecorded = f" Prefect has not recorded it either: {not_recorded}." if not_recorded else ""
        print(f"podium: run {config.run_name!r} failed: {shortfall}.{unrecorded}", file=sys.stderr, flush=True)
        return result.exit_code
    if not_recorded:
        print(f"podium: done, but not recorded in Prefect: {not_recorded}. The work itself is complete: MLflow "
              "and the serving location have it.", file=sys.stderr, flush=True)
        return EXIT_NOT_RECORDED
    return result.exit_code


def _flow_result(flow_fn: Any, config: Any, plan: Any, tracking_uri: str, settings: PodiumSettings,
                 which: str) -> Any:
    """Run the flow; its RunResult and whether Prefect recorded the flow run's end, or the exit code of a run stopped
    by a signal. podium's errors become the command's (podium.cli.errors): a refusal of the flow's own checks (a run
    in progress, a resume that changes the model's shape) exit 2, a server gone exit 3, a run that could not do its
    work exit 1."""
    from prefect.exceptions import CancelledRun

    from podium.flows.summary import result_of

    log = settings.home_dir / "logs" / "podium.log"
    try:
        try:
            result = flow_fn(config=config, tracking_uri=tracking_uri, mlflow_ui=settings.mlflow_ui(tracking_uri),
                             plan=plan)
            return result, True
        except Exception as exc:
            ended = result_of(exc)  # the run reached its end: what it did comes back with the error
            if ended is None:
                # Prefect's engine, as the flow run started or ended (MLflow's own outage is said below)
                if not isinstance(exc, TrackingUnavailable) and is_unreachable(exc):
                    raise ServerUnreachable(
                        f"the Prefect server stopped answering ({type(exc).__name__}: {exc}): the run "
                        f"{config.run_name!r} may have done its work, which MLflow and the serving location "
                        f"hold (`podium status --run-name {config.run_name}`); running the same command resumes it"
                    ) from None
                raise
            recorded = isinstance(exc, UnfinishedRun)  # its flow run ended Failed on purpose
            if not recorded:
                logging.getLogger(__name__).warning("the flow run's final state was not recorded in Prefect: %s: %s",
                                                    type(exc).__name__, exc)
            return ended, recorded
    except TrackingUnavailable as exc:
        raise ServerUnreachable(tracking_outage_message(exc, config.run_name, which)) from None
    except (RunInProgress, ConfigError, AliasTaken) as exc:
        # refused by the flow's own checks: a run in progress, a resume that changes the model, an alias taken
        raise Refused(str(exc)) from None
    except NoCheckpointReported as exc:
        raise RunFailed(str(exc)) from None
    except UserCodeError as exc:  # the user's exception with their frames; Ray's whole trace is in the log
        raise RunFailed(f"{exc}\n(the full trace, with Ray's frames: {log})") from None
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise  # a signal's exit (Ray's SIGTERM handler): its code stands
        # something inside the flow (a library) asked the process to exit as if it had succeeded: the run
        # did not finish, and the exit code must not say it did
        raise RunFailed(f"the run {config.run_name!r} ended before it finished: sys.exit({exc.code!r}) was "
                        f"called inside the flow (see {log}); the same command resumes it") from None
    except CancelledRun as exc:  # stopped by SIGINT / SIGTERM (podium.flows.stop): the flow run is Cancelled
        if stop.STOP.signum is None:
            raise  # cancelled from Prefect's side: Prefect's own handling stands
        prefect_api.link().settle(True)
        print(f"podium: {exc}", file=sys.stderr, flush=True)
        return exit_for_signal(stop.STOP.signum)
