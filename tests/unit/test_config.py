"""build_config: defaults, and errors that name the field, the value and what was expected."""

from __future__ import annotations

import pytest

from podium.config import PipelineConfig, build_config
from podium.errors import ConfigError


def test_defaults_build():
    config = build_config({})
    assert isinstance(config, PipelineConfig)
    assert (config.training.epochs, config.scaling.num_workers, config.promotion.mode) == (5, 2, "min")
    assert config.validation.fn == "podium.training.validate:validate_checkpoint"


def test_nested_values_are_typed():
    config = build_config({"training": {"epochs": 3, "learning_rate": 1}, "promotion": {"metric": "val_accuracy",
                                                                                        "mode": "max"}})
    assert config.training.epochs == 3 and config.training.learning_rate == 1.0  # a whole number is a number
    assert (config.promotion.metric, config.promotion.mode) == ("val_accuracy", "max")


@pytest.mark.parametrize("data, expected", [
    # TOML's `keep = true` was coerced to 1 (and checkpoints deleted), `keep = "2"` to 2
    ({"checkpoints": {"keep": True}}, "checkpoints.keep = True: expected a whole number, got a boolean"),
    ({"checkpoints": {"keep": "2"}}, "checkpoints.keep = '2': expected a whole number, got a string"),
    ({"training": {"epochs": "3"}}, "training.epochs = '3': expected a whole number, got a string"),
    ({"training": {"epochs": 3.0}}, "training.epochs = 3.0: expected a whole number, got a decimal number"),
    ({"training": {"learning_rate": "0.1"}}, "training.learning_rate = '0.1': expected a number, got a string"),
    ({"scaling": {"use_gpu": 1}}, "scaling.use_gpu = 1: expected true or false, got a whole number"),
    ({"promotion": {"thresholds": {"accuracy": {"min": "0.9"}}}},
     "promotion.thresholds.accuracy.min = '0.9': expected a number, got a string"),
])
def test_a_value_of_another_type_is_refused_not_coerced(data, expected):
    with pytest.raises(ConfigError) as err:
        build_config(data)
    assert expected in str(err.value)


@pytest.mark.parametrize("data, expected", [
    ({"training": {"epochs": 0}}, "training.epochs = 0: Input should be greater than or equal to 1"),
    ({"training": {"epochs": -1}}, "training.epochs = -1: Input should be greater than or equal to 1"),
    ({"scaling": {"num_workers": 0}}, "scaling.num_workers = 0: Input should be greater than or equal to 1"),
    ({"validation": {"concurrency": 0}},
     "validation.concurrency = 0: Input should be greater than or equal to 1"),
    ({"promotion": {"mode": "sideways"}}, "promotion.mode = 'sideways': Input should be 'min' or 'max'"),
    ({"training": {"train_loop": "mypkg.loop"}},
     "training.train_loop = 'mypkg.loop': expected 'package.module:function'"),
    ({"validation": {"fn": "mypkg.validate"}},
     "validation.fn = 'mypkg.validate': expected 'package.module:function'"),
    ({"training": {"epoch": 3}}, "training.epoch = 3: Extra inputs are not permitted"),
    ({"servng": "/srv"}, "servng = '/srv': Extra inputs are not permitted"),
    ({"run_name": "my run"}, "run_name = 'my run': expected 1-100 characters of letters, digits"),
    ({"run_name": "-x"}, "run_name = '-x': expected 1-100 characters"),
    ({"run_name": "x" * 101}, f"run_name = '{'x' * 101}': expected 1-100 characters"),
], ids=["epochs-0", "epochs-negative", "num_workers-0", "concurrency-0", "mode", "train_loop-no-colon",
        "validation-fn-no-colon", "unknown-nested-key", "unknown-top-key", "run_name-space",
        "run_name-leading-dash", "run_name-too-long"])
def test_invalid_value_is_named_with_what_was_expected(data, expected):
    with pytest.raises(ConfigError) as err:
        build_config(data)
    assert expected in str(err.value)


def test_every_invalid_field_is_reported_at_once():
    with pytest.raises(ConfigError) as err:
        build_config({"training": {"epochs": 0}, "scaling": {"num_workers": 0}})
    assert "training.epochs = 0" in str(err.value) and "scaling.num_workers = 0" in str(err.value)


def test_old_builtin_import_paths_keep_working_with_a_warning():
    """Configs written for podium 0.1 name the built-ins `training.loop:…` / `training.validate:…`."""
    import pytest

    from podium.config import BUILTIN_LOOP, BUILTIN_VALIDATE, build_config

    with pytest.warns(FutureWarning, match="podium.training.loop:train_loop_per_worker"):
        config = build_config({"training": {"train_loop": "training.loop:train_loop_per_worker"},
                               "validation": {"fn": "training.validate:validate_checkpoint"}})
    assert (config.training.train_loop, config.validation.fn) == (BUILTIN_LOOP, BUILTIN_VALIDATE)
    # a user's own module of the same package name is theirs, not an old podium path
    assert build_config({"training": {"train_loop": "training.train:train_func"}}).training.train_loop == \
        "training.train:train_func"


def test_a_config_file_that_is_not_a_table_is_refused(tmp_path):
    import pytest

    from podium.config import load_config_file
    from podium.errors import ConfigError

    for text in ("[1, 2]", '"podium"'):
        path = tmp_path / "c.json"
        path.write_text(text)
        with pytest.raises(ConfigError, match="expected a table of settings"):
            load_config_file(str(path))


def test_cli_help_shows_the_config_models_defaults():
    from podium.cli.options import OPTIONS, option_help
    from podium.config import field_default

    help_by_flag = {flag: option_help(path, text) for flag, path, typ, text in OPTIONS if typ is not None}
    assert f"(default: {field_default('training.epochs')})" in help_by_flag["--epochs"]
    assert f"(default: {field_default('promotion.metric')})" in help_by_flag["--metric"]
