"""`podium status`: a run's checkpoints (by default the latest run), what it promoted and why, and its model's
champion.

Imports inside functions are on purpose (start-up): a command loads only the libraries it uses; each is listed with
its measured cost in tests/unit/test_layers.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from podium.cli.errors import CliError
from podium.cli.options import add_read_options, config_from_args
from podium.cli.output import champion_json, checkpoint_json, print_status
from podium.cli.provenance import location_names, status_report
from podium.errors import NotFound, ServingError
from podium.settings import PodiumSettings
from podium.tracking.client import TAG_REASON, store_exists
from podium.tracking.ledger import TAG_WATCH
from podium.tracking.registry import registered_version_for, version_tags
from podium.tracking.runs import TAG_ENDED_BY, find_tracking_run, latest_run_name, models_with_runs, run_tags


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add this command's parser and handler."""
    status = sub.add_parser("status", help="Checkpoints of a run (default: the latest), what it promoted, "
                                           "and the model's champion.")
    add_read_options(status)
    status.set_defaults(func=cmd_status)


def find_run(args: argparse.Namespace, settings: PodiumSettings) -> tuple[Any, Any]:
    """(config, TrackingRun) of the run a read command is about: the one named (--run-name or the
    config file), else the experiment's latest. Without a model named (--model, --experiment or the config file)
    in a store whose runs are all of one other model, that model, said on stderr; with several, the refusal lists
    them. Read-only: a store that is not there is not created."""
    config = config_from_args(args, settings)

    tracking_uri = settings.resolved_tracking_uri()
    if not store_exists(tracking_uri):  # MLflow's client would create an empty store: a read must not
        raise CliError(f"no MLflow store at {tracking_uri}: nothing has run here yet (PODIUM_HOME = "
                       f"{settings.home_dir}; set MLFLOW_TRACKING_URI to read another store)")
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
                return find_run(args, settings)
            hint = (f"; runs of other models are here: {', '.join(others)} (--model NAME)" if others else "")
            raise NotFound(f"no podium run in MLflow experiment {config.experiment!r} at {tracking_uri}{hint}")
        config = config.model_copy(update={"run_name": latest})
    return config, find_tracking_run(tracking_uri, config.experiment, config.run_name)


def cmd_status(args: argparse.Namespace) -> int:
    """Checkpoints of a run (by default the latest), what it promoted and why, and its model's champion,
    from MLflow and the serving location (read-only)."""
    settings = PodiumSettings()
    config, tracking = find_run(args, settings)
    from podium.serving.layout import promoted_by
    from podium.tracking.records import list_records

    records = list_records(tracking)
    champion = champion_json(config)
    mine = promoted_by(config.serving, tracking.run_id)
    tags = run_tags(tracking)
    reason = tags.get(TAG_REASON)
    lineage_lines, lineage_json = status_report(tracking, config.serving, tags)
    watch = _watch_of(config, tracking.tracking_uri, mine)
    ended_by = tags.get(TAG_ENDED_BY)  # its command was gone (a SIGKILL): another command ended its runs, and how
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
                          "current": bool(champion and champion["version"] == mine.version),
                          # its watch after the switch, as the registry recorded it (passed, rolled-back; settled by
                          # the next command when its promoter was gone), or null
                          "watch": watch} if mine else None),
            "promotion_reason": reason,
            "ended_by": ended_by,
            "champion": champion,
        }))
        return 0
    print_status(config, tracking, records, mine, reason, champion, watch, ended_by)
    print("\n".join(lineage_lines))
    return 0


def _watch_of(config: Any, tracking_uri: str, mine: Any) -> dict[str, str] | None:
    """The watch of the version this run promoted, as its registered version's tags say ({state, reason}), or None:
    nothing promoted, never registered, or never watched."""
    if mine is None:
        return None
    try:
        name, _ = location_names(config.serving, None, None, config.promotion.registered_model)
    except ServingError:
        return None
    version = registered_version_for(tracking_uri, name, mine.manifest.get("version_uid"), mine.uri)
    tags = version_tags(tracking_uri, name, version) if version else {}
    state = tags.get(TAG_WATCH)
    return {"state": state, "reason": tags.get(f"{TAG_WATCH}.reason", "")} if state else None


def _disagreements(config: Any, tracking_uri: str) -> list[str]:
    """Where the registry and the serving location disagree (podium.tasks.reconcile), or why that was not checked."""
    from podium.tasks.reconcile import disagreements

    try:
        name, alias = location_names(config.serving, None, None, config.promotion.registered_model)
        return disagreements(config.serving, tracking_uri, name, alias)
    except ServingError as exc:
        return [str(exc)]
