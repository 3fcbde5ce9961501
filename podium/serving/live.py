"""The live checks at the serving location: the pointers that put a candidate in shadow and a new champion under
watch, and the replicas' tallies of each (the one module that reads and writes them: the promotion, the next
command and the replicas of `podium serve` all go through it).

    <serving>/SHADOW                               {"shadow_id", "version", "manifest", "champion", "by", ...}
    <serving>/shadow/<shadow id>/<replica>.json    one replica's tally of that shadow (podium.core.traffic.Tally)
    <serving>/WATCH                                {"watch_id", "version", "previous", "until", "limits", "by", ...}
    <serving>/watch/<watch id>/<replica>.json      one replica's counts of both versions (podium.core.traffic.WatchTally)

A promotion with `promotion.rollout = "shadow"` writes SHADOW (atomically, as CURRENT is written) once its
candidate is staged and verified, and removes it when the shadow ends. The candidate is still staged (not sealed:
it is not complete until it is decided on), so the pointer carries the manifest the replicas check it against.
Each replica of `podium serve` follows SHADOW as it follows CURRENT, loads the candidate, mirrors the live requests
to it and rewrites its tally every poll; the promotion reads the tallies back. A promotion killed mid-shadow leaves
the pointer behind: the next command removes it (`podium.tasks.reconcile.withdraw_orphans`).

A promotion with a `[promotion.watch]` table writes WATCH once its version is current (and registered), and removes
it when the watch is decided. Each replica follows WATCH as it follows SHADOW and rewrites its tally every poll; the
promotion reads the tallies back. The pointer is read back typed (`WatchPointer`: the `Watched`, its limits
included, as the promotion that started it wrote them). A promotion killed mid-watch leaves the pointer behind: the
next command settles the watch on the numbers written by then (`podium.tasks.watch.settle_orphan_watch`).
"""

from __future__ import annotations

import posixpath
import re
import time
from dataclasses import dataclass, field
from typing import Any

from podium.core.live import Watched
from podium.core.traffic import Tally, WatchTally
from podium.errors import ServingError
from podium.serving.layout import PromotedVersion, content_of
from podium.storage.documents import read_json, write_json
from podium.storage.locations import fsspec_filesystem, join, normalize_location

SHADOW_POINTER = "SHADOW"
TALLIES = "shadow"
WATCH_POINTER = "WATCH"
WATCH_TALLIES = "watch"
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def read_shadow(serving: str) -> dict[str, Any] | None:
    """The SHADOW pointer document, or None when no candidate is in shadow."""
    return read_json(join(normalize_location(serving), SHADOW_POINTER), ServingError)


def check_no_shadow(serving: str, shadow_id: str | None = None) -> None:
    """Raise if a candidate (other than `shadow_id`'s) is in shadow: the replicas compare one at a time. A promotion
    asks before it stages anything, under the promotion lock."""
    other = read_shadow(serving)
    if other is not None and other.get("shadow_id") != shadow_id:
        raise ServingError(f"{serving}: {other.get('version')} is already in shadow (run "
                           f"{dict(other.get('by') or {}).get('run_name')}): one candidate is shadowed at a time; "
                           "promote again once it is decided")


def start_shadow(serving: str, shadow_id: str, version: PromotedVersion, champion: str | None,
                 mark: dict[str, Any], **more: Any) -> None:
    """Put a staged candidate in shadow (`mark`: who runs the shadow, as a staged version's mark); refused while
    another is (`check_no_shadow`)."""
    safe_name(shadow_id, "shadow id")
    check_no_shadow(serving, shadow_id)
    write_json(join(normalize_location(serving), SHADOW_POINTER),
               {"shadow_id": shadow_id, "version": version.version, "manifest": version.manifest,
                "champion": champion, "started_at": time.time(), "by": mark, **more})


def end_shadow(serving: str, shadow_id: str) -> bool:
    """Remove the SHADOW pointer if it names `shadow_id` (the replicas stop mirroring at their next poll); whether
    it did. The tallies stay, as the evidence the decision was made on."""
    return remove_pointer(serving, SHADOW_POINTER, "shadow_id", shadow_id)


def remove_pointer(serving: str, name: str, key: str, stage_id: str) -> bool:
    """Remove the pointer `name` (SHADOW, WATCH) if its `key` is `stage_id`; whether it did."""
    pointer = read_json(join(normalize_location(serving), name), ServingError)
    if pointer is None or pointer.get(key) != stage_id:
        return False
    fs, path = fsspec_filesystem(join(normalize_location(serving), name))
    try:
        fs.rm(path)
    except FileNotFoundError:
        return False
    return True


def candidate_of(serving: str, pointer: dict[str, Any]) -> PromotedVersion:
    """The staged candidate a SHADOW pointer names, with the manifest it is checked against."""
    manifest = pointer.get("manifest")
    if not isinstance(manifest, dict) or not str(pointer.get("version", "")).startswith("v"):
        raise ServingError(f"{serving}/{SHADOW_POINTER} is corrupt: expected a version and its manifest")
    serving = normalize_location(serving)
    return PromotedVersion(version=str(pointer["version"]),
                           uri=join(serving, "versions", str(pointer["version"]), content_of(manifest)),
                           manifest=manifest)


def write_tally(serving: str, tally: Tally) -> None:
    """A replica's tally of a shadow, rewritten whole (atomically) every poll."""
    write_replica_tally(serving, TALLIES, tally.shadow_id, tally.replica, tally.as_dict())


def read_tallies(serving: str, shadow_id: str) -> list[Tally]:
    """Every replica's tally of a shadow (none yet: an empty list)."""
    return [Tally.from_dict(doc) for doc in read_replica_tallies(serving, TALLIES, shadow_id)]


def write_replica_tally(serving: str, folder: str, stage_id: str, replica: str, doc: dict[str, Any]) -> None:
    """One replica's tally of a stage (a shadow, a watch) at `<serving>/<folder>/<stage id>/<replica>.json`."""
    safe_name(stage_id, f"{folder} id")
    safe_name(replica, "replica")
    write_json(join(normalize_location(serving), folder, stage_id, f"{replica}.json"), doc)


def read_replica_tallies(serving: str, folder: str, stage_id: str) -> list[dict[str, Any]]:
    """Every replica's tally of a stage, by replica; none if none was written."""
    folder = join(normalize_location(serving), folder, stage_id)
    fs, root = fsspec_filesystem(folder)
    try:
        names = sorted(posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False))
    except FileNotFoundError:
        return []
    docs = (read_json(join(folder, name), ServingError) for name in names
            if name.endswith(".json") and not name.startswith("."))
    return [doc for doc in docs if doc]


def safe_name(name: str, what: str) -> str:
    """`name` if it is safe as a file name at the location (a shadow's or watch's id, a replica); else raise."""
    if not _NAME.match(name):
        raise ServingError(f"{what} {name!r}: expected letters, digits, '.', '_' and '-'")
    return name


@dataclass(frozen=True)
class WatchPointer:
    """The WATCH pointer, read back: the champion watched (its limits as the promotion that started it read them),
    who watches it (`by`: a staged version's mark), and when the watch started and ends."""

    watched: Watched
    by: dict[str, Any] = field(default_factory=dict)
    started_at: float | None = None
    until: float | None = None


def read_watch(serving: str) -> WatchPointer | None:
    """The WATCH pointer, or None when no champion is watched."""
    doc = read_json(join(normalize_location(serving), WATCH_POINTER), ServingError)
    if doc is None:
        return None
    started_at, until = doc.get("started_at"), doc.get("until")
    return WatchPointer(Watched.from_pointer(doc), dict(doc.get("by") or {}),
                        float(started_at) if started_at is not None else None,
                        float(until) if until is not None else None)


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
