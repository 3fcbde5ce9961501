"""The champion ledger is the one writer of what MLflow's registry holds about serving.

Read from the source, as tests/unit/test_layers.py reads imports: every call of one of MlflowClient's registry
writes (aliases, versions, version and model tags, descriptions), in every module of the installed package, is in
podium/tracking/ledger.py. A LoggedModel's tags are written by the ledger (promoted, withdrawn, the versions made
from it) and by the checkpoint's record (podium/tracking/records.py: its status, metrics, verdict), nowhere else.
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers.modules import podium_modules

from podium.tracking import ledger

REGISTRY_WRITES = {
    "create_registered_model", "rename_registered_model", "update_registered_model", "delete_registered_model",
    "set_registered_model_tag", "delete_registered_model_tag",
    "set_registered_model_alias", "delete_registered_model_alias",
    "create_model_version", "update_model_version", "delete_model_version", "transition_model_version_stage",
    "set_model_version_tag", "delete_model_version_tag", "copy_model_version",
}
LOGGED_MODEL_TAG_WRITES = {"set_logged_model_tags", "delete_logged_model_tag"}
LOGGED_MODEL_TAG_WRITERS = {"podium.tracking.ledger", "podium.tracking.records"}
# the tags a promotion, an approval or a rollback write on a LoggedModel: the ledger's alone
PROMOTION_TAGS = {ledger.TAG_PROMOTED, "podium.withdrawn", "mlflow.modelVersions"}


def _calls(path: Path) -> list[tuple[str, int, ast.Call]]:
    """Every call of a method by name (`x.name(...)`) in a module: (name, line, the call)."""
    return [(node.func.attr, node.lineno, node) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)]


def test_only_the_ledger_writes_the_registry():
    modules = podium_modules()
    assert "podium.tracking.ledger" in modules and "podium.tasks.carry_out" in modules
    found = [f"{module}:{line}: {name}" for module, path in modules.items() for name, line, _ in _calls(path)
             if name in REGISTRY_WRITES and module != "podium.tracking.ledger"]
    assert not found, "registry writes outside podium.tracking.ledger:\n" + "\n".join(found)
    writes = {name for name, _, _ in _calls(modules["podium.tracking.ledger"])}
    assert {"set_registered_model_alias", "delete_registered_model_alias", "create_model_version",
            "set_model_version_tag", "set_registered_model_tag"} <= writes  # the test reads the right calls


def test_only_the_ledger_writes_a_logged_model_s_promotion_tags():
    modules = podium_modules()
    outside = [f"{module}:{line}: {name}" for module, path in modules.items() for name, line, _ in _calls(path)
               if name in LOGGED_MODEL_TAG_WRITES and module not in LOGGED_MODEL_TAG_WRITERS]
    assert not outside, "LoggedModel tags written outside the ledger and the records:\n" + "\n".join(outside)
    records = modules["podium.tracking.records"].read_text()
    assert not [tag for tag in PROMOTION_TAGS - {"podium.withdrawn"} if tag in records]
    # the records module reads `podium.withdrawn` (a record's state) but never writes it
    for name, line, call in _calls(modules["podium.tracking.records"]):
        if name in LOGGED_MODEL_TAG_WRITES:
            assert "TAG_WITHDRAWN" not in ast.unparse(call), f"records.py:{line} writes the withdrawn tag"


ALIAS_MOVES = {"set_registered_model_alias", "delete_registered_model_alias"}


def test_one_function_moves_an_alias_and_only_the_ledger_calls_it():
    """"Who moves @champion?": podium.tracking.ledger.move_alias, called by the ledger's own verbs only."""
    modules = podium_modules()
    tree = ast.parse(modules["podium.tracking.ledger"].read_text())
    movers = {fn.name for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)
              for node in ast.walk(fn) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ALIAS_MOVES}
    assert movers == {"move_alias"}
    outside = [f"{module}:{line}: {name}" for module, path in modules.items() if module != "podium.tracking.ledger"
               for name, line, _ in _calls(path) if name in ALIAS_MOVES | {"move_alias"}]
    assert not outside, "alias moves outside podium.tracking.ledger:\n" + "\n".join(outside)
    # nor by name: no other module reaches MlflowClient's alias writes through getattr or a string
    spelled = [module for module, path in modules.items() if module != "podium.tracking.ledger"
               and any(name in path.read_text() for name in ALIAS_MOVES)]
    assert not spelled, spelled
