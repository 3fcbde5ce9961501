"""One poller for the live checks: the shadow before a switch (podium.tasks.shadow) and the watch after one
(podium.tasks.watch) both read the replicas' tallies of `podium serve` every poll until their policy has its
answer, a stop is asked for, CURRENT moves away from the version the check expects, or its duration passes.
The decisions are the policies' own (podium.core.live); this only waits."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from podium.serving import layout

Numbers = TypeVar("Numbers")
Ended = Literal["decided", "stopped", "moved", "over"]


@dataclass(frozen=True)
class Polled(Generic[Numbers]):
    """What the replicas' tallies said last, and why the poll ended: the policy `decided`, a stop was asked for
    (`stopped`), CURRENT `moved` to `current` (a rollback or a promotion meanwhile), or the duration was `over`;
    `over`: whether the duration had passed when the numbers were read."""

    numbers: Numbers
    ended: Ended
    over: bool
    current: str | None = None


def poll_live(serving: str, read: Callable[[], Numbers], decided: Callable[[Numbers, bool], bool],
              expected: str | None, duration_s: float, stop_requested: Callable[[], bool],
              poll_s: float) -> Polled[Numbers]:
    """Read `read()` every `poll_s` seconds for at most `duration_s`, until `decided(numbers, over)` (over: the
    duration has passed), a stop is asked for, or CURRENT names another version than `expected`."""
    deadline = time.monotonic() + duration_s
    while True:
        over = time.monotonic() >= deadline
        numbers = read()
        if decided(numbers, over):
            return Polled(numbers, "decided", over)
        if stop_requested():
            return Polled(numbers, "stopped", over)
        current = (layout.read_pointer(serving) or {}).get("version")
        if current != expected:
            return Polled(numbers, "moved", over, current)
        if over:
            return Polled(numbers, "over", over)
        time.sleep(poll_s)
