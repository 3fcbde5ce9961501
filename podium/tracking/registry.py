"""The model registry: a version per promotion, the alias serving systems follow."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from podium.core.records import CheckpointRecord
from podium.errors import AliasTaken
from podium.outages import is_unreachable
from podium.tracking.client import (
    TAG_SERVED_URI,
    TAG_WITHDRAWN,
    TrackingRun,
    tracking_call,
    tracking_client,
)

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

logger = logging.getLogger(__name__)

TAG_VERSION_UID = "podium.version_uid"  # a registered version's serving version, by the manifest's identity
TAG_LOCATION_OF = "podium.location."  # + alias: on the registered model, the id of the serving location owning it
TAG_LOCATION_ID = "podium.location_id"  # a registered version's serving location (its LOCATION.json id)


def version_source(tr: TrackingRun, model_id: str) -> str:
    """Where a registered version of this LoggedModel points.

    MLflow's own convention is `models:/<model_id>`, which links the version to the LoggedModel.
    A direct database store (sqlite:, postgresql:) resolves that URI with the process-wide tracking
    URI, not the client's (mlflow 3.17's SqlAlchemyStore.create_model_version), so there the version
    names the LoggedModel's artifact location itself; a tracking server resolves it on its side."""
    if tr.tracking_uri.startswith(("http://", "https://")):
        return f"models:/{model_id}"
    return tr.client().get_logged_model(model_id).artifact_location


@tracking_call("registering the champion")
def register_champion(tr: TrackingRun, record: CheckpointRecord, served_uri: str, name: str, alias: str,
                      tags: dict[str, str], version_uid: str, description: str = "", promoted: bool = True) -> str:
    """Register the champion's LoggedModel (its artifacts are the served model) as a new version of
    `name`, tagged with its serving version's identity (`version_uid`), and move `alias` to it; returns the
    version. `promoted` False: a candidate awaiting a decision (its LoggedModel is not tagged promoted yet)."""
    client = tr.client()
    _ensure_registered_model(client, name)
    tags = {**tags, TAG_SERVED_URI: served_uri, TAG_VERSION_UID: version_uid}
    description = description or f"{tr.run_name} step {record.step}"
    if record.model_id:
        mv = client.create_model_version(name, source=version_source(tr, record.model_id), run_id=tr.run_id,
                                         model_id=record.model_id, tags=tags, description=description)
    else:
        mv = client.create_model_version(name, source=served_uri, run_id=tr.run_id, tags=tags,
                                         description=description)
    version = _one_version(client, name, version_uid, str(mv.version))
    client.set_registered_model_alias(name, alias, version)
    if record.model_id:
        # the LoggedModel lists the versions made from it (as mlflow.register_model does): appended
        model = client.get_logged_model(record.model_id)
        listed = json.loads((model.tags or {}).get("mlflow.modelVersions") or "[]")
        client.set_logged_model_tags(record.model_id, {
            "mlflow.modelVersions": json.dumps([*listed, {"name": name, "version": version}]),
            **({"podium.promoted": "true"} if promoted else {})})
    return version


@tracking_call("recording the decision on the challenger")
def settle_challenger(tracking_uri: str, name: str, version: str, alias: str, challenger: str, model_id: str | None,
                      approved: bool, tags: dict[str, str]) -> None:
    """A decision on the version under the location's `challenger` alias: its tags (who, when, why), the
    promotion's `alias` moved to it if `approved` (its LoggedModel tagged promoted), and `challenger` removed if it
    still names it."""
    client = tracking_client(tracking_uri)
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    if approved:
        client.set_registered_model_alias(name, alias, version)
        if model_id:
            client.set_logged_model_tags(model_id, {"podium.promoted": "true"})
    mv = client.get_model_version(name, version)
    verdict = "approved, promoted by podium" if approved else tags.get("podium.approval", "rejected")
    client.update_model_version(name, version, description=(mv.description or "").replace(
        f"awaiting approval (alias {challenger})", verdict))
    if alias_target(tracking_uri, name, challenger) == version:
        client.delete_registered_model_alias(name, challenger)


def _ensure_registered_model(client: MlflowClient, name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name, description="Champions promoted by podium.")
    except MlflowException as exc:
        if "already exists" not in str(exc).lower() and "RESOURCE_ALREADY_EXISTS" not in str(exc):
            raise


def _with_uid(name: str, version_uid: str) -> str:
    """A search for the versions of `name` made for one serving version (a uid is hex: no quoting to do)."""
    return f"name = '{name}' AND tags.`{TAG_VERSION_UID}` = '{version_uid}'"


def _one_version(client: MlflowClient, name: str, version_uid: str, created: str) -> str:
    """The one version of `name` for this serving version: the first. Others, left by a create the HTTP client
    retried after a timeout although the server had taken it, are deleted."""
    same = sorted(int(v.version) for v in client.search_model_versions(_with_uid(name, version_uid))
                  if (v.tags or {}).get(TAG_VERSION_UID) == version_uid)
    for extra in same[1:]:
        logger.warning("%s: deleting duplicate model version %s of serving version %s (a retried create)", name,
                       extra, version_uid)
        client.delete_model_version(name, str(extra))
    return str(same[0]) if same else created


@tracking_call("reading the model registry")
def registered_version_for(tracking_uri: str, name: str, version_uid: str | None, served_uri: str) -> str | None:
    """The registered model version made for one serving version: the one tagged with its `version_uid`. A
    serving version of podium <= 0.3 has none: then the version whose source is its served copy (those versions
    were registered once per number, which podium <= 0.3 could reuse: the newest)."""
    from mlflow.exceptions import MlflowException

    client = tracking_client(tracking_uri)
    try:
        if version_uid:
            versions = client.search_model_versions(_with_uid(name, version_uid))
        else:
            versions = client.search_model_versions(f"name = '{name}'")
    except MlflowException as exc:
        if is_unreachable(exc):  # "not registered" must not be concluded from a server that did not answer
            raise
        return None
    if version_uid:
        matches = sorted(int(v.version) for v in versions if (v.tags or {}).get(TAG_VERSION_UID) == version_uid)
        return str(matches[0]) if matches else None
    matches = sorted((int(v.version) for v in versions if not (v.tags or {}).get(TAG_VERSION_UID) and (
        v.source == served_uri or (v.tags or {}).get(TAG_SERVED_URI) == served_uri)), reverse=True)
    return str(matches[0]) if matches else None


@tracking_call("reading the model registry")
def version_tags(tracking_uri: str, name: str, version: str) -> dict[str, str]:
    """The tags of one registered version ({} if it is not there)."""
    from mlflow.exceptions import MlflowException

    try:
        return dict(tracking_client(tracking_uri).get_model_version(name, version).tags or {})
    except MlflowException as exc:
        if is_unreachable(exc):
            raise
        return {}


@tracking_call("reading the model registry")
def versions_tagged(tracking_uri: str, name: str, key: str, value: str) -> dict[str, dict[str, str]]:
    """The registered versions of `name` with tag `key` = `value` (value: letters, digits, '_', '-'), with their
    tags."""
    from mlflow.exceptions import MlflowException

    try:
        found = tracking_client(tracking_uri).search_model_versions(f"name = '{name}' AND tags.`{key}` = '{value}'")
    except MlflowException as exc:
        if is_unreachable(exc):
            raise
        return {}
    return {str(v.version): dict(v.tags) for v in found if (v.tags or {}).get(key) == value}


def alias_taken(name: str, alias: str, location_uri: str, owner_uri: str | None) -> str:
    """The sentence that refuses a second serving location the alias of another."""
    owner = f"follows serving location {owner_uri}" if owner_uri else "names a version served from another location"
    return (f"alias @{alias} of registered model {name!r} {owner}; serving location {location_uri} needs an alias "
            "of its own (--alias NAME, or promotion.alias), so that neither moves the other's")


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


@tracking_call("reading the model registry")
def alias_owner(tracking_uri: str, name: str, alias: str) -> dict[str, str | None] | None:
    """The serving location that owns `alias` of `name` ({"id", "uri"}: its uri None until it registered a version),
    or None (no owner recorded, or no model)."""
    from mlflow.exceptions import MlflowException

    try:
        owner = dict(tracking_client(tracking_uri).get_registered_model(name).tags or {}).get(TAG_LOCATION_OF + alias)
    except MlflowException as exc:
        if is_unreachable(exc):
            raise
        return None
    return {"id": owner, "uri": location_of(tracking_uri, name, owner)} if owner else None


def served_from(served_uri: str) -> str:
    """The serving location a served copy belongs to (`<serving>/versions/vN/<content>`)."""
    return served_uri.rsplit("/versions/", 1)[0]


@tracking_call("reading the model registry")
def location_of(tracking_uri: str, name: str, location_id: str) -> str | None:
    """Where the serving location `location_id` of `name` is: read off a version it registered (None: none yet)."""
    for uri in _served_uris(tracking_uri, f"name = '{name}' AND tags.`{TAG_LOCATION_ID}` = '{location_id}'"):
        return served_from(uri)
    return None


@tracking_call("reading the model registry")
def location_uris(tracking_uri: str, name: str) -> list[str]:
    """Where the serving locations of `name` are: every location a registered version of it was served from."""
    return sorted({served_from(uri) for uri in _served_uris(tracking_uri, f"name = '{name}'")})


def _served_uris(tracking_uri: str, filter_string: str) -> list[str]:
    from mlflow.exceptions import MlflowException

    try:
        found = tracking_client(tracking_uri).search_model_versions(filter_string)
    except MlflowException as exc:
        if is_unreachable(exc):
            raise
        return []
    return [str(v.tags[TAG_SERVED_URI]) for v in found if (v.tags or {}).get(TAG_SERVED_URI)]


@tracking_call("reading the model registry")
def alias_target(tracking_uri: str, name: str, alias: str) -> str | None:
    """The version an alias points at, or None."""
    from mlflow.exceptions import MlflowException

    client = tracking_client(tracking_uri)
    try:
        return str(client.get_model_version_by_alias(name, alias).version)
    except MlflowException as exc:
        if is_unreachable(exc):
            raise
        return None


@tracking_call("moving the registry alias")
def set_alias(tracking_uri: str, name: str, alias: str, version: str) -> None:
    """Move a registry alias (rollback uses this)."""
    tracking_client(tracking_uri).set_registered_model_alias(name, alias, version)


@tracking_call("marking a withdrawn champion")
def mark_withdrawn(tracking_uri: str, name: str, version_uid: str | None, served_uri: str, model_id: str | None,
                   note: str | None) -> None:
    """Tag a served version's registered model version and its checkpoint's LoggedModel `podium.withdrawn`
    with `note` (a rollback withdrew it), or remove the tags (`note` None: it is served again).

    A record that is not there (never registered, deleted) is skipped: the serving history stays the
    source of truth."""
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
