"""`podium ui`: links to a run in the Prefect and MLflow UIs, starting what is needed."""

from __future__ import annotations

import argparse
import signal
import sys

from podium.cli.options import add_read_options
from podium.cli.output import print_mlflow_links
from podium.cli.status import find_run
from podium.services import ensure_prefect_server, start_mlflow_ui, stop_process, ui_url
from podium.settings import PodiumSettings
from podium.tracking.client import TAG_FLOW_RUN
from podium.tracking.runs import artifact_location_for, run_tags


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add this command's parser and handler."""
    ui = sub.add_parser("ui", help="Links to a run (default: the latest) in the Prefect and MLflow UIs.",
                        description="Print links to a run (default: the latest) in the Prefect and MLflow UIs. "
                                    "Starts this home's Prefect server if needed, and an MLflow UI on the run's "
                                    "store unless PODIUM_MLFLOW_UI_URL or an `mlflow server` tracking URI says "
                                    "where one is; that one serves until Ctrl-C.")
    add_read_options(ui)
    ui.set_defaults(func=cmd_ui)


def cmd_ui(args: argparse.Namespace) -> int:
    """Links to a run (by default the latest) in the Prefect and MLflow UIs, starting what is needed:
    this home's Prefect server, and an MLflow UI on the run's store unless one is configured (that one
    serves until Ctrl-C)."""
    settings = PodiumSettings()
    config, tracking = find_run(args, settings)

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
