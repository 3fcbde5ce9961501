"""The benchmark harness refuses measurements whose preconditions failed, and scores goals at the median
of the repeats (benchmarks/guard.py, benchmarks/report.py, benchmarks/pinning.py). Nothing is timed here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks/ is not installed

from benchmarks import report
from benchmarks.guard import Expectations, Monitor, Window, check_attempt
from benchmarks.pinning import CHAINED_ENV, CoreSplit, runtime_env_hook


def window(**kw) -> Window:
    w = Window(start=0.0, end=10.0)
    for k, v in kw.items():
        setattr(w, k, v)
    return w


def measured(**figures) -> dict:
    return {"summary": {"checkpoints": 3, "n": 3, **figures}, "measured": True, "attempts": [{"reasons": []}]}


NOT_MEASURED = {"summary": None, "measured": False,
                "attempts": [{"reasons": ["machine busy"]}, {"reasons": ["training not pinned"]}]}


def test_a_clean_attempt_is_a_measurement():
    expect = Expectations(epochs=3, validates=True, pinned=True, validation_s=2.0)
    w = window(pins=[{"pid": 1}])
    assert check_attempt({"checkpoints": 3, "n": 3, "val_p50": 2.4}, w, expect) == []


def test_each_failed_precondition_is_named():
    expect = Expectations(epochs=3, validates=True, pinned=True, validation_s=3.9, max_foreign_cores=0.1)
    w = window(foreign_ticks={"pytest[42]": 15 * os.sysconf("SC_CLK_TCK")}, pins=[],
               violations=["process 7 (raylet) allowed on the training core (cores [0, 1])"])
    reasons = check_attempt({"checkpoints": 3, "n": 2, "val_p50": 9.0}, w, expect)
    text = " | ".join(reasons)
    assert "machine busy" in text and "pytest[42]" in text
    assert "training not pinned: 0 of 1" in text
    assert "pinning violated: process 7" in text
    assert "2 of 3 checkpoints have metrics" in text
    assert "validation not as expected: p50 9.00 s against 3.90 s calibrated" in text
    assert check_attempt(None, window(pins=[{"pid": 1}]), expect, "run failed: exit 1") == ["run failed: exit 1"]


def test_the_ways_validation_is_held_to_the_floor_ways_in_the_same_round():
    """(b), (c), (d) are held to the validation cost (f) measured beside the same pinned training worker earlier
    in the round; to the calibration only in a round where (f) was not measured."""
    from types import SimpleNamespace

    from benchmarks.compare import Runner

    workload = SimpleNamespace(epochs=3, calibration={"validation_s": 2.89})
    runner = Runner(SimpleNamespace(max_foreign_cpu=0.1), workload, Path("."), "", "", CoreSplit(enabled=False),
                    None)  # type: ignore[arg-type]
    runner.floor_validation_s[2] = 4.49
    held = runner.expectations("d", 2)
    assert (held.validation_s, held.validation_source) == (4.49, "as (f) measured it in this round")
    assert check_attempt({"checkpoints": 3, "n": 3, "val_p50": 4.46}, window(), held) == []
    assert runner.expectations("d", 0).validation_s == 2.89  # round 1: (f) not measured
    assert runner.expectations("f", 2).validation_s is None and runner.expectations("a", 2).validation_s is None


def test_goals_are_scored_at_the_median_of_paired_rounds():
    results = {"a": [measured(train_wall=10.0, process_wall=20.0), measured(train_wall=10.0, process_wall=20.0),
                     measured(train_wall=10.0, process_wall=20.0)],
               "f": [measured(train_wall=10.0, machine_cpu_s=60.0, val_total_s=20.0),
                     measured(train_wall=10.0, machine_cpu_s=58.0, val_total_s=20.0),
                     measured(train_wall=10.0, machine_cpu_s=61.0, val_total_s=20.0)],
               "d": [measured(train_wall=10.2, val_p50=2.0, promoted=5.5, last_wait=1.0, excess_p95=0.3,
                              driver_cpu_s=5.0, server_cpu_s=1.0, machine_cpu_s=64.0, val_total_s=22.0),
                     measured(train_wall=11.0, val_p50=2.0, promoted=5.0, last_wait=1.0, excess_p95=0.4,
                              driver_cpu_s=6.5, server_cpu_s=1.0, machine_cpu_s=62.5, val_total_s=21.0),
                     measured(train_wall=10.25, val_p50=2.0, promoted=5.0, last_wait=1.0, excess_p95=1.5,
                              driver_cpu_s=5.5, server_cpu_s=1.5, machine_cpu_s=65.5, val_total_s=23.0)]}
    goals = {g: (m, v) for g, m, v in report.score_goals(results)}
    ratio = next(v for g, v in goals.items() if "the floor (f)" in g)
    assert ratio == ("1.02× (1.02–1.10×), median of 3", "met")  # one round over the limit: the median holds
    # the floor moves with the machine: the same (d) against a faster (f) misses
    slower = {**results, "f": [measured(train_wall=9.5)] * 3}
    assert next(v for g, _, v in report.score_goals(slower) if "the floor (f)" in g) == "missed"
    promotion = next(v for g, v in goals.items() if "promotion" in g)
    assert promotion[1] == "met" and promotion[0].startswith("2.0 (2.0–2.5)")
    # podium's own CPU over the whole machine: (d) less its validation, less the same of (f), round by round
    own = next(v for g, v in goals.items() if "own CPU-s" in g)
    assert own == ("2.0 (1.5–3.5) CPU-s, median of 3", "met")
    assert report.all_good(results)
    assert "1.02× (1.02–1.10×)" in report.table(results)
    assert "2.0 (1.5–3.5) over f" in report.cpu_table(results)
    unknown = {**results, "d": [measured(**{**o["summary"], "machine_cpu_s": None}) for o in results["d"]]}
    assert next(v for g, _, v in report.score_goals(unknown) if "own CPU-s" in g) == "not measured"


def test_a_way_with_a_repeat_not_measured_gives_no_number_and_fails_the_check():
    results = {"a": [measured(train_wall=10.0, process_wall=20.0)] * 2,
               "d0": [measured(train_wall=10.0, process_wall=22.0), NOT_MEASURED]}
    assert report.way_summaries(results, "d0") is None
    row = next(line for line in report.table(results).splitlines() if line.startswith("| (d0)"))
    assert "not measured" in row and "22.0" not in row
    why = report.not_measured_reason(results, "d0")
    assert why == "repeat 2: machine busy; then training not pinned"
    goal = next(r for r in report.score_goals(results) if "(d0)" in r[0])
    assert goal[2] == "not measured"
    assert not report.all_good(results)


def test_the_floor_sets_f_against_a_and_d_against_f_within_each_round():
    results = {"a": [measured(train_wall=10.0), measured(train_wall=20.0), measured(train_wall=10.0)],
               "f": [measured(train_wall=10.4), measured(train_wall=20.8), measured(train_wall=10.6)],
               "d": [measured(train_wall=10.4), measured(train_wall=21.8), measured(train_wall=10.6)]}
    line = report.floor_line(results)
    assert line is not None
    assert "1.04× (1.04–1.06×) (a) ((f))" in line and "1.00× (1.00–1.05×) (f)" in line
    assert report.floor_line({**results, "f": [NOT_MEASURED] * 3}) is None
    assert "(f) training only" in report.table(results)


def test_spread_is_median_and_range():
    assert report.spread([3.0, 1.0, 2.0]) == "2.0 (1.0–3.0)"
    assert report.spread([1.234], 2) == "1.23"
    assert report.spread(None) == "–"


def test_the_ray_hook_adds_the_pinning_setup_hook_and_chains_one_already_set():
    assert runtime_env_hook(None) == {"worker_process_setup_hook": "benchmarks.pinning.setup_worker"}
    env = runtime_env_hook({"env_vars": {"A": "1"}, "worker_process_setup_hook": "benchmarks.instrument.install"})
    assert env["worker_process_setup_hook"] == "benchmarks.pinning.setup_worker"
    assert env["env_vars"] == {"A": "1", CHAINED_ENV: "benchmarks.instrument.install"}


BUSY = "import time\nt = time.time()\nwhile time.time() - t < {s}: pass\n"


def test_the_monitor_counts_other_processes_not_ours(tmp_path):
    # "another session": a busy process that is not our descendant (started in a new session by a
    # shell that exits at once, so it is reparented away from us before the window opens)
    pid_file = tmp_path / "pid"
    subprocess.run(["sh", "-c", f"setsid {sys.executable} -c '{BUSY.format(s=3)}' & echo $! > {pid_file}"],
                   check=True)
    foreign = int(pid_file.read_text())
    ours = subprocess.Popen([sys.executable, "-c", BUSY.format(s=3)])
    with Monitor(CoreSplit(enabled=False), every_s=0.2) as monitor, monitor.window() as w:
        time.sleep(2)
    ours.wait()
    names = set(w.foreign_ticks)
    assert any(name.endswith(f"[{foreign}]") for name in names), names
    assert not any(name.endswith(f"[{ours.pid}]") for name in names)
    assert any(name.endswith(f"[{ours.pid}]") for name in w.our_ticks), w.our_ticks  # shown apart, for a closer look


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_while_a_train_worker_is_pinned_every_other_process_of_ours_is_kept_off_its_core(tmp_path):
    """Start-up has the whole machine; once the train worker pinned itself, the monitor moves the rest of the
    benchmark off its core; when it is gone, every core comes back."""
    split = CoreSplit()
    pins = tmp_path / "pins.jsonl"
    pins.write_text("")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(6)"])
    seen = {}
    with Monitor(split, every_s=0.1) as monitor, split, monitor.window(str(pins)) as w:
        time.sleep(0.5)
        seen["before"] = os.sched_getaffinity(other.pid)
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])
        os.sched_setaffinity(worker.pid, split.train)  # what benchmarks.pinning does inside the train worker
        pins.write_text(json.dumps({"pid": worker.pid, "t": time.time(), "threads": 1, "cpus": sorted(split.train)}) + "\n")
        time.sleep(1.0)
        seen["training"] = os.sched_getaffinity(other.pid)
        seen["harness"] = os.sched_getaffinity(0)
        worker.wait()
        time.sleep(1.0)
        seen["after"] = os.sched_getaffinity(other.pid)
    other.kill()
    other.wait()
    assert seen["before"] == split.all and seen["after"] == split.all, seen
    assert seen["training"] == split.other and seen["harness"] == split.other, seen
    assert w.violations == [], w.violations


def test_the_conditions_table_lists_only_the_repeats_that_needed_another_attempt():
    clean = {"a": [measured(train_wall=10.0)] * 2}
    assert report.conditions_table(clean) == "Every repeat of every way (2) was measured at its first attempt."
    rerun = {**measured(train_wall=10.0), "attempts": [{"reasons": ["machine busy"]}, {"reasons": []}]}
    mixed = {"a": [measured(train_wall=10.0), rerun], "d0": [NOT_MEASURED]}
    text = report.conditions_table(mixed)
    assert text.startswith("The other 1 repeat(s) were measured at their first attempt.")
    rows = [line for line in text.splitlines() if line.startswith("| (")]
    assert [row.split(" | ")[1:4] for row in rows] == [["2", "2", "measured"], ["1", "2", "**not measured**"]]


def test_podiums_own_cpu_per_checkpoint_is_read_between_two_checkpoints_from_both_processes():
    """benchmarks/scale.py: the CPU the podium process and its Prefect server used from one checkpoint persisted
    to another, per checkpoint, from the samples of each; None where the samples do not reach back."""
    from benchmarks.podium_run import cpu_between
    from benchmarks.scale import own_cpu_per_checkpoint

    driver = [(float(t), 10.0 + 0.5 * t) for t in range(100)]  # 0.5 CPU-s a second
    server = [(float(t), 2.0 + 0.1 * t) for t in range(100)]
    assert cpu_between(driver, 10.2, 20.7) == pytest.approx(5.0)  # the samples at 10 and 20
    assert cpu_between(driver, -1.0, 5.0) is None
    rows = [{"persisted": float(10 + 2 * i)} for i in range(40)]  # a checkpoint every 2 s from t = 10
    run = {"driver_cpu_samples": driver, "server_cpu_samples": server}
    assert own_cpu_per_checkpoint(run, rows, 0, 10) == pytest.approx(1.2)  # (10 + 2 CPU-s) / 10 checkpoints
    assert own_cpu_per_checkpoint({**run, "server_cpu_samples": []}, rows, 0, 10) is None
