"""What a checkpoint announcement carries, and where announcements go."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ValidationRequest:
    """What one report asked of validation, through `ray.train.report(..., validation=...)`.

    `stated` is False when the report said nothing (podium then validates, as it does every
    checkpoint); `requested` is False for `validation=False`. `fn_kwargs` are the report's
    keyword arguments for the validation function (Ray's `ValidationTaskConfig.fn_kwargs`): they
    may hold anything, a Ray Dataset included, so they never go into an event payload or a record.
    """

    requested: bool = True
    stated: bool = False
    fn_kwargs: dict[str, Any] = field(default_factory=dict)
    timeout_s: float | None = None

    def describe(self) -> str:
        """In words, for logs and records: what the report asked."""
        if not self.stated:
            return "validation not stated (validated by default)"
        if not self.requested:
            return "the loop reported validation=False"
        return "validation requested" + (f" with fn_kwargs {sorted(self.fn_kwargs)}" if self.fn_kwargs else "")


@dataclass(frozen=True)
class CheckpointEvent:
    """A report from Ray Train: with `checkpoint_uri` set, a checkpoint that has been persisted."""

    run_name: str
    step: int
    metrics: dict[str, float]
    checkpoint_uri: str | None = None
    checkpoint_name: str | None = None
    epoch: int | None = None
    persisted_at: float = field(default_factory=time.time)
    validation: ValidationRequest | None = None  # None: not known (a catch-up from storage, an outside job)

    @property
    def has_checkpoint(self) -> bool:
        """True when this report persisted a checkpoint."""
        return self.checkpoint_uri is not None

    def payload(self) -> CheckpointPayload:
        """What an event about this checkpoint carries (CheckpointPayload)."""
        return CheckpointPayload(
            run_name=self.run_name, step=self.step, metrics=dict(self.metrics), checkpoint_uri=self.checkpoint_uri,
            checkpoint_name=self.checkpoint_name, epoch=self.epoch, persisted_at=self.persisted_at,
            validation_requested=self.validation.requested if self.validation is not None else None)

    def to_dict(self) -> dict[str, Any]:
        """The payload as a plain dict (JSON-serializable), as a Prefect event carries it."""
        return asdict(self.payload())


@dataclass(frozen=True)
class CheckpointPayload:
    """A checkpoint announcement as it travels in JSON: the payload of a `podium.checkpoint.persisted` event, the
    deployment trigger's parameter built from it, and the validate-announced-checkpoint flow's parameter. The
    schema is written here once; the trigger and the flow take it whole.

    It is the CheckpointEvent without what JSON cannot carry: the validation request's `fn_kwargs` stay out (they
    may hold a dataset); whether validation was requested goes in (None: not stated, validated by default).
    JSON has no NaN: a metric that was not finite arrives as null (None)."""

    run_name: str
    step: int
    metrics: dict[str, float | None] = field(default_factory=dict)
    checkpoint_uri: str | None = None
    checkpoint_name: str | None = None
    epoch: int | None = None
    persisted_at: float | None = None  # None: not known (an event written by hand)
    validation_requested: bool | None = None

    def event(self) -> CheckpointEvent:
        """The CheckpointEvent it announces (without the request's `fn_kwargs`); a null metric is NaN."""
        request = None if self.validation_requested is None else ValidationRequest(self.validation_requested,
                                                                                    stated=True)
        return CheckpointEvent(
            run_name=self.run_name, step=self.step, checkpoint_uri=self.checkpoint_uri,
            metrics={k: math.nan if v is None else float(v) for k, v in self.metrics.items()},
            checkpoint_name=self.checkpoint_name, epoch=self.epoch, validation=request,
            **({"persisted_at": self.persisted_at} if self.persisted_at is not None else {}))


@dataclass(frozen=True)
class TrainingRestart:
    """Ray Train restarted the worker group after a failure (`restart` counts them in this run)."""

    run_name: str
    restart: int
    cause: str
    at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class TrainingStarted:
    """Ray Train's controller started: `controller` is its actor handle, for a clean stop (`raytrain.abort_training`).
    Announced only to the orchestrating process's own queue (`CheckpointAnnouncer(announce_controller=True)`)."""

    run_name: str
    controller: Any


class EventSink(Protocol):
    """Anything that takes announcements: a Ray queue, a Prefect event emitter, a list in a test."""

    def put(self, event: CheckpointEvent | TrainingRestart | TrainingStarted) -> None: ...


STEP_KEYS = ("step", "global_step", "training_iteration", "epoch")


def step_of(metrics: dict[str, Any], fallback: int) -> int:
    """The step a report is about: the first of STEP_KEYS present in its metrics, else `fallback`."""
    for key in STEP_KEYS:
        value = metrics.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(value)
    return fallback


def numeric_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of a metrics dict as floats; NaN and infinities are kept (the caller decides).

    Booleans and values that are not numbers (strings, lists) are left out; a tensor or NumPy
    scalar counts by its `.item()`."""
    out = {}
    for k, v in metrics.items():
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            out[k] = float(v)
        elif hasattr(v, "item"):
            try:
                out[k] = float(v.item())
            except (TypeError, ValueError):
                continue
    return out


# the key under which a validation function may return per-row values: {"val_loss": 0.31, ...,
# "podium.per_row": {"val_loss": <one value per validation row>}} (a list or a 1-D array, rows in the data's
# order). They are read by a promotion that asks for confidence (promotion.confidence), in the process that
# ran the validation, and never recorded as metrics.
PER_ROW_KEY = "podium.per_row"


@dataclass(frozen=True)
class ValidationResult:
    """What a validation function returned: its numbers exactly (NaN and infinities kept), a short
    description of every value that is not a number, so the verdict can name it, and the per-row values
    it gave under PER_ROW_KEY (metric -> one value per row), if any."""

    metrics: dict[str, float]
    non_numeric: dict[str, str] = field(default_factory=dict)
    per_row: dict[str, Any] = field(default_factory=dict)


def read_validation_result(result: dict[str, Any]) -> ValidationResult:
    """Split a validation function's dict into numbers, the values that are not (described by type and repr),
    and the per-row values under PER_ROW_KEY (a mapping of metric names; anything else there is described)."""
    result = dict(result)
    per_row = result.pop(PER_ROW_KEY, None)
    if per_row is not None and not isinstance(per_row, dict):
        result[PER_ROW_KEY] = per_row  # not what the key documents: the verdict names it
        per_row = None
    metrics = numeric_metrics(result)
    non_numeric = {k: f"{v!r:.80} ({type(v).__name__})" for k, v in result.items() if k not in metrics}
    return ValidationResult(metrics, non_numeric, {str(k): v for k, v in (per_row or {}).items()})
