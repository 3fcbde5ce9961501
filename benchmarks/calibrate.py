"""The machine's speed today, in one number: one training epoch of the comparison's job on one core.

    python benchmarks/calibrate.py            # about a minute; prints the epoch and the validation times

This machine's speed moves several-fold within a day, so a wall time (the test suite's, a benchmark's) means
little alone. State this number beside it: the same calibration `compare.py` runs before its first round
(`benchmarks.workload.calibrate`, the "full" job: an MLP of hidden 256 on 240,000 × 16 rows, batch 128, one
torch thread, pinned to core 0), measured here on its own. Run it on a quiet machine, just before or after.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.workload import PRESETS, calibrate, load_average, make_data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the calibration as JSON")
    args = p.parse_args(argv)
    workload = PRESETS["full"]
    cores = sorted(os.sched_getaffinity(0))
    before = load_average()
    with tempfile.TemporaryDirectory(prefix="podium-calibrate-") as work:
        train, val = make_data(workload, work)
        calibrate(workload, train, val, {cores[0]})
    cal = workload.calibration | {"load_average_before": before}
    if args.json:
        print(json.dumps(cal))
    else:
        print(f"one epoch of the compare job on core {cores[0]}: {cal['epoch_s']:.3f} s "
              f"(two estimates {cal['epoch_spread']:.0%} apart); one validation alone {cal['validation_alone_s']:.2f} s; "
              f"load average before: {cal['load_average_before']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
