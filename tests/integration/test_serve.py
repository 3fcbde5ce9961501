"""`podium serve` through the real commands, on loopback: one `podium serve` process for the module (on the test
process's Ray head, as a team's cluster runs it), live requests in threads while `podium promote` and
`podium rollback` switch the serving location's CURRENT. No training: the run's checkpoints are made
(helpers.checkpoints), and the nightly model's loader makes every version an MLflow model."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.checkpoints import make_trained_run, nightly_home
from helpers.commands import podium
from helpers.live import Load, call, predictions, serving
from podium_nightly_code import FEATURES

pytestmark = pytest.mark.integration

RUN = "live"
# rows the two checkpoints disagree on (epoch 1 is turned 20 degrees from the true boundary, epoch 0 40 degrees)
ROWS = [[-0.5, 1.0, 0.0, 0.0], [1.0, 0.2, 0.0, 0.0], [-1.0, -0.3, 0.5, 0.0]]
BODY = json.dumps({"dataframe_split": {"columns": FEATURES, "data": ROWS}}).encode()


@pytest.fixture(scope="module")
def live(prefect_api, shared_ray, tmp_path_factory, mlflow_template_db):
    """A module's own podium home and MLflow store, the session's Prefect server and Ray head, and one made run
    (2 checkpoints, epoch 1 the better)."""
    root = tmp_path_factory.mktemp("serve")
    env = nightly_home(root, mlflow_template_db, prefect_api, shared_ray.driver_env())
    made = make_trained_run(json.loads(_config(root).read_text()), env["MLFLOW_TRACKING_URI"])
    assert [r.status for r in made.records] == ["validated", "validated"], made.records
    return root, env


def _config(root: Path, **promotion) -> Path:
    config = {"run_name": RUN, "model": "live", "storage": str(root / "storage"), "serving": str(root / "serving"),
              "data": {"train": str(root / "train.parquet"), "val": str(root / "val.parquet"),
                       "feature_columns": list(FEATURES)},
              "training": {"train_loop": "podium_nightly_code:train_func",
                           "train_loop_config": {"epochs": 2, "angle_deg": 20.0}},
              "scaling": {"num_workers": 1}, "validation": {"fn": "podium_nightly_code:validate_fn"},
              "promotion": {"metric": "accuracy", "mode": "max", "verify": "load",
                            "model_loader": "podium_nightly_code:load_linear", **promotion}}
    path = root / f"config-{abs(hash(json.dumps(promotion, sort_keys=True)))}.json"
    path.write_text(json.dumps(config))
    return path


def _promote(live, *more: str, **promotion) -> dict:
    root, env = live
    proc = subprocess.run([sys.executable, "-m", "podium.cli", "promote", "--json", "--config",
                           str(_config(root, **promotion)), *more], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_requests_across_a_promotion_and_a_rollback_never_fail_and_each_is_answered_by_one_whole_version(live):
    root, env = live
    location = str(root / "serving")
    assert _promote(live)["promoted"]["version"] == "v000001"
    with serving(location, env) as served:
        health = json.loads(call(f"{served.url}/health").body)
        assert health["version"] == "v000001" and health["refused"] == {}, health
        with Load(served.url, BODY) as load:
            load.wait_for("v000001", after=0)
            # the other checkpoint, promoted over it: the replica loads it beside v000001, then switches
            promoted = _promote(live, "--always-promote", mode="min")
            assert promoted["promoted"]["version"] == "v000002", promoted
            switched = time.monotonic()
            first_new = load.wait_for("v000002", after=0)
            load.wait_for("v000002", after=switched)
            # a rollback switches back the same way
            rolling_back = time.monotonic()
            rolled = json.loads(podium(["rollback", "--json", "--serving", location, "--model", "live"], env).stdout)
            assert rolled["to_version"] == "v000001", rolled
            rolled_back = time.monotonic()
            back = load.wait_for("v000001", after=rolled_back)
            time.sleep(2)  # answers after the switch back, to see that none comes from v000002 any more
        answers = load.answers
    failed = [a for a in answers if a.status != 200]
    assert not failed, f"{len(failed)} of {len(answers)} requests failed, e.g. {failed[:3]}"
    assert {a.version for a in answers} == {"v000001", "v000002"}, {a.version for a in answers}
    # each answer is its version's own: one version's predictions, never a mix or a half-loaded model's
    by_version = {v: {json.dumps(predictions(a)) for a in answers if a.version == v} for v in ("v000001", "v000002")}
    assert all(len(p) == 1 for p in by_version.values()) and by_version["v000001"] != by_version["v000002"], by_version
    # one replica switches in place: once a version answers, no request sent after that gets the one before
    assert not [a for a in answers if a.sent > first_new.answered and a.answered < rolling_back
                and a.version == "v000001"], "v000001 answered after v000002 had"
    assert not [a for a in answers if a.sent > back.answered and a.version == "v000002"], \
        "v000002 answered after the rollback's v000001 had"
    # the new version answers soon after the command that switched it ends (a poll, a load and a check)
    assert back.answered - rolled_back < 60, f"the rollback's version answered {back.answered - rolled_back:.1f} s later"
    said = served.output()
    assert "serving " in said and ": v000002 at http://127.0.0.1:" in said and "NOT switched" not in said, said
    print(f"{len(answers)} requests, 0 failed; the rollback's version answered "
          f"{back.answered - rolled_back:.1f} s after the command ended")
