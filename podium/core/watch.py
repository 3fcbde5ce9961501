"""The watch after the switch (`[promotion.watch]`): what the new champion's live answers say once a promotion made
it current, and whether it stays. Pure, no I/O.

Each replica of `podium serve` counts the requests every version answered (podium.core.traffic), and while a watch
runs it writes its counts of the new champion and of the previous one (`WatchTally`). `aggregate_watch` sums the replicas'
counts into `WatchNumbers`; `decide_watch` compares the new champion with the previous one against the limits
(`WatchLimits`, from `promotion.watch`) and says, in words, whether it broke one, passed, or is still watched.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal

from podium.core.traffic import LATENCY_BUCKETS_MS, VersionTraffic, latency_ratio

State = Literal["watching", "broke", "passed"]
WATCHING: Final = "watching"
BROKE: Final = "broke"
PASSED: Final = "passed"


@dataclass(frozen=True)
class WatchLimits:
    """What the new champion's live answers must meet against the previous champion's (`promotion.watch`)."""

    max_error_rate_increase: float = 0.0
    max_latency_p95_ratio: float = 2.0
    min_requests: int = 20


def counts_of(traffic: VersionTraffic | None) -> dict[str, Any]:
    """One version's counts on one replica as plain data (a watch tally's entry); empty without a request."""
    if traffic is None or not traffic.requests:
        return {}
    return {"requests": traffic.requests, "error_statuses": {str(k): v for k, v in traffic.error_statuses.items()},
            "buckets": list(traffic.buckets), "fastest_ms": traffic.fastest_ms, "slowest_ms": traffic.slowest_ms}


def traffic_of(counts: Iterable[Mapping[str, Any]]) -> VersionTraffic:
    """Several replicas' counts of one version, summed into one (latency buckets added up)."""
    total = VersionTraffic(LATENCY_BUCKETS_MS)
    for c in counts:
        buckets = list(c.get("buckets") or [])
        if not c.get("requests") or len(buckets) != len(total.buckets):
            continue
        total.requests += int(c["requests"])
        for status, n in dict(c.get("error_statuses") or {}).items():
            total.error_statuses[int(status)] = total.error_statuses.get(int(status), 0) + int(n)
        total.buckets = [a + int(b) for a, b in zip(total.buckets, buckets)]
        total.fastest_ms = min(total.fastest_ms, float(c.get("fastest_ms", math.inf)))
        total.slowest_ms = max(total.slowest_ms, float(c.get("slowest_ms", 0.0)))
    return total


@dataclass
class WatchTally:
    """One replica's account of one watch (as written under `<serving>/watch/<watch id>/<replica>.json`): its
    counts of the new champion and of the previous one, since the replica started."""

    watch_id: str
    replica: str
    champion: str
    previous: str | None = None
    champion_counts: dict[str, Any] = field(default_factory=dict)
    previous_counts: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The tally as plain data (the replica's file)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> WatchTally:
        """A tally read back (unknown keys ignored)."""
        return cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})


@dataclass(frozen=True)
class WatchNumbers:
    """The replicas' tallies of one watch, summed: the new champion's and the previous one's live numbers."""

    requests: int = 0
    errors: int = 0
    p95_ms: float | None = None
    previous_requests: int = 0
    previous_errors: int = 0
    previous_p95_ms: float | None = None
    replicas: int = 0

    @property
    def error_rate(self) -> float | None:
        """The new champion's failed requests over its requests (None: none yet)."""
        return self.errors / self.requests if self.requests else None

    @property
    def previous_error_rate(self) -> float | None:
        """The previous champion's, as the same replicas counted it (None: they counted none)."""
        return self.previous_errors / self.previous_requests if self.previous_requests else None

    @property
    def latency_p95_ratio(self) -> float | None:
        """The new champion's p95 latency over the previous one's (None: either has no number)."""
        return latency_ratio(self.p95_ms, self.previous_p95_ms)

    def as_dict(self) -> dict[str, Any]:
        """The numbers as plain data, the derived ones included (outcome, history, registry, event)."""
        return {**asdict(self), "error_rate": self.error_rate, "previous_error_rate": self.previous_error_rate,
                "latency_p95_ratio": self.latency_p95_ratio}


def aggregate_watch(tallies: Iterable[WatchTally]) -> WatchNumbers:
    """The replicas' tallies summed."""
    tallies = list(tallies)
    new, old = traffic_of(t.champion_counts for t in tallies), traffic_of(t.previous_counts for t in tallies)
    return WatchNumbers(requests=new.requests, errors=new.errors, p95_ms=new.latency_quantile_ms(0.95),
                        previous_requests=old.requests, previous_errors=old.errors,
                        previous_p95_ms=old.latency_quantile_ms(0.95), replicas=len(tallies))


@dataclass(frozen=True)
class WatchVerdict:
    """Where a watch stands: still `watching`, `broke` a limit (the champion is rolled back), or `passed` (final);
    why in words, and the numbers."""

    state: State
    reason: str
    numbers: WatchNumbers
    failed: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The verdict as plain data."""
        return {"state": self.state, "reason": self.reason, "failed": list(self.failed), **self.numbers.as_dict()}


Settled = Literal["passed", "rolled-back", "stopped", "ended"]


@dataclass(frozen=True)
class WatchOutcome:
    """What became of a watched promotion (the outcome's `watch`): the last verdict, and what the promoter did with
    it (`state`: `passed`, final; `rolled-back`; `stopped` by a signal, the promotion standing; `ended` when another
    command moved CURRENT meanwhile), in words, after how long, for which version and the champion before it."""

    verdict: WatchVerdict
    state: str
    reason: str
    seconds: float
    version: str
    previous: str | None

    def as_dict(self) -> dict[str, Any]:
        """As plain data (`--json`'s `watch`, the attempt record): the verdict's numbers beside what became of it."""
        return {**self.verdict.as_dict(), "state": self.state, "reason": self.reason, "seconds": self.seconds,
                "version": self.version, "previous": self.previous}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> WatchOutcome:
        """Read back from `as_dict`'s form (the verdict's own state is recomputed from `failed` and `state`)."""
        numbers = WatchNumbers(**{k: doc[k] for k in WatchNumbers.__dataclass_fields__ if k in doc})
        state = str(doc.get("state", WATCHING))
        verdict_state: State = BROKE if doc.get("failed") else PASSED if state == "passed" else WATCHING
        verdict = WatchVerdict(verdict_state, str(doc.get("reason", "")), numbers, tuple(doc.get("failed") or ()))
        return cls(verdict, state, str(doc.get("reason", "")), float(doc.get("seconds", 0.0)), str(doc["version"]),
                   doc.get("previous"))


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def describe_watch(n: WatchNumbers) -> str:
    """The numbers in one phrase: `120 request(s), error rate 0.0 % (the previous champion's 0.0 %), latency p95
    4.1 ms vs 3.9 ms (x1.05)`."""
    if not n.requests:
        return "no live request answered yet"
    said = f"{n.requests} request(s), error rate {_pct(n.error_rate)} (the previous champion's {_pct(n.previous_error_rate)})"
    ratio = n.latency_p95_ratio
    if ratio is None or not math.isfinite(ratio) or n.p95_ms is None or n.previous_p95_ms is None:
        return said
    return f"{said}, latency p95 {n.p95_ms:.1f} ms vs {n.previous_p95_ms:.1f} ms (x{ratio:.2f})"


def decide_watch(numbers: WatchNumbers, limits: WatchLimits, over: bool) -> WatchVerdict:
    """Where the watch of a new champion stands on these numbers (`over`: its duration has passed).

    Limits are judged once the new champion answered `min_requests` requests, at every read: its error rate may
    exceed the previous champion's by at most `max_error_rate_increase`, and its p95 latency may be at most
    `max_latency_p95_ratio` times the previous one's (not judged where the replicas have no latency of the
    previous champion, e.g. they started after the switch). A value equal to its limit passes. A limit broken:
    `broke`, at once. None broken by the end: `passed`, saying so when fewer than `min_requests` came."""
    failed = []
    if numbers.requests >= limits.min_requests:
        rate, before = numbers.error_rate or 0.0, numbers.previous_error_rate or 0.0
        if rate - before > limits.max_error_rate_increase + 1e-12:
            failed.append(f"error rate {_pct(rate)} ({numbers.errors} of {numbers.requests}) above the previous "
                          f"champion's {_pct(before)} by more than max_error_rate_increase "
                          f"{_pct(limits.max_error_rate_increase)}")
        ratio = numbers.latency_p95_ratio
        if ratio is not None and not ratio <= limits.max_latency_p95_ratio:
            failed.append(f"latency p95 x{ratio:.2f} the previous champion's, above max_latency_p95_ratio "
                          f"{limits.max_latency_p95_ratio:g}")
    if failed:
        return WatchVerdict(BROKE, f"rolled back by its watch: {'; '.join(failed)} ({describe_watch(numbers)})", numbers,
                            tuple(failed))
    if not over:
        return WatchVerdict(WATCHING, f"watched: {describe_watch(numbers)}", numbers)
    if numbers.requests < limits.min_requests:
        return WatchVerdict(PASSED, f"final after its watch: {describe_watch(numbers)}, fewer than min_requests "
                                    f"{limits.min_requests}: no limit judged", numbers)
    return WatchVerdict(PASSED, f"final after its watch: {describe_watch(numbers)}", numbers)
