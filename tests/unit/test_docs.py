"""The docs stay a guide: short front pages, and code that imports only podium's public API."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import podium

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


@pytest.mark.parametrize("name, most", [("README.md", 300), ("BENCHMARKS.md", 250)])
def test_the_front_pages_stay_short(name, most):
    lines = (REPO / name).read_text().count("\n")
    assert lines <= most, f"{name} has {lines} lines; at most {most}: move the rest to the docs site"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_docs_import_only_the_public_api(page):
    """`from podium.x import ...` in a guide would make an internal module public."""
    text = page.read_text()
    internal = re.findall(r"^\s*(?:from podium\.[\w.]+ import .*|import podium\.[\w.]+.*)$", text, re.M)
    assert not internal, f"{page.name} imports internals: {internal}"
    for names in re.findall(r"^\s*from podium import ([^#\n]+)", text, re.M):
        unknown = {n.strip(" ()").split(" as ")[0] for n in names.split(",")} - set(podium.__all__) - {""}
        assert not unknown, f"{page.name} imports {sorted(unknown)}, which podium does not export"
