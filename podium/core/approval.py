"""A person's decision on a candidate awaiting approval (`promotion.approval = "required"`), and what no
decision in time means. Pure, no I/O.

A candidate that passed every check of the promotion policy waits under the registry alias `challenger`;
the decision, whoever made it and however (the `podium approve` / `podium reject` commands, the Prefect UI's
form, the timeout), is one `Approval`: recorded in the serving history, the manifest, the registered
version's tags and the promotion's outcome, so `podium history` and `podium lineage` can say who decided,
when and why.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

CHALLENGER = "challenger"  # the registry alias of a candidate awaiting a decision, beside the alias `champion`
APPROVE, REJECT = "approve", "reject"
VIA_UI, VIA_TIMEOUT, VIA_STOP = "the Prefect UI", "timeout", "stop"
VIA_UNASKED = "not asked"  # the decision could not be asked for: no one decided (see `unasked`)
VIA_SHADOW = "shadow"  # the candidate's shadow decided (promotion.rollout = "shadow", no person asked)


def challenger_alias(alias: str) -> str:
    """The registry alias of a candidate awaiting a decision at the serving location whose alias is `alias`:
    `challenger` beside `champion`, `<alias>-challenger` beside any other (each location has aliases of its own)."""
    return CHALLENGER if alias == "champion" else f"{alias}-{CHALLENGER}"


@dataclass(frozen=True)
class Approval:
    """One decision on a candidate: approved or not, by whom, why, when (epoch seconds), and how it came."""

    approved: bool
    by: str
    reason: str
    at: float
    via: str

    def describe(self) -> str:
        """The decision in one phrase: `approved by ana (podium approve): beats last week's on every slice`."""
        if self.via == VIA_UNASKED:
            return f"undecided: {self.reason}"
        if self.via == VIA_STOP:
            return f"withdrawn: {self.reason}"
        if self.via == VIA_SHADOW:  # its reason says passed or refused, with the numbers (podium.core.live)
            return self.reason
        verdict = "approved" if self.approved else "rejected"
        if self.via == VIA_TIMEOUT:
            return f"{verdict} on timeout: {self.reason}"
        return f"{verdict} by {self.by}: {self.reason}"

    def as_dict(self) -> dict[str, Any]:
        """The decision as plain data (manifest, history, outcome)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Approval:
        """A decision read back from its plain data (`as_dict`'s)."""
        return cls(approved=bool(data["approved"]), by=str(data["by"]), reason=str(data["reason"]),
                   at=float(data.get("at") or 0), via=str(data["via"]))

    def tags(self) -> dict[str, str]:
        """The decision as registry tags (`podium.approval`, `.by`, `.reason`, `.at`, `.via`)."""
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at))
        verdict = ("undecided" if self.via == VIA_UNASKED else "withdrawn" if self.via == VIA_STOP
                   else ("shadow passed" if self.approved else "shadow refused") if self.via == VIA_SHADOW
                   else "approved" if self.approved else "rejected")
        return {"podium.approval": verdict, "podium.approval.by": self.by,
                "podium.approval.reason": self.reason[:5000], "podium.approval.at": when,
                "podium.approval.via": self.via}


def signed_by_command(who: str, decision: str) -> str:
    """How `podium approve` / `podium reject` sign the answer they send: `ana@host (podium approve)`."""
    return f"{who} (podium {decision})"


def answered(decision: str, reason: str, by: str, at: float | None = None) -> Approval:
    """A person's answer (`decision` 'approve' or 'reject'), from the commands (`signed_by_command`) or the Prefect
    UI's form (an empty `by` is someone there)."""
    if decision not in (APPROVE, REJECT):
        raise ValueError(f"decision {decision!r}: expected {APPROVE!r} or {REJECT!r}")
    who = by.strip() or f"someone in {VIA_UI}"
    via = f"podium {decision}" if who.endswith(signed_by_command("", decision)) else VIA_UI
    return Approval(decision == APPROVE, who, reason.strip(), time.time() if at is None else at, via)


def timed_out(timeout_s: float, on_timeout: Literal["reject", "approve"], at: float | None = None) -> Approval:
    """What no decision within `timeout_s` means (`promotion.approval_on_timeout`)."""
    return Approval(on_timeout == APPROVE, "podium", f"no decision within {timeout_s:g} s "
                    f"(promotion.approval_on_timeout = {on_timeout})", time.time() if at is None else at, VIA_TIMEOUT)


def withdrawn(why: str, at: float | None = None) -> Approval:
    """A candidate no one can decide on any more: the run was stopped while it waited."""
    return Approval(False, "podium", why, time.time() if at is None else at, VIA_STOP)


def unasked(why: str, at: float | None = None) -> Approval:
    """A candidate no one could be asked about (Prefect did not take the pause that asks, or stopped answering
    while it waited): not promoted, and not a decision either. The run did not do its work
    (podium.flows.summary.run_shortfall): its command and its flow run end failed, and promoting the run again
    asks again."""
    return Approval(False, "podium", why, time.time() if at is None else at, VIA_UNASKED)


def shadowed(passed: bool, reason: str, at: float | None = None) -> Approval:
    """The verdict of a candidate's shadow (podium.core.live.decide_shadow), where no person is asked."""
    return Approval(passed, "podium", reason, time.time() if at is None else at, VIA_SHADOW)
