"""The layers point one way.

1. Import direction, read from the source (function-local imports included, as Ray's
   python/ray/train/v2/tests/test_circular_imports.py reads them): no cycle among podium's modules,
   and no module importing a layer above its own:

       core, errors <- config, settings, imports, outages, progress
            <- adapters (storage, serving, tracking, Prefect, services, charts)
            <- training, live <- tasks <- flows <- deployments, cli <- the public API (podium/__init__.py)

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

4. Function-local imports only where a start-up measurement justifies them: each is listed with its
   reason (ALLOWED), and a new one fails until it moves to the top of its module or gets one.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from helpers.modules import podium_modules

REPO = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------------------------------
# 1. import direction
# ---------------------------------------------------------------------------------------------------

# the longest matching prefix gives a module's layer; a module may import its own layer or any below
RANKS = {
    "podium.core": 0, "podium.errors": 0,  # podium's errors: every layer may raise them
    "podium.config": 1, "podium.settings": 1, "podium.imports": 1, "podium.outages": 1, "podium.progress": 1,
    "podium.storage": 2, "podium.serving": 2, "podium.tracking": 2, "podium.prefect_api": 2,
    "podium.prefect_events": 2, "podium.services": 2, "podium.charts": 2,
    "podium.training": 3,
    "podium.live": 3,  # Ray Serve's replicas: beside training (Ray's side), below the tasks and the command
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
    for layer in ("podium.core.verdict", "podium.cli.registry", "podium.flows.pipeline", "podium.training.loop"):
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
    # the replicas of `podium serve`: Ray Serve, no orchestrator; MLflow and torch load with a version
    "podium.live": (NOT_IN_WORKERS | {"torch"}, ["ray.serve", "starlette.responses", "numpy", "orjson"]),
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
    "podium.outages": (NOTHING_HEAVY | {"httpx", "requests"}, []),
    "podium.progress": (NOTHING_HEAVY, []),
    "podium.settings": (NOTHING_HEAVY, ["pydantic_settings"]),
    # what a run asks of Ray, read by `podium run` before anything else loads: Ray core and the config only
    "podium.training.resources": ({"prefect", "mlflow", "torch"}, ["ray", "pydantic"]),
    # a fresh run starts training before MLflow (about a second to import) has loaded: the flow, and what
    # `podium run` loads before it, name podium.tracking's functions without loading MLflow
    "podium.flows.pipeline": ({"mlflow", "torch"}, ["prefect", "prefect.futures", "ray.train", "ray.util.queue"]),
    "podium.cli.run": ({"mlflow", "torch"}, ["prefect"]),
    "podium.cli.registry": ({"mlflow", "torch"}, ["prefect"]),  # every command, as the parser is built
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


# ---------------------------------------------------------------------------------------------------
# 4. function-local imports, each with its reason
# ---------------------------------------------------------------------------------------------------

# Function-local imports only where a start-up measurement justifies them, each with its reason.
#
# Every import inside a function of podium's source is listed (by module and the module it imports: a
# podium module, or a library's top-level name) and must be in ALLOWED, with why it waits for the call.
# A new one fails here until it is moved to the top of its module or given a reason; one that is gone
# fails until its line is removed.
#
# The reasons rest on what each import costs a process that has loaded the importing module already,
# measured by benchmarks/import_costs.py on the 2-core dev machine (`python -X importtime` agrees within
# noise):
#
#     lightning.pytorch 8.5 s   mlflow 1.0-1.5 s   torch 1.0-1.5 s   ray.train 1.2 s   ray.data 1.0 s
#     prefect 0.75-1.1 s        transformers 0.6 s  matplotlib 0.5 s  ray 0.3-0.8 s    s3fs (aiohttp) 0.35 s
#     pandas 0.33 s             botocore 0.15 s     pydantic-settings 0.13 s          numpy 0.11 s
#
# and, through podium's own modules: tasks.promote 4.9 s, tasks.rollback 4.7 s, tasks.news 2.8 s (Prefect
# and MLflow), flows.pipeline 1.9 s, tasks.plan 1.35 s, serving.layout and what reads it 0.13-0.65 s
# (pyarrow, fsspec), training.export / training.validate / training.checkpoint 1.5-2.3 s (torch).
#
# An import whose cost measured under 0.1 s has no reason to wait: it goes to the top of its module.

# the reasons, one per kind of wait
MLFLOW = "MLflow (1.0-1.5 s) loads at the first call that needs it: `podium run` starts training before it has loaded"
PREFECT_LATE = ("Prefect (0.75-1.1 s) loads after podium.prefect_api has set its client settings "
                "(bound_client_settings), which Prefect reads when it is imported")
PREFECT_STATUS = "the commands that read the serving location and the registry (status, history) run without Prefect (0.75 s)"
TORCH = "torch (1.0-1.5 s) loads in the process that trains, validates or exports, never in the orchestrating one"
RAY = "Ray (0.3-0.8 s) loads where a call reaches the cluster: what a run asks of Ray is read before, without it"
RAY_DATA = "Ray Data and Ray Train (1.0-1.2 s each) load when the datasets are built, not at `podium run`'s start-up"
HELP = "`podium --help`, a bad flag and `podium lineage --help` answer without loading Prefect, MLflow, Ray or torch"
COMMAND = "each command loads what it uses: this one costs {} s, paid by the commands that call it only"

ALLOWED: dict[str, dict[str, str]] = {
    "podium": {"podium.training.promoted": "`import podium` stays cheap in Ray workers and for `podium --help` "
                                           "(load_promoted_model loads torch and MLflow, 1.2 s, when called)"},
    "podium.charts": {"matplotlib": "matplotlib (0.5 s) loads where a chart is drawn, not where reports are made"},
    "podium.core.policy": {"numpy": "numpy (0.11 s) only for a promotion that states a confidence: podium.core loads "
                                    "nothing heavy"},
    "podium.prefect_api": {"prefect": PREFECT_LATE},
    "podium.services": {"mlflow": MLFLOW},
    "podium.serving.tabular": {"torch": TORCH + ": MLflow's pyfunc imports this module to find the class"},
    "podium.serving.files_only": {"mlflow": MLFLOW + "; shipped inside a files model, it raises MLflow's error only "
                                            "when MLflow loads it"},
    "podium.storage.backends.s3": {"botocore": "botocore (0.15 s) only for an s3:// location; a local run never loads it"},
    "podium.storage.backends.azure": {"azure": "azure-core (with adlfs) only for an az:// location; every "
                                               "backend's module loads to name its settings for Ray workers"},
    "podium.storage.backends.s3_client": {"s3fs": "s3fs and aiohttp (0.35 s) only for an s3:// location; a local run "
                                                   "never loads them"},
    "podium.tracking.client": {"mlflow": MLFLOW,
                               "podium.settings": "pydantic-settings (0.13 s) only when no tracking URI is given"},
    "podium.tracking.datasets": {"mlflow": MLFLOW},
    "podium.tracking.ledger": {"mlflow": MLFLOW},
    "podium.tracking.models": {"mlflow": MLFLOW},
    "podium.tracking.records": {"mlflow": MLFLOW},
    "podium.tracking.registry": {"mlflow": MLFLOW},
    "podium.tracking.runs": {"mlflow": MLFLOW},
    "podium.tasks.package": {"podium.training.export": TORCH},
    "podium.tasks.reconcile": {"prefect": PREFECT_STATUS},
    "podium.tasks.train": {"podium.training.raytrain": RAY_DATA + " (raytrain loads Ray Train, 1.2 s)"},
    "podium.training.head": {"ray": RAY},
    "podium.training.ingest": {"ray": RAY_DATA,
                               "podium.training.data": "training.data (pandas through pyarrow, 0.9 s) loads when the "
                                                       "datasets are built, not at `podium run`'s start-up"},
    "podium.training.loaders": {"lightning": "Lightning (8.5 s), an optional framework, only for its checkpoints",
                                "transformers": "Transformers (0.6 s), an optional framework, only for its checkpoints"},
    "podium.live.fast": {"torch": TORCH + "; podium.live loads no torch at import (`podium serve`'s driver names "
                                  "the class only): a replica has it loaded with the version's module"},
    "podium.live.server": {"mlflow": MLFLOW + "; podium.live loads no MLflow at import",
                           "podium.training.promoted": "the replica loads MLflow and torch (promoted's loaders), "
                                                       "not `podium serve`'s driver, which only names the class"},
    "podium.cli.serve": {"ray": RAY, "podium.training.cluster": RAY + " (cluster: 1.1 s)",
                         "podium.live.server": RAY + " (Ray Serve loads with the deployment's class)",
                         "podium.serving.layout": COMMAND.format("0.2"),
                         "podium.storage.locations": COMMAND.format("0.14")},
    "podium.training.promoted": {"mlflow": MLFLOW + "; podium.training loads no MLflow at import",
                                 "podium.training.checkpoint": TORCH},
    "podium.training.raytrain": {"ray": TORCH + " (ray.train.torch loads torch, 3 s with Ray Train)"},
    "podium.training.sharded": {"torch": "torch.distributed.checkpoint's converter loads sympy (2.3 s): only for a "
                                         "sharded checkpoint"},
    "podium.training.validation_call": {"ray": RAY, "podium.training.cluster": RAY + " (cluster: 1.1 s)",
                                        "podium.training.raytrain": RAY_DATA + " (raytrain: 2.4 s)"},
    # the command (cli/): issue 51 rewrites it; the measured costs say which waits are worth it
    "podium.cli.main": {"podium.cli.registry": HELP},
    "podium.cli.k8s": {"podium.deployments.k8s": COMMAND.format("6.1 (Prefect and the flows, for the deployments' "
                                                                "nightly config)")},
    "podium.cli.output": {"podium.serving.layout": COMMAND.format("0.2"), "podium.serving.location": COMMAND.format("0.14")},
    "podium.cli.provenance": {
        "podium.serving.layout": COMMAND.format("0.14"), "podium.serving.location": COMMAND.format("0.36"),
        "podium.tracking.datasets": COMMAND.format("0.12"),
        "podium.storage.locations": COMMAND.format("0.14"), "podium.storage.preflight": COMMAND.format("0.14")},
    "podium.cli.status": {
        "podium.serving.layout": COMMAND.format("0.65"), "podium.tasks.reconcile": COMMAND.format("0.49"),
        "podium.tracking.records": COMMAND.format("0.39")},
    "podium.cli.history": {"podium.serving.layout": COMMAND.format("0.65")},
    "podium.cli.decide": {
        "podium.serving.staged": COMMAND.format("0.23"), "podium.tasks.promote": COMMAND.format("4.9")},
    "podium.cli.rollback": {
        "podium.serving.layout": COMMAND.format("0.65"), "podium.cli.run": COMMAND.format("0.01"),
        # a rollback runs as a Prefect flow: the flow's modules cost what tasks.rollback did (4.7 s)
        "podium.flows.rollback": COMMAND.format("4.7"), "prefect": PREFECT_LATE},
    "podium.cli.make_data": {
        "podium.storage.preflight": COMMAND.format("0.19"), "podium.training.data": COMMAND.format("0.43")},
    "podium.cli.run": {
        "podium.flows.pipeline": COMMAND.format("1.95"), "podium.flows.promote": COMMAND.format("1.77"),
        "podium.flows.summary": COMMAND.format("1.7"),
        "podium.tasks.plan": COMMAND.format("1.35"), "podium.tasks.reconcile": COMMAND.format("0.18"),
        "podium.training.data": COMMAND.format("0.33"), "podium.training.resources": COMMAND.format("0.34"),
        "prefect": PREFECT_LATE + "; the servers start in the background before it loads",
        "ray": RAY, "torch": TORCH},
    "podium.tasks.evidence": {"podium.tasks.train": RAY + " (tasks.train: 0.2 s)", "ray": RAY},
    "podium.tasks.carry_out": {"podium.training.validate": TORCH},
}


def local_imports(source: str, modules: set[str]) -> dict[str, set[int]]:
    """What a module's functions import -> the lines: a podium module by its name (`from podium.x import y` is
    podium.x.y where that is a module), any other library by its top-level name."""
    out: dict[str, set[int]] = defaultdict(set)
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]
            else:
                continue
            for target in targets:
                out[target if target.split(".")[0] == "podium" else target.split(".")[0]].add(node.lineno)
    return out


def found() -> dict[str, dict[str, set[int]]]:
    sources = podium_modules()
    found = {name: local_imports(path.read_text(), set(sources)) for name, path in sources.items()}
    return {name: imports for name, imports in found.items() if imports}


def test_every_function_local_import_has_its_reason():
    new = [f"{module}: {target} (line {min(lines)})" for module, imports in sorted(found().items())
           for target, lines in sorted(imports.items()) if target not in ALLOWED.get(module, {})]
    assert not new, ("function-local imports without a measured reason (move them to the top of the module, or "
                     "measure what they save and add them to ALLOWED):\n  " + "\n  ".join(new))


def test_every_reason_names_an_import_that_is_there():
    there = found()
    stale = [f"{module}: {target}" for module, targets in sorted(ALLOWED.items()) for target in sorted(targets)
             if target not in there.get(module, {})]
    assert not stale, "ALLOWED names imports that are no longer function-local:\n  " + "\n  ".join(stale)


def test_local_imports_are_found():
    """The check above would see a new one (the test of the test)."""
    source = "import os\ndef f():\n    import mlflow.entities\n    from podium.a import b, c\n    return os\n"
    assert local_imports(source, {"podium.a", "podium.a.b"}) == {"mlflow": {3}, "podium.a.b": {4}, "podium.a": {4}}


def test_no_test_module_imports_another_test_module():
    """What tests share lives in tests/helpers/ (or a conftest): a test module imported by another runs its
    module-level code twice and ties two files' worlds together."""
    found = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(REPO)}: {name}" for name in names
                      if name.split(".")[-1].startswith("test_")]
    assert not found, found
