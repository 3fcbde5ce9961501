"""The `podium` command: run, promote, status, ui, rollback, history, serve, k8s, worker, make-data, server.

Import paths given on the command line (`--train-loop`, `--validate-fn`) resolve from the current
directory first, as uvicorn and celery do: run podium from your repository's root.

Imports inside functions are on purpose (start-up): the commands load when the parser is built.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys

from podium.cli.errors import CliError, known_failure
from podium.cli.options import (
    Parser,
    add_ray_address,
    add_run_options,
    at_least,
    config_default,
    option_help,
    whole_number,
)
from podium.core.exits import EXIT_SIGINT, EXIT_SIGTERM, exit_for_signal
from podium.flows import stop  # the command's signal handling: standard library only (0.005 s)
from podium.settings import count_start


def use_current_directory() -> None:
    """Resolve import paths from the current directory first (as uvicorn and celery do), so that a
    user's `training.train:train_func` is found in the repository podium runs from."""
    cwd = os.getcwd()
    if sys.path[:1] != [cwd]:
        sys.path.insert(0, cwd)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used to document the CLI)."""
    from podium.cli import commands
    from podium.cli import run as run_command

    parser = Parser(
        prog="podium",
        description="Train on Ray Train, validate every checkpoint as it lands, record in MLflow, promote the best. "
                    "Embedded defaults keep everything under ./.podium; MLFLOW_TRACKING_URI, PREFECT_API_URL and "
                    "RAY_ADDRESS point it at real servers. Import paths (--train-loop, --validate-fn) resolve from "
                    "the current directory first: run podium from your repository's root.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="Train, validate every checkpoint, promote the best.",
                         description="Train, validate every checkpoint as it lands, record in MLflow, promote.")
    add_run_options(run)
    add_ray_address(run)
    run.set_defaults(func=lambda a: run_command.run_flow(a, "run"))
    promote = sub.add_parser("promote", help="Promote the best checkpoint of an existing run.",
                             description="Promote the best validated checkpoint of an existing run, with the "
                                         "settings it ran with (its metric, mode, policy, model class or loader, as "
                                         "MLflow recorded them); flags and --config override them, and the command "
                                         "says which it used. Where it serves (--serving, --alias) and --always-promote "
                                         "are this command's.")
    add_run_options(promote)
    add_ray_address(promote)
    promote.set_defaults(func=lambda a: run_command.run_flow(a, "promote"))
    status = sub.add_parser("status", help="Checkpoints of a run (default: the latest), what it promoted, "
                                           "and the model's champion.")
    add_run_options(status)
    status.set_defaults(func=commands.cmd_status)
    ui = sub.add_parser("ui", help="Links to a run (default: the latest) in the Prefect and MLflow UIs.",
                        description="Print links to a run (default: the latest) in the Prefect and MLflow UIs. "
                                    "Starts this home's Prefect server if needed, and an MLflow UI on the run's "
                                    "store unless PODIUM_MLFLOW_UI_URL or an `mlflow server` tracking URI says "
                                    "where one is; that one serves until Ctrl-C.")
    add_run_options(ui)
    ui.set_defaults(func=commands.cmd_ui)
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
    rollback.set_defaults(func=commands.cmd_rollback)
    for verb, what in (("approve", "becomes the champion"), ("reject", "is not promoted")):
        decide = sub.add_parser(verb, help=f"{verb.capitalize()} the candidate a run awaits approval for: it {what}.",
                                description=f"Answer a run waiting with promotion.approval = 'required' (its Prefect "
                                            f"flow run is paused): its candidate {what}. Who, when and why are kept "
                                            "in the serving history, the manifest and the registered version's tags.")
        decide.add_argument("--run-name", required=True, help="The run awaiting approval.")
        decide.add_argument("--reason", required=True, help="Why, in words.")
        decide.add_argument("--by", help="Who decides (default: user@host).")
        decide.set_defaults(func=lambda a, v=verb: commands.cmd_decide(a, approve=v == "approve"))
    history = sub.add_parser("history", help="The champions of a serving location: when, why, what started them.",
                             description="Every promotion and rollback of a serving location, oldest first, "
                                         "with the current and the withdrawn versions marked. Reads only.")
    history.add_argument("--model", default=config_default("model"),
                         help="The model whose serving location to read (default: %(default)s).")
    history.add_argument("--serving", help="Serving location (default: .podium/serving/<model>).")
    history.add_argument("--json", action="store_true", help="Print the history as JSON.")
    history.set_defaults(func=commands.cmd_history)
    from podium.cli import serve

    serve.add_parser(sub, config_default("model"))
    from podium.cli import provenance

    lineage = sub.add_parser("lineage", help="Where a served version came from, or which runs and champions used a "
                                             "dataset (by digest).",
                             description=provenance.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    lineage.add_argument("what", help="A serving version (v000002) or a dataset digest (its first 8+ characters).")
    lineage.add_argument("--serving", help="Serving location (default: .podium/serving/<model>).")
    lineage.add_argument("--model", default=config_default("model"),
                         help=option_help("model", "The model whose serving location to read."))
    lineage.add_argument("--json", action="store_true", help="Print the answer as JSON.")
    lineage.set_defaults(func=provenance.cmd_lineage)
    from podium.cli import k8s

    k8s.add_k8s_parser(sub)
    make = sub.add_parser("make-data", help="Write the synthetic demo dataset (Parquet).")
    make.add_argument("--out", help="Output folder or URI (default: .podium/data).")
    make.add_argument("--train-rows", type=at_least(1), default=24000, help="Training rows (default: 24000).")
    make.add_argument("--val-rows", type=at_least(1), default=6000, help="Validation rows (default: 6000).")
    make.add_argument("--features", type=at_least(1), default=16, help="Feature columns (default: 16).")
    make.add_argument("--classes", type=at_least(2), default=4, help="Classes (default: 4).")
    make.add_argument("--seed", type=whole_number, default=0, help="Random seed.")
    make.set_defaults(func=commands.cmd_make_data)
    worker = sub.add_parser("worker", help="Run a Prefect process worker for podium's deployments.",
                            description="Run `prefect worker start --type process` for podium's work pool, with "
                                        "RAY_ADDRESS and PODIUM_HOME set for its flow runs. MLFLOW_TRACKING_URI "
                                        "and the other variables of this environment pass through.")
    worker.add_argument("--pool", default="podium", help="Work pool (default: podium; created if missing).")
    worker.add_argument("--ray-address", help="Ray cluster the flow runs use (sets RAY_ADDRESS).")
    worker.add_argument("--limit", type=whole_number, help="Flow runs at once on this worker (default: no limit).")
    worker.set_defaults(func=commands.cmd_worker)
    server = sub.add_parser("server", help="Start or stop the local Prefect server of the embedded defaults.")
    server.add_argument("action", choices=["start", "stop"])
    server.set_defaults(func=commands.cmd_server)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `podium` console command (`argv` None: this process's arguments, as the command is
    started; a list: a call from Python, which is no process of its own and is not counted)."""
    if argv is None:
        count_start("podium")
    args = build_parser().parse_args(argv)
    use_current_directory()
    try:
        return args.func(args)
    except CliError as exc:
        print(f"podium: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:
        signum = stop.start_up_signal()
        if signum is not None:  # a start-up signal's exception, wrapped where it landed (a class body's __set_name__)
            print(f"podium: {'interrupted' if signum == signal.SIGINT else 'stopped by SIGTERM'}", file=sys.stderr)
            return exit_for_signal(signum)
        failure = known_failure(exc)  # a failure podium knows, met where its command did not map it (in a flow)
        if failure is None:
            raise
        print(f"podium: {failure}", file=sys.stderr)
        return failure.exit_code
    except KeyboardInterrupt:  # Ctrl-C before a run started (or after it ended): nothing to stop cleanly
        print("podium: interrupted", file=sys.stderr)
        return EXIT_SIGINT
    except SystemExit as exc:
        if exc.code == EXIT_SIGTERM:  # a SIGTERM before the run's own handler (podium.cli.run)
            print("podium: stopped by SIGTERM", file=sys.stderr)
        raise
    finally:
        # a local Prefect server still starting in the background (the command ends early) is not left running
        # unrecorded; one that started stays, as after any run (`podium server stop`)
        from podium.services import abandon_starts

        abandon_starts()
        if argv is not None:  # a call from Python: the process goes on, and a start-up signal's watchdog with it
            stop.stand_down()
        # the output is written: spare the exit a last garbage collection over every loaded library
        # (measured at seconds with torch, ray, prefect and mlflow loaded)
        gc.freeze()


if __name__ == "__main__":
    sys.exit(main())
