"""Every deployment builds: schedule, trigger and parameters that validate as the flows' own."""

from __future__ import annotations

import copy
import pickle
import uuid
from dataclasses import replace

import pytest
from prefect.events.schemas.events import Event
from prefect.server.events.actions import RunDeployment
from prefect.server.events.schemas.automations import EventTrigger as ServerEventTrigger
from prefect.server.events.schemas.events import ReceivedEvent
from prefect.utilities.schema_tools.hydration import HydrationContext, hydrate

from podium.config import CheckpointsConfig, PipelineConfig
from podium.core.events import CheckpointEvent, ValidationRequest
from podium.deployments.definitions import (
    NIGHTLY,
    NIGHTLY_KEEP_CHECKPOINTS,
    PROMOTE_ON_DEMAND,
    VALIDATE,
    build_deployments,
    load_deployed_config,
)
from podium.flows.pipeline import train_validate_promote
from podium.flows.promote import promote_run
from podium.flows.validate_announced import validate_announced_checkpoint
from podium.prefect_events import EVENT_PERSISTED, PrefectEventSink, checkpoint_resource
from podium.settings import PodiumSettings
from podium.training.raytrain import CheckpointAnnouncer

CONFIG = PipelineConfig(run_name="nightly", data={"train": "/d/train.parquet", "val": "/d/val.parquet"})
CHECKPOINT = CheckpointEvent(run_name="ext-job", step=188, metrics={"loss": 0.25, "accuracy": 0.9},
                             checkpoint_uri="/shared/storage/ext-job/checkpoint_00000188",
                             checkpoint_name="checkpoint_00000188", epoch=1)


@pytest.fixture(scope="module")
def deployments():
    return {d.name: d for d in build_deployments(CONFIG, cron="30 3 * * *", timezone="Europe/Paris")}


def test_every_deployment_builds_with_schedule_and_valid_parameters(deployments):
    assert set(deployments) == {NIGHTLY, VALIDATE, PROMOTE_ON_DEMAND}
    nightly = deployments[NIGHTLY]
    (schedule,) = nightly.schedules
    assert schedule.schedule.cron == "30 3 * * *" and schedule.schedule.timezone == "Europe/Paris"
    assert not deployments[PROMOTE_ON_DEMAND].schedules and not deployments[VALIDATE].schedules
    for name, d in deployments.items():
        # the stored parameters are what the flow will be called with: they must validate
        stored = PipelineConfig.model_validate(d.parameters["config"])
        # the nightly run gets a dated name of its own (the same name would resume last night's run), and keeps
        # the best checkpoints only (its storage stays bounded night after night)
        expected = CONFIG.model_copy(update={"run_name": f"{CONFIG.run_name}-{{date}}", "checkpoints": CheckpointsConfig(
            keep=NIGHTLY_KEEP_CHECKPOINTS)}) if name == NIGHTLY else CONFIG
        assert stored == expected
        assert "config" in d._parameter_openapi_schema.properties
    flows = {NIGHTLY: train_validate_promote, VALIDATE: validate_announced_checkpoint, PROMOTE_ON_DEMAND: promote_run}
    for name, flow in flows.items():
        # module-path entrypoints: a worker runs the podium installed beside it
        assert deployments[name].flow_name == flow.name
        assert deployments[name].entrypoint == f"{flow.fn.__module__}.{flow.fn.__name__}"


def _server_event(event: Event) -> ReceivedEvent:
    return ReceivedEvent.model_validate(event.model_dump(mode="json"))


def test_validation_trigger_fires_on_announced_checkpoints_only(deployments):
    (trigger,) = deployments[VALIDATE].triggers
    trigger.set_deployment_id(uuid.uuid4())
    server_trigger = ServerEventTrigger.model_validate(trigger.as_automation().trigger.model_dump(mode="json"))
    announced = PrefectEventSink("http://prefect.invalid/api").prefect_event(CHECKPOINT)
    assert announced.event == EVENT_PERSISTED
    assert server_trigger.covers(_server_event(announced))
    # the pipeline flow's own event (it validates that checkpoint itself) must not trigger a second validation
    in_flow = Event(event=EVENT_PERSISTED, resource=checkpoint_resource(CHECKPOINT), payload=CHECKPOINT.to_dict())
    assert not server_trigger.covers(_server_event(in_flow))
    mirrored = PrefectEventSink("http://prefect.invalid/api", request_validation=False).prefect_event(CHECKPOINT)
    assert not server_trigger.covers(_server_event(mirrored))


def test_trigger_renders_the_event_into_typed_flow_parameters(deployments):
    (trigger,) = deployments[VALIDATE].triggers
    announced = PrefectEventSink("http://prefect.invalid/api").prefect_event(CHECKPOINT)
    # what Prefect's RunDeployment action does with the trigger's parameters and the triggering event
    params = copy.deepcopy(trigger.parameters)
    RunDeployment._upgrade_v1_templates(params)
    rendered = hydrate(params, HydrationContext(render_jinja=True, raise_on_error=True,
                                                jinja_context={"event": _server_event(announced)}))
    assert rendered == {"checkpoint": {"run_name": "ext-job", "checkpoint_uri": CHECKPOINT.checkpoint_uri,
                                       "checkpoint_name": "checkpoint_00000188", "step": 188, "epoch": 1,
                                       "metrics": {"loss": 0.25, "accuracy": 0.9}, "validation_requested": None,
                                       "persisted_at": CHECKPOINT.persisted_at}}
    assert isinstance(rendered["checkpoint"]["step"], int)
    # a report that said validation=False reaches the flow as such: its checkpoint is recorded as skipped
    declined = replace(CHECKPOINT, validation=ValidationRequest(requested=False, stated=True))
    said_no = hydrate(copy.deepcopy(params), HydrationContext(render_jinja=True, raise_on_error=True, jinja_context={
        "event": _server_event(PrefectEventSink("http://prefect.invalid/api").prefect_event(declined))}))
    assert said_no["checkpoint"]["validation_requested"] is False
    # merged with the deployment's default config, they validate against the flow's signature: the flow gets the
    # announced event back whole (when it was persisted included)
    validated = validate_announced_checkpoint.validate_parameters({**deployments[VALIDATE].parameters, **rendered})
    assert validated["checkpoint"].event() == CHECKPOINT and validated["config"] == CONFIG
    declined_back = validate_announced_checkpoint.validate_parameters({**deployments[VALIDATE].parameters, **said_no})
    assert declined_back["checkpoint"].event() == declined


def test_prefect_event_sink_travels_to_the_ray_train_controller():
    """Ray pickles RunConfig callbacks into the controller: the sink must survive it, without secrets."""
    announcer = CheckpointAnnouncer("ext-job", [PrefectEventSink("http://prefect.invalid/api")])
    (sink,) = pickle.loads(pickle.dumps(announcer)).sinks
    assert sink.api_url == "http://prefect.invalid/api"
    assert set(vars(sink)) == {"api_url", "labels", "timeout_s"}
    # a report without a checkpoint is not an event: nothing is sent (the URL is unreachable)
    sink.put(CheckpointEvent(run_name="ext-job", step=3, metrics={"loss": 1.0}))


def test_run_name_placeholders_give_each_scheduled_run_its_own_name():
    from datetime import datetime, timezone

    config = PipelineConfig(run_name="churn-{date}")
    assert config.at(datetime(2026, 11, 21, 2, 0, tzinfo=timezone.utc)).run_name == "churn-20261121"
    assert config.at(datetime(2026, 11, 22, 2, 0, tzinfo=timezone.utc)).run_name == "churn-20261122"
    assert PipelineConfig(run_name="x-{datetime}").at(datetime(2026, 1, 2, 3, 4, 5)).run_name == "x-20260102-030405"


def test_deploy_fills_default_locations_from_the_workers_home_not_this_machines(tmp_path, monkeypatch):
    """`deploy --home /var/lib/podium/home`: a Kubernetes work pool's flow runs get locations on their shared
    volume; no path of the machine (or folder) that deployed them reaches a deployment's parameters."""
    monkeypatch.chdir(tmp_path)
    config_file = tmp_path / "podium.toml"
    config_file.write_text('run_name = "fraud"\n[data]\ntrain = "/var/lib/podium/home/data/train.parquet"\n'
                           'val = "/var/lib/podium/home/data/val.parquet"\n')
    here = PodiumSettings(home=tmp_path / ".podium")
    config = load_deployed_config(str(config_file), "/var/lib/podium/home", here)
    (nightly, *_) = build_deployments(config)
    assert str(tmp_path) not in str(nightly.parameters)
    assert nightly.parameters["config"]["storage"].startswith("/var/lib/podium/home/")
    assert str(tmp_path) in load_deployed_config(str(config_file), None, here).storage  # without --home: here
