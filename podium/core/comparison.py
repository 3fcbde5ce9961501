"""The same-data gate: which numbers were compared, on which data. Pure functions, no I/O.

A champion's number was measured on the validation data of the night it was promoted; tonight's
candidate is measured on tonight's. Compared as they are, a harder validation set keeps every better
model out and an easier one lets a worse one in. So before deciding, a side measured on other data than
the current validation data (its digest differs, or is unknown) is measured again on it: one more
validation, usually the champion's (`podium.tasks.evidence`). This module says which side needs it and puts
the comparison into words for the decision, the report and `podium status`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from podium.core.numbers import format_number

AT_VALIDATION = "validated"  # measured when its checkpoint was validated, on the current data
RESCORED = "re-scored"  # measured again, on the current data, for this comparison
STORED = "stored"  # the number kept from before, measured on other (or unknown) data


@dataclass(frozen=True)
class Measure:
    """One side of a comparison: whose number, its value, the data it was measured on, and how."""

    who: str
    value: float | None
    digest: str | None
    how: str
    stored_value: float | None = None  # a re-scored side: the number it had before
    stored_digest: str | None = None


@dataclass(frozen=True)
class Comparison:
    """The candidate's and the champion's numbers for `metric`, and the validation data they were measured on."""

    metric: str
    data: str | None  # the current validation data (location)
    digest: str | None  # its digest
    candidate: Measure
    champion: Measure | None = None
    note: str = ""  # a re-score that failed and what was done instead

    @property
    def same_data(self) -> bool:
        """Whether both numbers were measured on the current validation data (known by its digest)."""
        sides = [self.candidate] + ([self.champion] if self.champion else [])
        return self.digest is not None and all(m.digest == self.digest for m in sides)

    @property
    def rescored(self) -> list[str]:
        """Whose numbers were measured again for this comparison."""
        return [m.who for m in (self.candidate, self.champion) if m is not None and m.how == RESCORED]

    def describe(self) -> str:
        """The comparison in one sentence: the numbers, the data, and what was measured again."""
        parts = [_measure(self.metric, self.candidate)]
        if self.champion is not None:
            parts.append(_measure(self.metric, self.champion))
        numbers = ", ".join(parts)
        if self.same_data and self.champion:
            head = f"compared on the same validation data, {self.data} (digest {short(self.digest)}): {numbers}"
        elif self.same_data:
            head = f"measured on the validation data {self.data} (digest {short(self.digest)}): {numbers}"
        else:
            head = f"NOT compared on the same data (current validation data {self.data}, digest {short(self.digest)}): " \
                   f"{numbers}"
        return head + (f"; {self.note}" if self.note else "")


def short(digest: str | None) -> str:
    """A digest in text: its first 12 characters, or 'unknown'."""
    return digest[:12] if digest else "unknown"


def _measure(metric: str, m: Measure) -> str:
    text = f"{m.who} {metric} = {format_number(m.value)} ({m.how}"
    if m.how == RESCORED:
        text += f"; before: {format_number(m.stored_value)} on digest {short(m.stored_digest)}"
    elif m.how == STORED:
        text += f", measured on digest {short(m.digest)}"
    return text + ")"


def needs_rescore(recorded: str | None, current: str | None) -> bool:
    """A number must be measured again when it was measured on other data than the current one, or on
    data nobody recorded (a champion promoted before podium recorded digests). With no current digest
    there is nothing to measure against."""
    return current is not None and recorded != current


def rescored(m: Measure, value: float | None, digest: str | None) -> Measure:
    """`m` measured again on the data of `digest`, keeping what it had before."""
    return Measure(who=m.who, value=value, digest=digest, how=RESCORED, stored_value=m.value, stored_digest=m.digest)


def comparison_to_dict(comparison: Comparison) -> dict[str, Any]:
    """A comparison as plain data (the manifest, the run tag, the outcome, `--json`)."""
    return asdict(comparison)


def comparison_from_dict(d: Mapping[str, Any]) -> Comparison:
    """A comparison read back from a manifest, a run tag or an attempt record."""
    champion = d.get("champion")
    return Comparison(metric=d["metric"], data=d.get("data"), digest=d.get("digest"), candidate=Measure(**d["candidate"]),
                      champion=Measure(**champion) if champion else None, note=d.get("note", ""))
