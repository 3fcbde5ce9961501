"""Every command of `podium`, each registering its own parser and handler: a new command is its module and one
line here."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from podium.cli import (
    decide,
    history,
    k8s,
    make_data,
    provenance,
    rollback,
    runs,
    serve,
    server,
    status,
    ui,
    worker,
)
from podium.cli.options import config_default

# in the order `podium --help` lists them
COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    runs.add_parser,  # run, promote
    status.add_parser,
    ui.add_parser,
    rollback.add_parser,
    decide.add_parser,  # approve, reject
    history.add_parser,
    lambda sub: serve.add_parser(sub, config_default("model")),
    provenance.add_parser,  # lineage
    k8s.add_k8s_parser,
    make_data.add_parser,
    worker.add_parser,
    server.add_parser,
)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Every command's parser, under `sub`."""
    for add_parser in COMMANDS:
        add_parser(sub)
