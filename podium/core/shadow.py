"""The shadow stage of a promotion (`promotion.rollout = "shadow"`): what a candidate's answers to mirrored live
requests say, and whether it may replace the champion. Pure, no I/O.

Each replica of `podium serve` keeps one `Tally` of the shadow: on the requests the champion answered (200), how
many it mirrored to the candidate, how many of those the candidate failed (an exception, a 5xx answer, a NaN or
infinite prediction; a 4xx, a request its schema refuses, is not compared and not held against it), how many
predictions (rows) it was compared on and agreed with the champion, and both models' latencies on each request.
`aggregate` sums the replicas' tallies into `ShadowNumbers`; `decide_shadow` compares them with the limits
(`ShadowLimits`, from `promotion.shadow`) and says, in words, whether the candidate passed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from podium.core.numbers import format_percent
from podium.core.traffic import latency_ratio


@dataclass(frozen=True)
class ShadowLimits:
    """What the candidate's answers must meet (`promotion.shadow`)."""

    max_error_rate: float = 0.0
    max_latency_p95_ratio: float = 1.5
    min_agreement: float = 0.9
    on_no_traffic: Literal["refuse", "promote"] = "refuse"


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
    def outcome(self) -> Literal["passed", "refused", "stopped"]:
        """The verdict in a word (the registry's `podium.shadow` tag): a stopped shadow was not refused."""
        return "stopped" if self.stopped else "passed" if self.passed else "refused"

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
    return (f"{said}, latency p95 {1000 * (numbers.candidate_p95_s or 0):.1f} ms vs the champion's "
            f"{1000 * (numbers.champion_p95_s or 0):.1f} ms (x{ratio:.2f})")


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
