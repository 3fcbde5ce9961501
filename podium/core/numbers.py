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


def format_number(v: object) -> str:
    """A measured number as podium prints and records it in words, everywhere: four significant digits with the
    trailing zeros kept, so that numbers side by side read alike (0.1900 beside 0.1877; 12.00; 1.500e-05); an
    integer as it is, nan and inf as such, 'none' for no value. (Values kept for machines, in manifests, JSON and
    tags, keep every digit.)"""
    if v is None:
        return "none"
    if not isinstance(v, float) or not math.isfinite(v):  # an int (a bool too), nan, inf, or not a number
        return str(v)
    return f"{v:#.4g}".rstrip(".")


def format_signed(v: float) -> str:
    """A difference as podium prints it: a sign, then `format_number` (+0.01130, -0.004000)."""
    return f"{v:+#.4g}".rstrip(".") if math.isfinite(v) else f"{v:+}"


def format_percent(x: float | None) -> str:
    """A share as the live checks print it (the shadow's and the watch's reasons, the shadow's artifact): `12.5 %`,
    or `n/a` for no value."""
    return "n/a" if x is None else f"{100 * x:.1f} %"
