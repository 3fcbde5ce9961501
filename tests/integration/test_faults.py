"""Faults injected for real: the flow process killed or signalled, a disk full, the Ray head lost. (A training
worker process killed: test_ray_examples, on a loop of Ray's guides.)"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers.servers import RayHead, fill_filesystem
from mlflow.tracking import MlflowClient

from podium.serving.layout import read_current, read_history, read_pointer
from podium.serving.staging import verify_files
from podium.tracking.client import TAG_CHECKPOINT, TAG_STATUS, TAG_STEP

pytestmark = pytest.mark.integration


def _user_config(run_name, dataset, locations, loop_extra=None, validate_extra=None, epochs=4):
    return {
        "run_name": run_name, "storage": locations["storage"], "serving": locations["serving"],
        "data": {"train": dataset[0], "val": dataset[1]},
        "training": {"train_loop": "podium_user_code:train_func",
                     "train_loop_config": {"epochs": epochs, **(loop_extra or {})}},
        "validation": {"fn": "podium_user_code:validate_fn", "kwargs": validate_extra or {}},
        "promotion": {"metric": "score", "mode": "max"},
        # one training worker: what these tests break is podium's process, the worker's or the disk's, not DDP
        "scaling": {"num_workers": 1},
    }


def _models_by_checkpoint(tracking_uri):
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("podium")
    if exp is None:  # the run has not reached MLflow yet
        return {}
    models = client.search_logged_models([exp.experiment_id], max_results=1000)
    by = collections.defaultdict(list)
    for m in models:
        by[m.tags[TAG_CHECKPOINT]].append(m)
    return by


def _podium(args, env):
    return subprocess.Popen([sys.executable, "-m", "podium.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _flow_run_states(name: str) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as c:
        runs = c.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))
    return sorted(r.state.type.value for r in runs if r.state)


def _podium_env(prefect_api, locations, tmp_path, ray_head=None):
    """A `podium` process's environment: podium's own local Ray (the signals and kills of these tests reach it
    as a user's would), or `ray_head` (a RayHead) where the fault is not the process's nor Ray's."""
    env = {**os.environ, "PODIUM_HOME": str(tmp_path / "home"), "PREFECT_API_URL": prefect_api,
           "MLFLOW_TRACKING_URI": locations["tracking_uri"],
           # the user's own module is importable, as it would be for a user running podium
           "PYTHONPATH": os.pathsep.join(filter(None, [os.path.dirname(__file__), os.environ.get("PYTHONPATH")]))}
    env.pop("RAY_ADDRESS", None)
    return env | (ray_head.driver_env() if ray_head else {})


def _wait_group_gone(pgid: int, timeout_s: float = 60) -> None:
    """Until no process of the process group `pgid` is left (reaped, not only killed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < deadline, f"processes of group {pgid} still there after {timeout_s:g} s"
        time.sleep(0.1)


def _statuses(tracking_uri) -> dict[str, str]:
    return {name: models[0].tags.get(TAG_STATUS) for name, models in _models_by_checkpoint(tracking_uri).items()}


def _start_then_wait_for_a_new_verdict(config_path, env, tracking_uri) -> subprocess.Popen:
    """`podium run` started; returns once it recorded a verdict of its own and more checkpoints wait for
    theirs (the moment a stop or a kill loses the most)."""
    had = {name for name, status in _statuses(tracking_uri).items() if status == "validated"}
    proc = _podium(["run", "--json", "--config", str(config_path)], env)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        statuses = _statuses(tracking_uri)
        validated = {name for name, status in statuses.items() if status == "validated"}
        if validated - had and "pending" in statuses.values():
            return proc
        assert proc.poll() is None, f"exit {proc.returncode} before a new verdict:\n{proc.stderr.read()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"no new verdict with more checkpoints waiting after 300 s: {_statuses(tracking_uri)}")


def _check_stopped_by(sig, proc, name, tracking_uri, serving) -> None:
    """A stop by `sig`: exit 128 + sig, one line saying how to resume and no traceback; every record written
    whole and none duplicated; no verdict invented; the MLflow run KILLED; nothing promoted."""
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 128 + sig, f"exit {proc.returncode}:\n{err[-4000:]}"
    assert "Traceback" not in out + err, err[-4000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"podium: stopped by {sig.name}") and f"--run-name ({name}) to resume" in last, last
    by = _models_by_checkpoint(tracking_uri)
    assert all(len(v) == 1 for v in by.values()), "no MLflow record duplicated"
    statuses = {n: m[0].tags.get(TAG_STATUS) for n, m in by.items()}
    assert set(statuses.values()) <= {"validated", "pending"}, f"a stop is no verdict: {statuses}"
    for (model,) in by.values():  # every record written completely: its training metrics are there
        assert "loss" in {m.key for m in model.metrics or []}, model.tags
    client = MlflowClient(tracking_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("podium").experiment_id])
    assert run.info.status == "KILLED"
    assert not read_history(serving), "nothing promoted by a stopped run"


def test_flow_process_killed_then_stopped_by_each_signal_resumes_each_time_without_duplicates(
        prefect_api, dataset, locations, tmp_path):
    """One run name, four `podium run` processes, each stopped at the moment that loses the most (a verdict of
    its own recorded, more checkpoints waiting for theirs), each resumed by the same command:

    1. SIGKILL to the process group (a machine's OOM killer, `kill -9`): the next attempt marks the killed
       flow run Crashed and takes over.
    2. Ctrl-C (SIGINT to the process group, as a terminal sends it), 3. SIGTERM to podium's process (a
       scheduler's stop): the running validation records its verdict or stays pending, the flow run ends
       Cancelled, the MLflow run KILLED, one line says how to resume, exit code 128 + the signal.
    4. The last attempt finishes: every checkpoint recorded once and validated at most twice (once more only
       where a stop came before its verdict was written), a verdict already recorded never asked for again, the
       best promoted once."""
    name = "stopped"
    calls = tmp_path / "validations.log"
    epochs = 10
    config = _user_config(name, dataset, locations, epochs=epochs, loop_extra={"epoch_s": 1.0},
                          validate_extra={"calls_log": str(calls), "sleep_s": 2})
    config["validation"]["concurrency"] = 1
    path = tmp_path / "podium.json"
    path.write_text(json.dumps(config))
    env = _podium_env(prefect_api, locations, tmp_path)
    uri, serving = locations["tracking_uri"], locations["serving"]

    # the validations each checkpoint with a verdict had had when the verdict was there (after each stop)
    frozen: dict[int, int] = {}

    def freeze() -> None:
        counts = collections.Counter(int(x) for x in calls.read_text().split())
        for (model, *_) in _models_by_checkpoint(uri).values():
            if model.tags.get(TAG_STATUS) == "validated":
                step = int(model.tags[TAG_STEP])
                frozen.setdefault(step, counts[step])

    proc = _start_then_wait_for_a_new_verdict(path, env, uri)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    _wait_group_gone(proc.pid)  # the killed run's Ray processes share the driver's fate: none left to join
    assert all(len(v) == 1 for v in _models_by_checkpoint(uri).values()), "no MLflow record duplicated"
    freeze()
    assert frozen and set(frozen.values()) == {1}, frozen  # one attempt so far: one validation each

    proc = _start_then_wait_for_a_new_verdict(path, env, uri)
    # Ctrl-C reaches the whole process group (Ray's processes block SIGINT)
    os.killpg(proc.pid, signal.SIGINT)
    _check_stopped_by(signal.SIGINT, proc, name, uri, serving)
    assert _flow_run_states(f"{name}-run") == ["CANCELLED", "CRASHED"], "the killed attempt marked Crashed"
    freeze()

    proc = _start_then_wait_for_a_new_verdict(path, env, uri)
    # SIGTERM goes to podium's process only: sent to the group it also stops Ray's GCS and raylet, and the
    # driver exits when GCS stays away (a known limit, see the README)
    os.kill(proc.pid, signal.SIGTERM)
    _check_stopped_by(signal.SIGTERM, proc, name, uri, serving)
    assert _flow_run_states(f"{name}-run") == ["CANCELLED", "CANCELLED", "CRASHED"]
    freeze()

    proc = _podium(["run", "--json", "--config", str(path)], env)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert [c["step"] for c in result["checkpoints"]] == list(range(epochs))
    assert all(c["status"] == "validated" for c in result["checkpoints"])
    by = _models_by_checkpoint(uri)
    assert len(by) == epochs and all(len(v) == 1 for v in by.values()), "no MLflow record duplicated"
    counts = collections.Counter(int(x) for x in calls.read_text().split())
    assert set(counts) == set(range(epochs)) and max(counts.values()) <= 2, counts
    for step, before in frozen.items():  # a verdict recorded before a stop or the kill is never asked for again
        assert counts[step] == before, f"step {step} validated again after its verdict: {counts[step]} times"
    assert result["promoted"] is not None and len(read_history(serving)) == 1
    assert _flow_run_states(f"{name}-run") == ["CANCELLED", "CANCELLED", "COMPLETED", "CRASHED"]


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs: a filesystem that fills up for real (mounting it needs root)."""
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root: the disk-full test cannot run as this user")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_at_serving_says_where_removes_the_partial_version_keeps_the_champion(
        prefect_api, shared_ray, dataset, locations, tmp_path, small_disk):
    serving = str(small_disk / "serving")
    env = _podium_env(prefect_api, locations, tmp_path, shared_ray)  # the disk's fault, not the process's
    first = _user_config("disk-first", dataset, {**locations, "serving": serving}, epochs=2)
    (tmp_path / "first.json").write_text(json.dumps(first))
    proc = _podium(["run", "--config", str(tmp_path / "first.json")], env)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert (read_pointer(serving) or {}).get("version") == "v000001"

    fill_filesystem(small_disk, leave_bytes=512 * 1024)  # the next champion's 2 MiB checkpoint does not fit
    second = _user_config("disk-second", dataset, {**locations, "serving": serving}, epochs=2,
                          loop_extra={"pad_bytes": 2 * 1024 * 1024})
    second["promotion"]["always"] = True
    (tmp_path / "second.json").write_text(json.dumps(second))
    proc = _podium(["run", "--config", str(tmp_path / "second.json")], env)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 2, f"exit {proc.returncode}:\n{err[-3000:]}"
    assert "Traceback" not in out + err, err[-4000:]
    message = err.strip().splitlines()[-1]
    assert message.startswith(f"podium: no space left at the serving location {serving} while writing v000002"), message
    assert "v000001 stays current" in message and "removed" in message, message
    assert sorted(os.listdir(os.path.join(serving, "versions"))) == ["v000001", "v000002"]
    assert os.listdir(os.path.join(serving, "versions", "v000002")) == ["DISCARDED.json"], \
        "the partial version was removed, its number kept"
    assert read_current(serving).version == "v000001"
    verify_files(os.path.join(serving, "versions", "v000001"), read_current(serving).manifest)


def test_a_disk_too_full_for_the_promotion_lock_gets_the_same_one_sentence(small_disk):
    """Found by the chaos soak: a disk with no page left fails already where the promotion lock file takes
    its holder's name, before any version is claimed."""
    from podium.serving.layout import ServingFull
    from podium.tasks.promote import promotion_lock

    serving = str(small_disk / "serving")
    os.makedirs(serving)
    fill_filesystem(small_disk, leave_bytes=0)
    with pytest.raises(ServingFull) as full:
        with promotion_lock(serving):
            pass
    message = str(full.value)
    assert message.startswith(f"no space left at the serving location {serving} while writing its promotion lock"), message
    assert "nothing was written and nothing was being served" in message and "podium promote" in message, message


def test_user_code_errors_are_shown_once_with_the_users_own_frames(prefect_api, shared_ray, dataset, locations,
                                                                  tmp_path):
    """A training loop that raises, and a validation function that raises: each is reported as the user's
    exception with their own frames, once; Ray's frames stay in the log file."""
    config = _user_config("user-raises", dataset, locations, epochs=4, loop_extra={"raise_at_epoch": 3},
                          validate_extra={"fail_epoch": 1})
    config["scaling"]["max_failures"] = 0
    config["validation"]["retries"] = 0
    (tmp_path / "podium.json").write_text(json.dumps(config))
    proc = _podium(["run", "--config", str(tmp_path / "podium.json")],
                   _podium_env(prefect_api, locations, tmp_path, shared_ray))
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 1, f"exit {proc.returncode}:\n{err[-4000:]}"
    shown = out + err
    # the training loop's error: once, on stderr, with the user's frames and none of Ray's
    assert err.count("ValueError: bad batch at epoch 3") == 1, err[-4000:]
    assert "podium: the training loop podium_user_code:train_func (rank 0" in err, err[-4000:]
    assert 'podium_user_code.py", line' in err and "in _check_batch" in err and "in train_func" in err
    # the validation function's error: once, with the user's frames and none of Ray's or podium's
    assert shown.count("RuntimeError: validation data unavailable for epoch 1") == 1, shown[-4000:]
    assert "in validate_fn" in shown and "validation_call.py" not in shown, shown[-6000:]
    assert shown.count("Traceback (most recent call last)") == 2, shown[-6000:]
    assert "site-packages/ray" not in shown and "WorkerGroupError" not in shown, shown[-6000:]
    assert len(shown.splitlines()) < 60, f"more than a screen:\n{shown}"
    log = (tmp_path / "home" / "logs" / "podium.log").read_text(errors="replace")
    assert "WorkerGroupError" in log and "site-packages/ray" in log, "the full Ray trace goes to the log file"


@pytest.fixture
def ray_head(tmp_path, prefect_api, locations):
    head = RayHead(tmp_path, _podium_env(prefect_api, locations, tmp_path))
    head.start()
    yield head
    head.stop()


def test_ray_head_lost_mid_run_ends_it_clearly_then_resumes(ray_head, prefect_api, dataset, locations, tmp_path):
    """The head of the Ray cluster podium runs on dies (its GCS killed) mid-run: podium says so, ends the run
    (MLflow run FAILED, flow run Failed, checkpoints without a verdict pending, exit code 3) before Ray's own
    reconnect window ends the process with nothing said; on a new head, running it again finishes the run."""
    name = "head-lost"
    config = _user_config(name, dataset, locations, epochs=4, loop_extra={"epoch_s": 1.0},
                          validate_extra={"sleep_s": 2})
    config["validation"]["concurrency"] = 1
    (tmp_path / "podium.json").write_text(json.dumps(config))
    # Ray's window shrunk from 60 s to 20 s (podium acts 15 s before it ends): only the test's wait shrinks
    env = {**ray_head.env, "RAY_gcs_rpc_server_reconnect_timeout_s": "20"}
    args = ["run", "--config", str(tmp_path / "podium.json"), "--ray-address", f"127.0.0.1:{ray_head.port}"]
    proc = _podium(args, env)
    deadline = time.monotonic() + 300
    while not _models_by_checkpoint(locations["tracking_uri"]):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.2)
    ray_head.kill("gcs_server")
    killed = time.monotonic()
    out, err = proc.communicate(timeout=120)
    took = time.monotonic() - killed
    assert proc.returncode == 3, f"exit {proc.returncode} after {took:.0f} s:\n{err[-4000:]}"
    assert took < 20, f"{took:.0f} s: Ray's window ended the process, not podium"
    assert "Traceback" not in out + err, err[-4000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("podium: Ray's head at ") and f"--run-name ({name}) to resume" in last, last
    statuses = [m[0].tags.get(TAG_STATUS) for m in _models_by_checkpoint(locations["tracking_uri"]).values()]
    assert set(statuses) <= {"validated", "pending"}, f"losing the cluster is no verdict: {statuses}"
    client = MlflowClient(locations["tracking_uri"])
    (run,) = client.search_runs([client.get_experiment_by_name("podium").experiment_id])
    assert run.info.status == "FAILED"
    assert _flow_run_states(f"{name}-run") == ["FAILED"]

    ray_head.kill()  # what is left of the old head, then a new one on the same port
    ray_head.start()
    proc = _podium([*args[:1], "--json", *args[1:]], env)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert [c["status"] for c in result["checkpoints"]] == ["validated"] * 4
    assert all(len(v) == 1 for v in _models_by_checkpoint(locations["tracking_uri"]).values())
    assert len(read_history(locations["serving"])) == 1
