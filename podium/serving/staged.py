"""Versions being staged, and whether the process staging them is still there to finish them.

A promoter marks every version it claims with `versions/vN/STAGED.json` (who: host, process id and its
start time, run name, flow run) until it seals the version (its manifest) or discards it (a tombstone).
A candidate awaiting approval stays staged for as long as its command waits. A command killed with
SIGKILL leaves the mark behind; the next command that reads or changes the location finds it, sees that
the process it names is gone (same host: no process with that id and start time), and withdraws the
candidate (`podium.tasks.reconcile`). A mark from another host is left alone: its process cannot be
seen from here.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from podium.serving.layout import DISCARDED, MANIFEST, STAGED, ServingError, version_names
from podium.storage.documents import read_json, write_json
from podium.storage.locations import fsspec_filesystem, join, normalize_location


def process_started(pid: int) -> str | None:
    """The start time of process `pid` (clock ticks since boot, from /proc), or None if there is none: with the
    id, it names one process for good (an id alone is reused)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22, counted after the command name's parentheses


def this_process(run_name: str, **more: Any) -> dict[str, Any]:
    """The mark of a version staged by this process."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "pid_started": process_started(pid), "run_name": run_name,
            "staged_at": time.time(), **more}


def is_alive(mark: dict[str, Any]) -> bool | None:
    """Whether the process a mark names still runs: None where this host cannot tell (another host)."""
    if mark.get("host") != socket.gethostname():
        return None
    try:
        pid = int(mark.get("pid") or 0)
    except (TypeError, ValueError):
        return False
    started = process_started(pid) if pid > 0 else None
    return started is not None and started == mark.get("pid_started")


def mark_staged(version_dir: str, mark: dict[str, Any]) -> None:
    """Mark a claimed version as staged by `mark`'s process."""
    write_json(join(version_dir, STAGED), mark)


def unmark_staged(version_dir: str) -> None:
    """The version was sealed: it is no longer staged."""

    fs, path = fsspec_filesystem(join(version_dir, STAGED))
    try:
        fs.rm(path)
    except FileNotFoundError:
        pass


@dataclass(frozen=True)
class Staged:
    """A version that is neither complete (no manifest) nor discarded: staged, or left by a promoter that died."""

    version: str
    version_dir: str
    mark: dict[str, Any]  # empty: no mark (a promoter killed before it wrote one, or one of podium <= 0.3)
    alive: bool | None


def staged_versions(serving: str) -> list[Staged]:
    """Every version of the location that has neither a manifest nor a tombstone, with its mark and whether the
    process that staged it still runs (False for a version without a mark: nothing is staging it)."""
    serving = normalize_location(serving)
    out = []
    for name in version_names(serving):
        version_dir = join(serving, "versions", name)
        if any(read_json(join(version_dir, done), ServingError) is not None for done in (MANIFEST, DISCARDED)):
            continue
        mark = read_json(join(version_dir, STAGED), ServingError) or {}
        out.append(Staged(name, version_dir, mark, is_alive(mark) if mark else False))
    return out
