"""Rollback: serving goes back one champion along its history (or to a named version); the alias follows."""

from __future__ import annotations

import logging

from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel

from podium.errors import ServingError
from podium.serving import layout
from podium.tasks.promote import finish_cut_short
from podium.tasks.reconcile import origin, promotion_lock, switch_back

logger = logging.getLogger(__name__)


class RollbackOutcome(BaseModel):
    """Which version serving went back to, the one withdrawn, and the registry version the alias now names."""

    from_version: str
    to_version: str
    mlflow_version: str | None
    withdrawn: str | None = None
    switched: bool = True
    flow_run_id: str | None = None  # the `rollback` flow run that did it (the Prefect UI shows it)


def roll_back(serving: str, tracking_uri: str, registered_model: str, alias: str,
              to_version: str | None = None, reason: str | None = None) -> RollbackOutcome:
    """Point CURRENT back at the previous champion of the history (or at `to_version`), atomically, and
    make the registry follow: the alias moves, the version left is marked withdrawn.

    Each rollback goes one champion further back, skipping withdrawn ones, and is refused once there
    is none (ServingError). `to_version` may name a withdrawn version: that serves it again. Naming the
    current version switches nothing, but brings the alias and the withdrawn marks in line with the
    history (the repair after a rollback whose MLflow part did not go through).
    """
    if layout.read_pointer(serving) is None:  # checked before the lock, which would create the folder
        raise ServingError(f"nothing has been promoted to {serving!r}: nothing to roll back")
    with promotion_lock(serving) as still_locked:
        finish_cut_short(serving, tracking_uri, registered_model, alias, alias_too=False)
        back = switch_back(serving, tracking_uri, registered_model, alias, still_locked, to_version, reason,
                           origin("podium rollback"))
    return RollbackOutcome(from_version=back.from_version, to_version=back.to_version,
                           mlflow_version=back.mlflow_version, withdrawn=back.withdrawn, switched=back.switched)


@task(name="roll-back", cache_policy=NO_CACHE)
def roll_back_task(serving: str, tracking_uri: str, registered_model: str, alias: str, to_version: str | None = None,
                   reason: str | None = None) -> RollbackOutcome:
    """Point serving back one champion (or at `to_version`); the registry follows (`roll_back`)."""
    return roll_back(serving, tracking_uri, registered_model, alias, to_version, reason)
