"""The promotion policy: thresholds, guards and confidence, checked on a candidate. Pure functions, no I/O.

- A threshold (`promotion.thresholds`) is a bound a candidate's own metric must meet: `min`, `max`, or both.
  It holds for the first-ever promotion too; a missing, NaN or infinite metric fails it.
- A guard (`promotion.guards`) is a metric that must not regress against the champion, measured on the
  same data: `max_increase`, `max_decrease` (absolute) or `max_relative_increase`, `max_relative_decrease`
  (a fraction of the champion's value). With no champion there is nothing to compare: it does not block.
- Confidence (`promotion.confidence`): the lower bound of a paired bootstrap interval of the candidate's
  gain over the champion, row by row on the same validation rows, must be above `min_delta`. Without
  per-row values it fails (`promotion.confidence_without_rows = "refuse"`), or the decision compares point
  values and says so ("point"). With no champion to compare, or none measured on the same data, it is not made.

`podium.core.promotion.apply_checks` folds them into a decision: a failed check refuses a promotion, unless it is forced
(`promotion.always`): then they are reported and do not block.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from podium.core.numbers import finite, format_number, format_signed

if TYPE_CHECKING:
    import numpy as np

THRESHOLD, GUARD, CONFIDENCE, LOADABLE = "threshold", "guard", "confidence", "loadable"
# where the docs say how to make a checkpoint loadable (the refusal of the loadable gate names it)
LOADABLE_DOCS = "docs/promotion-policy.md#a-version-served-as-files"
WithoutRows = Literal["refuse", "point"]  # promotion.confidence_without_rows
GUARD_RULES = ("max_increase", "max_decrease", "max_relative_increase", "max_relative_decrease")
RESAMPLES = 2000  # paired bootstrap resamples: the interval's bounds move by about 0.1 % of its width between seeds
SEED = 0  # fixed: the same rows give the same interval, and so the same decision, every time


@dataclass(frozen=True)
class Check:
    """One check of the promotion policy: what was checked, both values, the limit, and whether it held.

    `passed` is None when the check could not be made (no champion to compare, no per-row values): such a
    check never blocks, and `note` says why."""

    kind: str  # threshold, guard or confidence
    metric: str
    rule: str  # min, max, one of GUARD_RULES, or "lower bound > min_delta"
    limit: float
    passed: bool | None
    candidate: float | None = None
    champion: float | None = None
    interval: tuple[float, float] | None = None  # confidence: the bootstrap interval of the gain
    level: float | None = None  # confidence: its level (0.95)
    rows: int | None = None  # confidence: how many paired rows
    note: str = ""

    def describe(self) -> str:
        """The check in one phrase: `threshold val_accuracy min 0.9: 0.8123, fails`."""
        verdict = {True: "holds", False: "FAILS", None: "not checked"}[self.passed]
        limit, mine, theirs = f"{self.limit:g}", format_number(self.candidate), format_number(self.champion)
        if self.kind == THRESHOLD:
            text = f"threshold {self.metric} {self.rule} {limit}: candidate {mine}"
        elif self.kind == GUARD:
            text = f"guard {self.metric} {self.rule} {limit}: candidate {mine}, champion {theirs}"
            if self.passed is not None and self.candidate is not None and self.champion is not None:
                text += f", change {format_signed(self.candidate - self.champion)}"
                if "relative" in self.rule:
                    text += f" (relative {format_signed((self.candidate - self.champion) / abs(self.champion))})"
        elif self.kind == LOADABLE:
            return self.note
        elif self.interval:
            text = (f"confidence {self.level:g} on {self.metric}: gain {interval_text(self.interval)} over {self.rows} "
                    f"paired rows, lower bound > min_delta {limit}")
        else:
            text = f"confidence {self.level:g} on {self.metric}: gain not measured row by row"
        return f"{text}, {verdict}" + (f" ({self.note})" if self.note else "")


def unknown_policy_metrics(metric: str, thresholds: Iterable[str], guards: Iterable[str], known: Collection[str],
                           reported: str) -> list[str]:
    """Each metric the promotion policy names (promotion.metric, a threshold's, a guard's) that is not among
    the metrics `known` to be reported (`reported` says which, and by what, in words: "the built-in loop and
    validation report ['loss', ...]"), one line each naming the field. A policy on a metric nothing reports
    cannot be met: every candidate would fail it (a typo, `val_acuracy`, would refuse every night), so it is
    refused before it is applied."""
    named = [(f"promotion.metric = {metric!r}", metric)] + [(f"promotion.thresholds.{m}", m) for m in sorted(thresholds)]
    named += [(f"promotion.guards.{m}", m) for m in sorted(guards)]
    return [f"{field}: no such metric; {reported}" for field, name in named if name not in known]


def interval_text(interval: tuple[float, float] | None) -> str:
    """A bootstrap interval as podium prints it: `[-0.004, +0.011]`."""
    return "none" if interval is None else f"[{format_signed(interval[0])}, {format_signed(interval[1])}]"


def check_thresholds(metrics: Mapping[str, float], thresholds: Mapping[str, Mapping[str, float | None]]) -> list[Check]:
    """Every bound of every threshold against the candidate's `metrics` (a missing or non-finite one fails)."""
    out = []
    for metric, bounds in sorted(thresholds.items()):
        value = metrics.get(metric)
        for rule in ("min", "max"):
            limit = bounds.get(rule)
            if limit is None:
                continue
            if not finite(value):
                out.append(Check(THRESHOLD, metric, rule, limit, False, None,
                                 note=f"the candidate has no finite {metric}"
                                      + (f" ({value})" if value is not None else "")))
                continue
            assert value is not None
            ok = value >= limit if rule == "min" else value <= limit
            out.append(Check(THRESHOLD, metric, rule, limit, ok, value))
    return out


def regression(rule: str, candidate: float, champion: float) -> float:
    """How far `candidate` moved from `champion` in the direction the guard's `rule` limits."""
    change = candidate - champion if "increase" in rule else champion - candidate
    return change / abs(champion) if "relative" in rule else change


def check_guards(candidate: Mapping[str, float], champion: Mapping[str, float] | None,
                 guards: Mapping[str, Mapping[str, float | None]], note: str = "") -> list[Check]:
    """Every guard: the candidate's metric against the champion's, both measured on the same data.

    `champion` None: there is no champion (or it could not be measured), and `note` says which: the guard
    is not checked and does not block. A candidate without a finite value fails; a champion without one
    cannot be compared with (not checked)."""
    out = []
    for metric, rules in sorted(guards.items()):
        rule, limit = next((r, v) for r, v in rules.items() if v is not None)
        mine = candidate.get(metric)
        theirs = champion.get(metric) if champion is not None else None
        if champion is None:
            out.append(Check(GUARD, metric, rule, limit, None, mine if finite(mine) else None,
                             note=note or "no champion to compare"))
        elif not finite(mine):
            out.append(Check(GUARD, metric, rule, limit, False, None, theirs if finite(theirs) else None,
                             note=f"the candidate has no finite {metric}"))
        elif not finite(theirs):
            out.append(Check(GUARD, metric, rule, limit, None, mine, None,
                             note=f"the champion has no finite {metric} on this data"))
        elif "relative" in rule and theirs == 0:
            out.append(Check(GUARD, metric, rule, limit, None, mine, theirs,
                             note="the champion's value is 0: a relative change is undefined"))
        else:
            assert mine is not None and theirs is not None
            out.append(Check(GUARD, metric, rule, limit, regression(rule, mine, theirs) <= limit, mine, theirs))
    return out


def bootstrap_interval(gain: Sequence[float] | np.ndarray, level: float, resamples: int = RESAMPLES,
                       seed: int = SEED) -> tuple[float, float]:
    """The percentile interval at `level` of the mean of `gain` (one value per row), by resampling rows
    with replacement `resamples` times from a fixed seed: the same rows always give the same interval."""
    import numpy as np  # only a decision with per-row values needs it

    rows = np.asarray(gain, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    chunk = max(1, 2**22 // max(len(rows), 1))  # at most ~32 MB of indices at once
    for start in range(0, resamples, chunk):
        n = min(chunk, resamples - start)
        means[start:start + n] = rows[rng.integers(0, len(rows), size=(n, len(rows)))].mean(axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)


def without_rows(metric: str, level: float, min_delta: float, why: str, accept: WithoutRows) -> Check:
    """The confidence check when the per-row values it needs are not there (`why`): with `accept` 'refuse'
    (promotion.confidence_without_rows) it fails, since a team that asked for a confidence gate gets none
    otherwise; with 'point' it is not made and the decision rests on the point values, saying so."""
    if accept == "point":
        return Check(CONFIDENCE, metric, "lower bound > min_delta", min_delta, None, level=level,
                     note=f"{why}: compared point values (promotion.confidence_without_rows = 'point')")
    return Check(CONFIDENCE, metric, "lower bound > min_delta", min_delta, False, level=level,
                 note=f"{why}: no confidence without per-row values (promotion.confidence_without_rows = 'refuse'; "
                      "'point' compares point values instead)")


def check_confidence(metric: str, mode: Literal["min", "max"], level: float, min_delta: float,
                     candidate_rows: Sequence[float] | np.ndarray | None,
                     champion_rows: Sequence[float] | np.ndarray | None, why_not: str = "",
                     accept: WithoutRows = "refuse") -> Check:
    """The candidate's gain over the champion, row by row (`candidate - champion` for 'max', the other way
    for 'min'), as a paired bootstrap interval at `level`: it holds when the lower bound is above `min_delta`.

    Without both sides' per-row values over the same rows (`why_not` says why) the check fails, or with
    `accept` 'point' it is not made and the decision rests on the point values (`without_rows`)."""
    if candidate_rows is None or champion_rows is None:
        return without_rows(metric, level, min_delta, why_not or "no per-row values", accept)
    import numpy as np

    mine, theirs = np.asarray(candidate_rows, dtype=np.float64), np.asarray(champion_rows, dtype=np.float64)
    if mine.shape != theirs.shape or mine.ndim != 1 or len(mine) == 0:
        return without_rows(metric, level, min_delta,
                            f"per-row values cannot be paired ({mine.shape} and {theirs.shape} rows)", accept)
    if not (np.isfinite(mine).all() and np.isfinite(theirs).all()):
        return Check(CONFIDENCE, metric, "lower bound > min_delta", min_delta, False, level=level, rows=len(mine),
                     note="per-row values are not all finite")
    gain = mine - theirs if mode == "max" else theirs - mine
    low, high = bootstrap_interval(gain, level)
    return Check(CONFIDENCE, metric, "lower bound > min_delta", min_delta, low > min_delta, float(mine.mean()),
                 float(theirs.mean()), interval=(low, high), level=level, rows=len(mine))


def check_served_as_model(step: int, candidate_as_files: bool | None, champion: str | None,
                          champion_as_files: bool | None, allow_files: bool, alias: str = "champion") -> Check | None:
    """The loadable gate: a candidate that would be served as files (`candidate_as_files`: its checkpoint is not in
    podium's format and neither promotion.model_class nor promotion.model_loader is set) never takes the alias from
    a `champion` that loads as an MLflow model (`champion_as_files` False), unless `allow_files`
    (promotion.allow_files, --allow-files): `models:/<model>@<alias>` would stop loading for everyone who loads it.

    None where the gate has nothing to say: a candidate that loads, no champion, a champion served as files too, or
    either side not known. Otherwise a Check that fails (the refusal, in one sentence, with the way out) or, allowed,
    holds and says so. `promotion.always` does not pass it: forcing a better number is not asking for files."""
    if candidate_as_files is not True or champion is None or champion_as_files is not False:
        return None
    files = (f"step {step} would be served as files (its checkpoint is not in podium's format, and neither "
             "promotion.model_class nor promotion.model_loader is set)")
    if allow_files:
        return Check(LOADABLE, "", "an MLflow model", 0.0, True,
                     note=f"{files}; it replaces champion {champion}, which loads as an MLflow model, as "
                          f"promotion.allow_files (--allow-files) asks: @{alias} no longer loads with mlflow.pyfunc")
    return Check(LOADABLE, "", "an MLflow model", 0.0, False,
                 note=f"not promoted: {files}, and champion {champion} loads as an MLflow model, which @{alias} would "
                      "stop doing; name the model's class (--model-class package.module:Class) or a loader "
                      f"(--model-loader package.module:function) to get a loadable model ({LOADABLE_DOCS}), or "
                      "--allow-files (promotion.allow_files) to promote the files anyway")


def check_to_dict(check: Check) -> dict[str, Any]:
    """A check as plain data (the manifest, the outcome, the MLflow record), with its phrase."""
    return {**dataclasses.asdict(check), "text": check.describe()}


def check_from_dict(data: Mapping[str, Any]) -> Check:
    """A check read back from its plain data (`check_to_dict`'s: its phrase, `text`, is what `describe` says)."""
    known = {f.name for f in dataclasses.fields(Check)}
    fields = {k: v for k, v in data.items() if k in known}
    if fields.get("interval") is not None:
        low, high = fields["interval"]
        fields["interval"] = (low, high)
    return Check(**fields)
