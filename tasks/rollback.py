"""Rollback: serving goes back one champion along its history (or to a named version); the alias follows."""

from __future__ import annotations

import logging
import time

from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel

from podium.errors import HistoryError, ServingError
from podium.serving import layout
from podium.serving.history import rollback_target
from podium.tasks.promote import origin, promotion_lock
from podium.tasks.reconcile import claim_location, sync_alias, withdraw_orphans
from podium.tracking import ledger

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
        claim_location(serving, tracking_uri, registered_model, alias)
        withdraw_orphans(serving, tracking_uri, registered_model, alias)
        current = layout.read_current(serving)
        assert current is not None  # the pointer exists, and only a promotion or a rollback writes it
        try:
            target_name, withdraws = rollback_target(layout.read_lineage(serving), current.version, to_version,
                                                     serving)
        except HistoryError as exc:
            raise ServingError(str(exc)) from None
        target = layout.read_version(serving, target_name)
        if target is None:
            raise ServingError(f"{serving}: version {target_name!r} does not exist or is incomplete")
        switched = target.version != current.version
        if switched:
            still_locked()
            why = f"rollback from {current.version}" + (f": {reason}" if reason else "")
            layout.switch_current(serving, target, why, action="rollback", withdrawn=withdraws,
                                  origin=origin("podium rollback"))
        mlflow_version = sync_registry(serving, tracking_uri, registered_model, alias)
    return RollbackOutcome(from_version=current.version, to_version=target.version, mlflow_version=mlflow_version,
                           withdrawn=withdraws, switched=switched)


@task(name="roll-back", cache_policy=NO_CACHE)
def roll_back_task(serving: str, tracking_uri: str, registered_model: str, alias: str, to_version: str | None = None,
                   reason: str | None = None) -> RollbackOutcome:
    """Point serving back one champion (or at `to_version`); the registry follows (`roll_back`)."""
    return roll_back(serving, tracking_uri, registered_model, alias, to_version, reason)


def sync_registry(serving: str, tracking_uri: str, registered_model: str, alias: str) -> str | None:
    """Make the registry say what the serving history says: the alias names the current version, every
    withdrawn version is tagged `podium.withdrawn` (its model version and its checkpoint's record), the
    current one is not. Idempotent; returns the registry version the alias names (None: not registered)."""
    current = layout.read_current(serving)
    if current is None:
        return None
    lineage = layout.read_lineage(serving)
    for name, switch in lineage.withdrawn.items():
        withdrawn = layout.read_version(serving, name)
        if withdrawn is None:
            continue
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(switch.at))
        ledger.withdraw(tracking_uri, registered_model, withdrawn.manifest.get("version_uid"), withdrawn.uri,
                        withdrawn.manifest.get("model_id"),
                        f"withdrawn from {serving} ({name}) on {when}: {switch.reason}")
    ledger.reinstate(tracking_uri, registered_model, current.manifest.get("version_uid"), current.uri,
                     current.manifest.get("model_id"))
    return sync_alias(serving, tracking_uri, registered_model, alias)
