"""The `podium` command, in its own process, in runs that share no world with another test (test_cli_process holds
the module-scoped `alpha` and `beta` runs; apart, xdist runs these beside them):

- the module's one training (`own_packages`): the console script from a user's repository, on a local Ray of
  podium's own, which it releases once training is done, stopped by SIGTERM right after its switch. It carries
  test_a_repository_with_its_own_training_and_tasks_packages (then `podium promote` of its run with a model loader
  instead of its recorded class) and test_a_sigterm_after_training_on_a_local_ray_released_early_completes_the_
  switched_promotion.
- test_a_loop_that_never_checkpoints_fails_the_run: Ray's FashionMNIST example, on the session's Ray head.
- test_a_run_stopped_while_its_server_starts_leaves_no_server_behind: SIGINT and SIGTERM while the embedded
  defaults' Prefect server starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path
from urllib.parse import quote

import pytest
from helpers.commands import podium, prefect_servers_of

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def own_packages(prefect_api, dataset, tmp_path_factory, mlflow_template_db):
    """The module's one training: `podium run` (the console script) from a user's repository with packages named
    `training` and `tasks`, on a local Ray of podium's own, which it shuts down once training is done; the command
    waits once CURRENT has switched (the test-only hook PODIUM_TEST_PAUSE_AT), until that Ray is gone, and is then
    sent SIGTERM, as a pod's stop reaches its main process. Its folders, environment, exit, output and the day."""
    from datetime import datetime, timezone

    tmp_path = tmp_path_factory.mktemp("own-packages")
    shutil.copy(mlflow_template_db, tmp_path / "mlflow.db")
    guide = (REPO / "docs" / "bring-your-own-loop.md").read_text()
    example = re.search(r"```python\n(# mypkg/train\.py\n.*?)```", guide, re.S).group(1)  # type: ignore[union-attr]
    storage_guide = (REPO / "docs" / "object-storage.md").read_text()
    own_fs = re.search(r"```python\n(# training/fs\.py\n.*?)```", storage_guide, re.S).group(1)  # type: ignore[union-attr]
    table = re.search(r"```toml\n(\[storage\]\n.*?)```", storage_guide, re.S).group(1)  # type: ignore[union-attr]
    root = tmp_path / "own-fs"
    repo = tmp_path / "user-repo"
    for package in ("training", "tasks"):
        (repo / package).mkdir(parents=True)
        (repo / package / "__init__.py").write_text("")
    (repo / "training" / "train.py").write_text(example)
    (repo / "training" / "fs.py").write_text(own_fs)
    assert "/mnt/shared/podium" in table
    (repo / "podium.toml").write_text(table.replace("/mnt/shared/podium", str(root)))
    (repo / "tasks" / "checks.py").write_text("from training.train import validate_fn  # noqa: F401\n")
    # a local Ray of podium's own, as a user's first run gets: the user's packages reach its workers through the
    # raylet's path, not an upload
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")}
    env.update({"PODIUM_HOME": str(tmp_path / "home"), "PREFECT_API_URL": prefect_api,
                "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "RAY_AUTH_MODE": "disabled"})
    console_script = os.path.join(os.path.dirname(sys.executable), "podium")
    day = datetime.now(timezone.utc).strftime("%Y%m%d")
    marker = tmp_path / "switched"
    proc = subprocess.Popen(
        [console_script, "run", "--json", "--run-name", "own-packages-v1.2-{date}", "--loop-config", "epochs=2",
         "--num-workers", "1", "--train-loop", "training.train:train_func", "--validate-fn", "tasks.checks:validate_fn",
         "--model-class", "training.train:Net", "--train-data", dataset[0], "--val-data", dataset[1],
         "--metric", "accuracy", "--mode", "max", "--config", "podium.toml", "--serving", str(tmp_path / "serving")],
        cwd=repo, env={**env, "PODIUM_TEST_PAUSE_AT": "after-switch", "PODIUM_TEST_PAUSE_FILE": str(marker)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 480
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, \
                f"the run never switched (exit {proc.poll()}):\n{proc.communicate(timeout=60)[1][-4000:]}"
            time.sleep(0.1)
        _ray_shut_down(proc.pid)  # the signal comes after the local Ray's shutdown, not during it
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=60)
    return types.SimpleNamespace(tmp_path=tmp_path, repo=repo, root=root, env=env, console_script=console_script,
                                 day=day, run=subprocess.CompletedProcess(proc.args, proc.returncode, out, err))


def _ray_shut_down(pid: int, timeout_s: float = 120) -> None:
    """Wait until the local Ray the command `pid` started (its GCS and raylet, its children) is gone: released once
    training was done (podium.training.cluster.release_ray)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                text = stat.read_text()  # "pid (comm) state ppid ..."
            except OSError:
                continue
            name, (state, ppid) = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()[:2]
            if int(ppid) == pid and state != "Z" and name in ("gcs_server", "raylet"):
                children.append(name)
        if not children:
            return
        time.sleep(0.2)
    raise AssertionError(f"the local Ray of podium process {pid} was not shut down after training")


def test_a_repository_with_its_own_training_and_tasks_packages(own_packages, dataset):
    """The user's repository has packages named `training` and `tasks`, as ML repositories often do.
    `podium` (the console script, not `python -m`) runs from the repository's root with no PYTHONPATH
    and resolves the user's packages, not its own (which are podium.training, podium.tasks). The run's name has a
    dot, as a versioned name often does, which MLflow refuses in a checkpoint record's name, and a {date} that the
    command fills. The user's code is the complete example of docs/bring-your-own-loop.md, as written there: its
    loop, validation function and model loader; the champion is a served MLflow model that predicts labels.
    Storage is a filesystem of the user's own, docs/object-storage.md's example as written there
    (training/fs.py, a `[storage]` table): checkpoints land under its root, validations read them through it
    and the champion is built from one of them. (The SIGTERM after its switch: the next test.)"""
    from datetime import datetime, timezone

    from mlflow.tracking import MlflowClient

    tmp_path, repo, root, env = own_packages.tmp_path, own_packages.repo, own_packages.root, own_packages.env
    console_script, day = own_packages.console_script, own_packages.day
    proc = own_packages.run
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [c["status"] for c in out["checkpoints"]] == ["validated", "validated"]
    assert all(c["metrics"]["accuracy"] > 0.5 for c in out["checkpoints"]), out["checkpoints"]
    if out["run_name"] != f"own-packages-v1.2-{day}":  # the command started after midnight (UTC)
        day = datetime.now(timezone.utc).strftime("%Y%m%d")
    assert out["promoted"] is not None and out["run_name"] == f"own-packages-v1.2-{day}"
    # the checkpoints are in the user's filesystem, named by its function and kwargs
    location = f"userfs://training.fs:make_fs;{quote(json.dumps({'root': str(root)}, separators=(',', ':')), safe='')}"
    location += "/checkpoints"
    uris = [c["uri"] for c in out["checkpoints"]]
    assert all(u.startswith(f"{location}/{out['run_name']}/checkpoint_") for u in uris), uris
    assert sorted(p.name for p in (root / "checkpoints" / out["run_name"]).glob("checkpoint_*") if p.is_dir()) == \
        sorted(u.rsplit("/", 1)[1] for u in uris)
    assert not (tmp_path / "storage").exists() and not (repo / ".podium" / "storage").exists()
    # the champion was built from one of them, read through the user's filesystem
    manifest = json.loads((tmp_path / "serving" / "versions" / out["promoted"]["version"] / "MANIFEST.json").read_text())
    assert manifest["checkpoint"] in uris and manifest["step"] == out["promoted"]["step"], manifest
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    models = client.search_logged_models([client.get_experiment_by_name("podium").experiment_id])
    assert {m.name for m in models} == {f"own-packages-v1_2-{day}-step-{c['step']}" for c in out["checkpoints"]}
    # the guide's model loader made the champion a served MLflow model: class labels from the feature columns
    load = ("import json, sys, mlflow, pandas as pd; df = pd.read_parquet(sys.argv[1]).drop(columns=['label']).head(5); "
            "print(json.dumps([int(v) for v in mlflow.pyfunc.load_model('models:/podium@champion').predict(df)]))")
    loaded = subprocess.run([sys.executable, "-c", load, dataset[1]], env=env, capture_output=True, text=True,
                            timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-4000:]
    predicted = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert len(predicted) == 5 and set(predicted) <= {0, 1, 2, 3}, predicted
    # the run was recorded with --model-class; promoted again with the guide's loader instead (which takes no
    # model_class), the loader replaces the recorded class rather than being refused beside it
    again = subprocess.run([console_script, "promote", "--json", "--run-name", out["run_name"], "--model-loader",
                            "training.train:load_model", "--config", "podium.toml", "--serving",
                            str(tmp_path / "serving")], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-4000:]
    promoted = json.loads(again.stdout.strip().splitlines()[-1])
    assert promoted["promoted"] is None and "already the champion" in promoted["promotion_reason"], promoted
    settings = promoted["settings"]
    assert settings["from_run"] and settings["used"]["promotion.model_loader"] == "training.train:load_model"
    assert settings["overridden"]["promotion.model_class"] == {"run": "training.train:Net", "used": None,
                                                               "by": "--model-loader"}, settings


def test_a_sigterm_after_training_on_a_local_ray_released_early_completes_the_switched_promotion(own_packages):
    """`podium run` on a local Ray of its own (no RAY_ADDRESS), which it shuts down as soon as training is done; a
    SIGTERM right after the switch (the promotion runs after that shutdown: Ray's shutdown once reset SIGTERM to its
    default behind Python's back, and the run died of it): the command ends on its own, exit 0, as for Ctrl-C, and
    the flow run, the MLflow run, CURRENT and @champion all say the promotion stood. (A stop at each other point of
    a promotion: test_stop_points.)"""
    from helpers.prefect_queries import flow_run_state

    from podium.serving.layout import read_current
    from podium.tracking.client import tracking_client
    from podium.tracking.runs import find_tracking_run

    proc = own_packages.run
    assert proc.returncode == 0, proc.stderr[-4000:]
    said, err = json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr
    late = "SIGTERM after the switch: v000001 promoted; the run is complete"
    assert "training done" in err, err[-3000:]
    assert said["late_stop"] == late and f"podium: {late}" in err, (said, err[-3000:])
    assert said["promoted"]["version"] == "v000001" == said["champion"]["version"], said
    uri = own_packages.env["MLFLOW_TRACKING_URI"]
    champion = tracking_client(uri).get_model_version_by_alias("podium", "champion")
    assert said["promoted"]["mlflow_version"] == str(champion.version), (said["promoted"], champion)
    served = read_current(str(own_packages.tmp_path / "serving"))
    assert served is not None and served.version == "v000001"
    assert champion.tags["podium.version_uid"] == served.manifest["version_uid"], champion.tags
    assert flow_run_state(f"{said['run_name']}-run").name == "Completed"
    run = find_tracking_run(uri, "podium", said["run_name"])
    assert run.client().get_run(run.run_id).info.status == "FINISHED"


def test_a_loop_that_never_checkpoints_fails_the_run(cli_env, tmp_path):
    """Ray's FashionMNIST example reports metrics only: the run fails, saying how to report a checkpoint."""
    from helpers.prefect_queries import flow_run_state
    from mlflow.tracking import MlflowClient

    cli_env["PYTHONPATH"] = os.path.dirname(__file__)  # the loop's module, as a user's own code
    proc = podium(["run", "--run-name", "no-ckpt", "--train-loop", "ray_example_checks:never_checkpoints",
                   "--validate-fn", "ray_example_checks:validate_tagged", "--num-workers", "1",
                   "--storage", str(tmp_path / "storage"), "--serving", str(tmp_path / "serving")],
                  cli_env, check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "reported metrics 2 time(s) but never with a checkpoint" in proc.stderr
    assert "ray.train.Checkpoint.from_directory" in proc.stderr and "Traceback" not in proc.stderr
    assert flow_run_state("no-ckpt-run").is_failed()
    client = MlflowClient(cli_env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("podium").experiment_id])
    assert run.info.status == "FAILED"


def _signals_as_in_a_terminal() -> None:
    """In the child, before podium starts: SIGINT and SIGTERM with their default action and not blocked, as a command
    a terminal or a scheduler starts has them. A child inherits an ignored or blocked signal (which podium respects,
    as Python does), and this pytest worker's state is whatever its earlier tests left (a full run under xdist
    ignored the group's SIGINT, where the test alone passed)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def test_a_run_stopped_while_its_server_starts_leaves_no_server_behind(dataset, tmp_path):
    """A run on the embedded defaults (no Prefect server configured), stopped by a signal while its server starts.
    (Runs refused before anything starts, and that nothing is left behind: test_cli_small.)"""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "RAY_ADDRESS")}
    env.update({"PODIUM_HOME": str(home), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"})

    # stopped while the server starts: Ctrl-C (SIGINT to the command's process group, as a terminal sends it), and a
    # scheduler's SIGTERM to the command: exit 128 + the signal, one line, and no server left that server.json
    # does not name (`podium server stop` finds every one). Where a library swallowed the signal's exception, the
    # command stops at its run's start instead (tests/unit/test_cli.py): the same exit, its own line
    proc = None
    try:
        for sig, to_group in ((signal.SIGINT, True), (signal.SIGTERM, False)):
            proc = subprocess.Popen([sys.executable, "-m", "podium.cli", "run", "--run-name", "stopped", "--epochs", "1",
                                     "--train-data", dataset[0], "--val-data", dataset[1]], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                    preexec_fn=_signals_as_in_a_terminal)
            deadline = time.monotonic() + 120
            while not prefect_servers_of(home):
                assert proc.poll() is None and time.monotonic() < deadline, f"no Prefect server started: {proc.poll()}"
                time.sleep(0.05)
            (os.killpg if to_group else os.kill)(proc.pid, sig)
            _, err = proc.communicate(timeout=180)
            last = err.strip().splitlines()[-1] if err.strip() else ""
            here = [line.strip() for line in open("/proc/self/status") if line.startswith(("SigBlk", "SigIgn"))]
            assert proc.returncode == 128 + sig and last.startswith("podium: "), (
                f"exit {proc.returncode} (this process: SIGINT {signal.getsignal(signal.SIGINT)}, {here}):\n{err[-3000:]}")
            assert "Traceback" not in err, err[-3000:]
            state = home / "prefect" / "server.json"
            deadline = time.monotonic() + 30
            while set(prefect_servers_of(home)) - ({json.loads(state.read_text())["pid"]} if state.exists() else set()):
                assert time.monotonic() < deadline, f"{sig.name}: a Prefect server that no server.json names was left"
                time.sleep(0.2)
            podium(["server", "stop"], env)
            assert prefect_servers_of(home) == []
    finally:  # a failed assertion above leaves neither the command nor a server it started running
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in prefect_servers_of(home):  # each server is a session of its own
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
