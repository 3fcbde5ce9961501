"""The Prefect API as a podium run uses it: a mirror of the run, never on its critical path.

Training, validation, MLflow records and promotion never wait on Prefect:

- every call podium makes itself (artifacts, lineage reads) goes through `call()`: it runs under a
  deadline, and is skipped while the server is known to be down (an artifact is kept, the latest per
  key, and written when the server answers again); a write the flow's loop makes while training goes
  on (the progress artifact) goes through `post()`, which does not wait for it at all: a server slow to
  answer (one starved of CPU beside training answered /health after 3-10 s) would otherwise hold the
  loop that records checkpoints and starts their validations;
- Prefect's own background senders do not fail slowly once per item: the run's log lines wait in a
  bounded buffer while the server is down (`log_sink`), and events (task-run states, checkpoint
  announcements) stay in the unconfirmed buffer of Prefect's events client, which gives an event up
  after 2 reconnection attempts and resends the buffer when it reconnects;
- the server's absence is said once: one log line and one progress line when it stops answering,
  one when it answers again. Prefect's per-item failure records are counted, not logged.

A watch thread probes `/health` while a run is on, so an outage is noticed within seconds whether or
not podium happens to be calling Prefect. The flow engine's own calls (the flow run's states) are
bounded by Prefect's client settings, which the CLI sets (`bound_client_settings`).

Why one module of this size: the link's calls, posts, held writes, watch and background senders share
one piece of state (is the server up, what is held for it); split, each part would reach into the others.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

from podium.errors import NotAnswered, NotFound
from podium.outages import is_unreachable
from podium.progress import say
from podium.services import prefect_health

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Prefect's client settings for a podium process, unless already set: a request gives up after 10 s
# without an answer, and a refused connection is retried twice (2 s, then 4 s apart) where Prefect's
# defaults (60 s, 5 retries 2-32 s apart) hold each call for over a minute
CLIENT_DEFAULTS = {"PREFECT_API_REQUEST_TIMEOUT": "10", "PREFECT_CLIENT_MAX_RETRIES": "2"}
CALL_DEADLINE_S = 15.0  # the most a call of podium's own waits, whatever the client settings
PROBE_S = 1.0  # how often the watch probes /health while a run is on
MAX_HELD_LOGS = 20_000


def bound_client_settings(environ: MutableMapping[str, str]) -> None:
    """Set Prefect's client timeouts and retries for a podium process (before Prefect is imported),
    unless the environment sets them already."""
    for name, value in CLIENT_DEFAULTS.items():
        environ.setdefault(name, value)


class PrefectLink:
    """This process's view of the Prefect server: up or down since when, and what waits for it."""

    def __init__(self, api_url: str | None):
        self.api_url = api_url
        self.down_since: float | None = None  # time.time() of the first failure of the current outage
        self.outages = 0
        self.down_s = 0.0  # seconds of outages that have ended
        self._lock = threading.Lock()
        self._calls = ThreadPoolExecutor(max_workers=4, thread_name_prefix="podium-prefect")
        self._artifacts: OrderedDict[str, Callable[[], Any]] = OrderedDict()  # key -> the latest write
        # posted writes are sent from a thread of their own: each is a `_run` on `_calls`, and a sender waiting
        # in `_calls` for a call queued behind it would hold the pool until the deadline (and call that an outage)
        self._posts = ThreadPoolExecutor(max_workers=1, thread_name_prefix="podium-prefect-post")
        self._posted: dict[str, Callable[[], Any] | None] = {}  # key -> next write (None: one in flight only)
        self._posts_done = threading.Condition(self._lock)
        self._logs: deque[dict[str, Any]] = deque(maxlen=MAX_HELD_LOGS)
        self.logs_dropped = 0
        self.failures_seen = 0  # Prefect's own failure records swallowed while it was down
        self._watch: threading.Thread | None = None
        self._stop = threading.Event()
        self._misses = 0  # failed probes in a row
        self._unanswered_since: float | None = None  # time.monotonic() of the first of them

    # ---- state

    @property
    def down(self) -> bool:
        """The server is known not to answer."""
        return self.down_since is not None

    def mark_down(self, reason: str) -> None:
        """The server stopped answering: said once per outage."""
        with self._lock:
            if self.down_since is not None:
                return
            self.down_since = time.time()
            self.outages += 1
        logger.warning("Prefect server %s stopped answering (%s): the run goes on; its Prefect records "
                       "(task runs, events, logs, artifacts) are held and sent if it answers again", self.api_url,
                       reason)
        say("Prefect server %s does not answer: the run goes on without it (its records are "
            "sent if it comes back)", self.api_url)

    def mark_up(self) -> None:
        """The server answers again: send what was held."""
        with self._lock:
            if self.down_since is None:
                return
            lasted = time.time() - self.down_since
            self.down_s += lasted
            self.down_since = None
            artifacts, self._artifacts = list(self._artifacts.items()), OrderedDict()
            logs = list(self._logs)
            self._logs.clear()
        for key, write in artifacts:
            self._run(write, "a held artifact", key=key)
        if logs:
            from prefect.logging.handlers import APILogWorker

            worker = APILogWorker.instance()
            for log in logs:
                worker.send(log)
        _nudge_events()
        logger.warning("Prefect server %s answers again after %.0f s: %d held artifact(s) and %d log line(s) sent, "
                       "events resent by Prefect's client", self.api_url, lasted, len(artifacts), len(logs))
        say("Prefect server answers again after %.0f s: the run's records catch up", lasted)

    def probe(self, timeout: float = 2.0, misses_to_down: int = 1, slow_down_s: float | None = None) -> bool:
        """Ask /health once; mark the server up, or down after `misses_to_down` failed probes in a row
        (a busy server may miss one). With `slow_down_s`, probes that only timed out mark it down once it
        has not answered for that long: a server that refuses connections is gone, one that answers late
        may be busy (a loaded machine). True if it answers."""
        if not self.api_url:
            return True
        health = prefect_health(self.api_url, timeout)
        if health == "up":
            self._misses, self._unanswered_since = 0, None
            self.mark_up()
            return True
        now = time.monotonic()
        if self._unanswered_since is None:
            self._unanswered_since = now - (timeout if health == "slow" else 0.0)
        self._misses += 1
        if self._misses >= misses_to_down and (
                slow_down_s is None or health == "gone" or now - self._unanswered_since >= slow_down_s):
            self.mark_down("its /health does not answer" if health == "gone"
                           else f"its /health has not answered for {now - self._unanswered_since:.0f} s")
        return False

    # ---- calls of podium's own

    def call(self, what: str, fn: Callable[[], T], *, key: str | None = None) -> T | None:
        """`fn()` (a Prefect API call), bounded: its value, or None where the server does not answer
        (noticed once) or refuses it (logged). With `key`, a write skipped for an outage is kept (the
        latest per key) and done when the server answers again."""
        if self.down:
            if key is not None:
                self._hold(key, _in_context(fn))
            return None
        return self._run(_in_context(fn), what, key=key)

    def _hold(self, key: str, fn: Callable[[], Any]) -> None:
        with self._lock:
            self._artifacts[key] = fn
            self._artifacts.move_to_end(key)

    def post(self, what: str, fn: Callable[[], Any], *, key: str) -> None:
        """`fn()`, a write of the latest state under `key`, done in the background; the caller does not wait.
        Writes of one key are done one at a time, in order; one posted while another of its key is in flight
        replaces any still waiting (only the latest state matters). While the server is down it is held as a
        `call` with `key` would hold it. `flush` waits for what was posted."""
        fn = _in_context(fn)
        with self._lock:
            sending = key in self._posted
            self._posted[key] = fn
        if not sending:
            self._posts.submit(self._send_posted, what, key)

    def _send_posted(self, what: str, key: str) -> None:
        while True:
            with self._lock:
                fn = self._posted.get(key)
                if fn is None:  # nothing more was posted meanwhile
                    del self._posted[key]
                    self._posts_done.notify_all()
                    return
                self._posted[key] = None
            try:
                if self.down:
                    self._hold(key, fn)
                else:
                    self._run(fn, what, key=key)
            except BaseException:  # _run reports its own failures; nothing may leave the key marked in flight
                logger.debug("posting %s failed", what, exc_info=True)

    def flush(self, timeout_s: float = CALL_DEADLINE_S) -> bool:
        """Wait up to `timeout_s` for the writes posted so far. True if none is left."""
        with self._lock:
            return self._posts_done.wait_for(lambda: not self._posted, timeout=timeout_s)

    def _run(self, fn: Callable[[], T], what: str, key: str | None = None) -> T | None:
        future = self._calls.submit(fn)
        deadline = time.monotonic() + CALL_DEADLINE_S
        try:
            while True:  # until it answers, the deadline, or the watch finds the server down meanwhile
                try:
                    return future.result(timeout=0.2)
                except FutureTimeout:
                    if not self.down and time.monotonic() < deadline:
                        continue
                    if self.down and key is not None:
                        self._hold(key, fn)
                    if self.down:
                        return None  # the call goes on in its thread; its outcome no longer matters
                    raise
        except BaseException as exc:
            if not is_unreachable(exc):
                logger.warning("Prefect refused %s: %s: %s", what, type(exc).__name__, exc)
                return None
            self.mark_down(f"{what}: {type(exc).__name__}: {exc}".strip()[:300])
            if key is not None:
                self._hold(key, fn)
            return None

    # ---- Prefect's background senders

    def log_sink(self, log: dict[str, Any]) -> None:
        """Prefect's API log sink: a log line goes to Prefect's log worker, or waits while the server is down."""
        if self.down:
            with self._lock:
                if len(self._logs) == self._logs.maxlen:
                    self.logs_dropped += 1
                self._logs.append(log)
            return
        from prefect.logging.handlers import APILogWorker

        APILogWorker.instance().send(log)

    def hold_queued_logs(self) -> int:
        """Take the log lines waiting in Prefect's log sender into the held ones: when the flow ends, its
        engine flushes that sender, waiting up to 5 s each time for lines it cannot send. Returns how many."""
        from prefect.logging.handlers import APILogWorker

        taken = 0
        for worker in list(getattr(APILogWorker, "_instances", {}).values()):  # Prefect's registry of senders
            if not isinstance(worker, APILogWorker):
                continue
            while True:
                try:
                    item = worker._queue.get_nowait()
                except Exception:
                    break
                worker._queue.task_done()
                if item is not None:
                    with self._lock:
                        self._logs.append(item)
                    taken += 1
        return taken

    def swallow(self, record: logging.LogRecord) -> bool:
        """Whether a failure record of Prefect's background senders is left out of the logs: it is
        while the server is down (counted; the outage was said once), or once a probe finds it down."""
        if not self.down and self.probe(timeout=3.0):
            return False
        self.failures_seen += 1
        return True

    # ---- the watch

    def watch(self) -> None:
        """Probe /health every PROBE_S seconds from now on (a daemon thread), and hold Prefect's
        background senders while the server is down."""
        if self._watch is not None or not self.api_url:
            return
        self._stop.clear()
        ctx = contextvars.copy_context()  # the run's settings (its API URL) and flow run, for what it sends
        self._watch = threading.Thread(target=ctx.run, args=(self._watching,), name="podium-prefect-watch",
                                       daemon=True)
        self._watch.start()

    def _watching(self) -> None:
        while not self._stop.wait(PROBE_S):
            try:
                self.probe(timeout=PROBE_S * 3, misses_to_down=2, slow_down_s=CALL_DEADLINE_S)
            except Exception:  # the watch must never die of a bad answer
                logger.debug("Prefect probe failed", exc_info=True)

    def stop_watch(self) -> None:
        """Stop probing."""
        self._stop.set()
        if self._watch is not None:
            self._watch.join(timeout=PROBE_S * 4)
            self._watch = None

    def settle(self, flow_end_recorded: bool) -> str | None:
        """At the end of a command: a last probe; while the server is down, drop what waits for it (so
        that the process exits without waiting on Prefect's senders) and say, in one sentence, what was
        not recorded. None if the server answers and the flow run's end was recorded."""
        self.flush()  # the last progress written (or held: the watch, still on, notices a server gone meanwhile)
        self.stop_watch()
        # a server that is gone refuses at once; one that is only busy gets as long as a call of podium's own
        if self.probe(timeout=CALL_DEADLINE_S) and flow_end_recorded:
            return None
        with self._lock:
            artifacts, logs = len(self._artifacts), len(self._logs) + self.logs_dropped
            self._artifacts.clear()
            self._logs.clear()
        events, queued_logs = _drop_held_events()
        since = time.strftime("%H:%M:%S", time.localtime(self.down_since or time.time()))
        lost = [f"{n} {what}" for n, what in ((artifacts, "artifact(s)"), (logs + queued_logs, "log line(s)"),
                                                (events, "event(s)")) if n]
        return (f"the Prefect server {self.api_url} has not answered since {since}: "
                + ("the flow run's final state" if not flow_end_recorded else "")
                + (", " if lost and not flow_end_recorded else "") + ", ".join(lost) + " were not recorded there")


_LINK: PrefectLink | None = None
_LINK_LOCK = threading.Lock()


def link() -> PrefectLink:
    """This process's link to the Prefect API it is configured with (PREFECT_API_URL)."""
    global _LINK
    from prefect.settings import PREFECT_API_URL

    api_url = PREFECT_API_URL.value()
    with _LINK_LOCK:
        if _LINK is None or _LINK.api_url != api_url:  # a process that talks to another server now (tests)
            if _LINK is not None:
                _LINK.stop_watch()
            _LINK = PrefectLink(api_url)
        return _LINK


def call(what: str, fn: Callable[[], T], *, key: str | None = None) -> T | None:
    """`fn()`, a Prefect API call of podium's own, through this process's link (see PrefectLink.call)."""
    return link().call(what, fn, key=key)


def post(what: str, fn: Callable[[], Any], *, key: str) -> None:
    """`fn()` in the background, the latest per key, through this process's link (see PrefectLink.post)."""
    link().post(what, fn, key=key)


def current_deployment() -> tuple[str, str] | None:
    """(id, name) of the deployment that started the current flow run, or None for a flow run without one.

    Read from the flow run's context: `prefect.runtime.deployment` asks the API for every flow run without a
    deployment (and fails when the server is down). Only the name of an actual deployment is asked, bounded."""
    deployment_id = _current_deployment_id()
    if deployment_id is None:
        return None

    def name() -> str | None:
        from prefect.runtime import deployment

        return deployment.name

    return str(deployment_id), call("reading the deployment's name", name) or ""


def _current_deployment_id() -> Any:
    """The id of the deployment that started the current flow run (from its context), or None."""
    from prefect.context import FlowRunContext

    return getattr(getattr(FlowRunContext.get(), "flow_run", None), "deployment_id", None)


def deployment_parameter(name: str) -> Any:
    """The deployment's own value of parameter `name` (what a run of it gets unless told otherwise), or None
    for a flow run without a deployment, or when the API does not answer."""
    deployment_id = _current_deployment_id()
    if deployment_id is None:
        return None

    def read() -> Any:  # (prefect.runtime.deployment.parameters are the flow run's, not the deployment's)
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            return (client.read_deployment(deployment_id).parameters or {}).get(name)

    return call("reading the deployment's parameters", read)


def flow_run_parameter(name: str) -> Any:
    """Parameter `name` of the current flow run as it was started with it (its JSON, before validation), or
    None outside a flow run."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    parameters = getattr(getattr(ctx, "flow_run", None), "parameters", None) or {}
    return parameters.get(name)


def paused_flow_run(run_name: str) -> str:
    """The id of the flow run of podium run `run_name` that is paused awaiting approval (`<run name>-run` or
    `<run name>-promote`); NotFound, saying what there is instead, when none is."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    names = [f"{run_name}-run", f"{run_name}-promote"]
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=names)),
                                     sort=FlowRunSort.START_TIME_DESC, limit=20)
    paused = [r for r in runs if r.state is not None and r.state.is_paused()]
    if len(paused) == 1:
        return str(paused[0].id)
    if paused:
        raise NotFound(f"{len(paused)} flow runs of run {run_name!r} await approval "
                          f"({', '.join(str(r.id) for r in paused)}): answer one in the Prefect UI")
    latest = f": its latest flow run, {runs[0].name}, is {runs[0].state_name}" if runs else ""
    raise NotFound(f"no flow run of run {run_name!r} awaits approval on this Prefect server{latest}")


def flow_run_parameters(flow_run_id: str) -> dict[str, Any]:
    """The parameters a flow run was started with (as Prefect keeps them: JSON)."""

    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return dict(client.read_flow_run(UUID(flow_run_id)).parameters or {})


def flow_run_state(flow_run_id: str) -> str | None:
    """The name of a flow run's state (Paused, Running, ...)."""

    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(UUID(flow_run_id)).state_name


def crash_flow_run(flow_run_id: str, message: str) -> None:
    """End a flow run whose process is gone as Crashed, saying why (Prefect cannot know: nothing reports for it)."""

    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(UUID(flow_run_id), Crashed(message=message), force=True)


def resume_with_input(flow_run_id: str, run_input: dict[str, Any]) -> None:
    """Resume a paused flow run with the input its form asks for (NotAnswered when it cannot be resumed: it is
    no longer paused, or its pause timed out)."""

    from prefect.exceptions import FlowPauseTimeout, NotPausedError
    from prefect.flow_runs import resume_flow_run

    try:
        resume_flow_run(UUID(flow_run_id), run_input=run_input)
    except (FlowPauseTimeout, NotPausedError) as exc:
        raise NotAnswered(str(exc)) from None


def _in_context(fn: Callable[[], T]) -> Callable[[], T]:
    """`fn` bound to the caller's context (the flow or task run an artifact belongs to), for another thread."""
    ctx = contextvars.copy_context()
    return lambda: ctx.run(_with_an_open_client, fn)


def _with_an_open_client(fn: Callable[[], T]) -> T:
    """`fn()`, with a client of its own if the Prefect client in its context has been closed: a write held for
    an outage is sent when the server answers again, which may be after the flow's engine closed the client
    the write's context names ("Cannot send a request, as the client has been closed")."""
    from prefect.context import SyncClientContext

    current = SyncClientContext.get()
    if current is None or not getattr(current.client, "_closed", False):
        return fn()
    SyncClientContext.__var__.set(None)  # type: ignore[arg-type]  # in this context only (a copy): else the new one would reuse the closed one
    with SyncClientContext():
        return fn()


# ---- Prefect's background senders, held while the server is down

class _SwallowOutageFailures(logging.Filter):
    """Drops Prefect's per-item failure records of its background senders while the server is down."""

    MESSAGES = ("Service %r failed to process item", "Unable to connect to", "Still processing items")

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg if isinstance(record.msg, str) else ""
        if not msg.startswith(self.MESSAGES):
            return True
        current = _LINK  # not link(): this runs in Prefect's threads, outside the run's settings context
        return current is None or not current.swallow(record)


_FILTER = _SwallowOutageFailures()
# the loggers Prefect's background senders report their failures on
_SENDER_LOGGERS = ("prefect._internal.concurrency", "prefect.events.clients", "EventsWorker", "APILogWorker")


def hold_background_senders() -> None:
    """From now on, in this process: Prefect's log lines and events wait while the server is down,
    and the failures of its senders are counted instead of logged one by one."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import set_api_log_sink
    from prefect.settings import PREFECT_CLOUD_API_URL

    current = link()
    set_api_log_sink(current.log_sink)
    if current.api_url and not current.api_url.startswith(PREFECT_CLOUD_API_URL.value()):
        # Prefect's own events client (emit_event sends only through its known client classes), told to
        # give up an event after 2 reconnection attempts instead of 10 with 1 s pauses: an event it could
        # not send stays in its unconfirmed buffer and is resent when it reconnects. Its URL is given: the
        # events worker's thread does not see the run's settings. Prefect Cloud's client is left as it is.
        from prefect.events.clients import PrefectEventsClient

        EventsWorker.set_client_override(PrefectEventsClient, api_url=current.api_url, reconnection_attempts=2)
    for name in _SENDER_LOGGERS:
        lg = logging.getLogger(name)
        if _FILTER not in lg.filters:
            lg.addFilter(_FILTER)


def _nudge_events() -> None:
    """Make the events client reconnect now (it resends what it holds on reconnecting) instead of at its
    next periodic checkpoint: by emitting one event of podium's own."""
    try:
        from prefect.events import emit_event

        emit_event(event="podium.prefect.reconnected", resource={"prefect.resource.id": "podium.prefect-link"})
    except Exception:
        logger.debug("could not emit the reconnection event", exc_info=True)


def _drop_held_events() -> tuple[int, int]:
    """(events, log lines) not sent, dropped so that the process exits without waiting for a server that
    is down: at exit, Prefect drains its senders' queues, each item waiting out its retries."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    dropped = {EventsWorker: 0, APILogWorker: 0}
    for kind in dropped:
        for worker in list(getattr(kind, "_instances", {}).values()):  # Prefect's private registry of senders
            if not isinstance(worker, kind):
                continue
            queue = worker._queue
            while True:
                try:
                    item = queue.get_nowait()
                except Exception:
                    break
                queue.task_done()
                if item is not None:
                    dropped[kind] += 1
            client = getattr(worker, "_client", None)
            dropped[kind] += len(getattr(client, "_unconfirmed_events", None) or [])
    return dropped[EventsWorker], dropped[APILogWorker]


@contextlib.contextmanager
def watching() -> Iterator[PrefectLink]:
    """A run's span: the watch probes the server and Prefect's senders are held while it is down."""
    current = link()
    hold_background_senders()
    current.watch()
    try:
        yield current
    finally:
        current.stop_watch()
        if current.down:
            current.hold_queued_logs()
        else:  # nothing held: events after the run go through Prefect's own client, to whatever server is set
            from prefect.events.worker import EventsWorker

            EventsWorker.set_client_override(None)


def record_flow_end(flow_run_id: str | None, summary_line: str, failed: bool = False) -> bool:
    """Record the flow run's end, Completed (or Failed), where the engine cannot: it could not when the
    server was down then, or the process ends before the engine does (its Ray cluster lost). True if the
    server took it."""
    return record_flow_state(flow_run_id, "FAILED" if failed else "COMPLETED", "Failed" if failed else "Completed",
                             summary_line)


def record_flow_state(flow_run_id: str | None, state_type: str, state_name: str, message: str) -> bool:
    """Set a flow run's state (`state_type` a Prefect StateType's value, named `state_name`), forced: its end as
    someone other than its engine knows it (the CLI after an outage, `podium k8s watch` after the RayJob's).
    True if the server took it."""
    if not flow_run_id:
        return False

    def record() -> bool:

        from prefect.client.orchestration import get_client
        from prefect.client.schemas.objects import State, StateType

        with get_client(sync_client=True) as client:
            client.set_flow_run_state(UUID(flow_run_id), State(type=StateType(state_type), name=state_name,
                                                               message=message), force=True)
        return True

    current = link()
    return bool(current.probe(timeout=3.0) and current.call("recording the flow run's end", record))


@dataclass(frozen=True)
class FlowRunSeen:
    """A flow run as a reader outside it sees it: its id, name, state type (None: no state yet) and message."""

    id: str
    name: str
    state_type: str | None
    message: str


def flow_runs_named_like(flow_name: str, name_prefix: str, started_after: datetime) -> list[FlowRunSeen] | None:
    """The flow runs of flow `flow_name` whose name starts with `name_prefix`, expected to start after
    `started_after`, the latest first; None when the server does not answer."""

    def read() -> list[FlowRunSeen]:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import (
            FlowFilter,
            FlowFilterName,
            FlowRunFilter,
            FlowRunFilterExpectedStartTime,
            FlowRunFilterName,
        )
        from prefect.client.schemas.sorting import FlowRunSort

        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])),
                flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=name_prefix),
                                              expected_start_time=FlowRunFilterExpectedStartTime(after_=started_after)),
                sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=50)
        return [FlowRunSeen(str(r.id), r.name, r.state.type.value if r.state else None,
                            (r.state.message or "") if r.state else "")
                for r in runs if r.name.startswith(name_prefix)]

    current = link()
    return current.call("reading flow runs", read) if current.probe(timeout=3.0) else None


def create_ended_flow_run(flow_name: str, flow_run_name: str, state_type: str, state_name: str,
                          message: str) -> str | None:
    """Make a flow run of flow `flow_name` that is already in its end state (a run whose process never started:
    what happened shows in the UI where its flow run would be). Its id, or None when the server does not answer."""

    def create() -> str:
        from prefect import Flow
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.objects import State, StateType

        def never_runs() -> None:
            """The flow this run is recorded under; the run's code is elsewhere."""

        with get_client(sync_client=True) as client:
            run = client.create_flow_run(Flow(never_runs, name=flow_name), name=flow_run_name, tags=["podium"],
                                         state=State(type=StateType(state_type), name=state_name, message=message))
        return str(run.id)

    current = link()
    return current.call("recording a flow run", create) if current.probe(timeout=3.0) else None
