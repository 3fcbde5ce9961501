"""Checkpoint announcements as they reach the orchestrating process, mirrored as Prefect events."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from prefect.events import Event, emit_event
from prefect.events.clients import get_events_client
from prefect.settings import PREFECT_API_URL, temporary_settings

from podium.core.events import STEP_KEYS, CheckpointEvent, TrainingRestart
from podium.core.numbers import format_number

logger = logging.getLogger(__name__)

EVENT_PERSISTED = "podium.checkpoint.persisted"
# Resource label of events whose checkpoint nobody else validates: the checkpoint-validation
# deployment triggers on it. The flow's own events lack it, as the flow validates those itself.
VALIDATION_LABEL = "podium.validation"
VALIDATION_BY_DEPLOYMENT = "deployment"


def checkpoint_resource(event: CheckpointEvent, **labels: str) -> dict[str, str]:
    """The Prefect resource a checkpoint event is about: `podium.checkpoint.<run>.<step>`."""
    return {
        "prefect.resource.id": f"podium.checkpoint.{event.run_name}.{event.step}",
        "prefect.resource.name": f"{event.run_name} step {event.step}",
        "podium.run_name": event.run_name,
        "podium.step": str(event.step),
        **({"podium.epoch": str(event.epoch)} if event.epoch is not None else {}),
        **({"podium.checkpoint_uri": event.checkpoint_uri} if event.checkpoint_uri else {}),
        **labels,
    }


def checkpoint_related(event: CheckpointEvent) -> list[dict[str, str]]:
    """The checkpoint's URI and training metrics as related resources of its event.

    The Prefect UI's event page shows related resources (v1 by id, v2 by name) but the payload
    only as raw JSON and the resource's labels not at all: this is how the step's URI and
    metrics become readable there."""
    related = [{"prefect.resource.id": f"podium.checkpoint_uri={event.checkpoint_uri}",
                "prefect.resource.role": "checkpoint", "prefect.resource.name": event.checkpoint_uri or ""}]
    related += metrics_related(event.metrics)
    return related[:20] if event.checkpoint_uri else related[1:21]


def metrics_related(metrics: dict[str, float]) -> list[dict[str, str]]:
    """Metrics as related resources of an event, by name; the step left out (it names the checkpoint)."""
    return [{"prefect.resource.id": f"podium.metric.{k}={format_number(v)}", "prefect.resource.role": "metric",
             "prefect.resource.name": f"{k} = {format_number(v)}"} for k, v in sorted(metrics.items()) if k not in STEP_KEYS]


def emit_checkpoint_event(event: CheckpointEvent) -> None:
    """Emit `podium.checkpoint.persisted` to Prefect's event feed (automations can trigger on it)."""
    emit_event(event=EVENT_PERSISTED, resource=checkpoint_resource(event), related=checkpoint_related(event),
               payload=event.to_dict())


class PrefectEventSink:
    """A checkpoint sink for training jobs outside a podium flow: each persisted checkpoint becomes a
    `podium.checkpoint.persisted` event, which the checkpoint-validation deployment triggers on.

    Give it to `training.raytrain.CheckpointAnnouncer` in your own Ray Train job. It is pickled into
    Ray Train's controller and emits from there, synchronously, so an event is delivered before
    training goes on (within `timeout_s`; a failure is logged and never stops training).

    The Prefect API URL is the one configured where the sink is built (the driver), unless given.
    Credentials are never pickled: the controller reads PREFECT_API_AUTH_STRING (or Prefect Cloud's
    PREFECT_API_KEY) from its own environment, the Ray node's. Set them there, not in the job's
    runtime_env: Ray passes its env_vars to worker processes on their command line.
    """

    def __init__(self, api_url: str | None = None, *, request_validation: bool = True, timeout_s: float = 30.0):
        self.api_url = api_url or PREFECT_API_URL.value()
        if not self.api_url:
            raise ValueError("PrefectEventSink needs a Prefect API: pass api_url or set PREFECT_API_URL")
        self.labels = {VALIDATION_LABEL: VALIDATION_BY_DEPLOYMENT} if request_validation else {}
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"PrefectEventSink({self.api_url!r})"

    def prefect_event(self, event: CheckpointEvent) -> Event:
        """The Prefect event this sink emits for a persisted checkpoint."""
        return Event(event=EVENT_PERSISTED, resource=checkpoint_resource(event, **self.labels),
                     related=checkpoint_related(event), payload=event.to_dict())

    def put(self, event: CheckpointEvent | TrainingRestart) -> None:
        """Emit the event of a persisted checkpoint; reports without a checkpoint, and restarts of the
        worker group (logged by Ray Train itself), are not events."""
        if not isinstance(event, CheckpointEvent) or not event.has_checkpoint:
            return
        # the controller calls this from inside its event loop: send from a thread of our own
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="podium-event")
        try:
            pool.submit(self._send, self.prefect_event(event)).result(timeout=self.timeout_s)
        finally:
            pool.shutdown(wait=False)

    def _send(self, event: Event) -> None:
        async def send() -> None:
            async with get_events_client(reconnection_attempts=3) as client:
                await client.emit(event)

        with temporary_settings(updates={PREFECT_API_URL: self.api_url}):
            asyncio.run(send())


# What podium decided, as Prefect events an automation can forward (deployments.definitions.news_automation)
EVENT_PROMOTED = "podium.promotion.promoted"
EVENT_REFUSED = "podium.promotion.refused"
EVENT_AWAITING_APPROVAL = "podium.promotion.awaiting-approval"
EVENT_SHADOWING = "podium.promotion.shadowing"  # a candidate in shadow (promotion.rollout = "shadow")
EVENT_APPROVED = "podium.promotion.approved"
EVENT_REJECTED = "podium.promotion.rejected"
EVENT_VALIDATION_FAILED = "podium.validation.failed"
EVENT_ROLLED_BACK = "podium.serving.rolled-back"
NEWS_EVENTS = (EVENT_PROMOTED, EVENT_REFUSED, EVENT_AWAITING_APPROVAL, EVENT_SHADOWING, EVENT_APPROVED,
               EVENT_REJECTED, EVENT_VALIDATION_FAILED, EVENT_ROLLED_BACK)


def model_resource(model: str) -> dict[str, str]:
    """The Prefect resource a decision is about: the model, `podium.model.<model>`."""
    return {"prefect.resource.id": f"podium.model.{model}", "prefect.resource.name": model, "podium.model": model}


def news_related(run_name: str | None, step: int | None, metrics: dict[str, float] | None = None,
                 mlflow_version: str | None = None, model: str | None = None) -> list[dict[str, str]]:
    """The run, the checkpoint, the registered version and the metrics a decision is about, as related
    resources (the Prefect UI shows them by name on the event's page)."""
    related: list[dict[str, str]] = []
    if run_name:
        related.append({"prefect.resource.id": f"podium.run.{run_name}", "prefect.resource.role": "run",
                        "prefect.resource.name": run_name})
    if run_name and step is not None:
        related.append({"prefect.resource.id": f"podium.checkpoint.{run_name}.{step}",
                        "prefect.resource.role": "checkpoint", "prefect.resource.name": f"{run_name} step {step}"})
    if model and mlflow_version:
        related.append({"prefect.resource.id": f"mlflow.model-version.{model}.{mlflow_version}",
                        "prefect.resource.role": "model-version",
                        "prefect.resource.name": f"{model} version {mlflow_version}"})
    return (related + metrics_related(metrics or {}))[:20]


def emit_news(event: str, resource: dict[str, str], related: list[dict[str, str]], payload: dict) -> None:
    """Emit one of NEWS_EVENTS where a Prefect API is configured. Never raises: news of a decision must not
    undo it (Prefect's events client sends in the background and drops what a down server cannot take)."""
    if not PREFECT_API_URL.value():
        return
    try:
        emit_event(event=event, resource=resource, related=related, payload=payload)
    except Exception:
        logger.warning("the Prefect event %s could not be sent", event, exc_info=True)
