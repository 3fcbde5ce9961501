"""The champion ledger: the one module that writes what MLflow's registry holds about serving.

The serving location's history is the record of decisions (podium.serving.layout); the registry mirrors it, and
every write of that mirror is here, named for what it records:

| verb                   | what the registry then says                                                            |
|------------------------|----------------------------------------------------------------------------------------|
| `claim_alias`          | the alias belongs to one serving location (tag `podium.location.<alias>` of the model)   |
| `promote_version`      | a new version, registered with its own files, under the promotion's alias              |
| `await_decision`       | a new version under the `challenger` alias, tagged `podium.approval = pending`         |
| `settle_challenger`    | the decision on it (tags), the alias moved to it if it was promoted, `challenger` gone  |
| `withdraw_challenger`  | a candidate whose command is gone: `podium.approval = withdrawn`, `challenger` gone     |
| `align_alias`          | the alias moved back in line with what serves (a command stopped before it moved it)   |
| `withdraw` / `reinstate` | a version a rollback left is tagged `podium.withdrawn` (and its LoggedModel), or not   |
| `record_watch`         | the watch after a version's switch: `podium.watch` (passed, rolled-back...), why, numbers |

Who moves @champion (or any alias)? `move_alias`, here, and nothing else: each verb above that moves an alias
(`promote_version`, `await_decision`, `settle_challenger`, `align_alias`) goes through it. Nothing else in podium
calls MlflowClient's registry writes (tests/unit/test_ledger.py reads the package to check both). Reads live in
podium.tracking.registry. The names of what it writes are beside it (`TAG_APPROVAL`, `TAG_DECISION`, `TAG_SHADOW`,
`TAG_WATCH`, ...; the ones the reads share, `TAG_LOCATION_OF` and `TAG_VERSION_UID`, in podium.tracking.registry),
and a live check's outcome becomes tags in one way (`live_tags`: the shadow's and the watch's alike).

A registered version's files are the bytes its serving version serves: each promotion's built model is logged
into the checkpoint's LoggedModel at a path of its own (`served/<vN>-<uid>`, podium.tracking.models) and the
version's source names that path, so a checkpoint promoted twice has two versions with two sets of files, and
`models:/<model>@<alias>` downloads what CURRENT serves (docs/serving.md).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from podium.core.live import ShadowVerdict, WatchVerdict
from podium.core.records import CheckpointRecord
from podium.errors import AliasTaken
from podium.outages import is_unreachable
from podium.tracking.client import TAG_SERVED_URI, TAG_WITHDRAWN, TrackingRun, tracking_call, tracking_client
from podium.tracking.registry import (
    TAG_LOCATION_OF,
    TAG_VERSION_UID,
    alias_taken,
    alias_target,
    location_of,
    registered_version_for,
    versions_tagged,
    with_uid,
)

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

logger = logging.getLogger(__name__)

TAG_APPROVAL = "podium.approval"  # a candidate's decision: pending, approved, rejected, withdrawn, discarded, ...
TAG_DECIDED = "podium.approval.decided"  # a discarded candidate: what was decided on it before it was discarded
TAG_DISCARDED = "podium.discarded"  # a candidate decided on but never served: why
TAG_PROMOTED = "podium.promoted"  # on a LoggedModel: a version of it was promoted
TAG_DECISION = "podium.decision"  # a candidate's decision, in words
TAG_SHADOW = "podium.shadow"  # a candidate's shadow: passed, refused or stopped; `.reason`, its numbers
TAG_WATCH = "podium.watch"  # a champion's watch: passed, rolled-back, stopped or ended; `.reason`, its numbers
PENDING, DISCARDED = "pending", "discarded"


def version_source(tr: TrackingRun, model_id: str, files_path: str | None) -> str:
    """Where a registered version of this LoggedModel points: its promotion's own files, at `files_path` inside the
    LoggedModel's artifacts (None: a serving version of podium <= 0.4, whose files were the LoggedModel's root).

    Inside the LoggedModel, so that MLflow links the version to it (a tracking server accepts a version's source
    with a `model_id` only within that model's artifact location: mlflow 3.17's `_validate_source_model`). The
    artifact location itself, not `models:/<model_id>`: that URI names the root only, and a direct database store
    (sqlite:, postgresql:) resolves it with the process-wide tracking URI, not the client's (mlflow 3.17's
    SqlAlchemyStore.create_model_version)."""
    if files_path is None and tr.tracking_uri.startswith(("http://", "https://")):
        return f"models:/{model_id}"
    root = tr.client().get_logged_model(model_id).artifact_location
    return f"{root.rstrip('/')}/{files_path}" if files_path else root


@tracking_call("registering the champion")
def promote_version(tr: TrackingRun, record: CheckpointRecord, served_uri: str, name: str, alias: str,
                    tags: dict[str, str], version_uid: str, description: str = "",
                    files_path: str | None = None) -> str:
    """Register a promoted serving version as a new version of `name` (its source: the files its promotion logged
    at `files_path` in the checkpoint's LoggedModel; without a LoggedModel, the served copy itself), tagged with its
    serving version's identity (`version_uid`), and move `alias` to it; its LoggedModel is tagged promoted.
    Returns the version."""
    return _register(tr, record, served_uri, name, alias, tags, version_uid, description, files_path, promoted=True)


@tracking_call("registering the candidate")
def await_decision(tr: TrackingRun, record: CheckpointRecord, served_uri: str, name: str, challenger: str,
                   tags: dict[str, str], version_uid: str, description: str = "",
                   files_path: str | None = None) -> str:
    """Register a staged candidate as `promote_version` does, under the `challenger` alias and tagged
    `podium.approval = pending`: the promotion's alias stays where it is until a decision (`settle_challenger`)."""
    return _register(tr, record, served_uri, name, challenger, {**tags, TAG_APPROVAL: PENDING}, version_uid,
                     description, files_path, promoted=False)


def _register(tr: TrackingRun, record: CheckpointRecord, served_uri: str, name: str, alias: str,
              tags: dict[str, str], version_uid: str, description: str, files_path: str | None,
              promoted: bool) -> str:
    client = tr.client()
    _ensure_registered_model(client, name)
    tags = {**tags, TAG_SERVED_URI: served_uri, TAG_VERSION_UID: version_uid}
    description = description or f"{tr.run_name} step {record.step}"
    if record.model_id:
        mv = client.create_model_version(name, source=version_source(tr, record.model_id, files_path),
                                         run_id=tr.run_id, model_id=record.model_id, tags=tags,
                                         description=description)
    else:
        mv = client.create_model_version(name, source=served_uri, run_id=tr.run_id, tags=tags,
                                         description=description)
    version = _one_version(client, name, version_uid, str(mv.version))
    move_alias(client, name, alias, version)
    if record.model_id:
        # the LoggedModel lists the versions made from it (as mlflow.register_model does): appended, once
        model = client.get_logged_model(record.model_id)
        listed = json.loads((model.tags or {}).get("mlflow.modelVersions") or "[]")
        entry = {"name": name, "version": version}
        client.set_logged_model_tags(record.model_id, {
            "mlflow.modelVersions": json.dumps(listed if entry in listed else [*listed, entry]),
            **({TAG_PROMOTED: "true"} if promoted else {})})
    return version


@tracking_call("recording the decision on the challenger")
def settle_challenger(tracking_uri: str, name: str, version: str, alias: str, challenger: str, model_id: str | None,
                      promoted: bool, tags: dict[str, str], discarded: str | None = None) -> None:
    """A decision on the version under the location's `challenger` alias: its tags (who, when, why), the
    promotion's `alias` moved to it if it was `promoted` (its LoggedModel tagged promoted), and `challenger` removed
    if it still names it.

    `discarded`: why a candidate that was decided on never served (approved, but the champion changed while it
    waited, or its switch failed): `podium.approval` then says `discarded`, `podium.approval.decided` what the
    decision was, `podium.discarded` why; the decision's other tags (who, when, how) stay."""
    client = tracking_client(tracking_uri)
    if discarded is not None:
        tags = {**tags, TAG_APPROVAL: DISCARDED, TAG_DECIDED: tags.get(TAG_APPROVAL, ""),
                TAG_DISCARDED: discarded[:5000]}
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    if promoted:
        move_alias(client, name, alias, version)
        if model_id:
            client.set_logged_model_tags(model_id, {TAG_PROMOTED: "true"})
    mv = client.get_model_version(name, version)
    verdict = ("approved, promoted by podium" if promoted
               else f"{DISCARDED} ({tags.get(TAG_DECIDED)})" if discarded is not None
               else tags.get(TAG_APPROVAL, "rejected"))
    client.update_model_version(name, version, description=(mv.description or "").replace(
        f"awaiting approval (alias {challenger})", verdict))
    if alias_target(tracking_uri, name, challenger) == version:
        move_alias(client, name, challenger, None)


@tracking_call("withdrawing the candidate")
def withdraw_challenger(tracking_uri: str, name: str, version_uid: str, alias: str, challenger: str,
                        decision: dict[str, str]) -> None:
    """The registered version(s) of a withdrawn candidate (its serving version `version_uid`): the `decision` a stop
    would have recorded, once (a version already decided keeps its decision), and the `challenger` alias off it."""
    for registered, tags in versions_tagged(tracking_uri, name, TAG_VERSION_UID, version_uid).items():
        settle_challenger(tracking_uri, name, registered, alias, challenger, None, False,
                          decision if tags.get(TAG_APPROVAL) == PENDING else {})


def move_alias(client: MlflowClient, name: str, alias: str, version: str | None) -> None:
    """Point `alias` of `name` at `version` (None: remove it). The one place in podium that moves a registry alias:
    the verbs of this module call it, each for what it records."""
    if version is None:
        client.delete_registered_model_alias(name, alias)
    else:
        client.set_registered_model_alias(name, alias, version)


@tracking_call("moving the registry alias")
def align_alias(tracking_uri: str, name: str, alias: str, version: str) -> bool:
    """Move `alias` to `version`, the registered version of what serves, if it names another (a promotion stopped
    between its switch and its alias, a rollback); returns whether it moved."""
    if alias_target(tracking_uri, name, alias) == version:
        return False
    move_alias(tracking_client(tracking_uri), name, alias, version)
    return True


@tracking_call("claiming the registry alias for the serving location")
def claim_alias(tracking_uri: str, name: str, alias: str, location_id: str, location_uri: str,
                   legacy_owner: bool | None = None) -> None:
    """Make `alias` of `name` belong to one serving location: the registered model's tag `podium.location.<alias>`
    holds the location's id (short, as the registry's page shows it); AliasTaken, saying which location has it, if
    another one does. An alias a podium <= 0.3 moved carries no such tag: `legacy_owner` says whether the version it
    names was served from this location (None: it names none, or no version)."""
    client = tracking_client(tracking_uri)
    _ensure_registered_model(client, name)
    owner = dict(client.get_registered_model(name).tags or {}).get(TAG_LOCATION_OF + alias)
    if owner and owner != location_id:
        where = location_of(tracking_uri, name, owner)
        if where != location_uri:  # (a location made anew where the owner was is its own)
            raise AliasTaken(alias_taken(name, alias, location_uri, where))
    if not owner and legacy_owner is False:
        raise AliasTaken(alias_taken(name, alias, location_uri, None))
    if owner != location_id:
        client.set_registered_model_tag(name, TAG_LOCATION_OF + alias, location_id)


@tracking_call("marking a withdrawn champion")
def withdraw(tracking_uri: str, name: str, version_uid: str | None, served_uri: str, model_id: str | None,
             note: str) -> None:
    """Tag a served version's registered model version and its checkpoint's LoggedModel `podium.withdrawn` with
    `note` (a rollback withdrew it). A record that is not there (never registered, deleted) is skipped: the serving
    history stays the source of truth."""
    _mark_withdrawn(tracking_uri, name, version_uid, served_uri, model_id, note)


@tracking_call("marking a champion served again")
def reinstate(tracking_uri: str, name: str, version_uid: str | None, served_uri: str, model_id: str | None) -> None:
    """Remove `withdraw`'s tags from a version that serves again (the current one, after a rollback to it)."""
    _mark_withdrawn(tracking_uri, name, version_uid, served_uri, model_id, None)


def live_tags(tag: str, word: str, reason: str, numbers: Mapping[str, Any]) -> dict[str, str]:
    """A live check's outcome as registry tags: `<tag>` (its word), `<tag>.reason`, and `<tag>.<number>` each (an
    empty value for none): the shadow's (`TAG_SHADOW`) and the watch's (`TAG_WATCH`) alike."""
    return {tag: str(word), f"{tag}.reason": reason[:5000],
            **{f"{tag}.{k}": "" if v is None else repr(v) for k, v in numbers.items()}}


def shadow_tags(verdict: ShadowVerdict | None) -> dict[str, str]:
    """A shadow's verdict as registry tags (`podium.shadow`, `.requests`, `.error_rate`, ...), for the decision on
    its candidate (`settle_challenger`): none without one."""
    if verdict is None:
        return {}
    n = verdict.numbers
    return live_tags(TAG_SHADOW, verdict.outcome, verdict.reason, {
        "requests": n.requests, "errors": n.errors, "error_rate": n.error_rate, "agreement": n.agreement,
        "latency_p95_ratio": n.latency_p95_ratio, "champion_p95_s": n.champion_p95_s,
        "candidate_p95_s": n.candidate_p95_s})


@tracking_call("recording the watch of the champion")
def record_watch(tracking_uri: str, name: str, version_uid: str | None, served_uri: str, outcome: str,
                 verdict: WatchVerdict) -> None:
    """Tag the registered version of a watched serving version with its watch's outcome (`podium.watch`: passed,
    rolled-back, stopped or ended, `podium.watch.reason`, its numbers). A version never registered is skipped: the serving
    history stays the source of truth."""
    version = registered_version_for(tracking_uri, name, version_uid, served_uri)
    if version is None:
        return
    client = tracking_client(tracking_uri)
    for key, value in live_tags(TAG_WATCH, outcome, verdict.reason, verdict.numbers.as_dict()).items():
        client.set_model_version_tag(name, version, key, value)


def _mark_withdrawn(tracking_uri: str, name: str, version_uid: str | None, served_uri: str, model_id: str | None,
                    note: str | None) -> None:
    from mlflow.exceptions import MlflowException

    client = tracking_client(tracking_uri)
    version = registered_version_for(tracking_uri, name, version_uid, served_uri)
    if version is not None:
        if note is None:
            client.delete_model_version_tag(name, version, TAG_WITHDRAWN)
        else:
            client.set_model_version_tag(name, version, TAG_WITHDRAWN, note)
    if not model_id:
        return
    try:
        tags = client.get_logged_model(model_id).tags or {}
    except MlflowException as exc:
        if is_unreachable(exc):
            raise
        return
    if note is not None:
        client.set_logged_model_tags(model_id, {TAG_WITHDRAWN: note})
    elif TAG_WITHDRAWN in tags:
        client.delete_logged_model_tag(model_id, TAG_WITHDRAWN)


def _ensure_registered_model(client: MlflowClient, name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name, description="Champions promoted by podium.")
    except MlflowException as exc:
        if "already exists" not in str(exc).lower() and "RESOURCE_ALREADY_EXISTS" not in str(exc):
            raise


def _one_version(client: MlflowClient, name: str, version_uid: str, created: str) -> str:
    """The one version of `name` for this serving version: the first. Others, left by a create the HTTP client
    retried after a timeout although the server had taken it, are deleted."""
    same = sorted(int(v.version) for v in client.search_model_versions(with_uid(name, version_uid))
                  if (v.tags or {}).get(TAG_VERSION_UID) == version_uid)
    for extra in same[1:]:
        logger.warning("%s: deleting duplicate model version %s of serving version %s (a retried create)", name,
                       extra, version_uid)
        client.delete_model_version(name, str(extra))
    return str(same[0]) if same else created
