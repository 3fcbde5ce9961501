"""One name, one meaning: no two of podium's modules define the same public name.

Read from the source: every public top-level function and class, every constant (an UPPER_CASE name), and
every Prefect task's and flow's `name=` (read as a Python name: `validate-and-record` is
`validate_and_record`). A name defined in two modules is a failure unless ALLOWED says why both mean
the same thing (a Prefect task named for the function it wraps, a public entry point over the function
that does the work).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ["podium", "flows", "tasks", "training", "deployments"]  # podium's source, as pyproject.toml maps it

# name -> why the modules that define it mean one thing by it
ALLOWED = {
    # the Prefect tasks around the MLflow adapter carry the names of the functions they call
    "open_tracking_run": "tasks.tracking's Prefect task of tracking.runs.open_tracking_run",
    "find_tracking_run": "tasks.tracking's Prefect task of tracking.runs.find_tracking_run",
    "record_checkpoint": "tasks.tracking's Prefect task of tracking.records.record_checkpoint",
    # the public API's entry point, imported lazily, over the function that does the work
    "load_promoted_model": "podium.load_promoted_model calls podium.training.promoted.load_promoted_model",
    # the tasks layer's call with the run's plan, of the function that knows Ray Train's snapshot
    "remove_unregistered_checkpoints": "tasks.resume's call, with the plan, of training.raytrain's",
    # each command's module adds its own parser and handler under `podium`'s (podium.cli.registry calls them)
    "add_parser": "each podium.cli command module's own parser and handler, which podium.cli.registry adds",
}


def public_names(source: str) -> set[str]:
    """The public names a module's source defines at its top level (TypeVars and `main` aside)."""
    out: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Call) and getattr(decorator.func, "id", None) in ("task", "flow"):
                    out.update(k.value.value.replace("-", "_") for k in decorator.keywords
                               if k.arg == "name" and isinstance(k.value, ast.Constant))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out.update(t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper() and len(t.id) > 1)
    return {n for n in out if not n.startswith("_") and n != "main"}


def shared_names(sources: dict[str, str]) -> dict[str, list[str]]:
    """Each public name defined by more than one module -> those modules."""
    where: dict[str, list[str]] = defaultdict(list)
    for module, source in sorted(sources.items()):
        for name in public_names(source):
            where[name].append(module)
    return {name: modules for name, modules in where.items() if len(modules) > 1}


def podium_sources() -> dict[str, str]:
    """Every module of podium's source (its path in the repository -> its text)."""
    return {str(p.relative_to(REPO)): p.read_text() for folder in FOLDERS for p in sorted((REPO / folder).rglob("*.py"))}


def test_no_two_modules_define_one_public_name():
    sources = podium_sources()
    shared = {name: modules for name, modules in shared_names(sources).items() if name not in ALLOWED}
    assert not shared, ("one name, two definitions (rename one, or say in ALLOWED why they are one thing):\n"
                        + "\n".join(f"  {name}: {', '.join(modules)}" for name, modules in sorted(shared.items())))


def test_every_allowed_name_is_still_shared():
    stale = set(ALLOWED) - set(shared_names(podium_sources()))
    assert not stale, f"ALLOWED names that no two modules define any more: {sorted(stale)}"


def test_a_prefect_name_and_a_constant_count():
    """The check above would see a shared name (the test of the test)."""
    a = 'from prefect import flow\n@flow(name="validate-checkpoint")\ndef run(): ...\nLIMIT = 3\nT = 1\n'
    b = "def validate_checkpoint(c): ...\nLIMIT = 4\ndef _private(): ...\n"
    assert shared_names({"a": a, "b": b}) == {"validate_checkpoint": ["a", "b"], "LIMIT": ["a", "b"]}
