"""What a run of the test suite cost, in the units the machine's speed does not move: at its end, one line
with the Ray Train starts, the Prefect and MLflow server starts and the `podium` processes, beside the wall time
and the day's epoch calibration (`python benchmarks/calibrate.py`; `.ci/run` measures it and passes it in
PODIUM_EPOCH_CALIBRATION_S).

Each start appends a line to the file PODIUM_COST_LOG names, where it happens (`podium.settings.count_start`):
the pytest process that runs the session sets it before its test processes start, and every process of the
suite inherits it (Ray's controller actors through the Ray they run on).

Each test file's own cost (the seconds its tests' setup, call and teardown took, module-scoped fixtures
included, and its starts) is printed per file and merged into `tests/suite-costs.json`, a committed file: a run of
a few files updates their entries and keeps the others', so the heaviest files can be seen without a full run
(`python -m json.tool tests/suite-costs.json | head`), and a change to a file's cost shows in review.

The same file orders the suite for its two processes: the test files are handed out heaviest first (xdist's
`loadscope` gives each process the next whole file when it is almost done with its last, in collection order;
`--no-loadscope-reorder` in pyproject.toml keeps that order instead of xdist's by number of tests), so that the
heaviest files do not start last while the other process has nothing left to do. A file the cost file does not
know yet counts as `_UNKNOWN_S` (an integration file) or nothing (a unit file).
"""

from __future__ import annotations

import collections
import json
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
COSTS_FILE = Path(__file__).parent / "suite-costs.json"
_UNKNOWN_S = 60.0  # the seconds of an integration test file the cost file does not know yet
_file_seconds: collections.Counter[str] = collections.Counter()  # on the session's own process: per test file
_file_tests: collections.Counter[str] = collections.Counter()


def stored_seconds(path: Path) -> dict[str, float]:
    """Each test file's seconds in the cost file at `path` (empty if there is none, or it cannot be read)."""
    try:
        held = json.loads(path.read_text())
        return {file: float(cost["seconds"]) for file, cost in held.items() if "seconds" in cost}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def heaviest_first(files: list[str], seconds: dict[str, float]) -> list[str]:
    """`files` (paths from the repository's root) in the order to hand them out: the heaviest first, by their stored
    seconds; a file not stored counts `_UNKNOWN_S` under tests/integration/, else nothing; ties keep their order."""
    def cost(file: str) -> float:
        return seconds.get(file, _UNKNOWN_S if file.startswith("tests/integration/") else 0.0)
    return sorted(files, key=lambda file: -cost(file))


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, each file's tests together, the heaviest files first (the module docstring); a run in one
    process (`-n 0`) keeps pytest's order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    by_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::")[0], []).append(item)
    items[:] = [item for file in heaviest_first(list(by_file), stored_seconds(COSTS_FILE)) for item in by_file[file]]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each phase's seconds, added to its test file's, on the session's own process (xdist's workers send it
    their reports)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    file = report.nodeid.split("::")[0]
    _file_seconds[file] += report.duration
    if report.when == "call" or (report.when == "setup" and report.skipped):
        _file_tests[file] += 1


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


def file_costs(seconds: collections.Counter, tests: collections.Counter,
               starts: list[list[str]]) -> dict[str, dict[str, float]]:
    """Per test file (its path from the repository's root): seconds, tests and each kind of start."""
    costs: dict[str, dict[str, float]] = {}
    for file, s in seconds.items():
        costs[file] = {"seconds": round(s, 1), "tests": tests.get(file, 0), **{k: 0 for k in COSTS}}
    for start in starts:
        if len(start) == 3 and start[2] != "-" and start[0] in COSTS:
            costs.setdefault(start[2], {"seconds": 0.0, "tests": 0, **{k: 0 for k in COSTS}})[start[0]] += 1
    return costs


def store_file_costs(path: Path, costs: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """`costs` merged into the JSON at `path` (this run's files replace their entries; the others stay), the
    heaviest first; what it now holds."""
    try:
        held = json.loads(path.read_text())
    except (OSError, ValueError):
        held = {}
    held = {**(held if isinstance(held, dict) else {}), **costs}
    held = dict(sorted(held.items(), key=lambda kv: -float(kv[1].get("seconds", 0))))
    path.write_text(json.dumps(held, indent=1) + "\n")
    return held


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
    costs = file_costs(_file_seconds, _file_tests, starts)
    for file, cost in sorted(costs.items(), key=lambda kv: -kv[1]["seconds"]):
        terminalreporter.write_line(f"file cost: {file} {cost['seconds']:.0f} s, {cost['tests']} tests, "
                                    + ", ".join(f"{cost[k]} {k}" for k in COSTS))
    if costs:
        store_file_costs(COSTS_FILE, costs)
    own = config.stash.get(_OWN_LOG, None)
    if own:
        os.unlink(own)
