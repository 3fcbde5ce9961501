"""Live traffic per served version, as one replica of `podium serve` counts it: requests, errors and latency.
Pure, no I/O.

A `Traffic` keeps, for each version that answered, how many requests it answered, how many of those were errors
(an answer other than 200, by status: a 4xx is the client's bad request, a 5xx the model's failure) and how long
each took, in fixed latency buckets (`LATENCY_BUCKETS_MS`, the boundaries of the Prometheus histogram too), so its
size does not grow with the requests it counts. Its p50 and p95 are estimated from the buckets as Prometheus'
`histogram_quantile` does (linearly within a bucket), kept within the fastest and slowest latencies measured:
accurate to a bucket's width. A `VersionWindow` keeps what the watch compares: a version's requests past its
warm-up, and its last stretch of them.

What a replica writes of a live check, the numbers its policies (podium.core.live) sum and judge: a shadow's
`Tally` (the candidate's answers to mirrored requests, compared with the champion's: `compare_answers`) and a
watch's `WatchTally` (the new champion's counts and the previous one's, as `counts_of` puts a `VersionTraffic`).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

# upper bounds (ms) of the latency buckets; one more bucket holds what is slower than the last
LATENCY_BUCKETS_MS: tuple[float, ...] = (0.5, 1, 1.5, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 60, 80, 100,
                                         150, 200, 300, 400, 500, 750, 1000, 1500, 2000, 3000, 5000, 10000, 30000,
                                         60000)


@dataclass
class VersionTraffic:
    """One version's requests on one replica: counts, errors by status, and latencies in buckets."""

    boundaries: Sequence[float] = LATENCY_BUCKETS_MS
    requests: int = 0
    error_statuses: dict[int, int] = field(default_factory=dict)
    buckets: list[int] = field(default_factory=list)  # per boundary, then one beyond the last
    fastest_ms: float = math.inf
    slowest_ms: float = 0.0

    def __post_init__(self) -> None:
        if not self.buckets:
            self.buckets = [0] * (len(self.boundaries) + 1)

    def add(self, latency_ms: float, status: int) -> None:
        """One answered request: how long it took and the status it was answered with (not 200: an error)."""
        self.requests += 1
        if status != 200:
            self.error_statuses[status] = self.error_statuses.get(status, 0) + 1
        self.buckets[bisect_left(self.boundaries, latency_ms)] += 1
        if latency_ms < self.fastest_ms:
            self.fastest_ms = latency_ms
        if latency_ms > self.slowest_ms:
            self.slowest_ms = latency_ms

    @property
    def errors(self) -> int:
        """Requests answered with a status other than 200."""
        return sum(self.error_statuses.values())

    @property
    def failures(self) -> int:
        """Requests the version failed (a 5xx): what counts against it, not a client's bad request (a 4xx)."""
        return sum(n for status, n in self.error_statuses.items() if is_failure(status))

    def latency_quantile_ms(self, q: float) -> float | None:
        """The `q` quantile (0 to 1) of the latencies, estimated from the buckets (None: no request)."""
        return quantile_from_buckets(self.buckets, self.boundaries, q, self.fastest_ms, self.slowest_ms)

    def as_dict(self) -> dict[str, Any]:
        """What a person reads: requests, errors (by status), latency p50, p95 and max in ms."""
        p50, p95 = self.latency_quantile_ms(0.5), self.latency_quantile_ms(0.95)
        return {"requests": self.requests, "errors": self.errors,
                "error_statuses": {str(status): n for status, n in sorted(dict(self.error_statuses).items())},
                "latency_ms": {"p50": _rounded(p50), "p95": _rounded(p95),
                               "max": _rounded(self.slowest_ms if self.requests else None)}}


class Traffic:
    """Every version's `VersionTraffic` on one replica, since it started counting."""

    def __init__(self, boundaries: Sequence[float] = LATENCY_BUCKETS_MS):
        self.boundaries = tuple(boundaries)
        self.versions: dict[str, VersionTraffic] = {}

    def add(self, version: str, latency_ms: float, status: int) -> None:
        """One request `version` answered, in `latency_ms`, with `status`."""
        counted = self.versions.get(version)
        if counted is None:
            counted = self.versions[version] = VersionTraffic(self.boundaries)
        counted.add(latency_ms, status)

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """Each version's numbers (see `VersionTraffic.as_dict`), by version."""
        return {version: counted.as_dict() for version, counted in sorted(dict(self.versions).items())}


def is_failure(status: int) -> bool:
    """Whether an answer's status is the model's failure (5xx), not the client's bad request (4xx) or an answer."""
    return status >= 500


WARMUP_REQUESTS = 10  # a version's first requests on a replica, kept apart: cold caches, a first batch
RECENT_S = 60.0  # the stretch of a version's last requests a watch compares a new champion with
RECENT_MAX = 50_000  # requests kept of that stretch, at most


class VersionWindow:
    """One version's requests on one replica as a watch compares them: its first `WARMUP_REQUESTS` apart (the
    warm-up after it loads), then every later one (`settled`), and the last `RECENT_S` seconds of those (`recent`:
    what a version that no longer serves answered just before it was replaced). `fast`: how many of the settled
    requests the fast path answered."""

    def __init__(self, boundaries: Sequence[float] = LATENCY_BUCKETS_MS):
        self.boundaries = tuple(boundaries)
        self.warmup, self.settled = VersionTraffic(self.boundaries), VersionTraffic(self.boundaries)
        self.fast = 0
        self.recent: deque[tuple[float, float, int, bool]] = deque(maxlen=RECENT_MAX)

    def add(self, at_s: float, latency_ms: float, status: int, fast: bool) -> None:
        """One request answered at `at_s` (a monotonic clock), in `latency_ms`, with `status`; `fast`: by the fast
        path."""
        if self.warmup.requests < WARMUP_REQUESTS:
            self.warmup.add(latency_ms, status)
            return
        self.settled.add(latency_ms, status)
        self.fast += fast
        self.recent.append((at_s, latency_ms, status, fast))
        while self.recent[0][0] < at_s - RECENT_S:
            self.recent.popleft()

    def last_stretch(self) -> tuple[VersionTraffic, int]:
        """The settled requests of the version's last `RECENT_S` seconds of answers, and how many of them the fast
        path answered."""
        counted, fast = VersionTraffic(self.boundaries), 0
        for _, latency_ms, status, on_fast in list(self.recent):
            counted.add(latency_ms, status)
            fast += on_fast
        return counted, fast


@dataclass
class Tally:
    """One replica's account of one shadow (as written under `<serving>/shadow/<shadow id>/<replica>.json`)."""

    shadow_id: str
    replica: str
    champion: str | None = None  # the version that answered the requests compared
    candidate: str | None = None
    requests: int = 0  # mirrored and answered (or failed) by the candidate
    errors: int = 0
    error_examples: list[str] = field(default_factory=list)  # the first few failures, in words
    rows: int = 0  # predictions compared, on the requests the candidate answered
    agreed: int = 0
    champion_latency_s: list[float] = field(default_factory=list)  # one per request, in order
    candidate_latency_s: list[float] = field(default_factory=list)
    not_loaded: str | None = None  # why this replica could not load the candidate (it mirrored nothing)

    EXAMPLES = 3

    def add(self, champion_s: float, candidate_s: float, failure: str | None, rows: int = 0, agreed: int = 0) -> None:
        """One mirrored request: both models' latencies, the candidate's failure (None: it answered), and on how
        many predictions it agreed with the champion."""
        self.requests += 1
        self.champion_latency_s.append(champion_s)
        self.candidate_latency_s.append(candidate_s)
        if failure is not None:
            self.errors += 1
            if len(self.error_examples) < self.EXAMPLES:
                self.error_examples.append(failure[:300])
            return
        self.rows += rows
        self.agreed += agreed

    def as_dict(self) -> dict[str, Any]:
        """The tally as plain data (the replica's file)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Tally:
        """A tally read back (unknown keys ignored)."""
        known = {k: doc[k] for k in cls.__dataclass_fields__ if k in doc}
        return cls(**known)



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



def is_finite_answer(predictions: Any) -> bool:
    """Whether every number in a decoded answer is finite (no NaN, no infinity), at any depth."""
    if isinstance(predictions, bool) or predictions is None or isinstance(predictions, str):
        return True
    if isinstance(predictions, (int, float)):
        return math.isfinite(predictions)
    if isinstance(predictions, Mapping):
        return all(is_finite_answer(v) for v in predictions.values())
    if isinstance(predictions, (list, tuple)):
        return all(is_finite_answer(v) for v in predictions)
    return True


def same_answer(a: Any, b: Any, tolerance: float) -> bool:
    """Whether two decoded predictions (of one row) are the same answer: numbers within `tolerance` (absolute, or
    relative to the larger), everything else equal, structure included."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_answer(a[k], b[k], tolerance) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_answer(x, y, tolerance) for x, y in zip(a, b))
    return bool(a == b)


def answer_rows(answer: Any) -> list[Any]:
    """The per-row predictions of a decoded scoring answer (`{"predictions": [...]}`, or the list itself)."""
    predictions = answer.get("predictions", answer) if isinstance(answer, Mapping) else answer
    if isinstance(predictions, Mapping):  # column-oriented: {"col": [row values]}
        columns = list(predictions.values())
        if columns and all(isinstance(c, list) for c in columns):
            return [dict(zip(predictions, values)) for values in zip(*columns)]
        return [predictions]
    return list(predictions) if isinstance(predictions, list) else [predictions]


def compare_answers(champion: Any, candidate: Any, tolerance: float) -> tuple[str | None, int, int]:
    """The candidate's answer to one mirrored request against the champion's (both decoded): its failure in words
    (None: it answered), and the predictions compared and agreed on."""
    if not is_finite_answer(candidate):
        return "a NaN or infinite prediction", 0, 0
    theirs, ours = answer_rows(champion), answer_rows(candidate)
    if len(theirs) != len(ours):
        return f"{len(ours)} prediction(s) for the champion's {len(theirs)}", 0, 0
    return None, len(ours), sum(same_answer(a, b, tolerance) for a, b in zip(theirs, ours))


def quantile_from_buckets(counts: Sequence[int], boundaries: Sequence[float], q: float, lowest: float,
                          highest: float) -> float | None:
    """The `q` quantile of values counted in buckets (`counts[i]`: values up to `boundaries[i]` and above the one
    before; the last count: above the last boundary), interpolated linearly within its bucket as Prometheus'
    `histogram_quantile` does, and kept within [`lowest`, `highest`], the extreme values seen. None: no value."""
    total = sum(counts)
    if total == 0:
        return None
    if not 0 <= q <= 1:
        raise ValueError(f"quantile {q}: expected a number from 0 to 1")
    rank, below = q * total, 0
    for i, count in enumerate(counts):
        if count and below + count >= rank:
            low = boundaries[i - 1] if i > 0 else 0.0
            high = boundaries[i] if i < len(boundaries) else highest
            low, high = max(low, lowest), min(high, highest)
            estimate = low + (high - low) * (rank - below) / count
            return min(max(estimate, lowest), highest)
        below += count
    return highest


def count_above(counts: Sequence[int], boundaries: Sequence[float], threshold: float) -> int:
    """How many values counted in buckets (as `quantile_from_buckets` takes them) are above `threshold`: those of
    the buckets above it, and the share of the bucket it falls in that lies above it (linearly, as a quantile is
    estimated), rounded down. The last bucket has no upper bound: all of it or none."""
    above = 0.0
    for i, count in enumerate(counts):
        low = boundaries[i - 1] if i > 0 else 0.0
        high = boundaries[i] if i < len(boundaries) else math.inf
        if low >= threshold:
            above += count
        elif high > threshold and math.isfinite(high):
            above += count * (high - threshold) / (high - low)
    return int(above + 1e-9)


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): how likely `k` or more of `n` requests are past a line that each passes
    with probability `p`."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p <= 0:
        return 0.0
    if p >= 1:
        return 1.0
    log_p, log_q = math.log(p), math.log1p(-p)
    total = 0.0
    for i in range(k, n + 1):
        term = math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p
                        + (n - i) * log_q)
        total += term
        if i > n * p and term < total * 1e-12:  # past the mode the terms only shrink
            break
    return min(total, 1.0)


def latency_ratio(new: float | None, old: float | None) -> float | None:
    """One version's latency over another's (the shadow's candidate over its champion, a watched champion over the
    one it replaced): None where either has no number; a zero `old` gives 1 for a zero `new`, else infinity."""
    if new is None or old is None:
        return None
    if old <= 0:
        return 1.0 if new <= 0 else math.inf
    return new / old


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
