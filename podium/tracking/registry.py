"""The model registry, read: which version was made for a serving version, what an alias names, which serving
location owns it. Every write is the champion ledger's (podium.tracking.ledger)."""

from __future__ import annotations

from podium.outages import is_unreachable
from podium.tracking.client import TAG_SERVED_URI, tracking_call, tracking_client

TAG_VERSION_UID = "podium.version_uid"  # a registered version's serving version, by the manifest's identity
TAG_LOCATION_OF = "podium.location."  # + alias: on the registered model, the id of the serving location owning it
TAG_LOCATION_ID = "podium.location_id"  # a registered version's serving location (its LOCATION.json id)


def with_uid(name: str, version_uid: str) -> str:
    """A search for the versions of `name` made for one serving version (a uid is hex: no quoting to do)."""
    return f"name = '{name}' AND tags.`{TAG_VERSION_UID}` = '{version_uid}'"


@tracking_call("reading the model registry")
def registered_version_for(tracking_uri: str, name: str, version_uid: str | None, served_uri: str) -> str | None:
    """The registered model version made for one serving version: the one tagged with its `version_uid`. A
    serving version of podium <= 0.3 has none: then the version whose source is its served copy (those versions
    were registered once per number, which podium <= 0.3 could reuse: the newest)."""
    from mlflow.exceptions import MlflowException

    client = tracking_client(tracking_uri)
    try:
        if version_uid:
            versions = client.search_model_versions(with_uid(name, version_uid))
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
