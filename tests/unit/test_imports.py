"""resolve_callable: import paths resolve to callables, or fail saying which field and why."""

from __future__ import annotations

import re

import pytest

from podium.imports import ImportPathError, resolve_callable
from podium.training.checkpoint import load_model


def test_resolves_a_function():
    assert resolve_callable("podium.training.checkpoint:load_model") is load_model


@pytest.mark.parametrize("path, expected", [
    ("training.checkpoint.load_model", "expected 'package.module:function'"),
    (":load_model", "expected 'package.module:function'"),
    ("training.checkpoint:", "expected 'package.module:function'"),
    ("podium_no_such_module:fn", "cannot import module 'podium_no_such_module'"),
    ("podium.training.checkpoint:no_such_fn", "module 'podium.training.checkpoint' has no attribute 'no_such_fn'"),
    ("podium.training.checkpoint:FORMAT", "'FORMAT' is a str, expected a function"),
], ids=["no-colon", "no-module", "no-attribute-name", "missing-module", "missing-attribute", "not-callable"])
def test_errors_name_the_field_the_path_and_the_problem(path, expected):
    with pytest.raises(ImportPathError, match=re.escape(f"validation.fn = {path!r}: {expected}")):
        resolve_callable(path, "validation.fn")
