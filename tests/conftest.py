"""What a run of the test suite cost, in the units the machine's speed does not move: at its end, one line
with the Ray Train starts, the Prefect and MLflow server starts and the `podium` processes, beside the wall time
and the day's epoch calibration (`python benchmarks/calibrate.py`; `.ci/run` measures it and passes it in
PODIUM_EPOCH_CALIBRATION_S).

Each start appends a line to the file PODIUM_COST_LOG names, where it happens (`podium.settings.count_start`):
the pytest process that runs the session sets it before its test processes start, and every process of the
suite inherits it (Ray's controller actors through the Ray they run on).
"""

from __future__ import annotations

import collections
import os
import tempfile
import time
from pathlib import Path

import pytest

from podium.settings import COSTS

_started = time.monotonic()


def _is_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")  # an xdist worker has it; the session's own process does not


def pytest_configure(config: pytest.Config) -> None:
    if _is_controller(config) and not os.environ.get("PODIUM_COST_LOG"):
        fd, path = tempfile.mkstemp(prefix="podium-suite-costs-", suffix=".log")
        os.close(fd)
        os.environ["PODIUM_COST_LOG"] = path
        config.stash[_OWN_LOG] = path


_OWN_LOG = pytest.StashKey[str]()


def cost_line(counts: collections.Counter[str], wall_s: float, calibration: str | None) -> str:
    """The suite's one line of cost."""
    names = {"ray_train": "Ray Train starts", "prefect_server": "Prefect server starts",
             "mlflow_server": "MLflow server starts", "podium": "podium processes"}
    parts = ", ".join(f"{counts.get(k, 0)} {names[k]}" for k in COSTS)
    day = (f"epoch calibration {float(calibration):.3f} s" if calibration
           else "epoch calibration not measured: python benchmarks/calibrate.py")
    return f"suite cost: {parts}; wall {wall_s:.0f} s ({day})"


def by_file(starts: list[list[str]], what: str, name: str) -> str:
    """One kind of start, by the test file that caused it (`-`: a process that did not know its test)."""
    files = collections.Counter(Path(start[2]).stem if start[2] != "-" else "-"
                                for start in starts if len(start) == 3 and start[0] == what)
    return f"{name} by test file: " + ", ".join(f"{file} {n}" for file, n in files.most_common())


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if not _is_controller(config):
        return
    path = os.environ.get("PODIUM_COST_LOG")
    starts = [line.split() for line in Path(path).read_text().splitlines()] if path and os.path.exists(path) else []
    counts = collections.Counter(start[0] for start in starts if start)  # "<what> <pid> <test file>" per start
    terminalreporter.write_line(cost_line(counts, time.monotonic() - _started,
                                          os.environ.get("PODIUM_EPOCH_CALIBRATION_S")))
    terminalreporter.write_line(by_file(starts, "ray_train", "Ray Train starts"))
    terminalreporter.write_line(by_file(starts, "podium", "podium processes"))
    own = config.stash.get(_OWN_LOG, None)
    if own:
        os.unlink(own)
