"""The model registry: a version per promotion, the alias serving systems follow."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from podium.core.approval import CHALLENGER
from podium.core.records import CheckpointRecord
from podium.tracking.client import (
    TAG_SERVED_URI,
    TAG_WITHDRAWN,
    TrackingRun,
    is_unreachable,
    tracking_call,
    tracking_client,
)

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

logger = logging.getLogger(__name__)


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
                      tags: dict[str, str], description: str = "", promoted: bool = True) -> str:
    """Register the champion's LoggedModel (its artifacts are the served model) as a new version of
    `name`, and move `alias` to it; returns the version. `promoted` False: a candidate awaiting a decision
    (its LoggedModel is not tagged promoted yet)."""
    from mlflow.exceptions import MlflowException

    client = tr.client()
    try:
        client.create_registered_model(name, description="Champions promoted by podium.")
    except MlflowException as exc:
        if "already exists" not in str(exc).lower() and "RESOURCE_ALREADY_EXISTS" not in str(exc):
            raise
    tags = {**tags, TAG_SERVED_URI: served_uri}
    description = description or f"{tr.run_name} step {record.step}"
    if record.model_id:
        mv = client.create_model_version(name, source=version_source(tr, record.model_id), run_id=tr.run_id,
                                         model_id=record.model_id, tags=tags, description=description)
    else:
        mv = client.create_model_version(name, source=served_uri, run_id=tr.run_id, tags=tags,
                                         description=description)
    version = _one_version(client, name, served_uri, str(mv.version))
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
def settle_challenger(tracking_uri: str, name: str, version: str, alias: str, model_id: str | None, approved: bool,
                      tags: dict[str, str]) -> None:
    """A decision on the version under the `challenger` alias: its tags (who, when, why), the promotion's `alias`
    moved to it if `approved` (its LoggedModel tagged promoted), and `challenger` removed if it still names it."""
    client = tracking_client(tracking_uri)
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    if approved:
        client.set_registered_model_alias(name, alias, version)
        if model_id:
            client.set_logged_model_tags(model_id, {"podium.promoted": "true"})
    mv = client.get_model_version(name, version)
    client.update_model_version(name, version, description=(mv.description or "").replace(
        f"awaiting approval (alias {CHALLENGER})", "approved, promoted by podium" if approved else "rejected"))
    if alias_target(tracking_uri, name, CHALLENGER) == version:
        client.delete_registered_model_alias(name, CHALLENGER)


def _served_by(name: str, served_uri: str) -> str:
    """A search for the versions of `name` made for one served copy (not all versions: a nightly model has
    many). MLflow's filter strings take no escapes: a value with a single quote goes in double quotes."""
    if "'" not in served_uri:
        return f"name = '{name}' AND tags.`{TAG_SERVED_URI}` = '{served_uri}'"
    if '"' not in served_uri:
        return f"name = '{name}' AND tags.`{TAG_SERVED_URI}` = \"{served_uri}\""
    return f"name = '{name}'"  # both quotes: every version of the model, compared below


def _one_version(client: MlflowClient, name: str, served_uri: str, created: str) -> str:
    """The one version of `name` for this served copy: the first. Others, left by a create the HTTP client
    retried after a timeout although the server had taken it, are deleted."""
    same = sorted(int(v.version) for v in client.search_model_versions(_served_by(name, served_uri))
                  if (v.tags or {}).get(TAG_SERVED_URI) == served_uri)
    for extra in same[1:]:
        logger.warning("%s: deleting duplicate model version %s of %s (a retried create)", name, extra, served_uri)
        client.delete_model_version(name, str(extra))
    return str(same[0]) if same else created


@tracking_call("reading the model registry")
def registered_version_for(tracking_uri: str, name: str, served_uri: str) -> str | None:
    """The registered model version whose source is this served copy, if it was registered."""
    from mlflow.exceptions import MlflowException

    client = tracking_client(tracking_uri)
    try:
        versions = client.search_model_versions(f"name = '{name}'")
    except MlflowException as exc:
        if is_unreachable(exc):  # "not registered" must not be concluded from a server that did not answer
            raise
        return None
    matches = sorted((int(v.version) for v in versions
                      if v.source == served_uri or (v.tags or {}).get(TAG_SERVED_URI) == served_uri), reverse=True)
    return str(matches[0]) if matches else None


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
def mark_withdrawn(tracking_uri: str, name: str, served_uri: str, model_id: str | None, note: str | None) -> None:
    """Tag a served version's registered model version and its checkpoint's LoggedModel `podium.withdrawn`
    with `note` (a rollback withdrew it), or remove the tags (`note` None: it is served again).

    A record that is not there (never registered, deleted) is skipped: the serving history stays the
    source of truth."""
    from mlflow.exceptions import MlflowException

    client = tracking_client(tracking_uri)
    version = registered_version_for(tracking_uri, name, served_uri)
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
