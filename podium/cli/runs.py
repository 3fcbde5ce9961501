"""`podium run` and `podium promote`: their parsers; what they do is podium.cli.run's."""

from __future__ import annotations

import argparse

from podium.cli.options import add_ray_address, add_run_options
from podium.cli.run import run_flow


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add this command's parser and handler."""
    run = sub.add_parser("run", help="Train, validate every checkpoint, promote the best.",
                         description="Train, validate every checkpoint as it lands, record in MLflow, promote.")
    add_run_options(run)
    add_ray_address(run)
    run.set_defaults(func=lambda a: run_flow(a, "run"))
    promote = sub.add_parser("promote", help="Promote the best checkpoint of an existing run.",
                             description="Promote the best validated checkpoint of an existing run, with the "
                                         "settings it ran with (its metric, mode, policy, model class or loader, as "
                                         "MLflow recorded them); flags and --config override them, and the command "
                                         "says which it used. Where it serves (--serving, --alias) and --always-promote "
                                         "are this command's.")
    add_run_options(promote)
    add_ray_address(promote)
    promote.set_defaults(func=lambda a: run_flow(a, "promote"))
