"""The watch after the switch at the serving location: the pointer that says a new champion is watched, and the
replicas' tallies of it.

    <serving>/WATCH                               {"watch_id", "version", "previous", "until", "limits", "by", ...}
    <serving>/watch/<watch id>/<replica>.json     one replica's counts of both versions (podium.core.watch.WatchTally)

A promotion with a `[promotion.watch]` table writes WATCH once its version is current (and registered), and removes
it when the watch is decided. Each replica of `podium serve` follows WATCH as it follows SHADOW and rewrites its
tally every poll; the promotion reads the tallies back. A promotion killed mid-watch leaves the pointer behind: the
next command settles the watch on the numbers written by then (`podium.tasks.watch.settle_orphan_watch`).
"""

from __future__ import annotations

import time
from typing import Any

from podium.core.watch import Watched, WatchTally
from podium.errors import ServingError
from podium.serving.shadow import read_replica_tallies, remove_pointer, safe_name, write_replica_tally
from podium.storage.documents import read_json, write_json
from podium.storage.locations import join, normalize_location

WATCH_POINTER = "WATCH"
WATCH_TALLIES = "watch"


def read_watch(serving: str) -> dict[str, Any] | None:
    """The WATCH pointer document, or None when no champion is watched."""
    return read_json(join(normalize_location(serving), WATCH_POINTER), ServingError)


def start_watch(serving: str, watched: Watched, duration_s: float, mark: dict[str, Any], **more: Any) -> None:
    """Say that `watched.version`, just made current in place of `watched.previous`, is watched for `duration_s`
    against its limits (`mark`: who watches, as a staged version's mark; `more`: what else the pointer names, e.g.
    the run). A watch left by another promotion is replaced: it watched a champion that is no longer the newest."""
    safe_name(watched.watch_id, "watch id")
    now = time.time()
    fields = watched.pointer_fields()
    write_json(join(normalize_location(serving), WATCH_POINTER),
               {"watch_id": fields.pop("watch_id"), "version": fields.pop("version"),
                "previous": fields.pop("previous"), "started_at": now, "until": now + duration_s,
                "duration_s": duration_s, "limits": fields.pop("limits"), "by": mark, **fields, **more})


def end_watch(serving: str, watch_id: str) -> bool:
    """Remove the WATCH pointer if it names `watch_id`; whether it did. The tallies stay, as the evidence."""
    return remove_pointer(serving, WATCH_POINTER, "watch_id", watch_id)


def write_watch_tally(serving: str, tally: WatchTally) -> None:
    """A replica's tally of a watch, rewritten whole (atomically) every poll."""
    write_replica_tally(serving, WATCH_TALLIES, tally.watch_id, tally.replica, tally.as_dict())


def read_watch_tallies(serving: str, watch_id: str) -> list[WatchTally]:
    """Every replica's tally of a watch (none yet: an empty list)."""
    return [WatchTally.from_dict(doc) for doc in read_replica_tallies(serving, WATCH_TALLIES, watch_id)]
