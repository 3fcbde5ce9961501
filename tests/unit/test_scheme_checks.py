"""Storage knows storage: read from the source, as tests/unit/test_ledger.py reads the registry's writes, no module
outside podium/storage/backends/ tells stores apart by their URI's scheme or a backend's name. It asks a function of
podium.storage.backends (`backend_for(uri)` and what the backend says, `store_of`, `is_remote`) instead.

What is still read by hand outside, each with why, is listed in KNOWN: a new check fails this test.
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers.modules import podium_modules

STORE_NAMES = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "file", "local", "userfs", "memory", "fsspec"}
PARSERS = {"urlparse", "urlsplit", "scheme_of"}

KNOWN = {
    # not storage: a tracking URI (sqlite:, http:, file:) or a Ray address (ray://)
    "podium.services": "tracking URIs", "podium.settings": "tracking URIs", "podium.tracking.client": "tracking URIs",
    "podium.tracking.ledger": "tracking URIs", "podium.tracking.runs": "tracking URIs",
    "podium.training.cluster": "a Ray address (ray://)",
    # storage, still read by hand
    "podium.config": "a [storage] table's userfs:// location is built and parsed where the table is validated: "
                     "podium.config sits below podium.storage and cannot ask it",
    "podium.deployments.k8s": "a Ray address (ray://), and a local location's path in the pods (`file://` removed: a "
                              "path on the pods' shared volume, which storage's normalize would make this machine's)",
    "podium.cli.run": "the local folders a refused command removes again (`\"://\" not in uri`): the command avoids "
                      "loading pyarrow (podium.storage.backends) before its plan",
}


def _scheme_checks(path: Path) -> list[str]:
    """Where a module tells URIs apart by their scheme: '://' in a comparison or a startswith, urlparse and kin,
    `.scheme`, a backend's `.name` compared with a store's, a table keyed by schemes."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        strings = [c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
        if isinstance(node, ast.Attribute) and node.attr == "scheme":
            found.append(f"{node.lineno}: .scheme")
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
            name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
            if name in PARSERS or (name in ("startswith", "removeprefix") and any("://" in s for s in strings)):
                found.append(f"{node.lineno}: {name}")
        elif isinstance(node, ast.Compare):
            attributes = {a.attr for a in ast.walk(node) if isinstance(a, ast.Attribute)}
            if any("://" in s for s in strings) or ("name" in attributes and STORE_NAMES & set(strings)):
                found.append(f"{node.lineno}: compares {strings}")
        elif isinstance(node, ast.Dict):
            if len(STORE_NAMES & {k.value for k in node.keys if isinstance(k, ast.Constant)}) >= 3:
                found.append(f"{node.lineno}: a table of schemes")
    return found


def test_no_module_outside_the_backends_reads_a_scheme():
    modules = podium_modules()
    assert "podium.serving.staging" in modules and "podium.storage.backends.local" in modules
    found = {module: checks for module, path in modules.items()
             if not module.startswith("podium.storage.backends") and (checks := _scheme_checks(path))}
    new = {module: checks for module, checks in found.items() if module not in KNOWN}
    assert not new, f"scheme checks outside podium/storage/backends/ (ask backend_for(uri) instead): {new}"
    gone = sorted(set(KNOWN) - set(found))
    assert not gone, f"KNOWN lists modules that no longer read a scheme: remove them: {gone}"
    # the test reads what it should: the backends themselves tell schemes apart
    assert _scheme_checks(modules["podium.storage.backends"])
