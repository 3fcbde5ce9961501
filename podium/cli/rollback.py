"""`podium rollback`: point a serving location back one champion along its history, as the Prefect flow `rollback`.

Imports inside functions are on purpose (start-up): a command loads only the libraries it uses; each is listed with
its measured cost in tests/unit/test_layers.py.
"""

from __future__ import annotations

import argparse
import json

from podium import prefect_api
from podium.cli.errors import CliError, ServerUnreachable
from podium.cli.options import config_default, option_help
from podium.cli.output import print_rollback
from podium.cli.provenance import location_names, nothing_promoted, serving_location
from podium.config import MODEL_NAME_RE
from podium.errors import ServiceError, ServingError, TrackingUnavailable
from podium.services import ensure_prefect_server
from podium.settings import PodiumSettings


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add this command's parser and handler."""
    rollback = sub.add_parser("rollback", help="Restore the previous champion at a serving location.",
                              description="Atomically point CURRENT back at the previous champion of the serving "
                                          "history (or --to) and move the MLflow alias with it. The version left "
                                          "is withdrawn: never promoted again unless named with --to. Each "
                                          "rollback goes one champion further back. Runs as the Prefect flow "
                                          "`rollback` (this home's server, started if needed, or PREFECT_API_URL), "
                                          "so that the Prefect UI shows it.")
    rollback.add_argument("--model", default=config_default("model"),
                          help=option_help("model", "The model whose champion to restore."))
    rollback.add_argument("--serving", help="Serving location (default: .podium/serving/<model>).")
    rollback.add_argument("--to", help="Version to restore, e.g. v000002 (default: the previous champion); a "
                                       "withdrawn version named here is served again.")
    rollback.add_argument("--reason", help="Why, in words: kept in the serving history and on the MLflow records.")
    rollback.add_argument("--registered-model", help="MLflow registered model (default: the serving location's, as its "
                                                     "first promotion recorded it; else the model name).")
    rollback.add_argument("--alias", help="Alias to move (default: the serving location's own, as its first promotion "
                                          f"recorded it; else {config_default('promotion.alias')!r}).")
    rollback.add_argument("--json", action="store_true", help="Print the outcome as JSON.")
    rollback.set_defaults(func=cmd_rollback)


def cmd_rollback(args: argparse.Namespace) -> int:
    """Point the serving location back one champion along its history; the MLflow alias follows. Runs as the Prefect
    flow `rollback` (this home's server, started if needed, or PREFECT_API_URL's), so that the Prefect UI shows it
    beside the runs that promoted."""
    settings = PodiumSettings()
    from podium.serving.layout import read_pointer

    if not MODEL_NAME_RE.match(args.model):
        raise CliError(f"--model = {args.model!r}: expected letters, digits, '_', '.', '-' (it names a folder)")
    serving = serving_location(args, settings)
    registered_model, alias = location_names(serving, args.registered_model, args.alias, args.model)
    if read_pointer(serving) is None:  # before any server starts
        raise ServingError(nothing_promoted(serving, args, settings, "nothing to roll back"))
    from podium.cli.run import quiet_command

    quiet_command(settings)
    try:
        api_url = ensure_prefect_server(settings.home_dir, settings.prefect_port, settings.prefect_api_url)
    except ServiceError as exc:
        raise ServerUnreachable(f"{exc}: nothing was rolled back (a rollback runs as a Prefect flow, which the "
                                "Prefect UI shows)") from None
    from prefect.settings import PREFECT_API_URL, temporary_settings

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

    print_rollback(serving, out, alias)
    return 0
