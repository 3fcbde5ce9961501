"""`podium promote --run-name R` promotes R on R's own settings, and a version served as files never replaces a
champion that loads as an MLflow model unless asked: through the real `podium` process.

No training: two runs of the nightly tests' linear model (2 epochs: epoch 1 the more accurate), their checkpoints made
directly in storage and recorded in the module's MLflow store with podium's own functions, as a `podium run` with
`--metric accuracy --mode max` would have left them (tests/helpers/checkpoints.py), each with a serving location
of its own in its record (the command serves where it is told, by default `.podium/serving/podium`):

  loadable   its record names the model loader (podium_nightly_code:load_linear): its versions are MLflow models
  files      no loader: its checkpoints (weights.json) are served as files

In order, each `podium promote` a command a user types, with no --config: the command knows only the run's name.

  1. promote loadable --always-promote           accuracy (max) from the run's record, epoch 1, an MLflow model that
                                                 `models:/podium@champion` loads and predicts with
  2. promote loadable --mode min --always-promote the flag overrides the run's mode (epoch 0), and says so
  3. promote files --always-promote              refused by the loadable gate, exit 0, the champion unchanged
  4. promote files --always-promote --allow-files admitted: the files are the champion, as asked
  5. promote foreign                             a run podium did not record: the command's own settings, said so
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
from helpers.checkpoints import make_trained_run, nightly_home
from helpers.commands import podium
from podium_nightly_code import FEATURES

pytestmark = pytest.mark.integration

LOADER = "podium_nightly_code:load_linear"
# loads the alias's model in a process of its own (no MLflow state shared with the test's) and predicts 3 rows
LOAD_CHAMPION = """
import sys, mlflow.pyfunc, pandas as pd
model = mlflow.pyfunc.load_model("models:/podium@champion")
rows = pd.DataFrame([[1.0, 0.2, 0.0, 0.0], [-1.0, -0.3, 0.5, 0.0], [0.5, 1.0, 0.0, 0.0]], columns=sys.argv[1:])
print([int(v) for v in model.predict(rows)])
"""


def _config(root: Path, run: str, promotion: dict) -> dict:
    """What `podium run --run-name RUN --metric accuracy --mode max ...` of the nightly model is configured with."""
    return {"run_name": run, "storage": str(root / "storage"), "serving": str(root / f"{run}-own-serving"),
            "data": {"train": str(root / "train.parquet"), "val": str(root / "val.parquet"),
                     "feature_columns": list(FEATURES)},
            "training": {"train_loop": "podium_nightly_code:train_func",
                         "train_loop_config": {"epochs": 2, "angle_deg": 20.0}},
            "scaling": {"num_workers": 1}, "validation": {"fn": "podium_nightly_code:validate_fn"},
            "promotion": {"metric": "accuracy", "mode": "max", **promotion}}


def _promote(env: dict[str, str], *args: str) -> types.SimpleNamespace:
    """`podium promote --json ARGS` (no --config); its exit code, JSON outcome and progress lines (stderr)."""
    proc = podium(["promote", "--json", *args], env)
    return types.SimpleNamespace(out=json.loads(proc.stdout.strip().splitlines()[-1]), said=proc.stderr)


def _champion_predicts(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LOAD_CHAMPION, *FEATURES], env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def promotions(prefect_api, tmp_path_factory, mlflow_template_db):
    """The module's home and MLflow store, the two made runs and a foreign one, and each step's outcome (see the
    module), with whether the champion loaded the MLflow way after each."""
    from mlflow.tracking import MlflowClient

    from podium.tracking.client import TAG_RUN

    root = tmp_path_factory.mktemp("run-settings")
    env = nightly_home(root, mlflow_template_db, prefect_api, {})
    for run, promotion in (("loadable", {"model_loader": LOADER}), ("files", {})):
        made = make_trained_run(_config(root, run, promotion), env["MLFLOW_TRACKING_URI"])
        assert [r.status for r in made.records] == ["validated", "validated"], made.records
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])  # a run of the model's experiment that podium did not make
    client.create_run(client.get_experiment_by_name("podium").experiment_id, run_name="foreign",
                      tags={TAG_RUN: "foreign"})
    steps = types.SimpleNamespace(root=root, env=env)
    steps.own = _promote(env, "--run-name", "loadable", "--always-promote")
    steps.own_loads = _champion_predicts(env)
    steps.flag = _promote(env, "--run-name", "loadable", "--mode", "min", "--always-promote")
    steps.refused = _promote(env, "--run-name", "files", "--always-promote")
    steps.refused_loads = _champion_predicts(env)
    steps.allowed = _promote(env, "--run-name", "files", "--always-promote", "--allow-files")
    steps.foreign = _promote(env, "--run-name", "foreign")
    return steps


def test_a_promotion_of_a_run_uses_the_run_s_own_metric_mode_and_model_loader(promotions):
    out, said = promotions.own.out, promotions.own.said
    promoted = out["promoted"]
    assert promoted is not None, out["promotion_reason"]  # on the command's defaults (val_loss): nothing to promote
    assert (promoted["version"], promoted["step"], promoted["metric"]) == ("v000001", 1, "accuracy"), promoted
    assert promoted["served_as"] == "mlflow-model", promoted  # the run's loader built the served model
    # the command's own serving location, not the one in the run's record
    assert promoted["uri"].startswith(str(promotions.root / "home" / "serving" / "podium")), promoted["uri"]
    settings = out["settings"]
    assert settings["from_run"] is True and settings["overridden"] == {}, settings
    assert settings["used"]["promotion.metric"] == "accuracy" and settings["used"]["promotion.mode"] == "max"
    assert settings["used"]["promotion.model_loader"] == LOADER
    line = f"using run loadable's settings: metric accuracy (max), model loader {LOADER}"
    assert line in said and settings["said"].startswith(line), said


def test_the_champion_promoted_on_the_run_s_settings_loads_and_predicts_the_mlflow_way(promotions):
    loaded = promotions.own_loads
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert loaded.stdout.strip() == "[1, 0, 1]", loaded.stdout


def test_a_flag_overrides_a_recorded_setting_and_the_command_says_so(promotions):
    out, said = promotions.flag.out, promotions.flag.said
    assert out["promoted"]["version"] == "v000002" and out["promoted"]["step"] == 0, out["promotion_reason"]
    assert out["promoted"]["served_as"] == "mlflow-model"  # the rest is still the run's: its loader
    assert out["settings"]["overridden"] == {"promotion.mode": {"run": "max", "used": "min", "by": "--mode"}}
    assert "overridden here: promotion.mode = 'min' (--mode; the run's: 'max')" in said, said


def test_a_version_served_as_files_is_refused_over_a_champion_that_loads(promotions):
    out = promotions.refused.out
    reason = out["promotion_reason"]
    assert out["promoted"] is None and out["champion"]["version"] == "v000002", out
    assert reason.startswith("not promoted: step 1 would be served as files"), reason
    assert "champion v000002 loads as an MLflow model" in reason
    assert "--model-class package.module:Class" in reason and "--allow-files" in reason
    assert "docs/promotion-policy.md#a-version-served-as-files" in reason
    assert promotions.refused_loads.returncode == 0, promotions.refused_loads.stderr[-3000:]


def test_allow_files_admits_a_version_served_as_files_as_asked(promotions):
    out = promotions.allowed.out
    assert out["promoted"]["version"] == "v000003" and out["promoted"]["served_as"] == "files", out
    assert "as promotion.allow_files (--allow-files) asks" in out["promotion_reason"]
    assert out["settings"]["used"]["promotion.allow_files"] is True


def test_a_run_podium_did_not_record_is_promoted_on_the_command_s_settings_said_in_one_line(promotions):
    out, said = promotions.foreign.out, promotions.foreign.said
    assert out["promoted"] is None and out["settings"]["from_run"] is False, out
    assert out["settings"]["used"]["promotion.metric"] == "val_loss"
    assert ("run foreign: its settings are not recorded in MLflow (a run from before podium recorded them, or one "
            "podium did not make): promoting with this command's settings: metric val_loss (min)") in said, said
