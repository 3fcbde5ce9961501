"""The validation function `benchmarks/data_scale.py` runs: podium's built-in one, plus the peak resident
memory of the process while it ran (`val_peak_rss_mb`, a metric like any other).

A top-level module of its own (this folder goes on PYTHONPATH), so that the same import path works with
podium before and after the change under measurement. Benchmark-only.
"""

from __future__ import annotations

import inspect
from typing import Any

# imported with this module (podium's warm-up imports it before training), not inside the measured call
from podium.training.validate import validate_checkpoint


def _peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def validate_measured(checkpoint: Any, **kwargs: Any) -> dict[str, float]:
    """podium.training.validate.validate_checkpoint, with this process's peak RSS during it."""
    with open("/proc/self/clear_refs", "w") as f:  # "5": reset the peak (VmHWM) to the current RSS
        f.write("5")
    accepted = inspect.signature(validate_checkpoint).parameters
    result = validate_checkpoint(checkpoint, **{k: v for k, v in kwargs.items() if k in accepted})
    return {**result, "val_peak_rss_mb": _peak_rss_mb()}


# podium passes a validation function the facts it names (val_data, label_column, ...): the probe names the
# same ones as podium's own function
validate_measured.__signature__ = inspect.signature(validate_checkpoint)  # type: ignore[attr-defined]
