"""Orchestration state: checkpoint announcements from Ray Train's controller, as the flow reads them."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prefect.futures import PrefectConcurrentFuture

from podium.tasks.events import emit_checkpoint_event
from podium.training import raytrain
from podium.training.events import CheckpointEvent, TrainingRestart

logger = logging.getLogger(__name__)

class CheckpointStream:
    """Announcements from Ray Train's controller, read by the flow while training runs."""

    def __init__(self) -> None:
        self.queue = raytrain.open_event_queue()
        self.sink = raytrain.RayQueueSink(self.queue)

    def follow(self, training: PrefectConcurrentFuture,
               poll_s: float = 0.2) -> Iterator[list[CheckpointEvent | TrainingRestart]]:
        """Yield the announcements (reports, and restarts of the worker group) that arrived, possibly
        none, every `poll_s` seconds at most, until training has ended and the queue is empty."""
        while True:
            done = training.wrapped_future.done()  # in-process: no API round trip per poll
            events = raytrain.drain(self.queue, timeout=poll_s)
            for event in events:
                if isinstance(event, CheckpointEvent) and event.has_checkpoint:
                    try:
                        emit_checkpoint_event(event)
                    except Exception:  # the Prefect event is a mirror; the flow has the event already
                        logger.exception("could not emit Prefect event for step %d", event.step)
            yield events
            if done and not events:
                return

    def close(self) -> None:
        """Stop the queue actor."""
        try:
            self.queue.shutdown()
        except Exception:
            logger.debug("queue shutdown failed", exc_info=True)
