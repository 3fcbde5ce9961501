"""Each package's description names every module it holds, and no module it does not.

A package's docstring lists its modules as bullets, one or more module names before a colon:

    - `layout`: the folder layout, the pointer, versions and history
    - `preprocessing`, `stats`: the training data's feature statistics

The names before the colon are read as module names; a module added, removed or renamed without its
line fails here.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest
import tomllib

PACKAGES = ["podium.core", "podium.cli", "podium.storage", "podium.storage.backends", "podium.serving", "podium.tracking",
            "podium.live", "podium.flows", "podium.tasks", "podium.training", "podium.deployments"]

# "- `a`: ...", "- `a`, `b` and `c`: ...": the names before the colon
BULLET = re.compile(r"^- ((?:`\w+`(?:, | and )?)+):", re.M)


def listed_modules(doc: str) -> set[str]:
    """The module names a package docstring lists."""
    return {name for head in BULLET.findall(doc) for name in re.findall(r"`(\w+)`", head)}


def package_modules(package: str) -> set[str]:
    """The modules of `package` (its __main__, which runs a command, aside)."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations
    return {m.name for m in pkgutil.iter_modules(spec.submodule_search_locations) if m.name != "__main__"}


def mismatch(doc: str, modules: set[str]) -> tuple[set[str], set[str]]:
    """(modules the docstring leaves out, names it lists that are no module)."""
    listed = listed_modules(doc)
    return modules - listed, listed - modules


@pytest.mark.parametrize("package", PACKAGES)
def test_the_package_docstring_names_its_modules(package):
    doc = importlib.import_module(package).__doc__ or ""
    missing, unknown = mismatch(doc, package_modules(package))
    assert not missing, f"{package}'s docstring leaves out {sorted(missing)}"
    assert not unknown, f"{package}'s docstring names {sorted(unknown)}, which are not modules of it"


def test_every_package_is_checked():
    declared = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    packages = set(declared["tool"]["setuptools"]["packages"]) - {"podium"}  # podium's own lists its public API
    assert packages == set(PACKAGES)


def test_a_missing_or_unknown_module_is_found():
    """The check above would see a drift (the test of the test)."""
    doc = "Words.\n\n- `layout`: the layout\n- `a`, `b` and `c`: three\n  `not_a_bullet`: continued\n"
    assert listed_modules(doc) == {"layout", "a", "b", "c"}
    assert mismatch(doc, {"layout", "a", "b", "c", "load"}) == ({"load"}, set())
    assert mismatch(doc, {"layout", "a", "b"}) == (set(), {"c"})
