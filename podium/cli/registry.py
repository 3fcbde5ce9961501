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
    runs.register,  # run, promote
    status.register,
    ui.register,
    rollback.register,
    decide.register,  # approve, reject
    history.register,
    lambda sub: serve.add_parser(sub, config_default("model")),
    provenance.register,  # lineage
    k8s.add_k8s_parser,
    make_data.register,
    worker.register,
    server.register,
)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Every command's parser, under `sub`."""
    for register in COMMANDS:
        register(sub)
