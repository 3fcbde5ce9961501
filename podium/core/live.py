"""The live checks, as pure decisions over live traffic: the shadow before a switch (`promotion.rollout =
"shadow"`: may a candidate that answered mirrored live requests replace the champion?) and the watch after one
(`[promotion.watch]`: does the new champion stay?). Two policies over the numbers the replicas of `podium serve`
count (podium.core.traffic), one set of states (`LiveState`) and one way of phrasing them. Pure, no I/O.

The shadow. Each replica keeps one `Tally` of the shadow: on the requests the champion answered (200), how many it
mirrored to the candidate, how many of those the candidate failed (an exception, a 5xx answer, a NaN or infinite
prediction; a 4xx, a request its schema refuses, is not compared and not held against it), how many predictions
(rows) it was compared on and agreed with the champion, and both models' latencies on each request. `aggregate`
sums the replicas' tallies into `ShadowNumbers`; `decide_shadow` compares them with the limits (`ShadowLimits`,
from `promotion.shadow`) and says, in words, whether the candidate passed.

The watch. Each replica counts the requests every version answered, and while a watch runs it writes its counts of
the new champion and of the previous one (`WatchTally`). `aggregate_watch` sums the replicas' counts into
`WatchNumbers`; `decide_watch` compares the new champion with the previous one against the limits (`WatchLimits`,
from `promotion.watch`) and says, in words, whether it broke one, passed, or is still watched.

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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Literal

from podium.core.numbers import format_percent
from podium.core.traffic import (
    LATENCY_BUCKETS_MS,
    Tally,
    WatchTally,
    binomial_tail,
    count_above,
    latency_ratio,
    traffic_of,
)


class LiveState(StrEnum):
    """Where a live check stands, in one word (what the registry's `podium.shadow` and `podium.watch` tags, the
    outcome and `--json` say). A shadow ends `passed`, `refused` or `stopped`; a watch is `watching` until it
    `broke` a limit or `passed`, and its promoter then settles it: `passed`, `rolled-back`, `stopped` by a signal
    (the promotion standing), or `ended` when another command moved CURRENT meanwhile."""

    WATCHING = "watching"
    PASSED = "passed"
    REFUSED = "refused"
    BROKE = "broke"
    STOPPED = "stopped"
    ROLLED_BACK = "rolled-back"
    ENDED = "ended"


def p95_phrase(new_ms: float, old_ms: float, ratio: float, whose: str = "") -> str:
    """Two versions' p95 latencies side by side, as both checks phrase them: `latency p95 4.1 ms vs the champion's
    3.9 ms (x1.05)` (`whose`: how the other version is named, if at all)."""
    return f"latency p95 {new_ms:.1f} ms vs {whose}{old_ms:.1f} ms (x{ratio:.2f})"


@dataclass(frozen=True)
class ShadowLimits:
    """What the candidate's answers must meet (`promotion.shadow`)."""

    max_error_rate: float = 0.0
    max_latency_p95_ratio: float = 1.5
    min_agreement: float = 0.9
    on_no_traffic: Literal["refuse", "promote"] = "refuse"



@dataclass(frozen=True)
class ShadowNumbers:
    """The replicas' tallies of one shadow, summed: what the decision is made on and what is recorded."""

    requests: int = 0
    errors: int = 0
    rows: int = 0
    agreed: int = 0
    champion_p95_s: float | None = None
    candidate_p95_s: float | None = None
    replicas: int = 0
    error_examples: tuple[str, ...] = ()
    not_loaded: tuple[str, ...] = ()  # why replicas could not load the candidate

    @property
    def error_rate(self) -> float | None:
        """Failed mirrored requests over mirrored requests (None: none mirrored)."""
        return self.errors / self.requests if self.requests else None

    @property
    def agreement(self) -> float | None:
        """Predictions the candidate agreed on over predictions compared (None: none compared)."""
        return self.agreed / self.rows if self.rows else None

    @property
    def latency_p95_ratio(self) -> float | None:
        """The candidate's p95 latency over the champion's, on the same requests (None: no request)."""
        return latency_ratio(self.candidate_p95_s, self.champion_p95_s)

    def as_dict(self) -> dict[str, Any]:
        """The numbers as plain data, the derived ones included (history, outcome, artifact)."""
        return {**asdict(self), "error_examples": list(self.error_examples), "not_loaded": list(self.not_loaded),
                "error_rate": self.error_rate, "agreement": self.agreement,
                "latency_p95_ratio": self.latency_p95_ratio}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ShadowNumbers:
        """The numbers read back from their plain data (`as_dict`'s; the derived ones are computed again)."""
        known = {k: doc[k] for k in cls.__dataclass_fields__ if k in doc}
        for listed in ("error_examples", "not_loaded"):
            if listed in known:
                known[listed] = tuple(known[listed] or ())
        return cls(**known)


STOPPED = "the run was stopped during the candidate's shadow"  # the reason of a shadow a stop ended


@dataclass(frozen=True)
class ShadowVerdict:
    """Whether the candidate passed its shadow, why in words, and the numbers it was decided on. `stopped`: a stop
    ended the shadow before any decision (`stopped_shadow`): the candidate is withdrawn, whatever the numbers say."""

    passed: bool
    reason: str
    numbers: ShadowNumbers
    failed: tuple[str, ...] = ()  # the limits it did not meet, in words
    stopped: bool = False

    @property
    def outcome(self) -> LiveState:
        """The verdict in a word (the registry's `podium.shadow` tag): a stopped shadow was not refused."""
        return LiveState.STOPPED if self.stopped else LiveState.PASSED if self.passed else LiveState.REFUSED

    def as_dict(self) -> dict[str, Any]:
        """The verdict as plain data: recorded in the history, the outcome, the registry's tags and the artifact (a
        stopped shadow's: `stopped`, and no `failed`)."""
        if self.stopped:
            return {"passed": self.passed, "stopped": True, "reason": self.reason, **self.numbers.as_dict()}
        return {"passed": self.passed, "reason": self.reason, "failed": list(self.failed), **self.numbers.as_dict()}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ShadowVerdict:
        """A verdict read back from its plain data (`as_dict`'s)."""
        return cls(passed=bool(doc["passed"]), reason=str(doc.get("reason", "")),
                   numbers=ShadowNumbers.from_dict(doc), failed=tuple(doc.get("failed") or ()),
                   stopped=bool(doc.get("stopped", False)))


def stopped_shadow(numbers: ShadowNumbers) -> ShadowVerdict:
    """The verdict of a shadow a stop ended: not passed, no limit said (`ShadowVerdict.stopped`)."""
    return ShadowVerdict(False, STOPPED, numbers, stopped=True)


def p95(values: Sequence[float]) -> float | None:
    """The 95th percentile by nearest rank (a value that was measured), or None of nothing."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def aggregate(tallies: Iterable[Tally]) -> ShadowNumbers:
    """The replicas' tallies summed (latency percentiles over every request of every replica)."""
    tallies = list(tallies)
    champion = [s for t in tallies for s in t.champion_latency_s]
    candidate = [s for t in tallies for s in t.candidate_latency_s]
    return ShadowNumbers(requests=sum(t.requests for t in tallies), errors=sum(t.errors for t in tallies),
                         rows=sum(t.rows for t in tallies), agreed=sum(t.agreed for t in tallies),
                         champion_p95_s=p95(champion), candidate_p95_s=p95(candidate), replicas=len(tallies),
                         error_examples=tuple(e for t in tallies for e in t.error_examples)[:Tally.EXAMPLES],
                         not_loaded=tuple(sorted({t.not_loaded for t in tallies if t.not_loaded})))


def shadow_has_answer(numbers: ShadowNumbers, wanted: int) -> bool:
    """Whether a shadow's numbers are all it waits for: `wanted` requests mirrored (`promotion.shadow.requests`), or
    every replica failed to load the candidate."""
    return numbers.requests >= wanted or bool(numbers.replicas and len(numbers.not_loaded) >= numbers.replicas)


def describe(numbers: ShadowNumbers) -> str:
    """The numbers in one phrase: `120 requests, error rate 0.0 %, agreement 98.3 % of 600 predictions, p95 4.1 ms
    vs the champion's 3.9 ms (x1.05)`."""
    if not numbers.requests:
        return "no request mirrored"
    said = (f"{numbers.requests} request(s), error rate {format_percent(numbers.error_rate)}, agreement "
            f"{format_percent(numbers.agreement)} of {numbers.rows} prediction(s)")
    ratio = numbers.latency_p95_ratio
    if ratio is None or not math.isfinite(ratio):
        return said
    return (f"{said}, " + p95_phrase(1000 * (numbers.candidate_p95_s or 0), 1000 * (numbers.champion_p95_s or 0),
                                     ratio, "the champion's "))


def decide_shadow(numbers: ShadowNumbers, limits: ShadowLimits, champion_changed: str | None = None) -> ShadowVerdict:
    """Whether a candidate with these shadow numbers may replace the champion.

    A shadow during which the champion changed (`champion_changed`: how, e.g. a rollback's `v2 -> v1`) fails: its
    answers were compared with another champion's. A candidate that no replica could load fails. No request
    mirrored: `limits.on_no_traffic` decides. Otherwise every limit must hold, a value equal to its limit passing:
    error rate at most `max_error_rate`, p95 latency at most `max_latency_p95_ratio` times the champion's, and
    agreement at least `min_agreement` (a candidate that answered no request has no agreement: it fails unless
    `min_agreement` is 0)."""
    if champion_changed:
        return ShadowVerdict(False, f"the champion changed during its shadow ({champion_changed}): it was compared "
                                    f"with another; promote the run again to compare it with the champion serving "
                                    f"now ({describe(numbers)})", numbers, ("champion changed",))
    if numbers.not_loaded and not numbers.requests:
        why = "; ".join(numbers.not_loaded)
        return ShadowVerdict(False, f"the candidate did not load in `podium serve`: {why}", numbers,
                             ("did not load",))
    if not numbers.requests:
        passed = limits.on_no_traffic == "promote"
        return ShadowVerdict(passed, f"no live request reached the shadow (is `podium serve` running and receiving "
                                     f"requests?): promotion.shadow.on_no_traffic = {limits.on_no_traffic}",
                             numbers, () if passed else ("no traffic",))
    failed = []
    rate = numbers.error_rate or 0.0
    if rate > limits.max_error_rate:
        examples = f" (e.g. {numbers.error_examples[0]})" if numbers.error_examples else ""
        failed.append(f"error rate {format_percent(rate)} ({numbers.errors} of {numbers.requests}) above max_error_rate "
                      f"{format_percent(limits.max_error_rate)}{examples}")
    ratio = numbers.latency_p95_ratio
    if ratio is not None and not ratio <= limits.max_latency_p95_ratio:
        failed.append(f"latency p95 x{ratio:.2f} the champion's, above max_latency_p95_ratio "
                      f"{limits.max_latency_p95_ratio:g}")
    agreement = numbers.agreement
    if (agreement is None and limits.min_agreement > 0) or (agreement is not None
                                                            and agreement < limits.min_agreement):
        failed.append(f"agreement {format_percent(agreement)} with the champion, below min_agreement "
                      f"{format_percent(limits.min_agreement)}")
    if failed:
        return ShadowVerdict(False, f"refused by its shadow: {'; '.join(failed)} ({describe(numbers)})", numbers,
                             tuple(failed))
    return ShadowVerdict(True, f"passed its shadow: {describe(numbers)}", numbers)



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
        """What the WATCH pointer keeps of it (podium.serving.live.start_watch adds when, how long and who)."""
        return {"watch_id": self.watch_id, "version": self.version, "previous": self.previous,
                "limits": self.limits.as_dict(), **({"model": self.model} if self.model is not None else {})}

    @classmethod
    def from_pointer(cls, doc: Mapping[str, Any]) -> Watched:
        """Read back from a WATCH pointer (its limits as the promotion that started it read them)."""
        previous, model = doc.get("previous"), doc.get("model")
        return cls(str(doc.get("watch_id")), str(doc.get("version")), str(previous) if previous else None,
                   WatchLimits.from_dict(dict(doc.get("limits") or {})), str(model) if model else None)



def _summed(counts: Iterable[Mapping[str, Any]], key: str) -> int:
    return sum(int(c.get(key) or 0) for c in counts)



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

    state: LiveState  # WATCHING, BROKE or PASSED
    reason: str
    numbers: WatchNumbers
    failed: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The verdict as plain data."""
        return {"state": str(self.state), "reason": self.reason, "failed": list(self.failed),
                **self.numbers.as_dict()}


@dataclass(frozen=True)
class WatchOutcome:
    """What became of a watched promotion (the outcome's `watch`): the last verdict, and what the promoter did with
    it (`state`: `passed`, final; `rolled-back`; `stopped` by a signal, the promotion standing; `ended` when another
    command moved CURRENT meanwhile), in words, after how long, for which version and the champion before it."""

    verdict: WatchVerdict
    state: LiveState  # one of SETTLED
    reason: str
    seconds: float
    version: str
    previous: str | None

    def as_dict(self) -> dict[str, Any]:
        """As plain data (`--json`'s `watch`, the attempt record): the verdict's numbers beside what became of it."""
        return {**self.verdict.as_dict(), "state": str(self.state), "reason": self.reason, "seconds": self.seconds,
                "version": self.version, "previous": self.previous}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> WatchOutcome:
        """Read back from `as_dict`'s form (the verdict's own state is recomputed from `failed` and `state`)."""
        numbers = WatchNumbers(**{k: doc[k] for k in WatchNumbers.__dataclass_fields__ if k in doc})
        state = as_settled(doc.get("state"))
        verdict_state = (LiveState.BROKE if doc.get("failed") else LiveState.PASSED if state == LiveState.PASSED
                         else LiveState.WATCHING)
        verdict = WatchVerdict(verdict_state, str(doc.get("reason", "")), numbers, tuple(doc.get("failed") or ()))
        return cls(verdict, state, str(doc.get("reason", "")), float(doc.get("seconds", 0.0)), str(doc["version"]),
                   doc.get("previous"))


# what becomes of a watch once its promoter (or the next command) settles it
SETTLED: tuple[LiveState, ...] = (LiveState.PASSED, LiveState.ROLLED_BACK, LiveState.STOPPED, LiveState.ENDED)


def as_settled(word: Any) -> LiveState:
    """A recorded outcome's word as one of `SETTLED` (one recorded before the words were fixed: `ended`)."""
    for settled in SETTLED:
        if word == settled:
            return settled
    return LiveState.ENDED


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
    return f"{said}, {p95_phrase(n.p95_ms, n.previous_p95_ms, ratio)}"


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
        return WatchVerdict(LiveState.BROKE, f"rolled back by its watch: {'; '.join(failed)} "
                                             f"({describe_watch(numbers)})", numbers, tuple(failed))
    said = describe_watch(numbers) + "".join(f"; {note}" for note in notes)
    if not over:
        return WatchVerdict(LiveState.WATCHING, f"watched: {said}", numbers)
    if numbers.requests < limits.min_requests:
        return WatchVerdict(LiveState.PASSED, f"final after its watch: {said}, fewer than min_requests "
                                              f"{limits.min_requests}: no limit judged", numbers)
    return WatchVerdict(LiveState.PASSED, f"final after its watch: {said}", numbers)
