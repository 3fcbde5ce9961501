"""Resolve 'package.module:function' import paths with errors that say what went wrong."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


class ImportPathError(ValueError):
    """An import path that does not resolve to a callable."""


def resolve_callable(path: str, field: str = "import path") -> Callable[..., Any]:
    """Import `package.module:function` and return the callable, or raise ImportPathError naming `field`."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ImportPathError(f"{field} = {path!r}: expected 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportPathError(f"{field} = {path!r}: cannot import module {module_name!r} ({exc})") from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise ImportPathError(f"{field} = {path!r}: module {module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise ImportPathError(f"{field} = {path!r}: {attr!r} is a {type(obj).__name__}, expected a function")
    return obj
