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

from podium import services
from podium.cli import signals  # the command's signal handling: standard library only (0.005 s)
from podium.cli.errors import CliError, known_failure
from podium.cli.options import Parser
from podium.core.exits import EXIT_SIGINT, EXIT_SIGTERM, exit_for_signal
from podium.flows.stop import SIGNALS
from podium.settings import count_start


def use_current_directory() -> None:
    """Resolve import paths from the current directory first (as uvicorn and celery do), so that a
    user's `training.train:train_func` is found in the repository podium runs from."""
    cwd = os.getcwd()
    if sys.path[:1] != [cwd]:
        sys.path.insert(0, cwd)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used to document the CLI): each command registers its own (podium.cli.registry)."""
    from podium.cli.registry import add_commands

    parser = Parser(
        prog="podium",
        description="Train on Ray Train, validate every checkpoint as it lands, record in MLflow, promote the best. "
                    "Embedded defaults keep everything under ./.podium; MLFLOW_TRACKING_URI, PREFECT_API_URL and "
                    "RAY_ADDRESS point it at real servers. Import paths (--train-loop, --validate-fn) resolve from "
                    "the current directory first: run podium from your repository's root.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `podium` console command (`argv` None: this process's arguments, as the command is
    started; a list: a call from Python, which is no process of its own and is not counted)."""
    if argv is None:
        count_start("podium")
    args = build_parser().parse_args(argv)
    use_current_directory()
    # a call from Python: the process goes on after the command, with the signal handlers it had before it
    handlers = {sig: signal.getsignal(sig) for sig in SIGNALS} if argv is not None else {}
    try:
        return args.func(args)
    except CliError as exc:
        print(f"podium: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:
        signum = signals.start_up_signal()
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
        services.abandon_starts()
        if argv is not None:  # a call from Python: the process goes on, and a start-up signal's watchdog with it;
            signals.end_command()  # neither a signal the command kept nor its handlers reach what the process does next
            for sig, handler in handlers.items():
                if handler is not None:
                    signal.signal(sig, handler)
        # the output is written: spare the exit a last garbage collection over every loaded library
        # (measured at seconds with torch, ray, prefect and mlflow loaded)
        gc.freeze()


if __name__ == "__main__":
    sys.exit(main())
