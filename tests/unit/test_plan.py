"""plan_run: the preflight that names the field before anything trains (plain function, no Prefect server)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from podium.config import PipelineConfig, build_config
from podium.errors import ConfigError
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
    assert re.search(r"promotion.metric = 'f1': no such metric; the built-in loop and validation report \[.*'val_loss'", message)


def test_a_threshold_or_guard_on_a_metric_the_builtins_do_not_report_is_refused_listing_those_they_do(make_config):
    # a typo (val_acuracy) trained, then failed the threshold with "candidate none", every night
    message = plan_error(make_config(promotion={"thresholds": {"val_acuracy": {"min": 0.9}},
                                                "guards": {"val_los": {"max_increase": 0.1}}}))
    assert re.search(r"promotion.thresholds.val_acuracy: no such metric; the built-in loop and validation report "
                     r"\[.*'val_accuracy'", message), message
    assert "promotion.guards.val_los: no such metric" in message
    plan_run(make_config(promotion={"thresholds": {"val_accuracy": {"min": 0.1}}, "guards": {"val_loss": {
        "max_increase": 0.1}}}))


def test_confidence_with_a_validation_function_that_cannot_give_rows_is_refused_unless_point_values_do(make_config):
    fns = "podium_validation_fns"
    without = make_config(promotion={"metric": "val_loss", "confidence": 0.95},
                          validation={"fn": f"{fns}:metrics_only"})
    message = plan_error(without)
    assert (f"promotion.confidence = 0.95 needs per-row values, and validation.fn = '{fns}:metrics_only' takes no "
            "per_row argument") in message and "promotion.confidence_without_rows = 'point'" in message
    plan_run(without.model_copy(update={"promotion": without.promotion.model_copy(
        update={"confidence_without_rows": "point"})}))
    plan_run(make_config(promotion={"metric": "val_loss", "confidence": 0.95},
                         validation={"fn": f"{fns}:metrics_with_rows"}))


def test_own_validation_may_report_any_metric(make_config):
    config = make_config(promotion={"metric": "f1"}, validation={"fn": "podium.training.checkpoint:load_model"})
    assert plan_run(config).config.promotion.metric == "f1"


def test_val_features_must_match_train_features(make_config, write_parquet):
    val = write_parquet("other.parquet", f00=[1.0], g=[2.0], f02=[3.0], label=[0])
    message = plan_error(make_config(data={"val": val}))
    assert "data.val has no feature column(s) ['f01'], which data.train has" in message
    assert "data.val has column(s) ['g'] that data.train has not" in message
    # a column the model needs is never allowed to be missing; an extra one is, and is reported
    message = plan_error(make_config(data={"val": val, "allow": ["schema_mismatch"]}))
    assert "['f01']" in message and "'g'" not in message


def test_val_columns_in_another_order_are_fine(make_config, write_parquet):
    val = write_parquet("other.parquet", f02=[3.0], label=[0], f00=[1.0], f01=[2.0])
    assert plan_run(make_config(data={"val": val})).validate_kwargs["feature_columns"] == ["f00", "f01", "f02"]


def test_val_column_of_another_type_is_refused_or_reported(make_config, write_parquet):
    val = write_parquet("other.parquet", f00=[1.0], f01=[2], f02=[3.0], label=[0])
    message = plan_error(make_config(data={"val": val}))
    assert "data.val: column 'f01' is integer, data.train has it as floating" in message
    assert "data.allow = ['schema_mismatch']" in message
    plan = plan_run(make_config(data={"val": val, "allow": ["schema_mismatch"]}))
    assert plan.data_warnings == ["data.val: column 'f01' is integer, data.train has it as floating"]


def test_nan_or_inf_in_a_feature_is_refused_naming_the_column(make_config, write_parquet):
    nan = float("nan")
    train = write_parquet("train.parquet", f00=[1.0, 2.0, 3.0], f01=[1.0, nan, 2.0], f02=[0.0, 1.0, float("inf")],
                          label=[0, 1, 2])
    message = plan_error(make_config(data={"train": train}))
    assert "data.train: feature column 'f01' has 1 NaN, infinite or null value(s) in 3 rows" in message
    assert "data.train: feature column 'f02' has 1 NaN" in message
    assert "'f00'" not in message and "data.allow = ['non_finite_features']" in message
    plan = plan_run(make_config(data={"train": train, "allow": ["non_finite_features"]}))
    assert len(plan.data_warnings) == 2


def test_val_labels_outside_the_training_labels_are_refused(make_config, write_parquet):
    train = write_parquet("train.parquet", f00=[1.0, 2.0], f01=[1.0, 2.0], f02=[1.0, 2.0], label=[1, 4])
    val = write_parquet("val.parquet", f00=[1.0, 2.0], f01=[1.0, 2.0], f02=[1.0, 2.0], label=[0, 3])
    message = plan_error(make_config(data={"train": train, "val": val}))
    assert "data.val: label column 'label' has values 0..3, outside data.train's 1..4" in message
    plan = plan_run(make_config(data={"train": train, "val": val, "allow": ["unseen_labels"]}))
    assert plan.loop_config["num_classes"] == 5 and "outside data.train's 1..4" in plan.data_warnings[0]


def test_serving_that_cannot_be_created(make_config, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    serving = str(blocker / "serving")
    said = plan_error(make_config(serving=serving))
    assert f"serving = {serving!r}: a file ({blocker}) stands where serving expects a folder" in said, said
    assert not (tmp_path / "storage").exists() and not (tmp_path / ".podium").exists()  # refused before either is made


# --- resuming a run: the model's shape cannot change, the rest takes effect ----------------------

def _persist_checkpoint(plan: RunPlan, step: int, epoch: int) -> None:
    """What Ray Train leaves in storage once it has persisted a checkpoint of the run: its run snapshot."""
    run_dir = Path(plan.storage) / plan.run_name
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "checkpoint_manager_snapshot.json").write_text(json.dumps({"checkpoint_results": [
        {"checkpoint_dir_name": f"checkpoint_{step:08d}", "metrics": {"step": step, "epoch": epoch}}]}))


def test_a_fresh_run_has_nothing_to_compare(make_config):
    from podium.tasks.resume import check_resume

    assert check_resume(plan_run(make_config())) is None


def test_a_resume_that_changes_epochs_says_so(make_config):
    from podium.tasks.resume import check_resume, record_run_settings

    first = plan_run(make_config(training={"epochs": 40}))
    record_run_settings(first)
    _persist_checkpoint(first, step=94, epoch=2)
    resume = check_resume(plan_run(make_config(training={"epochs": 4})))
    assert (resume.from_step, resume.from_epoch, resume.changes) == (94, 2, {"training.epochs": ("40", "4")})


@pytest.mark.parametrize("change, setting", [
    ({"data": {"feature_columns": ["f00", "f01"]}}, 'data.feature_columns = ["f00", "f01"] (the run was trained '
                                                    'with ["f00", "f01", "f02"])'),
    ({"training": {"hidden_size": 32}}, "training.hidden_size = 32 (the run was trained with 64)"),
    ({"training": {"train_loop": "podium_user_code:train_func"}}, "training.train_loop = "),
])
def test_a_resume_that_changes_the_models_shape_is_refused_naming_the_setting(make_config, change, setting,
                                                                             monkeypatch):
    from podium.tasks.resume import check_resume, record_run_settings

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "integration"))  # podium_user_code
    first = plan_run(make_config())
    record_run_settings(first)
    _persist_checkpoint(first, step=94, epoch=2)
    with pytest.raises(ConfigError) as err:
        check_resume(plan_run(make_config(**change)))
    message = str(err.value)
    assert "resumes from its checkpoint at step 94, but this start changes settings that shape the model" in message
    assert setting in message and "start a new run (--run-name podium-demo-2)" in message
LINEAR = "ray.train.examples.pytorch.torch_linear_example:train_func"


def test_a_users_loop_gets_exactly_its_config_and_podiums_facts_under_one_key(make_config):
    plan = plan_run(make_config(training={"train_loop": LINEAR, "train_loop_config": {"lr": 0.1, "epochs": 2}},
                                validation={"fn": "podium.training.checkpoint:load_model"}))
    assert plan.data_facts is plan.loop_config["podium"]  # what the served model is built from
    podium_facts = plan.loop_config.pop("podium")
    assert plan.loop_config == {"lr": 0.1, "epochs": 2}  # no hidden_size, batch_size, seed... of the built-in loop
    assert podium_facts["run_name"] == "podium-demo" and podium_facts["train_data"].endswith("train.parquet")
    # what podium read of the data it was given, as the built-in loop gets it
    assert podium_facts["feature_columns"] == plan_run(make_config()).loop_config["feature_columns"]
    assert podium_facts["num_classes"] >= 2


def test_data_only_a_users_loop_reads_may_be_anything(make_config, tmp_path):
    """Files given to your own loop that are not podium's tabular Parquet give no facts and no error."""
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.png").write_bytes(b"not parquet")
    plan = plan_run(make_config(data={"train": str(tmp_path / "images"), "val": str(tmp_path / "images")},
                                training={"train_loop": LINEAR}, validation={"fn": "podium.training.checkpoint:load_model"}))
    assert "feature_columns" not in plan.data_facts and plan.data_facts["train_data"].endswith("images")


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
def test_the_loop_learns_the_row_count_from_the_footers(make_config):
    plan = plan_run(make_config())
    assert plan.loop_config["train_rows"] == 60  # demo data: 60 training rows
    assert (plan.loop_config["shuffle"], plan.loop_config["shuffle_window_rows"]) == ("local", 65536)


def test_fewer_rows_than_workers_is_refused(make_config, write_parquet):
    tiny = write_parquet("tiny.parquet", f00=[1.0, 2.0], f01=[0.0, 1.0], f02=[3.0, 4.0], label=[0, 1])
    message = plan_error(make_config(data={"train": tiny}, scaling={"num_workers": 3}))
    assert f"data.train = {tiny!r}: 2 rows for scaling.num_workers = 3: expected at least one row per worker" in message


def test_shuffle_and_data_cpus_are_checked():
    with pytest.raises(ConfigError, match=re.escape("training.shuffle = 'sorted'")):
        build_config({"training": {"shuffle": "sorted"}})
    with pytest.raises(ConfigError, match=re.escape("scaling.data_cpus = 0")):
        build_config({"scaling": {"data_cpus": 0}})


def test_planning_the_same_files_again_reads_no_rows(make_config, demo_data, monkeypatch):
    """`podium run` plans before anything starts and its flow plans again: the second plan reuses the first
    one's inspection (the NaN scan reads every float value) while the files' digest is the same."""
    import pyarrow.parquet as pq

    import podium.tasks.plan as plan_module

    inspected: list[str] = []
    real = plan_module.inspect_dataset

    def counted(uri: str, *args: Any) -> Any:
        inspected.append(uri)
        return real(uri, *args)

    monkeypatch.setattr(plan_module, "inspect_dataset", counted)
    config = make_config()
    assert plan_run(config) == plan_run(config)
    assert sorted(inspected) == sorted(demo_data), "each dataset inspected once"
    pq.write_table(pq.read_table(demo_data[0]).slice(0, 30), demo_data[0])  # the same path, other data
    assert plan_run(config).loop_config["train_rows"] == 30
    assert inspected.count(demo_data[0]) == 2


def test_a_model_class_without_a_loader_is_built_before_anything_starts(make_config):
    """`--model-class` alone (podium's state-dict loader): a class that builds with no arguments plans; one that
    cannot be imported, built with no arguments, or is not a torch module is refused naming it, as is a model class
    with the built-in loop (whose checkpoints podium serves as they are)."""
    own = {"train_loop": LINEAR}
    assert plan_run(make_config(training=own, promotion={"model_class": "podium_model_classes:Net"}))
    message = plan_error(make_config(training=own, promotion={"model_class": "podium_model_classes:NeedsArguments"}))
    assert "promotion.model_class = 'podium_model_classes:NeedsArguments' cannot be built with no arguments" in message
    assert "missing 1 required positional argument: 'features'" in message
    assert "is not a torch.nn.Module class" in plan_error(
        make_config(training=own, promotion={"model_class": "podium_model_classes:NotAModule"}))
    assert "promotion.model_class" in plan_error(
        make_config(training=own, promotion={"model_class": "podium_model_classes:Missing"}))
    assert "is set with the built-in loop" in plan_error(
        make_config(promotion={"model_class": "podium_model_classes:Net"}))
