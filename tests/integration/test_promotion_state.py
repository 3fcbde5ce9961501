"""What is served is what was decided, whatever a team does in whatever order: through the `podium` command.

No training: one run of the nightly tests' linear model (2 epochs: epoch 0 is the worse checkpoint, epoch 1 the
better), its checkpoints made directly in storage and recorded in the module's MLflow store with podium's own
functions, validated by the real validation function (tests/helpers/checkpoints.py), carries every case: the cases
are about the promotion, not the training. Each case is `podium promote` (the real process) of that run to serving
locations of its own, with its own registered model, so the cases do not depend on each other. After each step the
stores are checked against one another (`assert_state_agrees`): the served version's identity is the one the alias's
registered version carries, the bytes the alias loads are the bytes served, no candidate is left pending or staged,
and `podium history` names what CURRENT names.

  rejected, then approved      a rejected candidate keeps its number (a tombstone); the next, approved, is what the
                               alias loads (on podium <= 0.3 the alias named the rejected model)
  two locations of one model   the second may not take the first's alias; with an alias of its own, a rollback at
                               one never moves the other's
  Ctrl-C, SIGTERM              the candidate awaiting approval is withdrawn, the flow run Cancelled, the command says
                               how to ask again
  SIGKILL                      `podium approve` of the dead command's run refuses and withdraws its candidate; the
                               next `podium promote` withdraws what another kill left
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.checkpoints import make_trained_run, nightly_home, promote_in_process
from helpers.commands import awaiting_approval, podium, podium_in_process
from podium_nightly_code import FEATURES

pytestmark = pytest.mark.integration

RUN = "state"


@pytest.fixture(scope="module")
def world(prefect_api, shared_ray, tmp_path_factory, mlflow_template_db):
    """A module's own podium home and MLflow store, the session's Prefect server and Ray head, and one run (`state`:
    2 checkpoints, epoch 1 the better), made and recorded without training."""
    root = tmp_path_factory.mktemp("promotion-state")
    env = nightly_home(root, mlflow_template_db, prefect_api, shared_ray.driver_env())
    made = make_trained_run(json.loads(_config(root, "trained", "state-train").read_text()), env["MLFLOW_TRACKING_URI"])
    assert [r.status for r in made.records] == ["validated", "validated"], made.records
    return root, env


def _config(root: Path, serving: str, registered_model: str, **promotion) -> Path:
    config = {"run_name": RUN, "model": "state", "storage": str(root / "storage"), "serving": str(root / serving),
              "data": {"train": str(root / "train.parquet"), "val": str(root / "val.parquet"),
                       "feature_columns": list(FEATURES)},
              "training": {"train_loop": "podium_nightly_code:train_func",
                           "train_loop_config": {"epochs": 2, "angle_deg": 20.0}},
              "scaling": {"num_workers": 1}, "validation": {"fn": "podium_nightly_code:validate_fn"},
              "promotion": {"metric": "accuracy", "mode": "max", "verify": "hashes",
                            "registered_model": registered_model, **promotion}}
    path = root / f"{serving}-{registered_model}-{abs(hash(json.dumps(promotion, sort_keys=True)))}.json"
    path.write_text(json.dumps(config))
    return path


def _promote(world, serving: str, registered_model: str, *more: str, **promotion) -> subprocess.Popen:
    """`podium promote --json` of the trained run, in the background (its own process group, as from a terminal)."""
    root, env = world
    return subprocess.Popen([sys.executable, "-m", "podium.cli", "promote", "--json", "--config",
                             str(_config(root, serving, registered_model, **promotion)), *more], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _awaiting(proc: subprocess.Popen) -> str:
    """The paused flow run's id once the command's candidate awaits approval."""
    return awaiting_approval(proc, RUN)


def _ended(proc: subprocess.Popen, code: int = 0) -> tuple[str, str]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == code, f"exit {proc.returncode}, expected {code}:\n{out[-2000:]}\n{err[-4000:]}"
    return out, err


def _flow_run_state(flow_run_id: str) -> str:
    from uuid import UUID

    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(UUID(flow_run_id)).state_name


def _sha256_tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in folder.rglob("*") if p.is_file()}


def _client(world):
    """The module's MLflow store, its registry included (MlflowClient alone looks for the registry elsewhere)."""
    from podium.tracking.client import tracking_client

    return tracking_client(world[1]["MLFLOW_TRACKING_URI"])


def assert_state_agrees(world, serving: str, name: str, alias: str = "champion") -> None:
    """The serving location, the registry and the history say the same thing, and nothing is left half-done."""
    import mlflow.artifacts

    from podium.serving.layout import read_current, read_history, read_pointer

    root, env = world
    location = root / serving
    client = _client(world)
    versions = client.search_model_versions(f"name = '{name}'")
    assert not [v.version for v in versions if (v.tags or {}).get("podium.approval") == "pending"], "left pending"
    aliases = client.get_registered_model(name).aliases
    assert not [a for a in aliases if a.endswith("challenger")], f"a challenger alias outlived its command: {aliases}"
    for folder in sorted((location / "versions").iterdir()):
        assert not (folder / "STAGED.json").exists(), f"{folder.name} is still marked staged"
        assert (folder / "MANIFEST.json").exists() != (folder / "DISCARDED.json").exists(), \
            f"{folder.name} is neither complete nor a tombstone: {sorted(os.listdir(folder))}"
    current = read_current(str(location))
    # what `podium history` reads and says (its command is tested in test_cli_process): one process fewer per check
    pointed = (read_pointer(str(location)) or {}).get("version")
    if current is None:
        assert alias not in aliases and pointed is None
        return
    assert pointed == current.version == read_history(str(location))[-1]["version"]
    registered = client.get_model_version_by_alias(name, alias)
    assert registered.tags["podium.version_uid"] == current.manifest["version_uid"], (
        f"@{alias} is version {registered.version} ({registered.tags.get('podium.serving_version')}), "
        f"serving is {current.version}")
    loaded = Path(mlflow.artifacts.download_artifacts(
        artifact_uri=client.get_model_version_download_uri(name, registered.version),
        dst_path=str(root / "downloads" / f"{name}-{time.time_ns()}")))
    served = {rel: f["sha256"] for rel, f in current.manifest["files"].items()}
    got = _sha256_tree(loaded)
    assert {rel: got.get(rel) for rel in served} == served, "the bytes the alias loads are not the bytes served"


def test_a_rejected_candidate_keeps_its_number_and_the_approved_one_after_it_is_what_the_alias_loads(world):
    root, env = world
    # the worse checkpoint (mode min picks epoch 0) awaits approval, and is rejected
    proc = _promote(world, "s1", "case1", approval="required", mode="min")
    _awaiting(proc)
    # the decisions in this process: `podium reject` and `podium approve` as processes are test_promotion_policy's
    podium_in_process(["reject", "--run-name", RUN, "--reason", "worse on the holiday slice"], env)
    _ended(proc)
    assert (root / "s1" / "versions" / "v000001" / "DISCARDED.json").exists()
    assert_state_agrees(world, "s1", "case1")
    # the better one awaits under a new number, is approved, and is what @champion loads
    proc = _promote(world, "s1", "case1", approval="required")
    _awaiting(proc)
    podium_in_process(["approve", "--run-name", RUN, "--reason", "better"], env)
    out = json.loads(_ended(proc)[0].strip().splitlines()[-1])
    assert out["promoted"]["version"] == "v000002" and out["promoted"]["step"] == 1, out["promotion_reason"]
    assert_state_agrees(world, "s1", "case1")
    champion = _client(world).get_model_version_by_alias("case1", "champion")
    assert champion.tags["podium.approval"] == "approved" and champion.tags["podium.step"] == "1"


def test_two_serving_locations_of_one_model_each_move_only_their_own_alias(world):
    root, env = world
    client = _client(world)
    # the first location's champion, promoted in this process: what is checked is the second's promotion
    promote_in_process(json.loads(_config(root, "a", "case2").read_text()), env)
    a1 = client.get_model_version_by_alias("case2", "champion").version
    # the second location may not take the first's alias: refused before anything is written there
    refused = _promote(world, "b", "case2")
    _, err = _ended(refused, 2)
    assert "alias @champion of registered model 'case2' follows serving location" in err
    assert "needs an alias of its own" in err and "Traceback" not in err
    assert not (root / "b" / "CURRENT").exists() and not (root / "b" / "versions").exists()
    # with an alias of its own it promotes, and a rollback at the first location leaves it where it is
    _ended(_promote(world, "b", "case2", "--alias", "staging"))
    b1 = client.get_model_version_by_alias("case2", "staging").version
    # the other checkpoint, as v000002 (in this process: `--always-promote` through the command: test_run_settings)
    promote_in_process(json.loads(_config(root, "a", "case2", mode="min", always=True).read_text()), env)
    assert client.get_model_version_by_alias("case2", "staging").version == b1
    # in this process (`podium rollback` as a process: test_cli_process)
    rolled = json.loads(podium_in_process(["rollback", "--json", "--serving", str(root / "a"), "--model", "state"],
                                          env).stdout)
    assert rolled["to_version"] == "v000001" and rolled["mlflow_version"] == str(a1)
    assert client.get_model_version_by_alias("case2", "champion").version == a1
    assert client.get_model_version_by_alias("case2", "staging").version == b1
    status = json.loads(podium_in_process(["status", "--json", "--run-name", RUN, "--model", "state", "--serving",
                                           str(root / "b")], env).stdout)
    assert status["champion"]["mlflow_model"] == "models:/case2@staging" and status["disagreements"] == []
    assert_state_agrees(world, "a", "case2")
    assert_state_agrees(world, "b", "case2", "staging")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_while_the_candidate_awaits_approval_withdraws_it(world, signum):
    root, env = world
    serving, name = f"s3-{signum.name}", f"case3-{signum.name.lower()}"
    proc = _promote(world, serving, name, approval="required")
    flow_run_id = _awaiting(proc)
    os.killpg(proc.pid, signum)
    _, err = _ended(proc, 128 + signum)
    assert "nothing was promoted" in err and f"podium promote --run-name {RUN}` asks again" in err, err
    assert _flow_run_state(flow_run_id) == "Cancelled"
    [version] = _client(world).search_model_versions(f"name = '{name}'")
    assert version.tags["podium.approval"] == "withdrawn", version.tags
    assert (root / serving / "versions" / "v000001" / "DISCARDED.json").exists()
    assert_state_agrees(world, serving, name)


def test_a_killed_command_s_candidate_is_withdrawn_by_the_next_command_and_cannot_be_approved(world):
    root, env = world
    proc = _promote(world, "s4", "case4", approval="required")
    flow_run_id = _awaiting(proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    said = podium(["approve", "--run-name", RUN, "--reason", "ok"], env, check=False)
    assert said.returncode == 1, said
    assert "the command that waits for it is gone" in said.stderr and "candidate v000001 was withdrawn" in said.stderr
    assert f"`podium promote --run-name {RUN}` asks again" in said.stderr
    assert _flow_run_state(flow_run_id) == "Crashed"
    assert_state_agrees(world, "s4", "case4")
    # killed again: the next promotion withdraws the leftovers itself, then promotes under a new number
    proc = _promote(world, "s4", "case4", approval="required")
    _awaiting(proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    out, err = _ended(_promote(world, "s4", "case4"))
    assert "withdrew v000002" in err, err
    assert json.loads(out.strip().splitlines()[-1])["promoted"]["version"] == "v000003"
    assert_state_agrees(world, "s4", "case4")
