"""`podium` with the changes BENCHMARKS.md recommends, applied from outside for measurement only.

    python -m benchmarks.podium_whatif run --json --config cfg.json     # same arguments as `podium`

Nothing in podium is edited; this wrapper patches the running process:
  1. tasks.report.Progress.update sends the progress artifact only when epoch or validated count
     changed (podium's flow calls it after every 0.2 s poll, one Prefect API request each time);
  2. gc.freeze() once the command is done, so the interpreter's final garbage collection does not
     walk every object of prefect, mlflow, torch and ray before the process can exit.
A third change, the Prefect server's task-run recorder flush interval (podium asked for 0.5 s, which
Prefect 3.8 truncates to 0: a busy loop), is a server setting: benchmarks.podium_run.start_server_fixed
starts the server with 1 s when podium's own setting still needs it (podium has since dropped it).
"""

from __future__ import annotations

import gc
import sys


def patch_progress() -> None:
    """Progress.update: no API request when nothing changed."""
    import tasks.report as report

    original = report.Progress.update

    def update(self, *, epoch: float | None = None, validated: int | None = None) -> None:
        trained = min(float(epoch), float(self.total)) if epoch is not None else self.trained
        count = validated if validated is not None else self.validated
        if getattr(self, "_bench_sent", None) == (trained, count):
            return
        self._bench_sent = (trained, count)
        original(self, epoch=epoch, validated=validated)

    report.Progress.update = update


def main() -> int:
    """Run podium's CLI with the patches."""
    patch_progress()
    from podium.cli import main as podium_main

    rc = podium_main(sys.argv[1:])
    sys.stdout.flush()
    gc.freeze()
    return rc


if __name__ == "__main__":
    sys.exit(main())
