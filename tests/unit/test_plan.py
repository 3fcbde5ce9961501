"""plan_run: the preflight that names the field before anything trains (plain function, no Prefect server)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from podium.config import ConfigError, PipelineConfig, build_config
from podium.tasks.plan import RunPlan, plan_run


@pytest.fixture
def make_config(tmp_path: Path, demo_data: tuple[str, str]):
    """make_config(data={...}, training={...}, ...) -> a valid config on the demo data with those sections merged in."""
    base: dict[str, Any] = {"storage": str(tmp_path / "storage"), "serving": str(tmp_path / "serving"),
                            "data": {"train": demo_data[0], "val": demo_data[1]}}

    def make(**overrides: Any) -> PipelineConfig:
        merged = {k: {**base.get(k, {}), **v} if isinstance(v, dict) else v for k, v in overrides.items()}
        return build_config({**base, **merged})

    return make


def plan_error(config: PipelineConfig) -> str:
    with pytest.raises(ConfigError) as err:
        plan_run(config)
    return str(err.value)


def test_plan_on_demo_data(make_config, tmp_path):
    plan = plan_run(make_config(training={"epochs": 2}))
    assert isinstance(plan, RunPlan)
    assert plan.loop_config["feature_columns"] == ["f00", "f01", "f02"]
    assert plan.loop_config["num_classes"] == 3
    assert plan.loop_config["epochs"] == 2
    assert plan.train_loop == "podium.training.loop:train_loop_per_worker"
    assert plan.validate_kwargs["feature_columns"] == ["f00", "f01", "f02"]
    for location in (plan.storage, plan.serving):  # created, and the write probe left nothing behind
        assert os.path.isabs(location) and os.listdir(location) == []


def test_missing_data_names_the_field_and_the_path(make_config, tmp_path):
    missing = str(tmp_path / "nowhere" / "train.parquet")
    assert f"data.train = {missing!r}: no such file or directory" in plan_error(make_config(data={"train": missing}))


def test_empty_locations_and_bad_import_paths_are_reported_together(make_config):
    message = plan_error(make_config(data={"val": ""}, training={"train_loop": "podium_no_such_module:loop"}))
    assert "data.val is empty" in message
    assert "training.train_loop = 'podium_no_such_module:loop': cannot import module" in message


def test_train_loop_attribute_that_does_not_exist(make_config):
    message = plan_error(make_config(training={"train_loop": "podium.training.loop:no_such_loop"}))
    assert "training.train_loop = 'podium.training.loop:no_such_loop': module 'podium.training.loop' has no attribute" in message


def test_metric_the_builtin_loop_does_not_report(make_config):
    message = plan_error(make_config(promotion={"metric": "f1"}))
    assert re.search(r"promotion.metric = 'f1': the built-in loop and validation report \[.*'val_loss'", message)


def test_own_validation_may_report_any_metric(make_config):
    config = make_config(promotion={"metric": "f1"}, validation={"fn": "podium.training.checkpoint:load_model"})
    assert plan_run(config).config.promotion.metric == "f1"


def test_val_features_must_match_train_features(make_config, write_parquet):
    val = write_parquet("other.parquet", f00=[1.0], g=[2.0], f02=[3.0], label=[0])
    assert "data.val: feature columns ['f00', 'g', 'f02'] differ" in plan_error(make_config(data={"val": val}))


def test_serving_that_cannot_be_created(make_config, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    serving = str(blocker / "serving")
    assert f"serving = {serving!r}: not writable" in plan_error(make_config(serving=serving))


LINEAR = "ray.train.examples.pytorch.torch_linear_example:train_func"


def test_a_users_loop_gets_exactly_its_config_and_podiums_facts_under_one_key(make_config):
    plan = plan_run(make_config(training={"train_loop": LINEAR, "train_loop_config": {"lr": 0.1, "epochs": 2}},
                                validation={"fn": "podium.training.checkpoint:load_model"}))
    podium_facts = plan.loop_config.pop("podium")
    assert plan.loop_config == {"lr": 0.1, "epochs": 2}  # no hidden_size, batch_size, seed... of the built-in loop
    assert podium_facts["run_name"] == "podium-demo" and podium_facts["train_data"].endswith("train.parquet")


def test_a_users_loop_and_function_need_no_data(make_config):
    plan = plan_run(make_config(data={"train": "", "val": ""}, training={"train_loop": LINEAR},
                                validation={"fn": "podium.training.checkpoint:load_model"}))
    assert plan.loop_config == {"podium": {"run_name": "podium-demo", "label_column": "label"}}


def test_settings_that_would_not_reach_the_loop_are_refused(make_config):
    message = plan_error(make_config(training={"train_loop": LINEAR, "epochs": 7, "train_loop_config": {"podium": 1}}))
    assert "training.epochs = 7: a setting of the built-in loop" in message and "--loop-config epochs=7" in message
    assert "key 'podium' is given twice" in message
    assert "training.train_loop_config = {...}: it is for a loop of your own" in plan_error(
        make_config(training={"train_loop_config": {"lr": 0.1}}))


def test_a_validation_function_whose_arguments_nothing_fills_is_refused_naming_them(make_config):
    # torch_linear_example's loop never sends fn_kwargs: train_run_name and epoch can come from nowhere
    message = plan_error(make_config(training={"train_loop": LINEAR},
                                     validation={"fn": "podium_validation_fns:needs_run_and_epoch"}))
    assert "requires train_run_name, epoch, which nothing fills" in message
    ok = make_config(training={"train_loop": LINEAR}, validation={
        "fn": "podium_validation_fns:needs_run_and_epoch", "kwargs": {"train_run_name": "a", "epoch": 1}})
    assert plan_run(ok).validate_kwargs["run_name"] == "podium-demo"
    assert "first positional argument" in plan_error(make_config(validation={"fn": "podium_validation_fns:no_checkpoint"}))
