"""The tracking server stops answering during a run, for real: a `mlflow server` process on loopback
(SQLite backend) is frozen with SIGSTOP, killed and restarted on the same port and database, killed
for good, or has its database write-locked, while `podium run` (its own process) records checkpoints
and verdicts through it.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.servers import MlflowServer
from mlflow.tracking import MlflowClient

from podium.core.events import CheckpointEvent
from podium.serving.layout import read_history
from podium.tracking.client import TAG_CHECKPOINT, TAG_RUN, TAG_STATUS, TAG_STEP
from podium.tracking.records import list_records, merge_validation, record_checkpoint
from podium.tracking.runs import open_tracking_run

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
HERE = Path(__file__).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path, mlflow_template_db):
    server = MlflowServer(tmp_path / "mlflow", mlflow_template_db)
    server.start()
    yield server
    server.kill()


def _models_by_checkpoint(url: str, run_name: str | None = None) -> dict[str, list]:
    """The MLflow records of the checkpoints (of one run, or of all), by checkpoint name."""
    client = MlflowClient(url)
    exp = client.get_experiment_by_name("podium")
    if exp is None:
        return {}
    by = collections.defaultdict(list)
    for m in client.search_logged_models([exp.experiment_id], max_results=1000):
        if run_name is None or m.tags.get(TAG_RUN) == run_name:
            by[m.tags[TAG_CHECKPOINT]].append(m)
    return by


def _statuses(url: str) -> list[str]:
    return [m[0].tags.get(TAG_STATUS) for m in _models_by_checkpoint(url).values()]


def _config(tmp_path: Path, dataset, run_name: str, calls: Path, epochs: int = 6, epoch_s: float = 0) -> Path:
    config = {
        "run_name": run_name, "storage": str(tmp_path / "storage"), "serving": str(tmp_path / "serving"),
        "data": {"train": dataset[0], "val": dataset[1]},
        "training": {"train_loop": "podium_user_code:train_func",
                     "train_loop_config": {"epochs": epochs, "epoch_s": epoch_s}},
        # one validation at a time, 2 s each: verdicts are being written for the whole outage
        "validation": {"fn": "podium_user_code:validate_fn", "concurrency": 1,
                       "kwargs": {"calls_log": str(calls), "sleep_s": 2}},
        # each run's serving location is its own, in a store the module's runs share: an alias of its own too
        "promotion": {"metric": "score", "mode": "max", "verify": "hashes", "alias": run_name},
        "scaling": {"num_workers": 1},  # the outages are the servers', not the training's: one worker
    }
    path = tmp_path / "podium.json"
    path.write_text(json.dumps(config))
    return path


def _env(tmp_path: Path, prefect_api: str, tracking_uri: str, ray, **extra: str) -> dict[str, str]:
    """A `podium` process's environment: on the session's Ray head (`ray`: the outages are the servers', not
    Ray's), the test's servers, podium's retry settings unless `extra` changes them."""
    env = {**os.environ, "PODIUM_HOME": str(tmp_path / "home"), "PREFECT_API_URL": prefect_api,
           "MLFLOW_TRACKING_URI": tracking_uri,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])), **extra}
    for name in ("RAY_ADDRESS", "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        if name not in extra:
            env.pop(name, None)
    return env | ray.driver_env()


class PodiumRun:
    """`podium run` (or `podium promote`) in a process group of its own; killed if the test ends before it does."""

    def __init__(self, config: Path, env: dict[str, str], command: str = "run"):
        self.proc = subprocess.Popen([sys.executable, "-m", "podium.cli", command, "--json", "--config", str(config)],
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)

    def wait_until(self, condition, what: str, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if self.proc.poll() is not None:
                raise AssertionError(f"podium exited {self.proc.returncode} before {what}:\n"
                                     f"{self.proc.stderr.read()[-4000:]}")
            assert time.monotonic() < deadline, f"no {what} after {timeout_s:g} s"
            time.sleep(0.2)

    def finish(self, timeout_s: float = 300) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout_s)
        return self.proc.returncode, out, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def podium_runs():
    runs: list[PodiumRun] = []

    def start(config: Path, env: dict[str, str], command: str = "run") -> PodiumRun:
        runs.append(PodiumRun(config, env, command))
        return runs[-1]

    yield start
    for run in runs:
        run.kill()


def _check_complete(url: str, calls: Path, serving: Path, steps: int) -> collections.Counter:
    """One record per checkpoint, each validated with its metric; promoted once. Returns validations per step."""
    by = _models_by_checkpoint(url)
    assert sorted(len(v) for v in by.values()) == [1] * steps, "exactly one MLflow record per checkpoint"
    for name, (model,) in by.items():
        assert model.tags[TAG_STATUS] == "validated", (name, model.tags)
        assert "score" in {m.key for m in model.metrics or []}, f"{name}: validation metric missing"
    assert len(read_history(str(serving))) == 1, "promoted exactly once"
    return collections.Counter(int(x) for x in calls.read_text().split())


def test_server_down_fails_the_run_clearly_then_its_resume_rides_out_brief_outages(
        mlflow_server, podium_runs, prefect_api, shared_ray, dataset, tmp_path):
    """One run name, two `podium run` processes on one MLflow server (each outage is the server's, so one run
    sequence shows them all, and the resume after a failure is itself the run that rides out the brief ones).

    1. The server is killed for good mid-run, with a short retry window: exit 3, the server named, no
       traceback, nothing recorded as failed; the verdicts already written stay.
    2. The server is back; the same command resumes the run, and while it trains and validates the server
       hangs for 8 s (accepts connections, answers nothing), then is killed and restarted on the same port
       and database. Nothing is lost: one record per checkpoint, each verdict computed once unless it could
       not be written before, one MLflow run FINISHED, promoted once."""
    epochs = 8
    calls = tmp_path / "validations.log"
    config = _config(tmp_path, dataset, "outage", calls, epochs=epochs, epoch_s=1.5)
    url = mlflow_server.url

    def verdicts_in_progress() -> bool:
        statuses = _statuses(url)
        return statuses.count("validated") >= 1 and statuses.count("pending") >= 1

    # 1. a retry window of about 2 s (attempts at 0, 0 and 2 s) instead of podium's minute: only the
    # test's wait shrinks, not what happens
    env = _env(tmp_path, prefect_api, url, shared_ray, MLFLOW_HTTP_REQUEST_MAX_RETRIES="2",
               MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR="1")
    run = podium_runs(config, env)
    run.wait_until(verdicts_in_progress, "a verdict with more checkpoints waiting for theirs")
    mlflow_server.kill()
    rc, out, err = run.finish()
    assert rc == 3, f"exit {rc}:\n{err[-4000:]}"
    assert "Traceback" not in out + err, err[-4000:]
    message = err.strip().splitlines()
    assert any(line.startswith("podium: MLflow tracking server") and url in line and "unreachable"
               in line for line in message), err[-2000:]
    assert "outage" in err and "resumes" in err, err[-2000:]

    mlflow_server.start()  # same port, same database
    before = {int(models[0].tags[TAG_STEP]): models[0].tags.get(TAG_STATUS)
              for models in _models_by_checkpoint(url).values()}
    validated_before = {step for step, status in before.items() if status == "validated"}
    assert validated_before and len(before) < epochs, f"the failed run left no training to resume: {before}"
    assert "failed" not in before.values(), "a write that failed must not become a failed verdict"
    log_file = tmp_path / "home" / "logs" / "podium.log"
    first_run_log = len(log_file.read_bytes())

    # 2. podium's retry settings, with each attempt cut to 3 s so that the freeze below outlasts one: the
    # client gives up on requests the server has received, and retries them
    env = _env(tmp_path, prefect_api, url, shared_ray, MLFLOW_HTTP_REQUEST_TIMEOUT="3")
    run = podium_runs(config, env)
    run.wait_until(lambda: len(_models_by_checkpoint(url)) > len(before), "a checkpoint of the resumed run recorded")
    mlflow_server.signal(signal.SIGSTOP)
    time.sleep(8)
    mlflow_server.signal(signal.SIGCONT)
    run.wait_until(verdicts_in_progress, "a verdict with more checkpoints waiting for theirs")
    mlflow_server.kill()
    time.sleep(3)
    mlflow_server.start()

    rc, out, err = run.finish()
    assert rc == 0, err[-4000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert [c["step"] for c in result["checkpoints"]] == list(range(epochs))
    assert all(c["status"] == "validated" and "score" in c["metrics"] for c in result["checkpoints"])
    counts = _check_complete(url, calls, tmp_path / "serving", steps=epochs)
    assert set(counts) == set(range(epochs))
    for step in validated_before:
        assert counts[step] == 1, f"step {step} had a verdict but was validated {counts[step]} times"
    # a verdict that could not be written is computed again on resume, but not retried in between
    assert max(counts.values()) <= 2, counts
    client = MlflowClient(url)
    (mlflow_run,) = client.search_runs([client.get_experiment_by_name("podium").experiment_id],
                                       filter_string=f"tags.`{TAG_RUN}` = 'outage'")
    assert mlflow_run.info.status == "FINISHED" and mlflow_run.info.run_id == result["mlflow_run_id"]
    # the run's own metrics by step: score from every validation
    history = client.get_metric_history(result["mlflow_run_id"], "score")
    assert sorted({m.step for m in history}) == list(range(epochs))
    # the brief outages reached the resumed run's client: both kinds of failed attempts were retried
    log = log_file.read_bytes()[first_run_log:].decode(errors="replace")
    assert "Read timed out" in log and "Retrying" in log, "the freeze did not hit a request"
    assert "Connection refused" in log, "the restart did not hit a request"


def test_writes_hung_past_the_request_timeout_leave_one_record_each(mlflow_server, monkeypatch):
    """A write the client retried after a timeout lands twice (the server had it): one record survives."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")

    def with_writes_locked(seconds: float, call):
        # the server's database takes no writes (reads go on) for `seconds`, while `call` runs
        lock = sqlite3.connect(mlflow_server.db, isolation_level=None, check_same_thread=False)
        lock.execute("BEGIN IMMEDIATE")
        release = threading.Timer(seconds, lambda: lock.execute("ROLLBACK"))
        release.start()
        try:
            return call()
        finally:
            release.join()
            lock.close()

    # the experiment: its retried create is answered "already exists" (names are unique)
    with_writes_locked(4, lambda: open_tracking_run(mlflow_server.url, "hung", "first", {}))
    assert mlflow_server.requests("POST", "/api/2.0/mlflow/experiments/create") >= 2, "the create was not retried"
    client = MlflowClient(mlflow_server.url)
    assert [e.name for e in client.search_experiments() if e.name == "hung"] == ["hung"]

    # the run: its retried create lands twice
    creates_before = mlflow_server.requests("POST", "/api/2.0/mlflow/runs/create")
    tr = with_writes_locked(4, lambda: open_tracking_run(mlflow_server.url, "hung", "hung-writes", {"a": 1}))
    assert mlflow_server.requests("POST", "/api/2.0/mlflow/runs/create") - creates_before >= 2, \
        "the run's create was not retried: no duplicate to clean up"
    runs = client.search_runs([tr.experiment_id], filter_string=f"tags.`{TAG_RUN}` = 'hung-writes'")
    assert [r.info.run_id for r in runs] == [tr.run_id]

    event = CheckpointEvent(run_name="hung-writes", step=7, metrics={"loss": 0.5}, epoch=7,
                            checkpoint_uri="/ckpt/checkpoint_000007", checkpoint_name="checkpoint_000007")
    creates_before = mlflow_server.requests("POST", "/api/2.0/mlflow/logged-models")
    record = with_writes_locked(4, lambda: record_checkpoint(tr, event))
    assert mlflow_server.requests("POST", "/api/2.0/mlflow/logged-models") - creates_before >= 2, \
        "the checkpoint's create was not retried: no duplicate to clean up"
    models = client.search_logged_models([tr.experiment_id], filter_string=f"source_run_id = '{tr.run_id}'")
    assert [m.model_id for m in models] == [record.model_id]

    merged = with_writes_locked(4, lambda: merge_validation(tr, record, {"val_loss": 0.25}))
    assert merged.status == "validated"
    (listed,) = list_records(tr)
    assert listed.model_id == record.model_id and listed.status == "validated"
    assert listed.metrics["val_loss"] == 0.25 and listed.metrics["loss"] == 0.5


# ---- the Prefect server goes away during a run: the run goes on without it

class PrefectServer:
    """This test's own `prefect server` process (podium's embedded-defaults server, in a home of its own),
    on a fixed port and database across restarts."""

    def __init__(self, home: Path):
        from podium.services import ensure_prefect_server

        self.home, self.port = home, _free_port()
        self.url = ensure_prefect_server(home, self.port)

    def pid(self) -> int:
        return json.loads((self.home.resolve() / "prefect" / "server.json").read_text())["pid"]

    def kill(self) -> None:
        """SIGKILL the server's process group: connections are refused until it is started again."""
        try:
            os.killpg(self.pid(), signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 30
        while _answers(self.url) and time.monotonic() < deadline:
            time.sleep(0.2)

    def start(self) -> None:
        """Start it again, on the same port and database (the port may still be in TIME_WAIT, which the
        server's own bind allows but podium's free-port check does not: started directly)."""
        from podium.services import _start_prefect_server

        assert _start_prefect_server(self.home.resolve() / "prefect", self.port, 180.0, {}) == self.url

    def stop(self) -> None:
        from podium.services import stop_prefect_server

        stop_prefect_server(self.home)


def _answers(api_url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _awaits_approval(api_url: str, run_name: str) -> bool:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from podium.prefect_api import paused_flow_run

    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        try:
            paused_flow_run(run_name)
        except LookupError:
            return False
    return True


@pytest.fixture
def prefect_server(tmp_path):
    server = PrefectServer(tmp_path / "prefect-home")
    yield server
    server.stop()


def _prefect_outage_config(tmp_path: Path, dataset, run_name: str, calls: Path) -> Path:
    # 6 epochs of about 1.5 s, and validations of 1 s: the outage starts with most of the run ahead
    path = _config(tmp_path, dataset, run_name, calls, epoch_s=1.5)
    config = json.loads(path.read_text())
    config["validation"]["kwargs"]["sleep_s"] = 1
    path.write_text(json.dumps(config))
    return path


def _start_prefect_outage_run(podium_runs, prefect_server, shared_ray, dataset, folder, tracking_uri, name: str):
    """A podium run (its files under `folder`) on a SQLite store (`tracking_uri`), its first checkpoint
    recorded, then the Prefect server killed. Returns (run, validations log)."""
    folder.mkdir(exist_ok=True)
    calls = folder / "validations.log"
    config = _prefect_outage_config(folder, dataset, name, calls)
    run = podium_runs(config, _env(folder, prefect_server.url, tracking_uri, shared_ray))
    run.wait_until(lambda: len(_models_by_checkpoint(tracking_uri, name)) >= 1, "the first checkpoint record")
    prefect_server.kill()
    return run, calls


def test_prefect_server_killed_mid_run_then_back_mid_run_then_while_a_candidate_awaits_approval(
        prefect_server, podium_runs, shared_ray, dataset, tmp_path, tracking_uri):
    """Two runs on one Prefect server of the test's own. The first loses the server at its first checkpoint
    for good: its work finishes, and it says it is not recorded in Prefect (exit 4). The server is started again
    on the same port and database; the second loses it at its first checkpoint, and gets it back a few
    checkpoints later: its records catch up, exit 0. Then `podium promote` of that run with approval required
    loses the server while its candidate awaits a decision: no one could decide, nothing is promoted, and the
    command fails saying so (exit 1), not as a success."""
    from helpers.prefect_queries import artifact_keys, flow_run_state, task_runs
    from prefect.settings import PREFECT_API_URL, temporary_settings

    down = tmp_path / "down"
    run, calls = _start_prefect_outage_run(podium_runs, prefect_server, shared_ray, dataset, down, tracking_uri,
                                           "prefect-down")
    rc, out, err = run.finish()
    assert rc == 4, f"exit {rc}:\n{err[-4000:]}"
    assert "Traceback" not in out + err, err[-4000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("podium: done, but not recorded in Prefect: the Prefect server " + prefect_server.url), last
    # the work itself is all done: every checkpoint validated once and recorded, the best promoted
    result = json.loads(out.strip().splitlines()[-1])
    assert [c["step"] for c in result["checkpoints"]] == list(range(6))
    assert all(c["status"] == "validated" and "score" in c["metrics"] for c in result["checkpoints"])
    assert result["promoted"] is not None and result["prefect_not_recorded"]
    counts = collections.Counter(int(x) for x in calls.read_text().split())
    assert counts == {step: 1 for step in range(6)}, counts
    assert len(read_history(str(down / "serving"))) == 1
    client = MlflowClient(tracking_uri)
    (mlflow_run,) = client.search_runs([client.get_experiment_by_name("podium").experiment_id],
                                       filter_string=f"tags.`{TAG_RUN}` = 'prefect-down'")
    assert mlflow_run.info.status == "FINISHED", "the MLflow run must not be left RUNNING"
    # the outage is said once on the terminal and once in the log, not once per event or call
    assert sum("does not answer" in line for line in err.splitlines()) == 1, err[-4000:]
    log = (down / "home" / "logs" / "podium.log").read_text(errors="replace")
    assert log.count("stopped answering") == 1, "the outage is logged once"
    assert "failed to process item" not in log and "Error logging to API" not in err + log
    print(f"wall time with the Prefect server down from the first checkpoint: {result['wall_time_s']} s")

    prefect_server.start()  # same port, same database
    back = tmp_path / "back"
    run, calls = _start_prefect_outage_run(podium_runs, prefect_server, shared_ray, dataset, back, tracking_uri,
                                           "prefect-back")
    run.wait_until(lambda: len(_models_by_checkpoint(tracking_uri, "prefect-back")) >= 3,
                   "checkpoints recorded while Prefect is down")
    prefect_server.start()

    rc, out, err = run.finish()
    assert rc == 0, f"exit {rc}:\n{err[-4000:]}"
    assert "Traceback" not in out + err, err[-4000:]
    assert any("answers again" in line for line in err.splitlines()), err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert all(c["status"] == "validated" for c in result["checkpoints"]) and len(result["checkpoints"]) == 6
    with temporary_settings(updates={PREFECT_API_URL: prefect_server.url}):
        assert flow_run_state("prefect-back-run").is_completed()
        # task runs whose states were held during the outage reached the server when it came back
        runs = task_runs("prefect-back-run", expect_at_least=12)
        validations = sorted(r.name for r in runs if r.name.startswith("validate-step-"))
        assert validations == [f"validate-step-{s}" for s in range(6)], validations
        assert all(r.state.is_completed() for r in runs if r.name.startswith("validate-step-"))
        assert {"prefect-back-checkpoints", "prefect-back-promotion", "prefect-back-chart",
                "prefect-back-progress"} <= artifact_keys("prefect-back-run")

    config = json.loads((back / "podium.json").read_text())
    config["serving"] = str(back / "serving-approved")
    config["promotion"].update(approval="required", approval_timeout_s=600, alias="approved")
    (back / "approval.json").write_text(json.dumps(config))
    promote = podium_runs(back / "approval.json", _env(back, prefect_server.url, tracking_uri, shared_ray), "promote")
    promote.wait_until(lambda: _awaits_approval(prefect_server.url, "prefect-back"), "a candidate awaiting approval")
    prefect_server.kill()
    rc, out, err = promote.finish()
    assert rc == 1, f"exit {rc}:\n{err[-4000:]}"
    assert "Traceback" not in out + err, err[-4000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("podium: run 'prefect-back' failed: the approval could not be asked for ("), last
    assert "nothing was promoted; `podium promote --run-name prefect-back` asks again" in last, last
    result = json.loads(out.strip().splitlines()[-1])
    assert result["promoted"] is None
    assert result["promotion_reason"].startswith("undecided: the approval could not be asked for ("), result
    assert not (back / "serving-approved" / "CURRENT").exists()
    [tombstone] = (back / "serving-approved" / "versions").iterdir()  # the staged copy is gone, its number kept
    assert sorted(os.listdir(tombstone)) == ["DISCARDED.json"]
    client = MlflowClient(tracking_uri)
    [undecided] = client.search_model_versions("tags.`podium.approval` = 'undecided'")
    assert "approved-challenger" not in undecided.aliases
    assert "approved-challenger" not in client.get_registered_model(undecided.name).aliases
