"""Numbers as podium judges them: finite or not, and listed for a person to read."""

from __future__ import annotations

import math
from collections.abc import Mapping


def finite(v: object) -> bool:
    """True for a real, finite number (a bool is not a metric)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def listed(values: Mapping[str, object]) -> str:
    """`a = 1, b = 'x'`, sorted by name: how metrics appear in reasons."""
    return ", ".join(f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {v}" for k, v in sorted(values.items()))


def format_metric(v: float) -> str:
    """A metric value in words: four significant digits, as podium prints metrics (0.1877, 1.5e-05)."""
    return f"{v:.4g}"


def format_value(v: float | None) -> str:
    """A value a decision states: six significant digits (0.187734), 'none' when there is none."""
    if v is None:
        return "none"
    return f"{v:.6g}" if math.isfinite(v) else str(v)
