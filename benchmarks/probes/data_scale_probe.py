"""The validation function `benchmarks/data_scale.py` runs: podium's built-in one, plus the peak resident
memory of the process while it ran (`val_peak_rss_mb`, a metric like any other).

A top-level module of its own (this folder goes on PYTHONPATH), so that the same import path works with
podium before and after the change under measurement. Benchmark-only.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any

# imported with this module (podium's warm-up imports it before training), not inside the measured call
from podium.training.validate import validate_checkpoint


def _status_mb(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


class _PrivatePeak(threading.Thread):
    """The highest private memory (RssAnon) of this process, sampled every 5 ms until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop, self.peak_mb = threading.Event(), _status_mb("RssAnon")

    def run(self) -> None:
        while not self.stop.wait(0.005):
            self.peak_mb = max(self.peak_mb, _status_mb("RssAnon"))


def validate_measured(checkpoint: Any, **kwargs: Any) -> dict[str, float]:
    """podium.training.validate.validate_checkpoint, with this process's memory during it: the peak RSS
    (`val_peak_rss_mb`; it cannot go below what the process held before the call, and Ray reuses worker
    processes), the private memory before the call (`val_private_before_mb`) and its sampled peak during it
    (`val_peak_private_mb`)."""
    with open("/proc/self/clear_refs", "w") as f:  # "5": reset the peak (VmHWM) to the current RSS
        f.write("5")
    before = _status_mb("RssAnon")
    sampler = _PrivatePeak()
    sampler.start()
    accepted = inspect.signature(validate_checkpoint).parameters
    try:
        result = validate_checkpoint(checkpoint, **{k: v for k, v in kwargs.items() if k in accepted})
    finally:
        sampler.stop.set()
        sampler.join()
    return {**result, "val_peak_rss_mb": _status_mb("VmHWM"), "val_private_before_mb": before,
            "val_peak_private_mb": max(sampler.peak_mb, _status_mb("RssAnon"))}


# podium passes a validation function the facts it names (val_data, label_column, ...): the probe names the
# same ones as podium's own function
validate_measured.__signature__ = inspect.signature(validate_checkpoint)  # type: ignore[attr-defined]
