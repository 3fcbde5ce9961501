"""podium's modules as the installed package names them: what the tests that read podium's source walk through
(tests/unit/test_layers.py, tests/unit/test_ledger.py)."""

from __future__ import annotations

import importlib.util
import pkgutil
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[2]


def podium_modules() -> dict[str, Path]:
    """Every module of the installed podium package (the name it is imported by -> its file)."""
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    found: dict[str, Path] = {}
    for package in packages:
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.origin, f"{package} is not importable"
        found[package] = Path(spec.origin)
        for info in pkgutil.iter_modules(spec.submodule_search_locations):
            if not info.ispkg:
                found[f"{package}.{info.name}"] = Path(spec.submodule_search_locations[0]) / f"{info.name}.py"
    return found
