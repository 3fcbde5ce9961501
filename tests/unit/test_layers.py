"""The layers point one way: each module, imported alone in a fresh interpreter, pulls in only what its
layer may use (the pattern of Ray's python/ray/train/v2/tests/test_circular_imports.py).

- podium.training runs inside Ray workers: no prefect, no mlflow.
- podium.flows and podium.tasks orchestrate: no torch (it loads in the processes that train and validate).
- podium.storage, podium.serving: plain I/O, no orchestrator, no tracking, no torch at import.
- podium.tracking, the MLflow adapter: no prefect.

One interpreter per layer first imports the heavy libraries that layer may use (checked to load
nothing forbidden), then imports each module in a forked child of its own: the same answer as a
fresh interpreter per module, without paying for torch or Prefect's import once per module.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

NOT_IN_WORKERS = {"prefect", "mlflow"}
NOTHING_HEAVY = {"prefect", "mlflow", "torch", "ray"}
# layer: (forbidden top-level packages, allowed libraries imported up front)
LAYERS: dict[str, tuple[set[str], list[str]]] = {
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
    "podium.config": (NOTHING_HEAVY, ["pydantic"]),
    "podium.selection": (NOTHING_HEAVY, []),
    "podium.charts": (NOTHING_HEAVY, ["matplotlib"]),  # drawn wherever reports are made, never in a worker
    "podium.gate": (NOTHING_HEAVY, []),
    "podium.provenance": (NOTHING_HEAVY, []),  # `podium lineage --help` answers at once
    "podium.redaction": (NOTHING_HEAVY, []),
    "podium.imports": (NOTHING_HEAVY, []),
    # what a run asks of Ray, read by `podium run` before anything else loads: Ray core and the config only
    "podium.resources": ({"prefect", "mlflow", "torch"}, ["ray", "pydantic"]),
    "podium.settings": (NOTHING_HEAVY, ["pydantic_settings"]),
    # a fresh run starts training before MLflow (about a second to import) has loaded: the flow, and what
    # `podium run` loads before it, name podium.tracking's functions without loading MLflow
    "podium.flows.pipeline": ({"mlflow", "torch"}, ["prefect", "prefect.futures", "ray.train", "ray.util.queue"]),
    "podium.commands": ({"mlflow", "torch"}, ["prefect"]),
    "podium.cli": (NOTHING_HEAVY, []),  # `podium --help` and a bad flag answer at once
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


@pytest.mark.parametrize("generic", ["training", "tasks", "flows", "deployments"])
def test_podium_takes_no_generic_top_level_name(generic):
    """A user's own `training` or `tasks` package is never shadowed by podium's (nor is it podium's)."""
    spec = importlib.util.find_spec(generic)
    assert spec is None or "podium" not in str(spec.origin) + str(spec.submodule_search_locations)
