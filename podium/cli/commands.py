"""What the other commands do once their arguments are parsed: status, ui, rollback, history, make-data,
server, worker (`podium run` and `podium promote`: podium.cli.run).

Imports inside functions are on purpose (start-up): a command loads only the libraries it uses (`podium
history` never loads MLflow or Prefect).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any

from podium.cli.errors import CliError, RunFailed, ServerUnreachable
from podium.cli.options import config_from_args, use_ray_address
from podium.cli.output import checkpoint_json, print_mlflow_links, print_status
from podium.errors import ServiceError, ServingError, TrackingUnavailable
from podium.settings import PodiumSettings, current_user


def _find_run(args: argparse.Namespace, settings: PodiumSettings) -> tuple[Any, Any]:
    """(config, TrackingRun) of the run a read command is about: the one named (--run-name or the
    config file), else the experiment's latest. Without a model named (--model, --experiment or the config file)
    in a store whose runs are all of one other model, that model, said on stderr; with several, the refusal lists
    them. Read-only: a store that is not there is not created."""
    config = config_from_args(args, settings)
    from podium.tracking.client import store_exists
    from podium.tracking.runs import find_tracking_run, latest_run_name, models_with_runs

    tracking_uri = settings.resolved_tracking_uri()
    if not store_exists(tracking_uri):  # MLflow's client would create an empty store: a read must not
        raise CliError(f"no MLflow store at {tracking_uri}: nothing has run here yet (PODIUM_HOME = "
                       f"{settings.home_dir}; set MLFLOW_TRACKING_URI to read another store)")
    try:
        if "run_name" not in config.model_fields_set:
            latest = latest_run_name(tracking_uri, config.experiment)
            if latest is None:
                others = [m for m in models_with_runs(tracking_uri) if m != config.experiment]
                named = args.config or getattr(args, "model", None) or getattr(args, "experiment", None)
                if len(others) == 1 and not named:
                    # no model named, and one model has runs here: that is the one meant
                    print(f"podium: no --model given; the only model with runs in {tracking_uri} is {others[0]!r}: "
                          f"showing it (--model {others[0]})", file=sys.stderr)
                    args.model = others[0]
                    return _find_run(args, settings)
                hint = (f"; runs of other models are here: {', '.join(others)} (--model NAME)" if others else "")
                raise LookupError(f"no podium run in MLflow experiment {config.experiment!r} at {tracking_uri}{hint}")
            config = config.model_copy(update={"run_name": latest})
        return config, find_tracking_run(tracking_uri, config.experiment, config.run_name)
    except LookupError as exc:  # no such run: a refusal (podium.cli.errors maps TrackingUnavailable)
        raise CliError(str(exc)) from None


def cmd_status(args: argparse.Namespace) -> int:
    """Checkpoints of a run (by default the latest), what it promoted and why, and its model's champion,
    from MLflow and the serving location (read-only)."""
    settings = PodiumSettings()
    config, tracking = _find_run(args, settings)
    from podium.cli.output import champion_json
    from podium.cli.provenance import status_report
    from podium.serving.layout import promoted_by
    from podium.tracking.client import TAG_REASON
    from podium.tracking.records import list_records
    from podium.tracking.runs import run_tags

    try:
        records = list_records(tracking)
        champion = champion_json(config)
        mine = promoted_by(config.serving, tracking.run_id)
        tags = run_tags(tracking)
        reason = tags.get(TAG_REASON)
        lineage_lines, lineage_json = status_report(tracking, config.serving, tags)
    except LookupError as exc:
        raise CliError(str(exc)) from None
    problems = _disagreements(config, tracking.tracking_uri)
    for problem in problems:
        print(f"podium: check: {problem}", file=sys.stderr)
    if args.json:
        # the run's data and origins, its last decision, the champion's lineage, where the stores disagree
        print(json.dumps({**lineage_json, "disagreements": problems,
            "run_name": config.run_name, "model": config.model, "mlflow_run_id": tracking.run_id,
            "tracking_uri": tracking.tracking_uri,
            "checkpoints": [checkpoint_json(r) for r in records],
            # what this run promoted (its newest version at the serving location), as `podium run --json` says
            "promoted": ({"version": mine.version, "uri": mine.uri, "step": mine.manifest.get("step"),
                          "metric": mine.manifest.get("metric"), "value": mine.manifest.get("value"),
                          "current": bool(champion and champion["version"] == mine.version)} if mine else None),
            "promotion_reason": reason,
            "champion": champion,
        }))
        return 0
    print_status(config, tracking, records, mine, reason, champion)
    print("\n".join(lineage_lines))
    return 0


def _disagreements(config: Any, tracking_uri: str) -> list[str]:
    """Where the registry and the serving location disagree (podium.tasks.reconcile), or why that was not checked."""
    from podium.tasks.reconcile import disagreements

    try:
        name, alias = location_names(config.serving, None, None, config.promotion.registered_model)
        return disagreements(config.serving, tracking_uri, name, alias)
    except ServingError as exc:
        return [str(exc)]


def cmd_decide(args: argparse.Namespace, approve: bool) -> int:
    """`podium approve` / `podium reject`: answer the run awaiting approval (its flow run is paused) through the
    Prefect API: this home's server, or PREFECT_API_URL."""
    import socket

    from podium.core.approval import signed_by_command
    from podium.services import running_prefect_server

    settings = PodiumSettings()
    try:
        api_url = settings.prefect_api_url or running_prefect_server(settings.home_dir)
    except ServiceError as exc:
        raise ServerUnreachable(str(exc)) from None
    if api_url is None:
        raise CliError(f"no Prefect server is running for {settings.home_dir} (and PREFECT_API_URL is not set), so no "
                       f"run there awaits approval: run `podium {'approve' if approve else 'reject'}` from the "
                       "project folder of the run, or set PREFECT_API_URL to the server it reports to")
    os.environ["PREFECT_API_URL"] = api_url  # before Prefect's client loads
    from podium.prefect_api import paused_flow_run, resume_with_input

    try:
        flow_run_id = paused_flow_run(args.run_name)
    except LookupError as exc:
        raise CliError(str(exc)) from None
    verb = "approve" if approve else "reject"
    gone = _awaiting_process_gone(flow_run_id, args.run_name, settings)
    if gone:
        raise RunFailed(gone)
    by = signed_by_command(args.by or f"{current_user()}@{socket.gethostname()}", verb)
    try:
        resume_with_input(flow_run_id, {"decision": verb, "reason": args.reason, "by": by})
    except RuntimeError as exc:
        raise CliError(f"run {args.run_name!r} could not be answered: {exc}") from None
    print(f"run {args.run_name}: {verb.rstrip('e')}ed by {by}: {args.reason}; the run goes on (flow run {flow_run_id})")
    return 0


def _awaiting_process_gone(flow_run_id: str, run_name: str, settings: PodiumSettings) -> str | None:
    """Why the paused flow run of `run_name` can no longer act on a decision (the command that awaits it is gone:
    killed, or its machine restarted), after withdrawing its candidate and ending the flow run Crashed; None when
    its process still runs, or runs on another host (which this one cannot see)."""
    from podium.prefect_api import crash_flow_run, flow_run_parameters
    from podium.serving.staged import staged_versions
    from podium.tasks.promote import promotion_lock
    from podium.tasks.reconcile import withdraw_orphans

    parameters = flow_run_parameters(flow_run_id)
    config = parameters.get("config") or {}
    serving = config.get("serving")
    promotion = config.get("promotion") or {}
    if not serving:
        return None
    mine = [s for s in staged_versions(serving) if s.mark.get("run_name") == run_name]
    if any(s.alive is not False for s in mine):
        return None
    tracking_uri = parameters.get("tracking_uri") or settings.resolved_tracking_uri()
    name = promotion.get("registered_model") or config.get("model") or "podium"
    alias = promotion.get("alias") or "champion"
    with promotion_lock(serving):
        withdrawn = withdraw_orphans(serving, tracking_uri, name, alias)
    what = f"its candidate {', '.join(withdrawn)} was withdrawn" if withdrawn else "no candidate of it is staged"
    message = (f"run {run_name!r} awaits approval in Prefect, but the command that waits for it is gone (killed, or "
               f"its machine restarted): {what}, nothing was promoted; `podium promote --run-name {run_name}` asks "
               "again")
    crash_flow_run(flow_run_id, message)
    return message


def cmd_ui(args: argparse.Namespace) -> int:
    """Links to a run (by default the latest) in the Prefect and MLflow UIs, starting what is needed:
    this home's Prefect server, and an MLflow UI on the run's store unless one is configured (that one
    serves until Ctrl-C)."""
    settings = PodiumSettings()
    config, tracking = _find_run(args, settings)
    from podium.services import ensure_prefect_server, start_mlflow_ui, stop_process, ui_url
    from podium.tracking.client import TAG_FLOW_RUN
    from podium.tracking.runs import artifact_location_for, run_tags

    api_url = ensure_prefect_server(settings.home_dir, settings.prefect_port, settings.prefect_api_url)
    mlflow_ui, proc = settings.mlflow_ui(tracking.tracking_uri), None
    if mlflow_ui is None:
        artifacts = artifact_location_for(tracking.tracking_uri) or str(settings.home_dir / "mlartifacts")
        proc, mlflow_ui = start_mlflow_ui(tracking.tracking_uri, artifacts, settings.home_dir / "logs" / "mlflow-ui.log")
    flow_run = run_tags(tracking).get(TAG_FLOW_RUN)
    print(f"run {config.run_name}")
    print(f"Prefect UI:  {ui_url(api_url)}/runs/flow-run/{flow_run}" if flow_run else f"Prefect UI:  {ui_url(api_url)}/runs")
    print_mlflow_links(tracking, mlflow_ui, config.promotion.registered_model, config.promotion.metric)
    if proc is None:
        return 0
    print(f"serving the MLflow UI on {tracking.tracking_uri} until Ctrl-C", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stopped like Ctrl-C: the MLflow UI goes with it
    try:
        proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        stop_process(proc)
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    """Point the serving location back one champion along its history; the MLflow alias follows. Runs as the Prefect
    flow `rollback` (this home's server, started if needed, or PREFECT_API_URL's), so that the Prefect UI shows it
    beside the runs that promoted."""
    settings = PodiumSettings()
    from podium.cli.provenance import nothing_promoted, serving_location
    from podium.config import MODEL_NAME_RE
    from podium.serving.layout import read_pointer

    if not MODEL_NAME_RE.match(args.model):
        raise CliError(f"--model = {args.model!r}: expected letters, digits, '_', '.', '-' (it names a folder)")
    serving = serving_location(args, settings)
    registered_model, alias = location_names(serving, args.registered_model, args.alias, args.model)
    if read_pointer(serving) is None:  # before any server starts
        raise ServingError(nothing_promoted(serving, args, settings, "nothing to roll back"))
    from podium.cli.run import quiet_command
    from podium.services import ensure_prefect_server

    quiet_command(settings)
    try:
        api_url = ensure_prefect_server(settings.home_dir, settings.prefect_port, settings.prefect_api_url)
    except ServiceError as exc:
        raise ServerUnreachable(f"{exc}: nothing was rolled back (a rollback runs as a Prefect flow, which the "
                                "Prefect UI shows)") from None
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from podium import prefect_api
    from podium.flows.rollback import rollback

    try:
        with temporary_settings(updates={PREFECT_API_URL: api_url}):
            out = rollback(serving=serving, tracking_uri=settings.resolved_tracking_uri(),
                           registered_model=registered_model, alias=alias, model=args.model, to_version=args.to,
                           reason=args.reason)
    except TrackingUnavailable as exc:
        now = (read_pointer(serving) or {}).get("version")
        raise ServerUnreachable(f"{exc}.\n  Serving {serving} serves {now}; the MLflow alias and withdrawn marks "
                                f"were not updated. Once the server answers, run `podium rollback --serving "
                                f"{serving} --to {now}`: it updates them without switching again.") from None
    except Exception as exc:
        if not prefect_api.is_unreachable(exc):
            raise
        now = (read_pointer(serving) or {}).get("version")
        raise ServerUnreachable(f"the Prefect server {api_url} stopped answering ({type(exc).__name__}: {exc}): "
                                f"serving {serving} serves {now} (`podium history --serving {serving}`)") from None
    if args.json:
        print(json.dumps(out.model_dump()))
        return 0
    from podium.cli.output import print_rollback

    print_rollback(serving, out, alias)
    return 0


def location_names(serving: str, registered_model: str | None, alias: str | None, model: str) -> tuple[str, str]:
    """The registered model and alias a command acts on at `serving`: the location's own (its LOCATION.json), or
    those given, or the model's name and `champion` before its first promotion. Given ones that differ from the
    location's are refused (ServingError): they would move another location's alias."""
    from podium.serving.location import check_belongs, read_location

    location = read_location(serving)
    if location is None:
        return registered_model or model, alias or "champion"
    check_belongs(location, registered_model or location.registered_model, alias or location.alias)
    return location.registered_model, location.alias


def cmd_history(args: argparse.Namespace) -> int:
    """The champions of a serving location: every switch, when, why and what started it (read-only). A location
    that does not exist is refused (exit 2, saying where podium looked); one that exists with nothing promoted yet
    says so (exit 0)."""
    settings = PodiumSettings()
    from podium.cli.output import print_history
    from podium.cli.provenance import location_exists, nothing_promoted, serving_location
    from podium.serving.history import current_switch, lineage_of, parse_switch
    from podium.serving.layout import read_history, read_pointer

    serving = serving_location(args, settings)
    history, pointer = read_history(serving), read_pointer(serving)
    if not history and pointer is None and not location_exists(serving):
        raise CliError(nothing_promoted(serving, args, settings))
    switches = [parse_switch(doc) for doc in history]
    lineage = lineage_of(switches)
    current = (pointer or {}).get("version")
    if args.json:
        # current_switch: the index in `switches` of the switch that made `current` the version served
        print(json.dumps({"serving": serving, "current": current, "current_switch": current_switch(switches, current),
                          "withdrawn": sorted(lineage.withdrawn), "switches": history}))
        return 0
    print_history(serving, history, current, set(lineage.withdrawn))
    return 0


def cmd_make_data(args: argparse.Namespace) -> int:
    """Write the deterministic synthetic dataset."""
    from podium.storage.preflight import check_folder, check_location
    from podium.training.data import make_classification_data

    # a file in the way, or a path no folder can be made at: one sentence, exit 2 (podium.cli.errors)
    out = check_location(check_folder(args.out or str(PodiumSettings().home_dir / "data"), "--out"), write=True)
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
    from podium.services import ensure_prefect_server

    settings = PodiumSettings()
    api_url = ensure_prefect_server(settings.home_dir, settings.prefect_port, settings.prefect_api_url)
    use_ray_address(args.ray_address)
    # flow runs start in a temporary folder: the embedded defaults must not resolve against it
    env = {**os.environ, "PREFECT_API_URL": api_url, "PODIUM_HOME": str(settings.home_dir)}
    # podium's own records (progress, verdicts, the decision and its reason) go to each flow run's log in
    # Prefect, as a `podium run`'s do
    extra = [n for n in env.get("PREFECT_LOGGING_EXTRA_LOGGERS", "").split(",") if n.strip()]
    env["PREFECT_LOGGING_EXTRA_LOGGERS"] = ",".join(dict.fromkeys([*extra, "podium"]))
    cmd = [sys.executable, "-m", "prefect", "worker", "start", "--pool", args.pool, "--type", "process"]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    print(f"podium worker: pool {args.pool}, Prefect API {api_url}, Ray "
          f"{env.get('RAY_ADDRESS') or 'local (per flow run)'}", flush=True)
    os.execve(sys.executable, cmd, env)
    return 0  # not reached
