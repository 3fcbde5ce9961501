"""The deployments podium declares: scheduled training, validation of announced checkpoints, promotion.

    python -m podium.deployments deploy --pool podium [--config podium.toml] [--cron "0 2 * * *"] [--timezone UTC]
                                        [--home /var/lib/podium/home]

registers them against PREFECT_API_URL on a process work pool (created if missing);
`prefect worker start --pool podium` (or `podium worker`) then runs them.

    python -m podium.deployments serve [--config podium.toml] [--cron ...] [--timezone ...] [--ray-address ...]

serves them from this process instead (Prefect's `serve`): runs execute here.

- nightly-training (train-validate-promote): on a cron schedule, the whole pipeline.
- validate-on-event (validate-announced-checkpoint): one run per `podium.checkpoint.persisted` event that a
  training job outside the flow emitted through `podium.prefect_events.PrefectEventSink`; the event's payload
  (`podium.core.events.CheckpointPayload`: run, checkpoint URI, name, step, epoch, metrics, when it was
  persisted) becomes the flow's typed `checkpoint` parameter.
- promote-on-demand (promote-run): promotion of the run named in its `config`.

    python -m podium.deployments notify --notify-webhook URL     (or --notify-slack URL; also on deploy/serve)

declares the automation `podium-news`: every decision podium announces as a Prefect event (promoted,
refused, awaiting approval, approved, rejected, a failed validation, a rollback) is sent through the
notification block `podium-news`: a webhook that gets JSON `{"subject": ..., "text": ...}`, or Slack.

Every deployment's entrypoint is a module path (`podium.flows.pipeline.train_validate_promote`): a worker
runs the podium version installed beside it, with no code pulled from elsewhere.
"""

from __future__ import annotations

import argparse
import os
from datetime import timedelta
from pathlib import Path
from typing import Any, cast
from uuid import UUID

from prefect import serve
from prefect.automations import Automation
from prefect.blocks.abstract import NotificationBlock
from prefect.blocks.notifications import CustomWebhookNotificationBlock, SlackWebhook
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, WorkPoolCreate
from prefect.deployments.runner import RunnerDeployment
from prefect.events import DeploymentEventTrigger, EventTrigger, Posture
from prefect.events.actions import SendNotification
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.schedules import Cron
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.types.entrypoint import EntrypointType
from prefect.workers.process import ProcessWorker

from podium.config import ConfigError, PipelineConfig, load_config
from podium.flows.pipeline import train_validate_promote
from podium.flows.promote import promote_run
from podium.flows.validate_announced import RECORD_LOCK, validate_announced_checkpoint
from podium.prefect_events import EVENT_PERSISTED, NEWS_EVENTS, VALIDATION_BY_DEPLOYMENT, VALIDATION_LABEL
from podium.services import ServiceError, ensure_prefect_server
from podium.settings import PodiumSettings

NIGHTLY = "nightly-training"
NIGHTLY_KEEP_CHECKPOINTS = 3  # checkpoints.keep of the nightly deployment where the config sets none
VALIDATE = "validate-on-event"
PROMOTE_ON_DEMAND = "promote-on-demand"
WORK_POOL = "podium"


def checkpoint_trigger() -> DeploymentEventTrigger:
    """Fire once per checkpoint event that asks for validation, passing its payload as the flow's `checkpoint`.

    The payload's schema is written once, `podium.core.events.CheckpointPayload`: the event carries it, and the
    flow's `checkpoint` parameter is typed with it. The value is a single Jinja expression: Prefect renders it
    with `| tojson` and parses it back, so the flow gets the payload's JSON (`step` an int, `metrics` a dict)
    and its signature validates it.
    """
    return DeploymentEventTrigger(
        name="validate-announced-checkpoint",
        description="One validate-announced-checkpoint run per checkpoint persisted by a job outside the pipeline flow.",
        expect={EVENT_PERSISTED},
        match={"prefect.resource.id": "podium.checkpoint.*", VALIDATION_LABEL: VALIDATION_BY_DEPLOYMENT},
        parameters={"checkpoint": "{{ event.payload }}"},
    )


NEWS = "podium-news"  # the automation, and the notification block it sends through
NEWS_SUBJECT = "podium: {{ event.event }} ({{ event.resource.name }})"
# metric values with four significant digits, as podium prints them everywhere (podium.core.numbers)
NEWS_BODY = (
    "{{ event.event }}: model {{ event.payload.model }}"
    "{% if event.payload.run_name %}, run {{ event.payload.run_name }}{% endif %}"
    "{% if event.payload.version %}; {{ event.payload.version }}{% endif %}"
    "{% if event.payload.mlflow_version %} (MLflow version {{ event.payload.mlflow_version }}){% endif %}"
    "{% if event.payload.step is number %}, step {{ event.payload.step }}{% endif %}"
    "{% if event.payload.value is number %}, {{ event.payload.metric }} = {{ '%.4g' | format(event.payload.value) }}{% endif %}"
    "{% if event.payload.to_version %}; serving went back from {{ event.payload.from_version }} to "
    "{{ event.payload.to_version }}{% endif %}"
    "{% if event.payload.reason %}. {{ event.payload.reason }}{% endif %}"
    "{% if event.payload.failure %}. {{ event.payload.failure }}{% endif %}")


def news_automation(block_document_id: UUID) -> Automation:
    """Forward every decision podium announces (promoted, refused, awaiting approval, approved, rejected, a
    failed validation, a rollback) through one notification block: a webhook, Slack, or any of Prefect's."""
    return Automation(
        name=NEWS,
        description="News of podium's decisions: promotions, refusals, failed validations, rollbacks.",
        trigger=EventTrigger(expect=set(NEWS_EVENTS), match={"prefect.resource.id": "podium.model.*"},
                             posture=Posture.Reactive, threshold=1, within=timedelta(0)),
        actions=[SendNotification(block_document_id=block_document_id, subject=NEWS_SUBJECT, body=NEWS_BODY)],
    )


def notification_block(webhook_url: str | None = None, slack_url: str | None = None) -> NotificationBlock:
    """Slack's incoming webhook, or a plain webhook that gets `{"subject": ..., "text": ...}` as JSON (the
    shape Slack, Mattermost and Teams' workflows take, and any receiver of your own)."""
    if slack_url:
        return SlackWebhook(url=slack_url)
    if not webhook_url:
        raise ValueError("a notification needs a webhook URL or a Slack webhook URL")
    return CustomWebhookNotificationBlock(name=NEWS, url=webhook_url,
                                          json_data={"subject": "{{subject}}", "text": "{{body}}"})


def register_news(block: NotificationBlock) -> UUID:
    """Save the notification block as `podium-news` and (re)create the `podium-news` automation; idempotent."""
    block_id = cast(UUID, block.save(NEWS, overwrite=True))
    try:
        cast(Automation, Automation.read(name=NEWS)).delete()
    except ValueError:  # none yet
        pass
    return cast(UUID, cast(Automation, news_automation(block_id).create()).id)


def nightly_config(config: PipelineConfig) -> PipelineConfig:
    """The config of a nightly run (the deployment's, and the Kubernetes RayJob's: podium.deployments.k8s)."""
    # each scheduled run trains a run of its own: the same name would resume last night's finished run
    nightly = config if "{" in config.run_name else config.model_copy(
        update={"run_name": f"{config.run_name[:90]}-{{date}}"})
    if nightly.checkpoints.keep is None:  # a night's storage stays bounded unless the config says otherwise
        nightly = nightly.model_copy(
            update={"checkpoints": nightly.checkpoints.model_copy(update={"keep": NIGHTLY_KEEP_CHECKPOINTS})})
    return nightly


def build_deployments(config: PipelineConfig, cron: str = "0 2 * * *", timezone: str = "UTC") -> list[RunnerDeployment]:
    """The scheduled training, the event-triggered checkpoint validation and the on-demand promotion.

    `config` is every deployment's default `config` parameter: the validation deployment validates
    with its data and validation settings (the run name comes from the event)."""
    params: dict[str, Any] = {"config": config.model_dump(mode="json")}
    module = EntrypointType.MODULE_PATH
    nightly = train_validate_promote.to_deployment(
        name=NIGHTLY, schedule=Cron(cron, timezone=timezone),
        parameters={"config": nightly_config(config).model_dump(mode="json")},
        tags=["podium", "training"],
        description="Train, validate every checkpoint as it lands, promote the best if it beats the champion.",
        entrypoint_type=module,
    )
    validate = validate_announced_checkpoint.to_deployment(
        name=VALIDATE, triggers=[checkpoint_trigger()], parameters=params, tags=["podium", "validation"],
        description="Record and validate one checkpoint announced by a training job outside the pipeline.",
        entrypoint_type=module,
    )
    promote = promote_run.to_deployment(
        name=PROMOTE_ON_DEMAND, parameters=params, tags=["podium", "promotion"],
        description="Promote the best validated checkpoint of the run named in the config.",
        entrypoint_type=module,
    )
    # to_deployment and apply are sync here (no running event loop): Prefect types them as either
    return [cast(RunnerDeployment, d) for d in (nightly, validate, promote)]


def ensure_record_lock() -> None:
    """Create the global concurrency limit that serializes record creation (see podium.flows.validate_announced)."""

    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(RECORD_LOCK)
        except ObjectNotFound:
            try:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=RECORD_LOCK, limit=1))
            except ObjectAlreadyExists:
                pass


def ensure_work_pool(name: str) -> None:
    """Create a process work pool named `name` unless it exists."""

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
        except ObjectNotFound:
            try:
                client.create_work_pool(WorkPoolCreate(
                    name=name, type=ProcessWorker.type,
                    base_job_template=ProcessWorker.get_default_base_job_template()))
            except ObjectAlreadyExists:
                pass


def register_deployments(deployments: list[RunnerDeployment], work_pool: str = WORK_POOL) -> list[UUID]:
    """Register deployments (and their triggers' automations) on a process work pool; idempotent."""
    ensure_work_pool(work_pool)
    ensure_record_lock()
    return [cast(UUID, d.apply(work_pool_name=work_pool)) for d in deployments]


def load_deployed_config(path: str | None, home: str | None, settings: PodiumSettings) -> PipelineConfig:
    """The deployments' config: its default locations (storage, serving) filled from `home`, the PODIUM_HOME of
    the machines the runs execute on (a Kubernetes work pool's pods: their shared volume's), else this machine's.
    A deployment's parameters travel to the worker as they are: a path of the machine that deployed them would
    mean nothing in a pod."""
    return load_config(path, {}, PodiumSettings(home=Path(home)) if home else settings)


def main(argv: list[str] | None = None) -> None:
    """Register podium's deployments on a work pool, or serve them from this process."""


    parser = argparse.ArgumentParser(prog="python -m podium.deployments", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["deploy", "serve", "notify"])
    parser.add_argument("--config", help="TOML or JSON run configuration (as for `podium run`).")
    parser.add_argument("--cron", default="0 2 * * *", help="Schedule of the training deployment.")
    parser.add_argument("--timezone", default="UTC", help="Time zone of the schedule.")
    parser.add_argument("--pool", default=WORK_POOL, help=f"Process work pool to deploy to (default: {WORK_POOL}).")
    parser.add_argument("--ray-address", help="serve: run on this Ray cluster (sets RAY_ADDRESS).")
    parser.add_argument("--home", help="PODIUM_HOME where the runs execute, which the config's default locations "
                        "are filled from (a Kubernetes work pool's: the shared volume's, e.g. /var/lib/podium/home; "
                        "default: this machine's).")
    parser.add_argument("--notify-webhook", metavar="URL", help="Send news of every decision (promoted, refused, "
                        "a failed validation, a rollback) to this webhook, as JSON {subject, text}.")
    parser.add_argument("--notify-slack", metavar="URL", help="Send that news to this Slack incoming webhook.")
    args = parser.parse_args(argv)
    if args.action == "notify" and not (args.notify_webhook or args.notify_slack):
        parser.error("notify needs --notify-webhook URL or --notify-slack URL")
    settings = PodiumSettings()
    try:
        config = load_deployed_config(args.config, args.home, settings)
        # the configured Prefect API, else the embedded local server (as `podium run` does)
        api_url = ensure_prefect_server(settings.home_dir, settings.prefect_port, settings.prefect_api_url)
    except (ConfigError, ServiceError) as exc:
        raise SystemExit(f"podium: {exc}") from None
    if args.notify_webhook or args.notify_slack:
        with temporary_settings(updates={PREFECT_API_URL: api_url}):
            automation_id = register_news(notification_block(args.notify_webhook, args.notify_slack))
        print(f"automation {NEWS}: {automation_id} (news of every decision, through the notification block {NEWS})")
        if args.action == "notify":
            return
    deployments = build_deployments(config, args.cron, args.timezone)
    if args.action == "deploy":
        with temporary_settings(updates={PREFECT_API_URL: api_url}):
            ids = register_deployments(deployments, args.pool)
        for d, deployment_id in zip(deployments, ids):
            print(f"{d.flow_name}/{d.name}: {deployment_id} (work pool {args.pool})")
        # `prefect deployment run` and `prefect worker` must talk to this server: a shell without this variable
        # reaches another (or a temporary one) and finds no deployment
        print(f"registered on the Prefect server at {api_url}; for the prefect CLI in another shell: "
              f"export PREFECT_API_URL={api_url}")
        return

    # served runs execute in subprocesses of this one, in its environment
    os.environ.update({"PREFECT_API_URL": api_url, "PODIUM_HOME": str(settings.home_dir)})
    if args.ray_address:
        os.environ["RAY_ADDRESS"] = args.ray_address
    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        ensure_record_lock()
        serve(*deployments)
