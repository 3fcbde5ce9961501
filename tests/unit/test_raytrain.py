"""select_kwargs: a validation function gets only the keyword arguments it can take.

Importing training.raytrain imports ray; nothing here starts it.
"""

from __future__ import annotations

from podium.training.raytrain import select_kwargs

OFFERED = {"val_data": "/v.parquet", "config": {"a": 1}, "run_name": "r", "unused": 0}


def test_only_accepted_names_are_passed():
    def validate(checkpoint, val_data, *, run_name="x"):
        return {}

    assert select_kwargs(validate, OFFERED) == {"val_data": "/v.parquet", "run_name": "r"}


def test_var_keyword_gets_everything():
    def validate(checkpoint, **kwargs):
        return {}

    assert select_kwargs(validate, OFFERED) == OFFERED


def test_positional_only_and_var_positional_are_not_filled_by_name():
    def validate(checkpoint, val_data, /, *config):
        return {}

    assert select_kwargs(validate, OFFERED) == {}
