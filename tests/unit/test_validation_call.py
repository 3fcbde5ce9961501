"""How podium calls a validation function, as Ray's documentation writes it (pure signature logic).

Importing podium.training.validation_call does not import Ray.
"""

from __future__ import annotations

from typing import Any

import pytest

from podium.training.validation_call import (
    may_send_report_kwargs,
    missing_arguments,
    signature_problem,
    validation_arguments,
)

FACTS = {"val_data": "/v.parquet", "run_name": "r", "step": 7}
USER = {"dataset": "DS", "epoch": 3, "train_run_name": "run-a"}


def test_the_guides_checkpoint_config_form_gets_the_reports_kwargs_as_config():
    def validate_fn(checkpoint, config):
        return {}

    assert validation_arguments(validate_fn, FACTS, USER) == {"config": USER}


def test_var_keyword_gets_the_users_kwargs_as_ray_passes_them_never_podiums_facts():
    def validate_fn(checkpoint, **kwargs):
        return {}

    assert validation_arguments(validate_fn, FACTS, USER) == USER


def test_named_parameters_take_the_users_value_first_then_podiums():
    def validate_fn(checkpoint, epoch, run_name, val_data="x", *, train_run_name, other=1):
        return {}

    got = validation_arguments(validate_fn, FACTS, {**USER, "val_data": "/mine.parquet"})
    assert got == {"epoch": 3, "run_name": "r", "val_data": "/mine.parquet", "train_run_name": "run-a"}


def test_a_config_key_sent_by_the_report_is_passed_as_it_is():
    def validate_fn(checkpoint, config):
        return {}

    assert validation_arguments(validate_fn, FACTS, {"config": {"a": 1}}) == {"config": {"a": 1}}


def test_the_checkpoint_only_form_gets_nothing_else():
    def validation_fn(checkpoint):
        return {}

    assert validation_arguments(validation_fn, FACTS, USER) == {}


def test_missing_arguments_are_the_required_ones_no_source_fills():
    def validate_fn(checkpoint, train_run_name, epoch, config=None, limit=3, **kwargs: Any):
        return {}

    assert missing_arguments(validate_fn, ["val_data", "step"]) == ["train_run_name", "epoch"]
    assert missing_arguments(validate_fn, ["train_run_name", "epoch"]) == []


def test_config_is_always_filled():
    def validate_fn(checkpoint, config):
        return {}

    assert missing_arguments(validate_fn, []) == []


@pytest.mark.parametrize("fn, problem", [
    (lambda: {}, "first positional argument"),
    (lambda *, checkpoint: {}, "first positional argument"),
    (lambda checkpoint, epoch, /: {}, "positional-only parameters ['epoch']"),
])
def test_signatures_podium_can_never_call(fn, problem):
    assert problem in signature_problem(fn)


def test_usual_signatures_have_no_problem():
    assert signature_problem(lambda checkpoint, config: {}) is None
    assert signature_problem(lambda checkpoint, **kwargs: {}) is None


def test_a_loop_that_never_names_fn_kwargs_cannot_send_them():
    from ray.train.examples.pytorch.torch_linear_example import train_func

    assert may_send_report_kwargs(train_func) is False
    assert may_send_report_kwargs(test_usual_signatures_have_no_problem)  # this module names fn_kwargs
