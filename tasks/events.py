"""Checkpoint announcements as they reach the orchestrating process, mirrored as Prefect events."""

from __future__ import annotations

import logging
from typing import Iterator

from prefect.events import emit_event
from prefect.futures import PrefectConcurrentFuture

from training import raytrain
from training.events import CheckpointEvent

logger = logging.getLogger(__name__)

EVENT_PERSISTED = "podium.checkpoint.persisted"


def emit_checkpoint_event(event: CheckpointEvent) -> None:
    """Emit `podium.checkpoint.persisted` to Prefect's event feed (automations can trigger on it)."""
    emit_event(
        event=EVENT_PERSISTED,
        resource={
            "prefect.resource.id": f"podium.checkpoint.{event.run_name}.{event.step}",
            "prefect.resource.name": f"{event.run_name} step {event.step}",
            "podium.run_name": event.run_name,
            "podium.step": str(event.step),
        },
        payload=event.to_dict(),
    )


class CheckpointStream:
    """Announcements from Ray Train's controller, read by the flow while training runs."""

    def __init__(self) -> None:
        self.queue = raytrain.open_event_queue()
        self.sink = raytrain.RayQueueSink(self.queue)

    def follow(self, training: PrefectConcurrentFuture, poll_s: float = 0.2) -> Iterator[list[CheckpointEvent]]:
        """Yield the announcements that arrived (possibly none) every `poll_s` seconds at most,
        until training has ended and the queue is empty."""
        while True:
            done = training.wrapped_future.done()  # in-process: no API round trip per poll
            events = raytrain.drain(self.queue, timeout=poll_s)
            for event in events:
                if event.has_checkpoint:
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
