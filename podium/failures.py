"""Failure reasons as people read them: plain text, one line per cause.

Ray's error messages carry terminal colour codes and whole remote tracebacks; a reason kept in
MLflow, the JSON output or a progress line is the plain message.
"""

from __future__ import annotations

import re

# ANSI escape sequences: CSI (colours, cursor moves) and the two-character ones
ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")
# the line that names an exception: "ValueError: ...", "ray.exceptions.ActorDiedError: ..."
EXCEPTION_LINE = re.compile(r"^[\w.]+(Error|Exception|Exit|Interrupt)\b")


def plain_text(text: str) -> str:
    """`text` without terminal colour codes."""
    return ANSI.sub("", text)


def describe_failure(error: BaseException | None, limit: int = 300) -> str:
    """A training failure in one plain line per failed rank: the exception line of each (a remote
    traceback ends with it), else its first line. Ray's WorkerGroupError lists `worker_failures`."""
    if error is None:
        return "unknown cause"
    failures = getattr(error, "worker_failures", None)
    if not isinstance(failures, dict) or not failures:
        failures = {-1: error}
    parts = []
    for rank, exc in sorted(failures.items()):
        lines = [ln.strip() for ln in plain_text(str(exc)).splitlines() if ln.strip()]
        named = next((ln for ln in reversed(lines) if EXCEPTION_LINE.match(ln)), None)
        text = named or (lines[0] if lines else type(exc).__name__)
        parts.append((f"rank {rank}: " if rank >= 0 else "") + text[:limit])
    return "; ".join(parts)
