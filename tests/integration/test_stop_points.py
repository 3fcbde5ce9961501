"""One point of no return in a promotion (docs/commands.md, "Stopping a command"): the switch of CURRENT. Through
the real `podium promote` process, a signal to its process group at each phase of a promotion, landed there by the
test-only hook PODIUM_TEST_PAUSE_AT (podium.tasks.carry_out.pause_for_tests: the promotion waits at that point until
a stop is asked for), then the exit code, `--json`, the Prefect flow run's state, the registry's alias and the
serving files (CURRENT, versions/) checked against each other.

No training: two runs of the nightly tests' linear model, `weak` and `strong` (the better), made and recorded
without Ray Train (tests/helpers/checkpoints.make_trained_run). Each case promotes `weak` to a serving location and
registered model of its own (the champion), then `strong` with the signal:

  before-stage      SIGINT before anything is staged            130, nothing staged, the champion stays
  stage-copy        SIGTERM inside the staging (model built)    143, nothing copied, the champion stays
  before-switch     SIGINT with the copy sealed                 130, the copy discarded (a tombstone), the champion
  after-switch      SIGINT once CURRENT switched                0: the promotion stands, `--json` and the flow run
                                                                say it and the stop, the alias names it
  (a stop while the candidate awaits approval, SIGINT and SIGTERM: test_promotion_state.py)
  approved          SIGTERM after `podium approve`, before the switch: 143, discarded, the approval kept on it
  shadow            SIGINT during the candidate's shadow        130, withdrawn, the champion stays (no `podium
                                                                serve`: the shadow waits for traffic)

The after-switch case runs with SIGINT and with SIGTERM (a scheduler's, a pod's stop: the same outcome), and the
approved case with SIGTERM. Each case's champion is promoted in the test's process (the promote-run flow): the
stopped promotion after it is the command's. (SIGTERM right after the switch of a `podium run` on a local Ray of its
own, released once training is done: test_cli_alone's training carries it.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.checkpoints import make_trained_run, nightly_home, promote_in_process
from helpers.commands import awaiting_approval, podium_in_process
from podium_nightly_code import FEATURES

pytestmark = pytest.mark.integration

RUNS = {"weak": 40.0, "strong": 5.0}  # angle_deg: the smaller, the better


def _config(root: Path, run: str, case: str, **promotion) -> Path:
    config = {"run_name": run, "model": f"stops-{case}", "storage": str(root / "storage"),
              "serving": str(root / case), "experiment": "stops",
              "data": {"train": str(root / "train.parquet"), "val": str(root / "val.parquet"),
                       "feature_columns": list(FEATURES)},
              "training": {"train_loop": "podium_nightly_code:train_func",
                           "train_loop_config": {"epochs": 2, "angle_deg": RUNS[run]}},
              "scaling": {"num_workers": 1}, "validation": {"fn": "podium_nightly_code:validate_fn"},
              "promotion": {"metric": "accuracy", "mode": "max", "verify": "hashes",
                            "registered_model": f"stops-{case}", **promotion}}
    path = root / f"{case}-{run}.json"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def world(prefect_api, shared_ray, tmp_path_factory, mlflow_template_db):
    """The module's podium home and MLflow store, and its two runs made without training."""
    root = tmp_path_factory.mktemp("stop-points")
    env = nightly_home(root, mlflow_template_db, prefect_api, shared_ray.driver_env())
    for run in RUNS:
        made = make_trained_run(json.loads(_config(root, run, "made").read_text()), env["MLFLOW_TRACKING_URI"])
        assert [r.status for r in made.records] == ["validated", "validated"], made.records
    return root, env


def _champion(world, case: str, **promotion) -> str:
    """Promote `weak` to the case's location, in this process (the champion is the case's setting; the stopped
    promotion after it is the command's): its champion's version."""
    root, env = world
    summary = promote_in_process(json.loads(_config(root, "weak", case, **promotion).read_text()), env)
    assert summary.promotion.promoted.version == "v000001", summary.promotion
    return summary.promotion.promoted.version


def _promote_paused(world, case: str, point: str, *more: str, **promotion) -> tuple[subprocess.Popen, Path]:
    """`podium promote --json` of `strong` in its own process group, set to wait at `point`; and the file it writes
    once it is there."""
    root, env = world
    marker = root / f"paused-{case}"
    env = {**env, "PODIUM_TEST_PAUSE_AT": point, "PODIUM_TEST_PAUSE_FILE": str(marker)}
    proc = subprocess.Popen([sys.executable, "-m", "podium.cli", "promote", "--json", "--config",
                             str(_config(root, "strong", case, **promotion)), *more], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    return proc, marker


def _when(proc: subprocess.Popen, there: Path, timeout_s: float = 300) -> None:
    """Wait until `there` exists; fail with the command's output if it ends first."""
    deadline = time.monotonic() + timeout_s
    while not there.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate(timeout=60)
            raise AssertionError(f"{there.name} never came (exit {proc.returncode}):\n{out[-2000:]}\n{err[-4000:]}")
        time.sleep(0.1)


def _ended(proc: subprocess.Popen, code: int) -> tuple[str, str]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == code, f"exit {proc.returncode}, expected {code}:\n{out[-2000:]}\n{err[-4000:]}"
    assert "Traceback" not in err, err[-4000:]
    return out, err


def _flow_run_state(run_name: str, which: str = "promote") -> str:
    """The final state of the newest flow run of `podium <which> --run-name run_name`."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    deadline = time.monotonic() + 60
    while True:
        with get_client(sync_client=True) as client:
            [newest] = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(
                any_=[f"{run_name}-{which}"])), sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=1)
        if newest.state and newest.state.is_final() or time.monotonic() > deadline:
            return newest.state_name
        time.sleep(0.5)


def _registry(world, case: str) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """The case's registered model: its aliases (alias -> version) and each version's tags."""
    from podium.tracking.client import tracking_client

    client = tracking_client(world[1]["MLFLOW_TRACKING_URI"])
    name = f"stops-{case}"
    aliases = client.get_registered_model(name).aliases
    aliases = dict(aliases) if isinstance(aliases, dict) else {a.alias: a.version for a in aliases}
    return aliases, {v.version: dict(v.tags or {}) for v in client.search_model_versions(f"name = '{name}'")}


def assert_serving_agrees(world, case: str, current: str) -> None:
    """CURRENT names `current`, a complete version; every other version folder is complete or a tombstone, none
    staged; @champion is the registered version of CURRENT's identity, no challenger alias and nothing pending
    is left; `podium history` says the same."""
    from podium.serving.history import current_switch, parse_switch
    from podium.serving.layout import read_current, read_history

    root, env = world
    location = root / case
    served = read_current(str(location))
    assert served is not None and served.version == current, (served, current)
    for folder in sorted((location / "versions").iterdir()):
        assert not (folder / "STAGED.json").exists(), f"{folder.name} is still marked staged"
        assert (folder / "MANIFEST.json").exists() != (folder / "DISCARDED.json").exists(), \
            f"{folder.name} is neither complete nor a tombstone: {sorted(os.listdir(folder))}"
    aliases, tags = _registry(world, case)
    assert set(aliases) == {"champion"}, aliases
    assert tags[aliases["champion"]]["podium.version_uid"] == served.manifest["version_uid"], (aliases, tags)
    assert not [v for v, t in tags.items() if t.get("podium.approval") == "pending"], tags
    # what `podium history` reads (its command is tested in test_cli_process): one process fewer per case
    switches = [parse_switch(doc) for doc in read_history(str(location))]
    assert switches[current_switch(switches, current)].version == current == switches[-1].version, switches[-3:]


def _stopped_before_switch(world, case: str, point: str, signum: signal.Signals, staged: bool) -> None:
    """A stop at `point` (before the switch): the exit code of the signal, no JSON, the one line, the flow run
    Cancelled, the champion still current and alone in the registry; the candidate's folder a tombstone if it was
    staged, else none made."""
    root, _ = world
    champion = _champion(world, case)
    proc, marker = _promote_paused(world, case, point)
    _when(proc, marker)
    os.killpg(proc.pid, signum)
    out, err = _ended(proc, 128 + signum)
    assert out.strip() == "", out  # no JSON: nothing was promoted, the exit code says so
    assert f"stopped before the switch: nothing was promoted ({signum.name})" in err, err[-3000:]
    assert "`podium promote --run-name strong` asks again" in err, err[-3000:]
    assert _flow_run_state("strong") == "Cancelled"
    versions = sorted(p.name for p in (root / case / "versions").iterdir())
    assert versions == (["v000001", "v000002"] if staged else ["v000001"]), versions
    if staged:
        assert (root / case / "versions" / "v000002" / "DISCARDED.json").exists()
    _, tags = _registry(world, case)
    assert len(tags) == 1, tags  # nothing registered for the candidate
    assert_serving_agrees(world, case, champion)


def test_a_stop_before_anything_is_staged_promotes_nothing(world):
    _stopped_before_switch(world, "before-stage", "before-stage", signal.SIGINT, staged=False)


def test_a_stop_during_the_staging_promotes_nothing_and_copies_nothing(world):
    _stopped_before_switch(world, "stage-copy", "stage-copy", signal.SIGTERM, staged=False)


def test_a_stop_with_the_copy_sealed_discards_it_and_the_champion_stays(world):
    _stopped_before_switch(world, "before-switch", "before-switch", signal.SIGINT, staged=True)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_right_after_the_switch_completes_the_promotion_and_every_output_says_so(world, signum):
    case = f"after-switch-{signum.name}"
    _champion(world, case)
    proc, marker = _promote_paused(world, case, "after-switch")
    _when(proc, marker)
    os.killpg(proc.pid, signum)
    out, err = _ended(proc, 0)
    said = json.loads(out.strip().splitlines()[-1])
    late = f"{signum.name} after the switch: v000002 promoted; the run is complete"
    assert said["promoted"]["version"] == "v000002" and said["champion"]["version"] == "v000002", said
    assert said["late_stop"] == late and f"podium: {late}" in err, (said, err[-3000:])
    aliases, tags = _registry(world, case)
    assert said["promoted"]["mlflow_version"] == str(aliases["champion"]), (said["promoted"], aliases)
    assert _flow_run_state("strong") == "Completed"
    assert_serving_agrees(world, case, "v000002")


def test_a_stop_after_the_approval_but_before_the_switch_withdraws_the_approved_candidate(world):
    root, env = world
    case = "approved"
    champion = _champion(world, case)
    proc, marker = _promote_paused(world, case, "before-switch", "--approval", "required")
    awaiting_approval(proc, "strong")
    # the approval in this process (`podium approve`'s own: test_promotion_state, test_promotion_policy)
    podium_in_process(["approve", "--run-name", "strong", "--reason", "looks good", "--by", "test"], env)
    _when(proc, marker)  # approved, sealed, about to switch
    os.killpg(proc.pid, signal.SIGTERM)  # a scheduler's stop: as Ctrl-C's
    out, err = _ended(proc, 143)
    assert out.strip() == "" and "stopped before the switch: nothing was promoted (SIGTERM)" in err, err[-3000:]
    assert _flow_run_state("strong") == "Cancelled"
    assert (root / case / "versions" / "v000002" / "DISCARDED.json").exists()
    # the person's approval is kept on the version the stop discarded (docs/promotion-policy.md)
    _, tags = _registry(world, case)
    [kept] = [t for t in tags.values() if t.get("podium.serving_version") == "v000002"]
    assert (kept["podium.approval"], kept["podium.approval.decided"], kept["podium.approval.reason"]) == \
        ("discarded", "approved", "looks good"), kept
    assert kept["podium.approval.by"].startswith("test"), kept
    assert_serving_agrees(world, case, champion)


def test_a_stop_during_the_shadow_withdraws_the_candidate_and_the_champion_stays(world):
    root, _ = world
    case = "shadow"
    shadowed = {"model_loader": "podium_nightly_code:load_linear", "rollout": "shadow",
                "shadow": {"requests": 8, "duration_s": 300}}
    champion = _champion(world, case, **shadowed)
    proc, _ = _promote_paused(world, case, "none", **shadowed)
    _when(proc, root / case / "SHADOW")  # no `podium serve`: the shadow waits for traffic until the stop
    os.killpg(proc.pid, signal.SIGINT)
    out, err = _ended(proc, 130)
    assert out.strip() == "" and "stopped before the switch: nothing was promoted (SIGINT)" in err, err[-3000:]
    assert _flow_run_state("strong") == "Cancelled"
    assert not (root / case / "SHADOW").exists()
    assert (root / case / "versions" / "v000002" / "DISCARDED.json").exists()
    assert_serving_agrees(world, case, champion)
