"""The layers point one way.

1. Import direction, read from the source (function-local imports included, as Ray's
   python/ray/train/v2/tests/test_circular_imports.py reads them): no cycle among podium's modules,
   and no module importing a layer above its own:

       core, errors <- config, settings, imports <- adapters (storage, serving, tracking, Prefect, services, charts)
            <- training <- tasks <- flows <- deployments, cli <- the public API (podium/__init__.py)

2. What each module pulls in, imported alone in a fresh interpreter:
   - podium.training runs inside Ray workers: no prefect, no mlflow.
   - podium.flows and podium.tasks orchestrate: no torch (it loads in the processes that train and validate).
   - podium.storage, podium.serving: plain I/O, no orchestrator, no tracking, no torch at import.
   - podium.tracking, the MLflow adapter: no prefect.
   - podium.core: pure; nothing heavy.

   One interpreter per layer first imports the heavy libraries that layer may use (checked to load
   nothing forbidden), then imports each module in a forked child of its own: the same answer as a
   fresh interpreter per module, without paying for torch or Prefect's import once per module.

3. The repository's folders never become top-level names (`training`, `tasks`...) of an install.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------------------------------
# 1. import direction
# ---------------------------------------------------------------------------------------------------

# the longest matching prefix gives a module's layer; a module may import its own layer or any below
RANKS = {
    "podium.core": 0, "podium.errors": 0,  # podium's errors: every layer may raise them
    "podium.config": 1, "podium.settings": 1, "podium.imports": 1,
    "podium.storage": 2, "podium.serving": 2, "podium.tracking": 2, "podium.prefect_api": 2,
    "podium.prefect_events": 2, "podium.services": 2, "podium.charts": 2,
    "podium.training": 3,
    "podium.tasks": 4,
    "podium.flows": 5,
    "podium.deployments": 6, "podium.cli": 6,
    "podium": 7, "podium.__main__": 7,  # the public API re-exports from every layer
}


def rank(module: str) -> int:
    """The layer of `module`: its longest prefix in RANKS."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in RANKS:
            return RANKS[".".join(parts[:n])]
    raise AssertionError(f"{module} is in no layer: add it to RANKS")


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


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The podium modules that `name` imports anywhere in its file (top level, function-local, or under
    TYPE_CHECKING)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        for target in targets:
            if not target.startswith("podium"):
                continue
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
                break  # `from a.b import c`: the module c if it is one, else a.b
    return out


def import_graph() -> dict[str, set[str]]:
    modules = podium_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read_from_every_module():
    graph = import_graph()
    assert len(graph) > 80, sorted(graph)
    for layer in ("podium.core.verdict", "podium.cli.commands", "podium.flows.pipeline", "podium.training.loop"):
        assert layer in graph
    assert "podium.core.records" in graph["podium.tasks.validate"]


def test_no_module_imports_a_layer_above_its_own():
    upward = {f"{a} ({rank(a)}) -> {b} ({rank(b)})" for a, targets in import_graph().items() for b in targets
              if rank(b) > rank(a)}
    assert not upward, "imports that point up:\n" + "\n".join(sorted(upward))


def test_there_are_no_import_cycles():
    assert not cycles(import_graph())


def test_nothing_below_the_command_imports_it():
    users = {a for a, targets in import_graph().items() for b in targets
             if b.startswith("podium.cli") and not a.startswith("podium.cli") and a not in ("podium", "podium.__main__")}
    assert not users, f"these modules import podium.cli: {sorted(users)}"


def test_the_core_imports_nothing_else_of_podium():
    outside = {f"{a} -> {b}" for a, targets in import_graph().items() if a.startswith("podium.core")
               for b in targets if not b.startswith("podium.core")}
    assert not outside, outside


def test_cycles_and_upward_imports_are_found():
    """The checks above would see a violation (the test of the test)."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert rank("podium.tasks.promote") > rank("podium.training.loop") > rank("podium.tracking.records")


def test_the_public_api_is_exported_and_documented():
    import podium

    for name in podium.__all__:
        value = getattr(podium, name)
        if name != "__version__":
            assert value.__doc__ and value.__doc__.strip(), f"podium.{name} has no docstring"
    assert podium.__doc__ and all(f"`{name}`" in podium.__doc__ for name in podium.__all__ if name != "__version__")


# ---------------------------------------------------------------------------------------------------
# 2. what each module pulls in
# ---------------------------------------------------------------------------------------------------

NOT_IN_WORKERS = {"prefect", "mlflow"}
NOTHING_HEAVY = {"prefect", "mlflow", "torch", "ray"}
# layer: (forbidden top-level packages, allowed libraries imported up front)
LAYERS: dict[str, tuple[set[str], list[str]]] = {
    "podium.core": (NOTHING_HEAVY, []),
    "podium.errors": (NOTHING_HEAVY, []),
    "podium.training": (NOT_IN_WORKERS, ["torch", "ray.train", "ray.train.torch", "ray.util.queue", "pyarrow.dataset",
                                         "numpy", "pydantic", "fsspec", "s3fs"]),
    "podium.flows": ({"torch"}, ["prefect", "prefect.futures", "ray.train", "ray.util.queue", "mlflow.tracking",
                                 "pyarrow.dataset", "s3fs", "pydantic"]),
    "podium.tasks": ({"torch"}, ["prefect", "prefect.artifacts", "ray.train", "ray.util.queue", "mlflow.tracking",
                                 "pyarrow.dataset", "s3fs", "pydantic"]),
    "podium.deployments": ({"torch"}, ["prefect", "prefect.deployments", "ray.train", "mlflow.tracking", "s3fs"]),
    "podium.storage": (NOTHING_HEAVY, ["pyarrow.fs", "fsspec", "s3fs", "botocore.session", "pydantic_settings"]),
    "podium.serving": (NOTHING_HEAVY, ["pyarrow.fs", "fsspec", "s3fs", "pydantic_settings"]),
    "podium.tracking": ({"prefect", "torch"}, ["mlflow.tracking", "mlflow.entities", "requests", "pyarrow"]),
    "podium.prefect_events": ({"torch", "mlflow"}, ["prefect", "prefect.events"]),
    "podium.config": (NOTHING_HEAVY, ["pydantic"]),
    "podium.charts": (NOTHING_HEAVY, ["matplotlib"]),  # drawn wherever reports are made, never in a worker
    "podium.imports": (NOTHING_HEAVY, []),
    "podium.settings": (NOTHING_HEAVY, ["pydantic_settings"]),
    # what a run asks of Ray, read by `podium run` before anything else loads: Ray core and the config only
    "podium.training.resources": ({"prefect", "mlflow", "torch"}, ["ray", "pydantic"]),
    # a fresh run starts training before MLflow (about a second to import) has loaded: the flow, and what
    # `podium run` loads before it, name podium.tracking's functions without loading MLflow
    "podium.flows.pipeline": ({"mlflow", "torch"}, ["prefect", "prefect.futures", "ray.train", "ray.util.queue"]),
    "podium.cli.run": ({"mlflow", "torch"}, ["prefect"]),
    "podium.cli.commands": ({"mlflow", "torch"}, ["prefect"]),
    # `podium --help`, a bad flag and `podium lineage --help` answer at once
    "podium.cli.main": (NOTHING_HEAVY, []),
    "podium.cli.options": (NOTHING_HEAVY, []),
    "podium.cli.provenance": (NOTHING_HEAVY, []),
    "podium": (NOTHING_HEAVY, []),
}

PROBE = r"""
import importlib, json, os, pkgutil, sys
layer, forbidden, allowed = sys.argv[1], set(json.loads(sys.argv[2])), json.loads(sys.argv[3])
def tops():
    return {m.split(".")[0] for m in sys.modules}
for lib in allowed:
    importlib.import_module(lib)
assert not (tops() & forbidden), f"the allowed libraries load {sorted(tops() & forbidden)}"
names = [layer]
spec = importlib.util.find_spec(layer)
if spec.submodule_search_locations and layer != "podium":
    names += [m.name for m in pkgutil.walk_packages(spec.submodule_search_locations, prefix=layer + ".",
                                                   onerror=lambda name: None)
              if not m.name.endswith(".__main__")]  # runs a command: not a module to import
result = {}
for name in names:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(name)
            out = {"loaded": sorted(tops() & forbidden)}
        except BaseException as exc:
            out = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(write, json.dumps(out).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        result[name] = json.loads(f.read() or '{"error": "the child died"}')
    os.waitpid(pid, 0)
print(json.dumps(result))
"""


@pytest.mark.parametrize("layer", list(LAYERS))
def test_the_layers_point_one_way(layer):
    forbidden, allowed = LAYERS[layer]
    done = subprocess.run([sys.executable, "-c", PROBE, layer, json.dumps(sorted(forbidden)), json.dumps(allowed)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if layer.count(".") == 1 and importlib.util.find_spec(layer).submodule_search_locations:
        assert len(result) > 1, f"no modules found under {layer}"
    errors = {name: r["error"] for name, r in result.items() if "error" in r}
    assert not errors, errors
    broken = {name: r["loaded"] for name, r in result.items() if r["loaded"]}
    assert not broken, f"{layer} may not load {sorted(forbidden)}; these modules do: {broken}"


# ---------------------------------------------------------------------------------------------------
# 3. one import name
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("generic", ["training", "tasks", "flows", "deployments"])
def test_podium_takes_no_generic_top_level_name(generic, tmp_path):
    """A user's own `training` or `tasks` package is never shadowed by podium's (nor is it podium's).

    Asked from an empty folder, with nothing on the path but the environment: the repository's own
    folders are not importable there, wherever the clone lives and whatever it is called."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", "import importlib.util, sys; s = importlib.util.find_spec(sys.argv[1]); "
                           "print(s and (s.origin or list(s.submodule_search_locations)))", generic],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    where = done.stdout.strip()
    assert where == "None" or str(REPO) not in where, f"`import {generic}` finds podium's folder: {where}"
