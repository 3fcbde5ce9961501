"""The metric per checkpoint, drawn so a person can trust it (matplotlib only: no Prefect, no MLflow).

One figure for the Prefect chart artifact and the MLflow run alike: every checkpoint at its step,
on a labelled value axis (a line over the values, never bars scaled between the smallest and
the largest value), the champion the run was measured against as a reference line, and the
winning checkpoint marked.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any

from podium.core.numbers import format_number
from podium.core.records import VALIDATED, CheckpointRecord
from podium.imports import Preload


def _load_matplotlib() -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display: render to files
    import matplotlib.figure
    import matplotlib.font_manager
    import matplotlib.ticker
    from matplotlib.backends import backend_agg  # noqa: F401


_MATPLOTLIB = Preload("podium-preload-charts", _load_matplotlib)


def preload_charts() -> None:
    """Load matplotlib (about half a second, its font list included) in a background thread, once per
    process: the flow calls this while training runs, so that the reports at a run's end do not wait for it."""
    _MATPLOTLIB.start()


@dataclass(frozen=True)
class Mark:
    """A labelled value on the chart: the champion's reference line, or the winning checkpoint."""

    label: str
    value: float | None = None
    step: int | None = None


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def metric_figure(records: list[CheckpointRecord], metric: str, mode: str, title: str,
                  winner: Mark | None = None, reference: Mark | None = None) -> Any | None:
    """A matplotlib Figure of `metric` per checkpoint, or None when no checkpoint has a finite value.

    Checkpoints without a finite value (failed, pending, NaN) are marked with a cross on the step
    axis, so a missing point is visibly missing."""
    _MATPLOTLIB.wait()
    _load_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    points = [(r.step, r.metrics[metric]) for r in records
              if r.status == VALIDATED and _finite(r.metrics.get(metric))]
    if not points:
        return None
    shown = {s for s, _ in points}
    missing = [r.step for r in records if r.step not in shown]
    fig = Figure(figsize=(8, 4.2), dpi=110, layout="constrained")
    ax = fig.subplots()
    steps, values = [s for s, _ in points], [v for _, v in points]
    ax.plot(steps, values, marker="o", color="#1f77b4", label=f"{metric} of a checkpoint", zorder=2)
    if len(points) <= 12:
        for s, v in points:
            if winner is None or s != winner.step:  # the winner's value is in the legend, not under its star
                ax.annotate(format_number(v), (s, v), textcoords="offset points", xytext=(0, 8), ha="center", fontsize=8)
    if missing:
        ax.scatter(missing, [0.02] * len(missing), marker="x", color="#d62728", transform=ax.get_xaxis_transform(),
                   label="no value (failed, pending or not finite)", zorder=3, clip_on=False)
    if reference is not None and reference.value is not None and _finite(reference.value):
        ax.axhline(reference.value, linestyle="--", color="#555555", linewidth=1.2, zorder=1,
                   label=f"{reference.label}: {format_number(reference.value)}")
    if winner is not None and winner.step is not None and winner.value is not None and _finite(winner.value):
        ax.scatter([winner.step], [winner.value], s=260, marker="*", color="#ffbf00", edgecolors="black",
                   zorder=4, label=f"{winner.label}: step {winner.step}, {format_number(winner.value)}")
    ax.set_xlabel("training step of the checkpoint")
    ax.set_ylabel(f"{metric} ({'lower' if mode == 'min' else 'higher'} is better)")
    formatter = ScalarFormatter(useOffset=False)  # tick labels are the values themselves, not offsets
    ax.yaxis.set_major_formatter(formatter)
    ax.margins(y=0.15)
    if len(steps) <= 12:
        ax.set_xticks(sorted({r.step for r in records}))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=8, loc="best")
    return fig


def figure_png(fig: Any) -> bytes:
    """The figure as PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
