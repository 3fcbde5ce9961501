"""Orchestration state: checkpoint announcements from Ray Train's controller, as the flow reads them."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from prefect.futures import PrefectConcurrentFuture

from podium.core.events import CheckpointEvent, TrainingRestart, TrainingStarted
from podium.prefect_events import emit_checkpoint_event
from podium.training import raytrain

logger = logging.getLogger(__name__)

class CheckpointStream:
    """Announcements from Ray Train's controller, read by the flow while training runs."""

    def __init__(self) -> None:
        self.queue: Any = raytrain.open_event_queue()
        self.sink = raytrain.RayQueueSink(self.queue)
        self.reader: Any = raytrain.EventReader(self.queue)
        self.controller: object | None = None  # Ray Train's controller, once it has started (for a clean stop)
        self._held: list[CheckpointEvent | TrainingRestart] = []  # drained while stopping training, not yet followed

    def follow(self, training: PrefectConcurrentFuture,
               poll_s: float = 0.2) -> Iterator[list[CheckpointEvent | TrainingRestart]]:
        """Yield the announcements (reports, and restarts of the worker group) that arrived, possibly
        none, every `poll_s` seconds at most, until training has ended and the queue is empty."""
        while True:
            done = training.wrapped_future.done()  # in-process: no API round trip per poll
            events, self._held = [*self._held, *self._drain(poll_s)], []
            for event in events:
                if isinstance(event, CheckpointEvent) and event.has_checkpoint:
                    try:
                        emit_checkpoint_event(event)
                    except Exception:  # the Prefect event is a mirror; the flow has the event already
                        logger.exception("could not emit Prefect event for step %d", event.step)
            yield events
            if done and not events:
                return

    def _drain(self, timeout: float) -> list[CheckpointEvent | TrainingRestart]:
        """The announcements that arrived within `timeout`; the controller's handle, when it comes, is kept."""
        events: list[CheckpointEvent | TrainingRestart] = []
        for item in self.reader.drain(timeout):
            if isinstance(item, TrainingStarted):
                self.controller = item.controller
            else:
                events.append(item)
        return events

    def stop_training(self, training: PrefectConcurrentFuture, timeout_s: float = 60.0) -> bool:
        """Abort training (the run is stopping) and wait up to `timeout_s` for its task to end. Checkpoints
        persisted so far stay for the resume. True if training has ended."""

        deadline = time.monotonic() + timeout_s
        try:
            while not training.wrapped_future.done() and time.monotonic() < deadline:
                self._held.extend(self._drain(0.2))  # the controller's handle may be on its way
                if self.controller is not None:
                    raytrain.abort_training(self.controller, timeout_s=max(deadline - time.monotonic(), 1.0))
                    break
        except Exception as exc:  # Ray itself is going (a SIGTERM to the process group reached it too)
            logger.info("training could not be aborted through Ray Train's controller: %s: %s", type(exc).__name__, exc)
        try:
            training.wrapped_future.exception(timeout=max(deadline - time.monotonic(), 0.1))
        except Exception:  # still running, or cancelled before it started
            pass
        return training.wrapped_future.done()

    def close(self) -> None:
        """Stop the queue actor (once; before Ray is released: a Ray call after that would start a new one)."""
        reader, self.reader, self.queue = self.reader, None, None
        if reader is None:
            return
        try:
            reader.close()
        except Exception:
            logger.debug("queue shutdown failed", exc_info=True)
