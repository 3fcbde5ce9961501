"""`podium history`: the champions of a serving location (read-only).

Imports inside functions are on purpose (start-up): a command loads only the libraries it uses; each is listed with
its measured cost in tests/unit/test_layers.py.
"""

from __future__ import annotations

import argparse
import json

from podium.cli.errors import CliError
from podium.cli.options import config_default
from podium.cli.output import print_history
from podium.cli.provenance import location_exists, nothing_promoted, serving_location
from podium.serving.history import current_switch, lineage_of, parse_switch
from podium.settings import PodiumSettings


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add this command's parser and handler."""
    history = sub.add_parser("history", help="The champions of a serving location: when, why, what started them.",
                             description="Every promotion and rollback of a serving location, oldest first, "
                                         "with the current and the withdrawn versions marked. Reads only.")
    history.add_argument("--model", default=config_default("model"),
                         help="The model whose serving location to read (default: %(default)s).")
    history.add_argument("--serving", help="Serving location (default: .podium/serving/<model>).")
    history.add_argument("--json", action="store_true", help="Print the history as JSON.")
    history.set_defaults(func=cmd_history)


def cmd_history(args: argparse.Namespace) -> int:
    """The champions of a serving location: every switch, when, why and what started it (read-only). A location
    that does not exist is refused (exit 2, saying where podium looked); one that exists with nothing promoted yet
    says so (exit 0)."""
    settings = PodiumSettings()
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
