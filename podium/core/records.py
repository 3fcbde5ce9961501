"""A checkpoint's record and its statuses, and the champion: the nouns every layer passes around."""

from __future__ import annotations

from dataclasses import dataclass, field

PENDING, VALIDATED, FAILED = "pending", "validated", "failed"
SKIPPED = "skipped"  # recorded, not validated: the loop's report said validation=False


@dataclass(frozen=True)
class CheckpointRecord:
    """One checkpoint as recorded in MLflow: training metrics and, once validated, validation metrics."""

    step: int
    uri: str
    status: str = PENDING
    metrics: dict[str, float] = field(default_factory=dict)
    model_id: str | None = None
    run_name: str | None = None
    failure: str | None = None
    validated_at: float | None = None
    withdrawn: str | None = None  # why it was withdrawn from serving (a rollback), if it was
    note: str | None = None  # why a checkpoint was not validated (a skipped one)
    val_digest: str | None = None  # digest of the validation data its metrics were measured on
    deleted: str | None = None  # why its files were deleted from storage (checkpoints.keep), if they were


@dataclass(frozen=True)
class Champion:
    """What the serving location currently holds."""

    version: str
    step: int | None
    metric: str
    value: float | None
    source: str | None = None
    mode: str | None = None  # None: a champion promoted before podium recorded the direction
    run_name: str | None = None
