"""Serving the champion live: a Ray Serve deployment that follows a serving location's CURRENT.

Each replica loads the version CURRENT names and answers MLflow's scoring protocol (what `mlflow models serve`
answers, so its clients work unchanged):

    POST /invocations   predictions (JSON: dataframe_split, dataframe_records, instances, inputs; CSV; Parquet)
    GET  /ping, /health 200 once a version is loaded (503 before), with what serves and what was refused
    GET  /version       the same, as JSON

Every answer carries the version that gave it in the `X-Podium-Version` header.

Following promotions and rollbacks: a replica reads CURRENT every `poll_s` seconds, in a thread of its own. When
CURRENT names another version, the replica loads it beside the one serving, checks it as a promotion does (its
files against the manifest's hashes, its answers on its input example against the ones recorded when it was
built), and only then switches the reference that requests take. A request takes that reference once, at its
start, and runs wholly on that version: none is dropped, none is answered by a half-loaded model. A version that
fails to load or to check is never switched to: the replica keeps serving the one it has, logs why, and says it
on /health; it tries that version again only if CURRENT names it again after naming another.
"""

from __future__ import annotations

import asyncio
import json
import logging
import posixpath
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import Response

from podium.core.served import MAKE_LOADABLE, SERVED_AS_FILES, is_served_as_files
from podium.errors import ServingError
from podium.serving.layout import PromotedVersion, read_current
from podium.serving.staging import verify_files
from podium.storage.locations import is_remote

logger = logging.getLogger(__name__)

VERSION_HEADER = "X-Podium-Version"


@dataclass(frozen=True)
class Serving:
    """One loaded version: the MLflow pyfunc model requests are answered with."""

    version: str
    uid: str | None
    model: Any
    input_schema: Any
    since: float = field(default_factory=time.time)


def load_serving(version: PromotedVersion) -> Serving:
    """A complete version, loaded and checked (hashes, input example); only MLflow models serve live."""
    from podium.training.promoted import MLMODEL, load_version  # MLflow and torch load only here

    if MLMODEL not in version.manifest.get("files", {}) or is_served_as_files(version.manifest.get("served_as")):
        raise ServingError(f"{version.version} is {SERVED_AS_FILES}: it cannot be served live; {MAKE_LOADABLE}")
    if not is_remote(version.uri):  # served in place: its files are checked against the manifest first
        verify_files(posixpath.dirname(version.uri.rstrip("/")), version.manifest)
    promoted = load_version(version, check_answers=True)
    pyfunc = promoted.pyfunc
    return Serving(version.version, version.manifest.get("version_uid"), pyfunc, pyfunc.metadata.get_input_schema())


class ChampionServer:
    """The Ray Serve deployment's class: serves `serving`'s current version and follows CURRENT (see the module)."""

    def __init__(self, serving: str, poll_s: float = 1.0):
        self._serving, self._poll_s = serving, poll_s
        self._active: Serving | None = None
        self._refused: dict[str, str] = {}  # version -> why it was not switched to, while CURRENT names it
        self._lock = threading.Lock()
        self._follow_once()  # a replica starts with the current version loaded, or with nothing promoted yet
        self._stop = threading.Event()
        self._follower = threading.Thread(target=self._follow, name="podium-follow-current", daemon=True)
        self._follower.start()

    def _follow(self) -> None:
        while not self._stop.wait(self._poll_s):
            self._follow_once()

    def _follow_once(self) -> None:
        with self._lock:
            try:
                current = read_current(self._serving)
            except Exception as exc:  # a store that is briefly unreachable: keep serving what is loaded
                logger.warning("podium serve: cannot read %s/CURRENT (%s); still serving %s", self._serving, exc,
                               self._active.version if self._active else "nothing")
                return
            if current is None or (self._active is not None and current.version == self._active.version):
                self._refused.clear()
                return
            if current.version in self._refused:
                return
            try:
                loaded = load_serving(current)
            except Exception as exc:  # anything the load or the check raises: that version is not switched to
                why = f"{type(exc).__name__}: {exc}" if not isinstance(exc, ServingError) else str(exc)
                self._refused = {current.version: why}
                logger.error("podium serve: %s not switched to, still serving %s: %s", current.version,
                             self._active.version if self._active else "nothing", why)
                return
            previous, self._active = self._active, loaded  # one assignment: the switch
            self._refused.clear()
            logger.warning("podium serve: now serving %s (was %s)", loaded.version,
                           previous.version if previous else "nothing")

    def status(self) -> dict[str, Any]:
        """What this replica serves, and any version CURRENT names that it refused, with why."""
        active = self._active
        return {"serving": self._serving, "version": active.version if active else None,
                "version_uid": active.uid if active else None, "since": active.since if active else None,
                "refused": dict(self._refused)}

    def check_health(self) -> None:
        """Ray Serve's health check: a replica that no longer follows CURRENT is replaced."""
        if not self._follower.is_alive():
            raise RuntimeError("podium serve: this replica stopped following CURRENT")

    def __del__(self) -> None:
        self._stop.set()

    async def __call__(self, request: Any) -> Any:
        path = request.url.path.rstrip("/") or "/"
        active = self._active  # the one version this whole request runs on
        headers = {VERSION_HEADER: active.version} if active else {}
        if request.method == "GET" and path in ("/ping", "/health", "/version"):
            return Response(json.dumps(self.status()), status_code=200 if active else 503, headers=headers,
                            media_type="application/json")
        if path != "/invocations" or request.method != "POST":
            return Response(json.dumps({"error_code": "ENDPOINT_NOT_FOUND", "message": f"{request.method} {path}: "
                                        "expected POST /invocations, GET /ping, /health or /version"}),
                            status_code=404, media_type="application/json")
        if active is None:
            return Response(json.dumps({"error_code": "TEMPORARILY_UNAVAILABLE",
                                        "message": f"nothing is promoted to {self._serving} yet"}),
                            status_code=503, media_type="application/json")
        return await _invoke(active, await request.body(), request.headers.get("content-type", ""), headers)


async def _invoke(active: Serving, body: bytes, content_type: str, headers: dict[str, str]) -> Any:
    """MLflow's scoring server's own handling of one request (parsing, schema, predictions to JSON, errors)."""
    from mlflow.exceptions import MlflowException
    from mlflow.pyfunc.scoring_server import invocations

    try:
        result = await asyncio.to_thread(invocations, body, content_type, active.model, active.input_schema)
    except MlflowException as exc:
        return Response(exc.serialize_as_json(), status_code=exc.get_http_status_code(), headers=headers,
                        media_type="application/json")
    return Response(result.response, status_code=result.status, headers=headers, media_type=result.mimetype)
