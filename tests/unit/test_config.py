"""build_config: defaults, and errors that name the field, the value and what was expected."""

from __future__ import annotations

import pytest

from podium.config import ConfigError, PipelineConfig, build_config


def test_defaults_build():
    config = build_config({})
    assert isinstance(config, PipelineConfig)
    assert (config.training.epochs, config.scaling.num_workers, config.promotion.mode) == (5, 2, "min")
    assert config.validation.fn == "podium.training.validate:validate_checkpoint"


def test_nested_values_are_typed():
    config = build_config({"training": {"epochs": "3"}, "promotion": {"metric": "val_accuracy", "mode": "max"}})
    assert config.training.epochs == 3
    assert (config.promotion.metric, config.promotion.mode) == ("val_accuracy", "max")


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
