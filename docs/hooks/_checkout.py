"""Make `import podium` read this checkout, whatever podium is installed in the environment.

The repository's folders flows/, tasks/, training/ and deployments/ install as podium.flows,
podium.tasks, podium.training and podium.deployments (setuptools package-dir). An editable
install maps them to the checkout it was made from, which may be another one: the finder below
maps them to this checkout, so the pages are built from the code beside them.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REMAPPED = {"podium.flows": "flows", "podium.tasks": "tasks", "podium.training": "training",
            "podium.deployments": "deployments"}


class _CheckoutFinder(importlib.abc.MetaPathFinder):
    """podium and its remapped subpackages from ROOT; their submodules then follow __path__."""

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname == "podium":
            return importlib.machinery.PathFinder.find_spec(fullname, [str(ROOT)])
        if fullname in REMAPPED:  # PathFinder looks up the last part of the name: ROOT/flows for podium.flows
            return importlib.machinery.PathFinder.find_spec(fullname, [str(ROOT)])
        return None


def use_checkout() -> Path:
    """Put this checkout first for `podium` (idempotent); drop a podium imported from elsewhere."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    if not any(isinstance(f, _CheckoutFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _CheckoutFinder())
    loaded = sys.modules.get("podium")
    if loaded is not None and not str(getattr(loaded, "__file__", "")).startswith(str(ROOT)):
        for name in [n for n in sys.modules if n == "podium" or n.startswith("podium.")]:
            del sys.modules[name]
    return ROOT
