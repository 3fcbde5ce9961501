"""One truth for what is served: the serving location's history is the record of decisions; the registry's
aliases and tags are derived from it, checked against it and repaired where a command was cut short.

Every command that changes what a location serves (`podium run`, `promote`, `rollback`, the decisions on a
candidate) starts here, under the location's promotion lock:

- `claim_location`: the location's identity (`LOCATION.json`: its registered model and alias) and the
  registry's record that the alias belongs to it; a second location of a model asking for the same alias is
  refused, so that neither moves the other's.
- `withdraw_orphans`: a version staged by a process that is gone (a promoter or a candidate awaiting approval
  or in shadow, killed with SIGKILL) is withdrawn: its files go (its number stays taken), its registered version
  is tagged `podium.approval = withdrawn` and the challenger alias leaves it; a SHADOW pointer its process left
  is removed (`podium serve` stops mirroring to it).
- `sync_alias`: the alias names the registered version made for the current serving version (matched by the
  manifest's `version_uid`), moved there if a command stopped between the switch and the alias.

`disagreements` is the read-only check `podium status` reports.
"""

from __future__ import annotations

import logging

from podium import prefect_api
from podium.core.approval import challenger_alias, withdrawn
from podium.errors import AliasTaken
from podium.progress import say
from podium.serving import layout
from podium.serving.location import Location, check_belongs, ensure_location, read_location
from podium.serving.shadow import end_shadow, read_shadow
from podium.serving.staged import is_alive, staged_versions
from podium.storage.locations import join, normalize_location
from podium.tracking import ledger
from podium.tracking.client import TAG_SERVED_URI
from podium.tracking.registry import alias_owner, alias_taken, alias_target, registered_version_for, version_tags

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
            _end_flow_run(str(who["flow_run_id"]), f"{staged.version} withdrawn: {why}")
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


def _end_flow_run(flow_run_id: str, message: str) -> None:
    """End the flow run of a command that is gone as Crashed, if Prefect still shows it paused or running (nothing
    else would: no process reports for it). Best effort: Prefect mirrors, the serving location decides."""
    from prefect.settings import PREFECT_API_URL

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
    if alias_target(tracking_uri, name, alias) != version:
        ledger.repair_alias(tracking_uri, name, alias, version)
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
    if stale:
        out.append(f"{', '.join(stale)} staged by a command that is gone; the next promote or rollback withdraws it")
    return out
