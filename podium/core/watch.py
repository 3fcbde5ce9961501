"""The watch after the switch (`[promotion.watch]`): what the new champion's live answers say once a promotion made
it current, and whether it stays. Pure, no I/O.

Each replica of `podium serve` counts the requests every version answered (podium.core.traffic), and while a watch
runs it writes its counts of the new champion and of the previous one (`WatchTally`). `aggregate_watch` sums the replicas'
counts into `WatchNumbers`; `decide_watch` compares the new champion with the previous one against the limits
(`WatchLimits`, from `promotion.watch`) and says, in words, whether it broke one, passed, or is still watched.

Like with like: both versions are counted under the same live traffic, next to the switch. The new champion's
requests after its warm-up (its first `WARMUP_REQUESTS` on each replica: cold caches, a first batch) are compared
with the previous champion's last `RECENT_S` seconds of answers before it was replaced (not its whole life on the
replica). Only the model's failures (5xx) count as errors, not a client's bad request (4xx). A latency limit broken
rolls back only where the numbers support it: the new champion's p95 above `max_latency_p95_ratio` times the
previous one's, and more of its requests past that line than chance would put there if its p95 were within it (a
binomial test at `SIGNIFICANCE`), so one slow answer among a few cannot decide. Latency is not judged where one
version answered mostly on the fast path and the other mostly through MLflow's pyfunc code (not like with like),
nor where the previous champion has fewer than `min_requests` requests to compare with; the verdict says so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal

from podium.core.numbers import format_percent
from podium.core.traffic import (
    LATENCY_BUCKETS_MS,
    VersionTraffic,
    binomial_tail,
    count_above,
    latency_ratio,
)

State = Literal["watching", "broke", "passed"]
WATCHING: Final = "watching"
BROKE: Final = "broke"
PASSED: Final = "passed"

SIGNIFICANCE = 0.001  # how unlikely by chance a latency difference must be to roll a champion back
TAIL = 0.05  # the share of requests a p95 leaves above it


@dataclass(frozen=True)
class WatchLimits:
    """What the new champion's live answers must meet against the previous champion's (`promotion.watch`)."""

    max_error_rate_increase: float = 0.0
    max_latency_p95_ratio: float = 2.0
    min_requests: int = 20

    def as_dict(self) -> dict[str, Any]:
        """As plain data (what the WATCH pointer carries, for a command that settles a watch its promoter left)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> WatchLimits:
        """Read back from `as_dict`'s form (unknown keys ignored, missing ones the defaults)."""
        return cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})


@dataclass(frozen=True)
class Watched:
    """One watch after a switch: its id, the version watched, the champion it replaced, the limits it is judged
    against, and the model it names. The promotion that watches holds it; a command that settles a watch its
    promoter left reads it back from the WATCH pointer (`from_pointer`)."""

    watch_id: str
    version: str
    previous: str | None
    limits: WatchLimits
    model: str | None = None

    def pointer_fields(self) -> dict[str, Any]:
        """What the WATCH pointer keeps of it (podium.serving.watch.start_watch adds when, how long and who)."""
        return {"watch_id": self.watch_id, "version": self.version, "previous": self.previous,
                "limits": self.limits.as_dict(), **({"model": self.model} if self.model is not None else {})}

    @classmethod
    def from_pointer(cls, doc: Mapping[str, Any]) -> Watched:
        """Read back from a WATCH pointer (its limits as the promotion that started it read them)."""
        previous, model = doc.get("previous"), doc.get("model")
        return cls(str(doc.get("watch_id")), str(doc.get("version")), str(previous) if previous else None,
                   WatchLimits.from_dict(dict(doc.get("limits") or {})), str(model) if model else None)


def counts_of(traffic: VersionTraffic | None, fast: int = 0, warmup: int = 0) -> dict[str, Any]:
    """One version's counts on one replica as plain data (a watch tally's entry): `fast`, how many of them the fast
    path answered; `warmup`, the requests kept apart before them. Empty without a request."""
    if traffic is None or not traffic.requests:
        return {"warmup": warmup} if warmup else {}
    statuses = dict(traffic.error_statuses)  # one copy: a replica's event loop may add a status meanwhile
    return {"requests": traffic.requests, "error_statuses": {str(k): v for k, v in statuses.items()},
            "buckets": list(traffic.buckets), "fastest_ms": traffic.fastest_ms, "slowest_ms": traffic.slowest_ms,
            "fast": fast, "warmup": warmup}


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


def _summed(counts: Iterable[Mapping[str, Any]], key: str) -> int:
    return sum(int(c.get(key) or 0) for c in counts)


@dataclass
class WatchTally:
    """One replica's account of one watch (as written under `<serving>/watch/<watch id>/<replica>.json`): its
    counts of the new champion since its warm-up, and of the previous one over its last stretch of answers."""

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
    """The replicas' tallies of one watch, summed: the new champion's and the previous one's live numbers. `errors`
    are the model's failures (5xx), `client_errors` the new champion's 4xx (not counted against it), `warmup` its
    requests kept apart; `fast_requests`, those the fast path answered; `buckets`, the new champion's latency
    buckets (what the latency test counts; not recorded)."""

    requests: int = 0
    errors: int = 0
    p95_ms: float | None = None
    previous_requests: int = 0
    previous_errors: int = 0
    previous_p95_ms: float | None = None
    replicas: int = 0
    client_errors: int = 0
    warmup: int = 0
    fast_requests: int = 0
    previous_fast_requests: int = 0
    buckets: tuple[int, ...] = field(default=(), repr=False, compare=False)

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

    @property
    def like_with_like(self) -> bool:
        """Whether both versions answered mostly on the same path (the fast path, or MLflow's pyfunc code)."""
        if not self.requests or not self.previous_requests:
            return True
        return (2 * self.fast_requests >= self.requests) == (2 * self.previous_fast_requests >= self.previous_requests)

    def as_dict(self) -> dict[str, Any]:
        """The numbers as plain data, the derived ones included (outcome, history, registry, event)."""
        said = {k: v for k, v in asdict(self).items() if k != "buckets"}
        return {**said, "error_rate": self.error_rate, "previous_error_rate": self.previous_error_rate,
                "latency_p95_ratio": self.latency_p95_ratio, "like_with_like": self.like_with_like}


def aggregate_watch(tallies: Iterable[WatchTally]) -> WatchNumbers:
    """The replicas' tallies summed."""
    tallies = list(tallies)
    news, olds = [t.champion_counts for t in tallies], [t.previous_counts for t in tallies]
    new, old = traffic_of(news), traffic_of(olds)
    return WatchNumbers(requests=new.requests, errors=new.failures, p95_ms=new.latency_quantile_ms(0.95),
                        previous_requests=old.requests, previous_errors=old.failures,
                        previous_p95_ms=old.latency_quantile_ms(0.95), replicas=len(tallies),
                        client_errors=new.errors - new.failures, warmup=_summed(news, "warmup"),
                        fast_requests=_summed(news, "fast"), previous_fast_requests=_summed(olds, "fast"),
                        buckets=tuple(new.buckets))


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
    state: Settled
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
        state = as_settled(doc.get("state"))
        verdict_state: State = BROKE if doc.get("failed") else PASSED if state == "passed" else WATCHING
        verdict = WatchVerdict(verdict_state, str(doc.get("reason", "")), numbers, tuple(doc.get("failed") or ()))
        return cls(verdict, state, str(doc.get("reason", "")), float(doc.get("seconds", 0.0)), str(doc["version"]),
                   doc.get("previous"))


SETTLED: tuple[Settled, ...] = ("passed", "rolled-back", "stopped", "ended")


def as_settled(word: Any) -> Settled:
    """A recorded outcome's word as a `Settled` (one recorded before the words were fixed: `ended`)."""
    for settled in SETTLED:
        if word == settled:
            return settled
    return "ended"


def describe_watch(n: WatchNumbers) -> str:
    """The numbers in one phrase: `120 request(s) after a warm-up of 10, error rate 0.0 % (the previous champion's
    0.0 %), latency p95 4.1 ms vs 3.9 ms (x1.05)`."""
    if not n.requests:
        return "no live request answered yet" + (f" past its warm-up ({n.warmup} request(s))" if n.warmup else "")
    said = f"{n.requests} request(s)"
    if n.warmup:
        said += f" after a warm-up of {n.warmup}"
    said += f", error rate {format_percent(n.error_rate)} (the previous champion's {format_percent(n.previous_error_rate)})"
    if n.client_errors:
        said += f", {n.client_errors} bad request(s) from clients (4xx, not counted)"
    ratio = n.latency_p95_ratio
    if ratio is None or not math.isfinite(ratio) or n.p95_ms is None or n.previous_p95_ms is None:
        return said
    return f"{said}, latency p95 {n.p95_ms:.1f} ms vs {n.previous_p95_ms:.1f} ms (x{ratio:.2f})"


def judge_latency(numbers: WatchNumbers, limits: WatchLimits) -> tuple[str | None, str | None]:
    """The latency limit on these numbers: (the limit broken, in words; None: not broken) and (why it was not
    judged, or why a p95 above the limit did not decide; None: nothing to say)."""
    ratio, limit = numbers.latency_p95_ratio, limits.max_latency_p95_ratio
    if ratio is None or ratio <= limit or numbers.previous_p95_ms is None:
        return None, None
    if not numbers.like_with_like:
        new = "the fast path" if 2 * numbers.fast_requests >= numbers.requests else "MLflow's pyfunc code"
        old = "MLflow's pyfunc code" if new == "the fast path" else "the fast path"
        return None, (f"latency not judged: the new champion answered mostly through {new}, the previous one "
                      f"through {old} (not like with like)")
    if numbers.previous_requests < limits.min_requests:
        return None, (f"latency not judged: the previous champion has {numbers.previous_requests} request(s) to "
                      f"compare with, fewer than min_requests {limits.min_requests}")
    line = limit * numbers.previous_p95_ms
    slower = count_above(numbers.buckets, LATENCY_BUCKETS_MS, line) if numbers.buckets else numbers.requests
    chance = binomial_tail(slower, numbers.requests, TAIL)
    said = (f"{slower} of {numbers.requests} request(s) slower than {line:.1f} ms (x{limit:g} the previous "
            f"champion's p95), p = {chance:.2g}")
    if chance < SIGNIFICANCE:
        return (f"latency p95 x{ratio:.2f} the previous champion's, above max_latency_p95_ratio {limit:g} ({said})",
                None)
    return None, f"latency p95 x{ratio:.2f} not held against it: {said}, as chance allows"


def decide_watch(numbers: WatchNumbers, limits: WatchLimits, over: bool) -> WatchVerdict:
    """Where the watch of a new champion stands on these numbers (`over`: its duration has passed).

    Limits are judged once the new champion answered `min_requests` requests past its warm-up, at every read: its
    error rate (5xx) may exceed the previous champion's by at most `max_error_rate_increase`, and its latency must
    not be shown above `max_latency_p95_ratio` times the previous one's p95 (`judge_latency`: a difference the
    numbers support, between versions on the same path; not judged where the replicas have no latency of the
    previous champion, e.g. they started after the switch). A value equal to its limit passes. A limit broken:
    `broke`, at once. None broken by the end: `passed`, saying so when fewer than `min_requests` came."""
    failed, notes = [], []
    if numbers.requests >= limits.min_requests:
        rate, before = numbers.error_rate or 0.0, numbers.previous_error_rate or 0.0
        if rate - before > limits.max_error_rate_increase + 1e-12:
            failed.append(f"error rate {format_percent(rate)} ({numbers.errors} of {numbers.requests}) above the previous "
                          f"champion's {format_percent(before)} by more than max_error_rate_increase "
                          f"{format_percent(limits.max_error_rate_increase)}")
        broken, note = judge_latency(numbers, limits)
        failed += [broken] if broken else []
        notes += [note] if note else []
    if failed:
        return WatchVerdict(BROKE, f"rolled back by its watch: {'; '.join(failed)} ({describe_watch(numbers)})", numbers,
                            tuple(failed))
    said = describe_watch(numbers) + "".join(f"; {note}" for note in notes)
    if not over:
        return WatchVerdict(WATCHING, f"watched: {said}", numbers)
    if numbers.requests < limits.min_requests:
        return WatchVerdict(PASSED, f"final after its watch: {said}, fewer than min_requests "
                                    f"{limits.min_requests}: no limit judged", numbers)
    return WatchVerdict(PASSED, f"final after its watch: {said}", numbers)
