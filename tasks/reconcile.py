"""One truth for what is served: the serving location's history is the record of decisions; the registry's
aliases and tags are derived from it, checked against it and repaired where a command was cut short.

Every command that changes what a location serves (`podium run`, `promote`, `rollback`, the decisions on a
candidate) starts under the location's promotion lock (`promotion_lock`; `origin` says who started a switch) with
what a command cut short finished (`podium.tasks.promote.finish_cut_short`, in this order):

- `claim_location`: the location's identity (`LOCATION.json`: its registered model and alias) and the
  registry's record that the alias belongs to it; a second location of a model asking for the same alias is
  refused, so that neither moves the other's.
- `withdraw_orphans`: a version staged by a process that is gone (a promoter or a candidate awaiting approval
  or in shadow, killed with SIGKILL) is withdrawn: its files go (its number stays taken), its registered version
  is tagged `podium.approval = withdrawn` and the challenger alias leaves it; a SHADOW pointer its process left
  is removed (`podium serve` stops mirroring to it).
- a watch after a switch (`[promotion.watch]`) whose promoter is gone is settled next to the watch's own task
  (`podium.tasks.watch.settle_orphan_watch`): a limit broken rolls the new champion back (`switch_back`, here).
- `sync_alias`: the alias names the registered version made for the current serving version (matched by the
  manifest's `version_uid`), moved there if a command stopped between the switch and the alias (the one repair of
  the alias; `podium.tracking.ledger.align_alias` moves it).

`disagreements` is the read-only check `podium status` reports.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from podium import prefect_api
from podium.core.approval import challenger_alias, withdrawn
from podium.errors import AliasTaken, HistoryError, ServingError, TrackingUnavailable
from podium.progress import say
from podium.serving import layout
from podium.serving.history import rollback_target
from podium.serving.live import end_shadow, read_shadow, read_watch
from podium.serving.location import Location, check_belongs, ensure_location, read_location
from podium.serving.staged import is_alive, staged_versions
from podium.settings import current_user
from podium.storage.lease import LeaseError, location_lock
from podium.storage.locations import join, normalize_location
from podium.tracking import ledger
from podium.tracking.client import TAG_SERVED_URI
from podium.tracking.registry import alias_owner, alias_taken, alias_target, registered_version_for, version_tags
from podium.tracking.runs import kill_orphan_runs

logger = logging.getLogger(__name__)


def origin(command: str | None = None) -> dict[str, Any]:
    """What started a switch of CURRENT, for its history record: the Prefect flow run (and deployment)
    or the command, and who ran it where."""
    # local: Prefect's runtime loads only when a promotion asks who started it (`podium status` reads this module)
    from prefect.runtime import flow_run

    out: dict[str, Any] = {"user": current_user(), "host": socket.gethostname(), "pid": os.getpid()}
    if command:
        out["command"] = command
    if flow_run.id:
        out.update(flow=flow_run.flow_name, flow_run=flow_run.name, flow_run_id=str(flow_run.id))
        started_by = prefect_api.current_deployment()
        if started_by and started_by[1]:
            out["deployment"] = started_by[1]
    return out


@contextlib.contextmanager
def promotion_lock(serving: str, timeout_s: float = 600.0) -> Iterator[Callable[[], None]]:
    """One promoter at a time per serving location, from decision to alias; yields a `check()`.

    Without it two promoters could each switch CURRENT and move the alias in
    interleaved order, leaving the registry naming another version than serving.
    `<serving>/.promotion.lock`: an flock locally, a lease object on S3
    (`training.lease.location_lock`). `check()` raises if an S3 lease was lost
    (its holder stalled past the TTL and another promoter took it over):
    promotion calls it before every step that others can see.
    """
    locked = False
    try:
        with location_lock(serving, ".promotion.lock", timeout_s, "promotion") as check:
            locked = True
            yield check
    except LeaseError as exc:
        raise layout.ServingError(str(exc)) from None
    except OSError as exc:  # a full disk before anything was written: the lock file takes its holder's name
        if locked or not layout.is_disk_full(exc):
            raise
        raise layout.full_location_error(serving, "its promotion lock", exc) from None


def claim_location(serving: str, tracking_uri: str, registered_model: str, alias: str) -> Location:
    """The serving location's identity, and the registry's alias claimed for it (AliasTaken if another location of
    the model owns it; ServingError if the location belongs to another model or alias)."""
    found = read_location(serving)
    check_belongs(found, registered_model, alias)  # before anything is written when the location is someone else's
    legacy = _legacy_owner(serving, tracking_uri, registered_model, alias) if found is None else None
    location = found or ensure_location(serving, registered_model, alias)
    ledger.claim_alias(tracking_uri, registered_model, alias, location.id, location.uri, legacy)
    return location


def check_location_claim(serving: str, tracking_uri: str, registered_model: str, alias: str) -> None:
    """`claim_location`'s refusals, read-only, for a command to say before it starts anything (the flow claims under
    the promotion lock again, for a run that no command started)."""
    # the owner first, then the location: a promoter racing this command writes the location's file before its
    # claim of the alias, and moves the alias after both, so what is read here is never a half of its first promotion
    owner = alias_owner(tracking_uri, registered_model, alias)
    found = read_location(serving)
    check_belongs(found, registered_model, alias)
    here = normalize_location(serving)
    if owner is not None and owner.get("uri") != here and (found is None or owner.get("id") != found.id):
        raise AliasTaken(alias_taken(registered_model, alias, here, owner.get("uri")))
    if (owner is None and found is None and _legacy_owner(serving, tracking_uri, registered_model, alias) is False
            and read_location(serving) is None):  # (no promoter made the location meanwhile: the alias is another's)
        raise AliasTaken(alias_taken(registered_model, alias, here, None))


def _legacy_owner(serving: str, tracking_uri: str, name: str, alias: str) -> bool | None:
    """Whether the version `alias` names (moved by podium <= 0.3, which recorded no owner) was served from here."""
    version = alias_target(tracking_uri, name, alias)
    if version is None:
        return None
    served = version_tags(tracking_uri, name, version).get(TAG_SERVED_URI, "")
    return served.startswith(normalize_location(serving).rstrip("/") + "/")


def withdraw_candidate(serving: str, tracking_uri: str, name: str, alias: str, version: str, version_uid: str | None,
                       why: str) -> None:
    """Withdraw a staged version: its files (a tombstone keeps its number), then its registry version's tags and the
    challenger alias. In that order: a registry that did not answer leaves nothing served, and the next command
    finishes it."""
    layout.discard_version(join(normalize_location(serving), "versions", version), why)
    if not version_uid:
        return
    # the decision a stop would have recorded (podium.tasks.promote.settle_candidate), once: a version already
    # decided keeps its decision, and loses the challenger alias only
    ledger.withdraw_challenger(tracking_uri, name, version_uid, alias, challenger_alias(alias), withdrawn(why).tags())


def withdraw_orphans(serving: str, tracking_uri: str, name: str, alias: str) -> list[str]:
    """Withdraw every version staged by a process of this host that is gone; returns their numbers. Call it under
    the promotion lock: a version being staged right now is marked before its files are copied."""
    withdrawn = []
    for staged in staged_versions(serving):
        if staged.alive is not False:
            continue
        who = staged.mark
        why = (f"its command (run {who.get('run_name')}, process {who.get('pid')} on {who.get('host')}) ended without "
               "finishing it" if who else "left incomplete by a promoter that stopped")
        withdraw_candidate(serving, tracking_uri, name, alias, staged.version, who.get("version_uid"), why)
        say("serving %s: withdrew %s: %s", serving, staged.version, why)
        if who.get("flow_run_id"):
            end_flow_run(tracking_uri, str(who["flow_run_id"]), f"{staged.version} withdrawn: {why}")
        withdrawn.append(staged.version)
    end_orphan_shadow(serving)
    return withdrawn


def end_orphan_shadow(serving: str) -> str | None:
    """Remove the SHADOW pointer if the process that started it is gone (seen from this host) or its candidate is no
    longer staged; returns the version it named. A shadow another host runs is left alone."""
    pointer = read_shadow(serving)
    if pointer is None:
        return None
    version = str(pointer.get("version"))
    staged = {s.version for s in staged_versions(serving)}
    if version in staged and is_alive(dict(pointer.get("by") or {})) is not False:
        return None
    end_shadow(serving, str(pointer.get("shadow_id")))
    say("serving %s: ended the shadow of %s: its command ended without finishing it", serving, version)
    return version


def end_flow_run(tracking_uri: str, flow_run_id: str, message: str) -> None:
    """End the runs a command that is gone left open: its MLflow run KILLED (the run it trained, if any), and its flow
    run Crashed, if Prefect still shows it paused or running (nothing else would: no process reports for them), each
    saying why. Best effort: Prefect and MLflow mirror, the serving location decides."""
    from prefect.settings import PREFECT_API_URL

    try:
        for run_id in kill_orphan_runs(tracking_uri, flow_run_id, f"its command ended without ending it: {message}"):
            say("MLflow run %s of flow run %s: marked KILLED (its command is gone)", run_id, flow_run_id)
    except TrackingUnavailable as exc:
        logger.warning("the MLflow run of flow run %s not ended: %s", flow_run_id, exc)
    if not PREFECT_API_URL.value():  # no server to tell (Prefect's client would start a temporary one of its own)
        return

    def crash() -> None:
        if prefect_api.flow_run_state(flow_run_id) in ("Paused", "Running", "Suspended"):
            prefect_api.crash_flow_run(flow_run_id, message)

    try:
        crash()
    except Exception as exc:
        logger.warning("flow run %s not ended in Prefect: %s: %s", flow_run_id, type(exc).__name__, exc)


def sync_alias(serving: str, tracking_uri: str, name: str, alias: str) -> str | None:
    """Move `alias` to the registered version of the current serving version if it names another; returns that
    version (None: nothing current, or the current version was never registered)."""
    current = layout.read_current(serving)
    if current is None:
        return None
    version = registered_version_for(tracking_uri, name, current.manifest.get("version_uid"), current.uri)
    if version is None:
        logger.warning("no registered version of %s is serving version %s: alias %s not moved", name,
                       current.version, alias)
        return None
    if ledger.align_alias(tracking_uri, name, alias, version):
        say("registry: moved @%s of %s to version %s (serving %s at %s)", alias, name, version, current.version,
            serving)
    return version


def disagreements(serving: str, tracking_uri: str, name: str, alias: str) -> list[str]:
    """What the registry says that the serving location does not (read-only; empty when they agree)."""
    out = []
    current = layout.read_current(serving)
    target = alias_target(tracking_uri, name, alias)
    if current is not None:
        version = registered_version_for(tracking_uri, name, current.manifest.get("version_uid"), current.uri)
        if version is None:
            out.append(f"serving {current.version} has no registered version of {name!r}")
        elif target != version:
            out.append(f"@{alias} names version {target} of {name!r}, but serving {current.version} is version "
                       f"{version}; the next promote or rollback moves it")
    elif target is not None:
        out.append(f"@{alias} names version {target} of {name!r}, but nothing is served at {serving}")
    stale = [s.version for s in staged_versions(serving) if s.alive is False]
    shadow = read_shadow(serving)
    if shadow is not None and is_alive(dict(shadow.get("by") or {})) is False:
        out.append(f"{serving}/SHADOW names {shadow.get('version')}, put in shadow by a command that is gone; the next "
                   "promote or rollback removes it")
    watch = read_watch(serving)
    if watch is not None and is_alive(watch.by) is False:
        out.append(f"{serving}/WATCH names {watch.watched.version}, watched by a command that is gone; the next promote "
                   "or rollback settles its watch")
    if stale:
        out.append(f"{', '.join(stale)} staged by a command that is gone; the next promote or rollback withdraws it")
    return out


@dataclass(frozen=True)
class SwitchedBack:
    """What `switch_back` did: from which version to which, the one withdrawn, and the alias's registered version."""

    from_version: str
    to_version: str
    withdrawn: str | None
    switched: bool
    mlflow_version: str | None


def switch_back(serving: str, tracking_uri: str, name: str, alias: str, still_locked: Callable[[], None],
                to_version: str | None, reason: str | None, origin: dict[str, Any]) -> SwitchedBack:
    """A rollback's switch, under the promotion lock (`podium.tasks.rollback.roll_back` holds it): CURRENT back to
    the previous champion of the history (or `to_version`), the version left withdrawn, the registry made to
    follow (`sync_registry`). `origin`: what started it, for the history record."""
    current = layout.read_current(serving)
    if current is None:
        raise ServingError(f"nothing has been promoted to {serving!r}: nothing to roll back")
    try:
        target_name, withdraws = rollback_target(layout.read_lineage(serving), current.version, to_version, serving)
    except HistoryError as exc:
        raise ServingError(str(exc)) from None
    target = layout.read_version(serving, target_name)
    if target is None:
        raise ServingError(f"{serving}: version {target_name!r} does not exist or is incomplete")
    switched = target.version != current.version
    if switched:
        still_locked()
        why = f"rollback from {current.version}" + (f": {reason}" if reason else "")
        layout.switch_current(serving, target, why, action="rollback", withdrawn=withdraws, origin=origin)
    mlflow_version = sync_registry(serving, tracking_uri, name, alias)
    return SwitchedBack(current.version, target.version, withdraws, switched, mlflow_version)


def sync_registry(serving: str, tracking_uri: str, registered_model: str, alias: str) -> str | None:
    """Make the registry say what the serving history says: the alias names the current version, every
    withdrawn version is tagged `podium.withdrawn` (its model version and its checkpoint's record), the
    current one is not. Idempotent; returns the registry version the alias names (None: not registered)."""
    current = layout.read_current(serving)
    if current is None:
        return None
    lineage = layout.read_lineage(serving)
    for version_name, switch in lineage.withdrawn.items():
        withdrawn_version = layout.read_version(serving, version_name)
        if withdrawn_version is None:
            continue
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(switch.at))
        ledger.withdraw(tracking_uri, registered_model, withdrawn_version.manifest.get("version_uid"),
                        withdrawn_version.uri, withdrawn_version.manifest.get("model_id"),
                        f"withdrawn from {serving} ({version_name}) on {when}: {switch.reason}")
    ledger.reinstate(tracking_uri, registered_model, current.manifest.get("version_uid"), current.uri,
                     current.manifest.get("model_id"))
    return sync_alias(serving, tracking_uri, registered_model, alias)
