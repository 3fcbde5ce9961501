"""The five-minute tour of README.md and Getting started, as a newcomer types it: the `podium` command in a fresh
project folder on the embedded defaults (no servers configured, no PODIUM_HOME: `./.podium`), each step's command
as the docs write it, each step's key line as the docs show it. Two trainings: the tour's own."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "docs" / "getting-started.md"]
PODIUM = os.path.join(os.path.dirname(sys.executable), "podium")  # the console script a user runs
# the one line the docs give for MLflow to find the embedded store, from the project folder
EMBEDDED_STORE = "MLFLOW_TRACKING_URI=sqlite:///.podium/mlflow.db"

# the tour's commands, in order, as the docs write them, with the line each one's output must have
TOUR = [
    ("podium run", r"^promoted step \d+ \(val_loss=0\.\d+\) as v000001: .*/\.podium/serving/podium/versions/"
                   r"v000001/model$", r"^  MLflow: models:/podium@champion = version 1$"),
    ("podium status", r"^this run promoted: v000001 \(step \d+, val_loss=0\.\d+\)$",
                      r"^champion of model podium at .*: v000001 "),
    ("podium history", r": 1 switch\(es\), current v000001$", r"promote  v000001  run podium-demo"),
    ("podium lineage v000001", r"^v000001 \(current\): step \d+ of run podium-demo"),
    ("podium run --run-name second --learning-rate 0.003",
     r"^promoted step \d+ \(val_loss=0\.\d+\) as v000002: ", r"better than champion v000001 \(0\.\d+\) by",
     r"^  MLflow: models:/podium@champion = version 2$"),
    ("podium rollback", r": v000002 -> v000001 \(v000002 withdrawn\); alias champion -> version 1$"),
    ("podium history", r": 3 switch\(es\), current v000001$", r"rollback v000001 .*withdrew v000002  \[current\]$"),
]

# README's snippet as written there (it builds its DataFrame from the demo data), and what the test reads of it
_SNIPPET = re.search(r"```python\n(import mlflow\n.*?)```", PAGES[0].read_text(), re.S)
LOAD = (_SNIPPET.group(1) if _SNIPPET else "raise SystemExit('README.md has no snippet that loads the champion')") + """
print("predicted", len(mlflow.pyfunc.load_model("models:/podium@champion").predict(df)), len(model.predict_proba(df)))
print("champion version", mlflow.MlflowClient().get_model_version_by_alias("podium", "champion").version)
"""


def _embedded_env() -> dict[str, str]:
    """A newcomer's shell: no servers configured, no PODIUM_HOME."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "RAY_ADDRESS", "PODIUM_MLFLOW_UI_URL",
                         "PODIUM_HOME")}


def _step(command: str, folder: Path, env: dict[str, str]) -> str:
    args = shlex.split(command)
    proc = subprocess.run([PODIUM, *args[1:]], cwd=folder, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"`{command}` exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc.stdout


def _load_champion(folder: Path, env: dict[str, str]) -> str:
    """The docs' Python snippet, run from the project folder with the line the docs give."""
    name, value = EMBEDDED_STORE.split("=", 1)
    proc = subprocess.run([sys.executable, "-c", LOAD], cwd=folder, env=env | {name: value}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def test_the_docs_show_the_tour_as_this_test_runs_it():
    """Each command of the tour, and the line that points MLflow at the embedded store, is on both pages."""
    for page in PAGES:
        text = page.read_text()
        for command, *_ in TOUR:
            assert re.search(rf"^{re.escape(command)}\b", text, re.M), f"{page.name} lacks `{command}`"
        assert EMBEDDED_STORE in text and 'mlflow.pyfunc.load_model("models:/podium@champion")' in text, page.name


def test_the_tour_promotes_a_second_version_rolls_back_and_loads_the_champion(tmp_path):
    """The tour in order, in a fresh folder; each step's key line; the champion loads the MLflow way before and
    after the rollback; the folder's Prefect server is stopped at the end, whatever happened."""
    folder = tmp_path / "project"
    folder.mkdir()
    env = _embedded_env()
    try:
        for i, (command, *expected) in enumerate(TOUR):
            out = _step(command, folder, env)
            for pattern in expected:
                assert re.search(pattern, out, re.M), f"`{command}` printed no line like {pattern!r}:\n{out}"
            if i == 0:
                loaded = _load_champion(folder, env)
                assert "predicted 8 8" in loaded and "champion version 1" in loaded, loaded
        loaded = _load_champion(folder, env)  # after the rollback: version 1 again
        assert "predicted 8 8" in loaded and "champion version 1" in loaded, loaded
        assert not (folder / "mlflow.db").exists(), "MLflow made a store of its own in the project folder"
    finally:
        subprocess.run([PODIUM, "server", "stop"], cwd=folder, env=env, capture_output=True, timeout=120)
