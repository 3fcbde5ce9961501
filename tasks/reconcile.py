"""One truth for what is served: the serving location's history is the record of decisions; the registry's
aliases and tags are derived from it, checked against it and repaired where a command was cut short.

Every command that changes what a location serves (`podium run`, `promote`, `rollback`, the decisions on a
candidate) starts here, under the location's promotion lock (`finish_cut_short` does the first three in order):

- `claim_location`: the location's identity (`LOCATION.json`: its registered model and alias) and the
  registry's record that the alias belongs to it; a second location of a model asking for the same alias is
  refused, so that neither moves the other's.
- `withdraw_orphans`: a version staged by a process that is gone (a promoter or a candidate awaiting approval
  or in shadow, killed with SIGKILL) is withdrawn: its files go (its number stays taken), its registered version
  is tagged `podium.approval = withdrawn` and the challenger alias leaves it; a SHADOW pointer its process left
  is removed (`podium serve` stops mirroring to it).
- `sync_alias`: the alias names the registered version made for the current serving version (matched by the
  manifest's `version_uid`), moved there if a command stopped between the switch and the alias.
- `settle_orphan_watch`: a watch after a switch (`[promotion.watch]`) whose promoter is gone is settled on the
  numbers the replicas wrote by then: a limit broken rolls the new champion back (`switch_back`), else it is
  final (`settle_watch`, which the promotion that watches calls too).

`disagreements` is the read-only check `podium status` reports.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from podium import prefect_api
from podium.core.approval import challenger_alias, withdrawn
from podium.core.watch import BROKE, Watched, WatchVerdict, aggregate_watch, decide_watch
from podium.errors import AliasTaken, HistoryError, ServingError, TrackingUnavailable
from podium.prefect_events import EVENT_ROLLED_BACK, emit_news, model_resource, news_related
from podium.progress import say
from podium.serving import layout
from podium.serving.history import rollback_target
from podium.serving.location import Location, check_belongs, ensure_location, read_location
from podium.serving.shadow import end_shadow, read_shadow
from podium.serving.staged import is_alive, staged_versions
from podium.serving.watch import end_watch, read_watch, read_watch_tallies
from podium.settings import current_user
from podium.storage.locations import join, normalize_location
from podium.tracking import ledger
from podium.tracking.client import TAG_SERVED_URI
from podium.tracking.registry import alias_owner, alias_taken, alias_target, registered_version_for, version_tags
from podium.tracking.runs import kill_orphan_runs

logger = logging.getLogger(__name__)


def claim_location(serving: str, tracking_uri: str, registered_model: str, alias: str) -> Location:
    """The serving location's identity, and the registry's alias claimed for it (AliasTaken if another location of
    the model owns it; ServingError if the location belongs to another model or alias)."""
    found = read_location(serving)
    check_belongs(found, registered_model, alias)  # before anything is written when the location is someone else's
    legacy = _legacy_owner(serving, tracking_uri, registered_model, alias) if found is None else None
    location = found or ensure_location(serving, registered_model, alias)
    ledger.claim_alias(tracking_uri, registered_model, alias, location.id, location.uri, legacy)
    return location


def finish_cut_short(serving: str, tracking_uri: str, registered_model: str, alias: str,
                     alias_too: bool = True) -> Location:
    """What a command cut short, finished before anything is read or decided from the location (call it under the
    promotion lock): the location claimed, orphans withdrawn (a shadow ended, a watch settled), and the alias moved
    to what serves (`alias_too`: False for a rollback, whose `switch_back` brings the whole registry in line)."""
    location = claim_location(serving, tracking_uri, registered_model, alias)
    withdraw_orphans(serving, tracking_uri, registered_model, alias)
    if alias_too:
        sync_alias(serving, tracking_uri, registered_model, alias)
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
            _end_flow_run(tracking_uri, str(who["flow_run_id"]), f"{staged.version} withdrawn: {why}")
        withdrawn.append(staged.version)
    end_orphan_shadow(serving)
    settle_orphan_watch(serving, tracking_uri, name, alias)
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


def _end_flow_run(tracking_uri: str, flow_run_id: str, message: str) -> None:
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
    if watch is not None and is_alive(dict(watch.get("by") or {})) is False:
        out.append(f"{serving}/WATCH names {watch.get('version')}, watched by a command that is gone; the next promote "
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


def settle_watch(serving: str, tracking_uri: str, name: str, alias: str, watched: Watched,
                 verdict: WatchVerdict, still_locked: Callable[[], None], origin: dict[str, Any]) -> str:
    """Carry out a watch's verdict, under the promotion lock: a limit broken rolls the watched version back to the
    champion it replaced (the history record says why), if it still serves; then its registered version is tagged
    with the outcome (`podium.watch`: rolled-back, passed, or ended when the champion changed meanwhile), the
    WATCH pointer goes, and a rollback is announced (`podium.serving.rolled-back`, the verdict in its payload).
    Returns the outcome's word."""
    version, previous = watched.version, watched.previous
    current = (layout.read_pointer(serving) or {}).get("version")
    outcome = "passed"
    back = None
    if current != version:
        outcome = "ended"  # a rollback or a promotion meanwhile: the watched champion no longer serves
    elif verdict.state == BROKE:
        back = switch_back(serving, tracking_uri, name, alias, still_locked, previous, verdict.reason,
                           {**origin, "watch": verdict.as_dict()})
        outcome = "rolled-back"
    watched = layout.read_version(serving, version)
    if watched is not None:
        numbers = verdict.numbers.as_dict()
        ledger.record_watch(tracking_uri, name, watched.manifest.get("version_uid"), watched.uri,
                            {"podium.watch": outcome, "podium.watch.reason": verdict.reason[:5000],
                             **{f"podium.watch.{k}": "" if v is None else repr(v) for k, v in numbers.items()}})
    end_watch(serving, watched.watch_id)
    if back is not None and back.switched:
        model = watched.model or name
        emit_news(EVENT_ROLLED_BACK, model_resource(model), news_related(None, None, None, back.mlflow_version, name),
                  {"model": model, "registered_model": name, "from_version": back.from_version,
                   "to_version": back.to_version, "mlflow_version": back.mlflow_version, "withdrawn": back.withdrawn,
                   "reason": verdict.reason, "watch": verdict.as_dict()})
    return outcome


def settle_orphan_watch(serving: str, tracking_uri: str, name: str, alias: str) -> str | None:
    """Settle a watch whose promoter is gone (seen from this host), on the numbers the replicas wrote by then: a
    limit broken rolls the watched champion back, else it is final (`settle_watch`); the promoter's flow run ends
    saying so. Returns the outcome's word; None when no watch was left. Call it under the promotion lock."""
    pointer = read_watch(serving)
    if pointer is None or is_alive(dict(pointer.get("by") or {})) is not False:
        return None
    watched = Watched.from_pointer(pointer)
    numbers = aggregate_watch(read_watch_tallies(serving, watched.watch_id))
    verdict = decide_watch(numbers, watched.limits, over=True)
    cut = "its promoter ended during its watch, settled by the next command: "
    verdict = WatchVerdict(verdict.state, cut + verdict.reason, verdict.numbers, verdict.failed)
    origin = {"user": current_user(), "host": socket.gethostname(), "pid": os.getpid(),
              "command": "settled a watch its promoter left"}
    outcome = settle_watch(serving, tracking_uri, name, alias, watched, verdict, lambda: None, origin)
    version = watched.version
    said = (f"rolled back {version} to {watched.previous}: {verdict.reason}" if outcome == "rolled-back"
            else f"{version}: {verdict.reason}" if outcome == "passed"
            else f"ended the watch of {version}: it no longer serves")
    say("serving %s: %s", serving, said)
    flow_run_id = dict(pointer.get("by") or {}).get("flow_run_id")
    if flow_run_id:
        _end_flow_run(tracking_uri, str(flow_run_id), said)
    return outcome
