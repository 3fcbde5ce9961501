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


# frames that are Ray's or Python's machinery around the user's code, never the user's own
_MACHINERY = re.compile(r'File "[^"]*(/site-packages/ray/|/ray/_private/|/ray/train/|/ray/util/|/threading\.py|'
                        r'/concurrent/futures/|/podium/training/validation_call\.py|/training/validation_call\.py)')


# the first line of a Ray task's error text: "ray::podium-validate:checkpoint_000001() (pid=123, ip=...)"
_RAY_TASK_HEADER = re.compile(r"^ray::\S*\(.*\)\s*\(pid=\d+")


def user_frames(traceback_text: str) -> str:
    """A remote traceback as text, with the frames of Ray's and Python's machinery left out: what remains
    is the user's own frames and their exception (the full text goes to the log file). A Ray task's error
    text (its task header, then the frames) reads as a Python traceback."""
    lines = plain_text(traceback_text).rstrip().splitlines()
    if lines and _RAY_TASK_HEADER.match(lines[0]):
        lines[0] = "Traceback (most recent call last):"
    out: list[str] = []
    skipping = False
    for line in lines:
        if line.startswith("  File "):
            skipping = bool(_MACHINERY.search(line))
            if not skipping:
                out.append(line)
            continue
        if line.startswith("    ") and skipping:
            continue  # the source line (and carets) of a frame left out
        skipping = False
        out.append(line)
    return "\n".join(out)
