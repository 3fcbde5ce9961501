"""A serving location's promotion history, read as a lineage of champions: pure functions, no I/O.

Every switch of CURRENT leaves one record under `<serving>/history/` (`layout.switch_current`).
Replayed in order, they say which versions were champions, in the order they were promoted, and
which of them were withdrawn by a rollback. Rollback walks back along that lineage, one champion
further each time, skipping withdrawn ones; the CURRENT pointer's `previous` field is only a note.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from podium.errors import HistoryError

PROMOTE, ROLLBACK = "promote", "rollback"


@dataclass(frozen=True)
class Switch:
    """One switch of CURRENT, as recorded in the history."""

    version: str
    at: float
    action: str
    reason: str
    previous: str | None = None
    withdrawn: str | None = None
    origin: Mapping[str, Any] = field(default_factory=dict)
    record: Mapping[str, Any] = field(default_factory=dict)


def parse_switch(doc: Mapping[str, Any]) -> Switch:
    """A history record as a Switch. Records of podium <= 0.2 have no `action` or `withdrawn`: a
    rollback is told by its reason ("rollback from vN"), and it withdrew the version it left."""
    reason = str(doc.get("reason") or "")
    action = str(doc.get("action") or (ROLLBACK if reason.startswith("rollback") else PROMOTE))
    previous = doc.get("previous")
    withdrawn = doc["withdrawn"] if "withdrawn" in doc else (previous if action == ROLLBACK else None)
    return Switch(version=str(doc.get("version")), at=float(doc.get("switched_at") or 0.0), action=action,
                  reason=reason, previous=previous, withdrawn=withdrawn, origin=doc.get("origin") or {},
                  record=doc)


@dataclass(frozen=True)
class Lineage:
    """The champions of a serving location in the order they were promoted, and the withdrawn ones."""

    champions: tuple[str, ...]
    withdrawn: Mapping[str, Switch]  # version -> the rollback that withdrew it (and it was not restored since)


def lineage_of(switches: Iterable[Switch]) -> Lineage:
    """Replay the switches in order: a promotion adds a champion, a rollback withdraws the version it
    left, and whatever becomes current is not withdrawn (a withdrawn version named explicitly is back)."""
    champions: list[str] = []
    withdrawn: dict[str, Switch] = {}
    for s in switches:
        if s.action == PROMOTE and s.version not in champions:
            champions.append(s.version)
        if s.withdrawn and s.withdrawn != s.version:
            withdrawn[s.withdrawn] = s
        withdrawn.pop(s.version, None)
    return Lineage(tuple(champions), withdrawn)


def current_switch(switches: Sequence[Switch], current: str | None) -> int | None:
    """The index of the switch that made `current` the version served: the last one to it (a version promoted,
    left by a rollback and rolled back to appears several times; only the switch that put it in place last is
    current). None when nothing is current or no switch to it was recorded."""
    for index in range(len(switches) - 1, -1, -1):
        if switches[index].version == current:
            return index
    return None


def rollback_target(lineage: Lineage, current: str, to: str | None = None,
                    serving: str = "the serving location") -> tuple[str, str | None]:
    """Where a rollback from `current` goes, and the version it withdraws (None: none).

    Without `to`: the latest champion promoted before `current` that was not withdrawn; each rollback
    goes one further back, and none is left after the first champion (HistoryError). With `to`: that
    version, withdrawn or not (naming it is the way to serve a withdrawn version again); going back
    to an earlier champion withdraws `current`, going forward to a later one withdraws nothing.
    `to == current` returns (current, None): nothing to switch.
    """
    order = list(lineage.champions)
    if current not in order:  # its history record was lost (a crash right after the switch): it is the latest
        order.append(current)
    position = order.index(current)
    if to is not None:
        if to == current:
            return current, None
        if to not in order:
            raise HistoryError(f"{serving}: {to} was never a champion there (its history has {order}), "
                               "so it is not rolled back to")
        return to, (current if order.index(to) < position else None)
    for version in reversed(order[:position]):
        if version not in lineage.withdrawn:
            return version, current
    withdrawn = sorted(lineage.withdrawn)
    note = (f"; {', '.join(withdrawn)} {'was' if len(withdrawn) == 1 else 'were'} withdrawn "
            "(name one with --to to serve it again)") if withdrawn else ""
    raise HistoryError(f"{serving}: {current} is the earliest champion still standing, there is nothing "
                       f"to roll back to{note}")
