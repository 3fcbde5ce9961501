"""A checkpoint's verdict: one pure function of what is known about it. No I/O.

Every place that decides a checkpoint's fate (the flow's validation queue, the validation task, the
checkpoint-validation flow of a deployment) asks `decide_verdict` and carries the answer out; one
adapter (`podium.tracking.records.record_verdict`) writes it to MLflow. The ladder, first match wins:

| what is known                                                   | verdict                         |
|-----------------------------------------------------------------|---------------------------------|
| the record already has a verdict (a resumed run)                | kept as it is, nothing written  |
| a training metric is NaN or infinite (the weights diverged)     | failed, not validated           |
| not validated yet, the report said `validation=False`           | skipped                         |
| not validated yet, a required argument of the function unfilled | failed, naming the argument     |
| not validated yet                                               | pending: validate it now        |
| its validation ended because the run was asked to stop          | pending: validated on resume    |
| its validation raised (after its retries)                       | failed, with the error          |
| it returned a non-numeric, NaN or infinite value                | failed, with the values         |
| it returned neither the promotion metric nor had training it    | failed, naming the metric       |
| otherwise                                                       | validated, with the metrics     |
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from podium.core.events import ValidationRequest
from podium.core.numbers import finite, listed
from podium.core.records import FAILED, PENDING, SKIPPED, VALIDATED


@dataclass(frozen=True)
class ValidationOutcome:
    """How a validation of one checkpoint ended: what it returned, or the error it raised, or a stop."""

    metrics: Mapping[str, float] = field(default_factory=dict)
    non_numeric: Mapping[str, str] = field(default_factory=dict)  # name -> what it was, in words
    error: str | None = None  # it raised after its retries: "TypeError: ..."
    stopped: bool = False  # it ended because the run was asked to stop

    @classmethod
    def raised(cls, exc: BaseException, stopped: bool = False) -> ValidationOutcome:
        """A validation that ended with `exc` (after its retries), or with the run's stop."""
        return cls(error=f"{type(exc).__name__}: {exc}", stopped=stopped)


@dataclass(frozen=True)
class Verdict:
    """The decision on one checkpoint, for the caller to carry out.

    `status` is the checkpoint's status after the decision; `validate` says to run the validation
    function now (no verdict yet); `unchanged` says the record already holds this verdict (nothing to
    write). `reason` is a failure's reason, a skip's note, or why a checkpoint stays pending;
    `metrics` are the validation metrics to record with the verdict."""

    status: str
    reason: str | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    validate: bool = False
    unchanged: bool = False

    @property
    def to_record(self) -> bool:
        """True when this is a new verdict to write onto the checkpoint's record."""
        return not self.unchanged and self.status != PENDING


def decide_verdict(
    *,
    step: int,
    metric: str,
    status: str = PENDING,
    training: Mapping[str, float] | None = None,
    request: ValidationRequest | None = None,
    validation_fn: str = "",
    missing_arguments: Sequence[str] = (),
    given_arguments: Sequence[str] = (),
    outcome: ValidationOutcome | None = None,
) -> Verdict:
    """The verdict on checkpoint `step` from what is known about it (the table in this module's docstring).

    `status` is its record's status as found; `training` its training metrics; `request` what its
    report asked of validation (None: not known, validated by default); `missing_arguments` the
    required parameters of `validation_fn` that neither podium nor `given_arguments` fill; `outcome`
    how its validation ended (None: it has not run); `metric` the promotion metric."""
    training = training or {}
    if status != PENDING:
        return Verdict(status, unchanged=True)
    if (diverged := judge_training(training, step)) is not None:
        return Verdict(FAILED, diverged)
    if outcome is None:
        if request is not None and not request.requested:
            return Verdict(SKIPPED, f"not validated: {request.describe()}")
        if missing_arguments:
            return Verdict(FAILED, f"not validated: {validation_fn} requires {', '.join(missing_arguments)}, which "
                                   f"neither podium nor the arguments given for this checkpoint "
                                   f"({sorted(given_arguments)}) fill")
        return Verdict(PENDING, validate=True)
    if outcome.stopped:
        return Verdict(PENDING, "its validation ended with the run's stop: it is validated when the run resumes")
    if outcome.error is not None:
        return Verdict(FAILED, outcome.error)
    failure = judge_validation(outcome.metrics, outcome.non_numeric, training, metric)
    return Verdict(FAILED if failure else VALIDATED, failure, dict(outcome.metrics))


def judge_training(metrics: Mapping[str, float], step: int) -> str | None:
    """Why a checkpoint must not be validated or promoted on its training metrics, or None if they are fine.

    A loss that went NaN or infinite means the weights have diverged (one NaN in a feature is enough);
    the checkpoint's validation could still report a finite accuracy, so it is failed here."""
    bad = {k: v for k, v in metrics.items() if not finite(v)}
    return f"training metric(s) not finite at step {step}: {listed(bad)}" if bad else None


def judge_validation(returned: Mapping[str, float], non_numeric: Mapping[str, str],
                     training: Mapping[str, float], metric: str) -> str | None:
    """The verdict on what a validation function returned: None (validated), or why the checkpoint failed.

    Every value must be a finite number: a string, a NaN or an infinity fails the checkpoint (a model
    with NaN weights can still score a finite accuracy, next to a NaN loss). The ranking `metric` must
    be among the validation's or the training's metrics."""
    if non_numeric:
        return f"validation returned non-numeric metric(s): {', '.join(f'{k} = {v}' for k, v in sorted(non_numeric.items()))}"
    bad = {k: v for k, v in returned.items() if not finite(v)}
    if bad:
        return f"validation returned non-finite metric(s): {listed(bad)}"
    if metric not in returned and metric not in training:
        return (f"validation returned no {metric!r} (the promotion metric); it returned {sorted(returned)}"
                + (f", training reported {sorted(training)}" if training else ""))
    return None


def run_failure(statuses: Sequence[str]) -> str | None:
    """Why a run whose checkpoints ended with `statuses` failed as a whole, or None.

    A run none of whose checkpoints was validated, with at least one that failed, did not do its work,
    whatever else it did: its scheduler must not read it as a success. A run whose checkpoints were all
    skipped (its loop said `validation=False` every time) or kept from an earlier attempt is not failed here."""
    failed = sum(s == FAILED for s in statuses)
    if failed and not any(s == VALIDATED for s in statuses):
        return f"every validation failed ({failed} of {len(statuses)} checkpoint(s) failed, none validated)"
    return None
