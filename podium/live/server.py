"""Serving the champion live: a Ray Serve deployment that follows a serving location's CURRENT.

Each replica loads the version CURRENT names and answers MLflow's scoring protocol (what `mlflow models serve`
answers, so its clients work unchanged):

    POST /invocations   predictions (JSON: dataframe_split, dataframe_records, instances, inputs; CSV; Parquet)
    GET  /ping          200 once a version is loaded (503 before), with what serves and what was refused (JSON)
    GET  /health        the same, with this replica's requests, errors and latency per version since it started
    GET  /version       the same as /health

The fast path (podium.live.fast): a request the version's fast path takes (a model podium built, JSON in the
common shapes, no params) is read into a float32 array on the replica's event loop and waits, at most
`batch_wait_s`, for others to join it (Ray Serve's `@serve.batch`, at most `max_batch_size` requests); the batch's
rows go through the torch module in one call. Every other request is answered by MLflow's scoring server's own
code on the pyfunc model, as before; both give the same answers, byte for byte.

Every answer carries the version that gave it in the `X-Podium-Version` header. Each replica counts the requests
each version answered, their errors and latency, in Ray Serve's metrics and in a tally of its own
(podium.live.traffic).

Following promotions and rollbacks: a replica reads CURRENT every `poll_s` seconds, in a thread of its own. When
CURRENT names another version, the replica loads it beside the one serving, checks it as a promotion does (its
files against the manifest's hashes, its answers on its input example against the ones recorded when it was
built), and only then switches the reference that requests take. A request takes that reference once, at its
start, and runs wholly on that version: none is dropped, none is answered by a half-loaded model. A version that
fails to load or to check is never switched to: the replica keeps serving the one it has, logs why, and says it
on /health; it tries that version again only if CURRENT names it again after naming another.

Shadowing a candidate (`promotion.rollout = "shadow"`, podium.serving.live): a replica follows the location's
SHADOW pointer in the same thread. When it names a candidate, the replica loads and checks it as it would for a
switch, and from then on hands a copy of each request the champion answered (200) to a thread of its own, after
the champion's answer is made: the client waits for the champion only. That thread asks the candidate, compares
its answer with the champion's and adds both latencies to the replica's tally (podium.core.traffic.Tally), which
the follower writes under the serving location every poll. Mirrored requests wait in a short queue; beyond it
they are not mirrored (the shadow samples, the champion never waits).

Watching a new champion (`[promotion.watch]`, podium.serving.live): while the location's WATCH pointer names one,
the follower writes this replica's counts of it (past its warm-up) and of the champion it replaced (its last stretch
of answers before the switch: podium.core.traffic.VersionWindow) under the serving location every poll, when they
changed; the promotion that watches reads them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import posixpath
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ray import serve
from ray.serve._private import constants as serve_settings  # how Ray read its settings here: no public API says
from ray.serve.exceptions import RayServeException
from starlette.responses import Response

from podium.core.served import MAKE_LOADABLE, SERVED_AS_FILES, is_served_as_files
from podium.core.traffic import Tally, WatchTally, compare_answers, counts_of, is_failure
from podium.errors import ServingError
from podium.live.fast import FastModel, answer_batch, fast_model_of
from podium.live.ingress import HAPROXY, PROXY
from podium.live.traffic import ReplicaTraffic
from podium.serving.layout import PromotedVersion, read_current
from podium.serving.live import candidate_of, read_shadow, read_watch, write_tally, write_watch_tally
from podium.serving.staging import verify_files
from podium.storage.locations import is_remote

logger = logging.getLogger(__name__)

VERSION_HEADER = "X-Podium-Version"

MAX_BATCH_SIZE = 16  # requests answered by one model call, at most (`podium serve --max-batch-size`)
BATCH_WAIT_S = 0.001  # how long a request waits for others to join its batch (`podium serve --batch-wait-ms`)
MIRROR_BACKLOG = 32  # mirrored requests waiting for the candidate, at most; beyond, a request is not mirrored


@dataclass(frozen=True)
class Serving:
    """One loaded version: the MLflow pyfunc model requests are answered with, and its fast path (None: every
    request goes to the pyfunc model)."""

    version: str
    uid: str | None
    model: Any
    input_schema: Any
    since: float = field(default_factory=time.time)
    fast: FastModel | None = None


def load_serving(version: PromotedVersion) -> Serving:
    """A complete version, loaded and checked (hashes, input example); only MLflow models serve live."""
    from podium.training.promoted import MLMODEL, load_version  # MLflow and torch load only here

    if MLMODEL not in version.manifest.get("files", {}) or is_served_as_files(version.manifest.get("served_as")):
        raise ServingError(f"{version.version} is {SERVED_AS_FILES}: it cannot be served live; {MAKE_LOADABLE}")
    if not is_remote(version.uri):  # served in place: its files are checked against the manifest first
        verify_files(posixpath.dirname(version.uri.rstrip("/")), version.manifest)
    promoted = load_version(version, check_answers=True)
    pyfunc = promoted.pyfunc
    schema = pyfunc.metadata.get_input_schema()
    return Serving(version.version, version.manifest.get("version_uid"), pyfunc, schema,
                   fast=fast_model_of(pyfunc, schema))


@dataclass
class Shadowing:
    """A candidate in shadow on this replica: its loaded model, the tally of its mirrored requests and what the
    SHADOW pointer asks (how many requests, how close numbers must be to agree)."""

    candidate: Serving
    tally: Tally
    requests: int
    tolerance: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    written: int = -1  # the tally's request count when it was last written

    def wants_more(self) -> bool:
        """Whether this replica still mirrors: the shadow asked for more requests than it has counted."""
        with self.lock:
            return self.tally.requests < self.requests


class ChampionServer:
    """The Ray Serve deployment's class: serves `serving`'s current version and follows CURRENT (see the module),
    and SHADOW. `replica` names this replica's shadow tallies (default: host, process and a random suffix);
    `max_batch_size` and `batch_wait_s` size the fast path's batches."""

    def __init__(self, serving: str, poll_s: float = 1.0, replica: str | None = None,
                 max_batch_size: int = MAX_BATCH_SIZE, batch_wait_s: float = BATCH_WAIT_S):
        self._serving, self._poll_s = serving, poll_s
        # which ingress answers clients, as Ray read its settings in this replica (a cluster's own, if it was started
        # elsewhere): HAProxy in front of the replicas, or Ray Serve's Python HTTP proxy
        self._ingress = HAPROXY if serve_settings.RAY_SERVE_ENABLE_HA_PROXY else PROXY
        # outside a replica (a test calling the class) there is no batch queue: each request is its own batch
        self._batched: Callable[[Fast], Awaitable[Answer]] = self._answer_alone
        if in_replica():  # this instance's own batch queue: Ray Serve's, made on the first request, in the replica's loop
            self._batched = serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_s)(
                self._answer_batch)
        self._replica = replica or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._active: Serving | None = None
        self._refused: dict[str, str] = {}  # version -> why it was not switched to, while CURRENT names it
        self._lock = threading.Lock()
        self._shadow: Shadowing | None = None
        self._shadow_refused: dict[str, str] = {}  # shadow id -> why its candidate did not load here
        self._watch_written: tuple[str, Any, Any] | None = None  # the watch tally last written: id, both counts
        self._watch_previous: tuple[str | None, dict[str, Any]] = (None, {})  # a watch's previous champion, counted
        self._mirrors = ThreadPoolExecutor(max_workers=1, thread_name_prefix="podium-shadow")
        self._backlog = threading.BoundedSemaphore(MIRROR_BACKLOG)
        self._traffic = ReplicaTraffic(serving, self._replica)
        self._fast = {"requests": 0, "batches": 0}  # what the fast path answered here, in how many model calls
        self._follow_once()  # a replica starts with the current version loaded, or with nothing promoted yet
        self._stop = threading.Event()
        self._follower = threading.Thread(target=self._follow, name="podium-follow-current", daemon=True)
        self._follower.start()

    def _follow(self) -> None:
        while not self._stop.wait(self._poll_s):
            self._follow_once()

    def _follow_once(self) -> None:
        self._follow_current()
        self._follow_shadow()
        self._follow_watch()

    def _follow_current(self) -> None:
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

    def _follow_shadow(self) -> None:
        """Start, go on with or end mirroring to the candidate SHADOW names; write this replica's tally."""
        try:
            pointer = read_shadow(self._serving)
        except Exception as exc:  # as for CURRENT: a store briefly unreachable changes nothing here
            logger.warning("podium serve: cannot read %s/SHADOW (%s)", self._serving, exc)
            return
        shadowing = self._shadow
        if shadowing is not None and (pointer is None or pointer.get("shadow_id") != shadowing.tally.shadow_id):
            self._shadow = None  # requests stop being mirrored; those under way still count
            self._mirrors.submit(self._write_tally, shadowing)  # after them: the executor runs in order
            logger.warning("podium serve: shadow of %s ended", shadowing.candidate.version)
            shadowing = None
        if shadowing is not None:
            self._write_tally(shadowing)
            return
        if pointer is None:
            self._shadow_refused.clear()
            return
        shadow_id = str(pointer.get("shadow_id"))
        if shadow_id in self._shadow_refused:
            return
        active = self._active
        tally = Tally(shadow_id, self._replica, champion=active.version if active else None,
                      candidate=str(pointer.get("version")))
        try:
            if active is None:
                raise ServingError("no champion is served here to compare it with")
            loaded = load_serving(candidate_of(self._serving, pointer))
        except Exception as exc:  # the candidate is not shadowed here, and its promotion is told why
            why = f"{type(exc).__name__}: {exc}" if not isinstance(exc, ServingError) else str(exc)
            self._shadow_refused = {shadow_id: why}
            tally.not_loaded = f"{self._replica}: {why}"
            logger.error("podium serve: %s not shadowed: %s", tally.candidate, why)
            self._write_tally(None, tally)
            return
        self._shadow = Shadowing(loaded, tally, int(pointer.get("requests") or 0),
                                 float(pointer.get("agreement_tolerance") or 0.0))
        self._write_tally(self._shadow)
        logger.warning("podium serve: shadowing %s beside %s", loaded.version, active.version)

    def _follow_watch(self) -> None:
        """While WATCH names a new champion, write this replica's counts of it and of the champion it replaced (when
        they changed): the promotion that watches it reads them."""
        try:
            pointer = read_watch(self._serving)
        except Exception as exc:  # as for CURRENT: a store briefly unreachable changes nothing here
            logger.warning("podium serve: cannot read %s/WATCH (%s)", self._serving, exc)
            return
        if pointer is None:
            self._watch_written = None
            return
        version, previous = pointer.watched.version, pointer.watched.previous
        windows = dict(self._traffic.windows)
        new, old = windows.get(version), windows.get(str(previous)) if previous else None
        champion_counts = counts_of(new.settled, new.fast, new.warmup.requests) if new is not None else {}
        watch_id = pointer.watched.watch_id
        if self._watch_previous[0] == watch_id:  # its last stretch, counted once the replica switched away from it
            previous_counts = self._watch_previous[1]
        else:
            previous_counts = counts_of(*old.last_stretch(), old.warmup.requests) if old is not None else {}
            if self._active is not None and self._active.version == version:
                self._watch_previous = (watch_id, previous_counts)
        tally = WatchTally(watch_id, self._replica, version, previous, champion_counts, previous_counts)
        written = (tally.watch_id, tally.champion_counts.get("requests"), tally.previous_counts.get("requests"))
        if written == self._watch_written:
            return
        try:
            write_watch_tally(self._serving, tally)
        except Exception as exc:  # the next poll writes it again
            logger.warning("podium serve: watch tally not written (%s)", exc)
            return
        self._watch_written = written

    def _write_tally(self, shadowing: Shadowing | None, tally: Tally | None = None) -> None:
        if shadowing is not None:
            with shadowing.lock:
                if shadowing.tally.requests == shadowing.written:
                    return
                shadowing.written = shadowing.tally.requests
                tally = Tally.from_dict(shadowing.tally.as_dict())
        assert tally is not None
        try:
            write_tally(self._serving, tally)
        except Exception as exc:  # the next poll writes it again
            logger.warning("podium serve: shadow tally not written (%s)", exc)
            if shadowing is not None:
                shadowing.written = -1

    def status(self) -> dict[str, Any]:
        """What this replica serves, any version CURRENT names that it refused (with why), and the candidate it
        shadows (or why it could not)."""
        active, shadowing = self._active, self._shadow
        shadow = None
        if shadowing is not None:
            shadow = {"version": shadowing.candidate.version, "shadow_id": shadowing.tally.shadow_id,
                      "requests": shadowing.tally.requests}
        return {"serving": self._serving, "ingress": self._ingress, "version": active.version if active else None,
                "version_uid": active.uid if active else None, "since": active.since if active else None,
                "fast_path": active is not None and active.fast is not None,
                "refused": dict(self._refused), "shadow": shadow, "shadow_refused": dict(self._shadow_refused)}

    def check_health(self) -> None:
        """Ray Serve's health check: a replica that no longer follows CURRENT is replaced."""
        if not self._follower.is_alive():
            raise RuntimeError("podium serve: this replica stopped following CURRENT")

    def __del__(self) -> None:
        self._stop.set()
        self._mirrors.shutdown(wait=False, cancel_futures=True)

    def traffic(self) -> dict[str, Any]:
        """This replica's requests, errors and latency per version since it started (other replicas count theirs),
        and the requests its fast path answered, in how many batches (model calls)."""
        return {**self._traffic.as_dict(), "fast_path": dict(self._fast)}

    async def __call__(self, request: Any) -> Any:
        started = time.perf_counter()
        path = request.url.path.rstrip("/") or "/"
        active = self._active  # the one version this whole request runs on
        headers = {VERSION_HEADER: active.version} if active else {}
        if request.method == "GET" and path in ("/ping", "/health", "/version"):
            said = self.status() if path == "/ping" else {**self.status(), "this_replica": self.traffic()}
            return Response(json.dumps(said), status_code=200 if active else 503, headers=headers,
                            media_type="application/json")
        if path != "/invocations" or request.method != "POST":
            return Response(json.dumps({"error_code": "ENDPOINT_NOT_FOUND", "message": f"{request.method} {path}: "
                                        "expected POST /invocations, GET /ping, /health or /version"}),
                            status_code=404, media_type="application/json")
        if active is None:
            return Response(json.dumps({"error_code": "TEMPORARILY_UNAVAILABLE",
                                        "message": f"nothing is promoted to {self._serving} yet"}),
                            status_code=503, media_type="application/json")
        shadowing = self._shadow  # taken with the version: the request is mirrored to that shadow's candidate
        body, content_type = await request.body(), request.headers.get("content-type", "")
        rows = active.fast.parse(body, content_type) if active.fast is not None else None
        if rows is not None:
            answer = await self._batched(Fast(active, rows, body, content_type))
        else:
            answer = await asyncio.to_thread(_invoke, active, body, content_type)
        if answer.status == 200 and shadowing is not None and shadowing.candidate is not active:
            self._mirror(shadowing, body, content_type, answer)
        self._traffic.record(active.version, time.perf_counter() - started, answer.status, rows is not None)
        return Response(answer.body, status_code=answer.status, headers=headers, media_type=answer.media_type)

    async def _answer_alone(self, request: Fast) -> Answer:
        """A fast request answered alone (where no batch queue runs: outside Ray Serve)."""
        return (await self._answer_batch([request]))[0]

    async def _answer_batch(self, requests: list[Fast]) -> list[Answer]:
        """Ray Serve's batch handler: the batch's requests answered off the event loop."""
        self._fast["requests"] += len(requests)  # on the event loop: no lock
        self._fast["batches"] += 1
        return await asyncio.to_thread(_answer_fast, requests)

    def _mirror(self, shadowing: Shadowing, body: bytes, content_type: str, champion: Answer) -> None:
        """Hand a copy of a request the champion answered to the candidate's thread (not waited for)."""
        if not shadowing.wants_more() or not self._backlog.acquire(blocking=False):
            return
        try:
            self._mirrors.submit(self._shadow_one, shadowing, body, content_type, champion)
        except RuntimeError:  # the replica is shutting down
            self._backlog.release()

    def _shadow_one(self, shadowing: Shadowing, body: bytes, content_type: str, champion: Answer) -> None:
        try:
            answer = invoke(shadowing.candidate, body, content_type)
            # the candidate's failure (5xx) counts against it; a request its schema refuses (4xx) is not compared
            failure, rows, agreed = (_compared(champion, answer, shadowing.tolerance) if answer.status == 200
                                     else (f"answered {answer.status}: {answer.message()}", 0, 0)
                                     if is_failure(answer.status) else (None, 0, 0))
            with shadowing.lock:
                shadowing.tally.add(champion.seconds, answer.seconds, failure, rows, agreed)
        finally:
            self._backlog.release()


@dataclass(frozen=True)
class Answer:
    """A model's answer to one request, as MLflow's scoring server makes it, and how long the model took."""

    body: str | bytes
    status: int
    media_type: str
    seconds: float

    def message(self) -> str:
        """The answer's body in short (an error's message)."""
        text = self.body.decode(errors="replace") if isinstance(self.body, bytes) else self.body
        try:
            return str(json.loads(text).get("message", text))[:300]
        except (ValueError, AttributeError):
            return text[:300]


def in_replica() -> bool:
    """Whether this code runs in a Ray Serve replica (Ray Serve's batch queue works there only)."""
    try:
        serve.get_replica_context()
    except RayServeException:
        return False
    return True


@dataclass(frozen=True)
class Fast:
    """A request the fast path takes: the version it runs on, its rows, and its body (for the pyfunc path, if the
    batch's model call fails)."""

    serving: Serving
    rows: np.ndarray
    body: bytes
    content_type: str


def _answer_fast(requests: list[Fast]) -> list[Answer]:
    """A batch's answers: one model call per version in it (a batch spans a switch at most). If the call fails,
    each request is answered alone by the pyfunc path, with MLflow's own error."""
    answers: list[Answer | None] = [None] * len(requests)
    by_version: dict[int, list[int]] = {}
    for i, request in enumerate(requests):
        by_version.setdefault(id(request.serving), []).append(i)
    for indices in by_version.values():
        serving = requests[indices[0]].serving
        assert serving.fast is not None
        try:
            said = answer_batch(serving.fast, [requests[i].rows for i in indices])
        except Exception as exc:  # e.g. a model that raises on some rows: MLflow's answer says how, request by request
            logger.warning("podium serve: %s failed on a batch of %d requests (%s): answering each alone",
                           serving.version, len(indices), exc)
            for i in indices:
                answers[i] = _invoke(serving, requests[i].body, requests[i].content_type)
            continue
        for i, one in zip(indices, said):
            answers[i] = Answer(one.body, 200, "application/json", one.seconds)
    return [a for a in answers if a is not None]


def invoke(serving: Serving, body: bytes, content_type: str) -> Answer:
    """One request answered alone: by the fast path where it takes it, else by the pyfunc path (the shadow's
    candidate is asked so, as the champion answered it)."""
    fast = serving.fast
    rows = fast.parse(body, content_type) if fast is not None else None
    if fast is None or rows is None:
        return _invoke(serving, body, content_type)
    try:
        one = answer_batch(fast, [rows])[0]
    except Exception:  # as for a batch: MLflow's own answer
        return _invoke(serving, body, content_type)
    return Answer(one.body, 200, "application/json", one.seconds)


def _invoke(serving: Serving, body: bytes, content_type: str) -> Answer:
    """MLflow's scoring server's own handling of one request (parsing, schema, predictions to JSON, errors), timed.

    A client's bad request (a body MLflow cannot parse, rows its schema refuses) is MLflow's answer, a 4xx. An
    exception the model itself raises is a 500 (MLflow's server answers 400 to it, as to a bad request): the model
    failed, not the client, and only that counts against a version in the shadow and the watch."""
    from mlflow.exceptions import MlflowException
    from mlflow.pyfunc.scoring_server import invocations

    started = time.perf_counter()
    model = _Predicting(serving.model)
    try:
        result = invocations(body, content_type, model, serving.input_schema)
    except MlflowException as exc:
        if model.raised is None or isinstance(model.raised, MlflowException):  # MLflow's own: the rows, the schema
            return Answer(exc.serialize_as_json(), exc.get_http_status_code(), "application/json",
                          time.perf_counter() - started)
        return _model_failed(model.raised, started)
    except Exception as exc:  # what MLflow's server would answer 500 to, kept as an answer for the shadow's count
        return _model_failed(exc, started)
    return Answer(result.response, result.status, result.mimetype, time.perf_counter() - started)


def _model_failed(exc: BaseException, started: float) -> Answer:
    return Answer(json.dumps({"error_code": "INTERNAL_ERROR", "message": f"the model failed: {type(exc).__name__}: "
                              f"{exc}"}), 500, "application/json", time.perf_counter() - started)


class _Predicting:
    """A pyfunc model as MLflow's scoring code calls it (`metadata`, `predict`), remembering what its `predict`
    raised: MLflow's own exception (a schema the rows do not meet) is the client's; any other, the model's."""

    def __init__(self, model: Any):
        self.model, self.metadata = model, model.metadata
        self.raised: BaseException | None = None

    def predict(self, data: Any, params: dict[str, Any] | None = None) -> Any:
        try:
            return self.model.predict(data, params=params)
        except Exception as exc:
            self.raised = exc
            raise


def _compared(champion: Answer, candidate: Answer, tolerance: float) -> tuple[str | None, int, int]:
    """The candidate's failure (None: none) and the predictions compared and agreed on, for one mirrored request."""
    try:
        theirs, ours = json.loads(champion.body), json.loads(candidate.body)
    except ValueError:  # not JSON (MLflow answers JSON): compared as text, one answer
        same = champion.body == candidate.body
        return None, 1, int(same)
    return compare_answers(theirs, ours, tolerance)
