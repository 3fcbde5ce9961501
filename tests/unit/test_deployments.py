"""Every deployment builds, with its schedule and parameters that validate as the flow's."""

from flows.pipeline import train_validate_promote
from deployments.definitions import NIGHTLY, PROMOTE, build_deployments
from training.config import PipelineConfig


def test_every_deployment_builds_with_schedule_and_valid_parameters():
    config = PipelineConfig(run_name="nightly", data={"train": "/d/train.parquet", "val": "/d/val.parquet"})
    deployments = {d.name: d for d in build_deployments(config, cron="30 3 * * *", timezone="Europe/Paris")}
    assert set(deployments) == {NIGHTLY, PROMOTE}
    nightly = deployments[NIGHTLY]
    (schedule,) = nightly.schedules
    assert schedule.schedule.cron == "30 3 * * *" and schedule.schedule.timezone == "Europe/Paris"
    assert not deployments[PROMOTE].schedules
    for d in deployments.values():
        # the stored parameters are what the flow will be called with: they must validate
        assert PipelineConfig.model_validate(d.parameters["config"]) == config
        assert "config" in d._parameter_openapi_schema.properties
    assert nightly.flow_name == train_validate_promote.name
