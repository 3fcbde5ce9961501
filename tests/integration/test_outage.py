"""The servers podium records to stop answering during a run, for real: the tracking server (a `mlflow server`
process on loopback, SQLite backend) frozen with SIGSTOP, killed and restarted on the same port and database, killed
for good, or its database write-locked; the Prefect server (one of the test's own) killed for good, or killed and
started again; while `podium run` or `podium promote` (their own processes) record through them.

Trains 3 times (Ray Train starts), in the module's `outages` (on the session's Ray head: the outages are the
servers', not Ray's), a run's outages one after another so that each check sees only its own:

  run                          its outages                                    its tests
  outage, attempt 1            MLflow killed for good (exit 3)                test_mlflow_server_down_fails_the_run_
                                                                              clearly
  outage, attempt 2 (the       MLflow hung for 12 s at its first checkpoint   test_the_resume_rides_out_brief_mlflow_
  resume)                      record, then killed and restarted; then the    outages,
                               Prefect server killed, and started again once  test_prefect_server_back_mid_run_its_
                               a verdict was written without it (exit 0)      records_catch_up
  prefect-down                 the Prefect server killed at its first         test_prefect_server_down_for_good_the_
                               checkpoint, for good (exit 4)                  work_finishes_and_says_so

and, between the last two, `podium promote` of `outage` with approval required, the Prefect server killed while its
candidate awaits a decision (test_promote_fails_when_prefect_is_lost_while_a_candidate_awaits_approval: no training).
Each test reads what its step left, so each fails on its own; a step not reached fails its tests, saying why. The
hung writes' test trains nothing: it writes to the module's tracking server once the runs are done with it.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers.servers import MlflowServer
from mlflow.tracking import MlflowClient

from podium.core.events import CheckpointEvent
from podium.serving.layout import read_history
from podium.tracking.client import TAG_CHECKPOINT, TAG_RUN, TAG_STATUS, TAG_STEP
from podium.tracking.records import list_records, merge_validation, record_checkpoint
from podium.tracking.runs import open_tracking_run

# the module's runs go through their outages in the first of their tests' setup, which pytest-timeout counts in
# that test's time
pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]

BIN = Path(sys.executable).parent
HERE = Path(__file__).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def _retries(log: str) -> list[str]:
    """The lines of a podium.log where urllib3 retried a request of MLflow's client."""
    return [line for line in log.splitlines() if "Retrying" in line and "mlflow" in line]


def _refused_retries(log: str) -> list[str]:
    return [line for line in _retries(log) if "Connection refused" in line]


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


def _check_complete(url: str, calls: Path, serving: Path, steps: int) -> collections.Counter:
    """One record per checkpoint, each validated with its metric; promoted once. Returns validations per step."""
    by = _models_by_checkpoint(url)
    assert sorted(len(v) for v in by.values()) == [1] * steps, "exactly one MLflow record per checkpoint"
    for name, (model,) in by.items():
        assert model.tags[TAG_STATUS] == "validated", (name, model.tags)
        assert "score" in {m.key for m in model.metrics or []}, f"{name}: validation metric missing"
    assert len(read_history(str(serving))) == 1, "promoted exactly once"
    return collections.Counter(int(x) for x in calls.read_text().split())


def test_writes_hung_past_the_request_timeout_leave_one_record_each(outages, monkeypatch):
    """A write the client retried after a timeout lands twice (the server had it): one record survives. On the
    module's tracking server, once its runs are done with it (an experiment of its own; each count is of the
    requests this test made)."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    mlflow_server = outages.mlflow

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
    creates_before = mlflow_server.requests("POST", "/api/2.0/mlflow/experiments/create")
    with_writes_locked(4, lambda: open_tracking_run(mlflow_server.url, "hung", "first", {}))
    assert mlflow_server.requests("POST", "/api/2.0/mlflow/experiments/create") - creates_before >= 2, \
        "the create was not retried"
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


# ---- the module's runs: what each step of the outages left

EPOCHS = 12  # the resume trains most of them: time for the Prefect outage, then MLflow's


@dataclass
class Ended:
    """What a `podium` process left: its exit code and output, and what the test saw while it ran."""

    rc: int
    out: str
    err: str
    seen: dict = field(default_factory=dict)

    def result(self) -> dict:
        return json.loads(self.out.strip().splitlines()[-1])


@dataclass
class Outages:
    """The module's runs and what each step left (`ended`), or why the sequence stopped early (`broken`)."""

    root: Path
    mlflow: MlflowServer
    prefect: PrefectServer
    ray: object
    dataset: tuple[str, str]
    ended: dict[str, Ended] = field(default_factory=dict)
    broken: str | None = None
    runs: list[PodiumRun] = field(default_factory=list)

    def get(self, step: str) -> Ended:
        """What `step` left; its test fails if the sequence did not reach it."""
        if step not in self.ended:
            pytest.fail(f"the step {step!r} was not reached: {self.broken}")
        return self.ended[step]

    def start(self, config: Path, env: dict[str, str], command: str = "run") -> PodiumRun:
        self.runs.append(PodiumRun(config, env, command))
        return self.runs[-1]

    def end(self, step: str, run: PodiumRun, **seen) -> Ended:
        rc, out, err = run.finish()
        self.ended[step] = Ended(rc, out, err, seen)
        return self.ended[step]

    def run(self) -> None:
        self.mlflow_outages_and_prefect_back()
        self.approval_without_prefect()
        self.prefect_down_for_good()

    def mlflow_outages_and_prefect_back(self) -> None:
        """The run `outage`: MLflow killed for good, then its resume through a Prefect outage and brief MLflow ones."""
        folder, url = self.root / "outage", self.mlflow.url
        folder.mkdir()
        calls = folder / "validations.log"
        config = _config(folder, self.dataset, "outage", calls, epochs=EPOCHS, epoch_s=1.5)

        def verdicts_in_progress() -> bool:
            statuses = _statuses(url)
            return statuses.count("validated") >= 1 and statuses.count("pending") >= 1

        # 1. a retry window of about 2 s (attempts at 0, 0 and 2 s) instead of podium's minute: only the
        # test's wait shrinks, not what happens
        env = _env(folder, self.prefect.url, url, self.ray, MLFLOW_HTTP_REQUEST_MAX_RETRIES="2",
                   MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR="1")
        run = self.start(config, env)
        run.wait_until(verdicts_in_progress, "a verdict with more checkpoints waiting for theirs")
        self.mlflow.kill()
        self.end("mlflow-down", run)

        self.mlflow.start()  # same port, same database
        before = {int(models[0].tags[TAG_STEP]): models[0].tags.get(TAG_STATUS)
                  for models in _models_by_checkpoint(url).values()}
        self.ended["mlflow-down"].seen["before"] = before
        log_file = folder / "home" / "logs" / "podium.log"
        first_run_log = len(log_file.read_bytes())

        # 2. podium's retry settings, with each attempt cut to 3 s so that the freeze below outlasts one: the
        # client gives up on requests the server has received, and retries them. Validations of 10 s: the
        # resume's are still going for both outages, one after the other, whatever the attempt before left
        # (read from a file at each validation: once the outages are over, the rest validate in 1 s each)
        sleep_s = folder / "validation-sleep-s"
        sleep_s.write_text("10")
        settings = json.loads(config.read_text())
        settings["validation"]["kwargs"]["sleep_s_file"] = str(sleep_s)
        config.write_text(json.dumps(settings))
        env = _env(folder, self.prefect.url, url, self.ray, MLFLOW_HTTP_REQUEST_TIMEOUT="3")
        run = self.start(config, env)
        # MLflow hung for 12 s (it accepts connections, answers nothing; longer than a validation, so that a verdict
        # is written into it) at the resume's first checkpoint record, then killed and restarted while verdicts are
        # being written
        run.wait_until(lambda: len(_models_by_checkpoint(url)) > len(before), "a checkpoint of the resumed run recorded")
        self.mlflow.signal(signal.SIGSTOP)
        time.sleep(12)
        self.mlflow.signal(signal.SIGCONT)
        run.wait_until(verdicts_in_progress, "a verdict with more checkpoints waiting for theirs")
        self.mlflow.kill()
        # down until one of the run's requests was refused (urllib3 retries it, 4 s then 8 s later...): a fixed 3 s
        # down could fall between two requests (validations of 10 s), and then nothing had ridden it out
        run.wait_until(lambda: _refused_retries(log_file.read_bytes()[first_run_log:].decode(errors="replace")),
                       "request refused while MLflow is down", timeout_s=30)
        self.mlflow.start()
        # then the Prefect server lost, and started again once a verdict was written without it
        validated = _statuses(url).count("validated")
        self.prefect.kill()
        run.wait_until(lambda: _statuses(url).count("validated") > validated, "a verdict written while Prefect is down")
        self.prefect.start()
        sleep_s.write_text("1")  # nothing more to ride out: the rest of the run's validations go quicker
        ended = self.end("resume", run, calls=calls)
        ended.seen["log"] = log_file.read_bytes()[first_run_log:].decode(errors="replace")

    def approval_without_prefect(self) -> None:
        """`podium promote` of `outage` with approval required: the Prefect server lost while its candidate waits."""
        folder = self.root / "outage"
        config = json.loads((folder / "podium.json").read_text())
        config["serving"] = str(folder / "serving-approved")
        config["promotion"].update(approval="required", approval_timeout_s=600, alias="approved")
        (folder / "approval.json").write_text(json.dumps(config))
        promote = self.start(folder / "approval.json", _env(folder, self.prefect.url, self.mlflow.url, self.ray),
                             "promote")
        promote.wait_until(lambda: _awaits_approval(self.prefect.url, "outage"), "a candidate awaiting approval")
        self.prefect.kill()
        self.end("approval", promote, serving=folder / "serving-approved")

    def prefect_down_for_good(self) -> None:
        """The run `prefect-down` (a SQLite store of its own): the Prefect server lost at its first checkpoint."""
        self.prefect.start()  # after the approval's outage: same port, same database
        folder = self.root / "prefect-down"
        folder.mkdir()
        shutil.copy(self.root / "template.db", folder / "mlflow.db")
        tracking_uri = f"sqlite:///{folder / 'mlflow.db'}"
        calls = folder / "validations.log"
        # 6 epochs of about 1.5 s, and validations of 1 s: the outage starts with most of the run ahead
        config = _config(folder, self.dataset, "prefect-down", calls, epoch_s=1.5)
        settings = json.loads(config.read_text())
        settings["validation"]["kwargs"]["sleep_s"] = 1
        config.write_text(json.dumps(settings))
        run = self.start(config, _env(folder, self.prefect.url, tracking_uri, self.ray))
        run.wait_until(lambda: len(_models_by_checkpoint(tracking_uri, "prefect-down")) >= 1, "the first checkpoint record")
        self.prefect.kill()
        self.end("prefect-down", run, calls=calls, tracking_uri=tracking_uri, folder=folder)

    def kill_left(self) -> None:
        for run in self.runs:
            run.kill()


@pytest.fixture(scope="module")
def outages(tmp_path_factory, mlflow_template_db, shared_ray, dataset):
    """The module's runs through their outages (this module's docstring): what each step left."""
    root = tmp_path_factory.mktemp("outages")
    shutil.copy(mlflow_template_db, root / "template.db")
    mlflow = MlflowServer(root / "mlflow", mlflow_template_db)
    mlflow.start()
    prefect = PrefectServer(root / "prefect-home")
    sequence = Outages(root, mlflow, prefect, shared_ray, dataset)
    try:
        try:
            sequence.run()
        except Exception as exc:  # the steps not reached fail their own tests, saying this
            sequence.broken = f"{type(exc).__name__}: {exc}"
        sequence.kill_left()
        # both servers answer for the tests that read what the runs left (the records stay in their databases)
        if not _answers(prefect.url):
            prefect.start()
        if not _answers(mlflow.url):  # MLflow's server answers /health as Prefect's API does
            mlflow.start()
        yield sequence
    finally:
        sequence.kill_left()
        prefect.stop()
        mlflow.kill()


def test_mlflow_server_down_fails_the_run_clearly(outages):
    """The tracking server killed for good mid-run, with a short retry window: exit 3, the server named, no
    traceback, nothing recorded as failed; the verdicts already written stay."""
    ended = outages.get("mlflow-down")
    assert ended.rc == 3, f"exit {ended.rc}:\n{ended.err[-4000:]}"
    assert "Traceback" not in ended.out + ended.err, ended.err[-4000:]
    url = outages.mlflow.url
    assert any(line.startswith("podium: MLflow tracking server") and url in line and "unreachable"
               in line for line in ended.err.strip().splitlines()), ended.err[-2000:]
    assert "outage" in ended.err and "resumes" in ended.err, ended.err[-2000:]
    before = ended.seen["before"]
    assert "validated" in before.values() and len(before) < EPOCHS, f"the failed run left no training to resume: {before}"
    assert "failed" not in before.values(), "a write that failed must not become a failed verdict"


def test_the_resume_rides_out_brief_mlflow_outages(outages):
    """The server back, the same command resumes the run; while it validates, the server hangs for 12 s (accepts
    connections, answers nothing), then is killed and restarted on the same port and database. Nothing is lost:
    one record per checkpoint, each verdict computed once unless it could not be written before, one MLflow run
    FINISHED, promoted once."""
    ended = outages.get("resume")
    assert ended.rc == 0, ended.err[-4000:]
    result = ended.result()
    assert [c["step"] for c in result["checkpoints"]] == list(range(EPOCHS))
    assert all(c["status"] == "validated" and "score" in c["metrics"] for c in result["checkpoints"])
    url = outages.mlflow.url
    counts = _check_complete(url, ended.seen["calls"], outages.root / "outage" / "serving", steps=EPOCHS)
    assert set(counts) == set(range(EPOCHS))
    before = outages.get("mlflow-down").seen["before"]
    for step in (step for step, status in before.items() if status == "validated"):
        assert counts[step] == 1, f"step {step} had a verdict but was validated {counts[step]} times"
    # a verdict that could not be written is computed again on resume, but not retried in between
    assert max(counts.values()) <= 2, counts
    client = MlflowClient(url)
    (mlflow_run,) = client.search_runs([client.get_experiment_by_name("podium").experiment_id],
                                       filter_string=f"tags.`{TAG_RUN}` = 'outage'")
    assert mlflow_run.info.status == "FINISHED" and mlflow_run.info.run_id == result["mlflow_run_id"]
    # the run's own metrics by step: score from every validation
    history = client.get_metric_history(result["mlflow_run_id"], "score")
    assert sorted({m.step for m in history}) == list(range(EPOCHS))
    # the brief outages reached the resumed run's MLflow client (urllib3's retries, which name the MLflow API;
    # the Prefect outage after them is another client's): both kinds of failed attempts were retried
    retried = _retries(ended.seen["log"])
    assert any("Read timed out" in line for line in retried), "the freeze did not hit a request"
    assert _refused_retries(ended.seen["log"]), "the restart did not hit a request"


def test_prefect_server_back_mid_run_its_records_catch_up(outages):
    """The Prefect server lost during the resume's validations and back while they go on: the run says it
    answers again, exit 0; the flow run Completed, the task runs whose states were held during the outage and the
    artifacts reached the server when it came back."""
    from helpers.prefect_queries import artifact_keys, flow_run_state, task_runs
    from prefect.settings import PREFECT_API_URL, temporary_settings

    ended = outages.get("resume")
    assert ended.rc == 0, f"exit {ended.rc}:\n{ended.err[-4000:]}"
    assert "Traceback" not in ended.out + ended.err, ended.err[-4000:]
    assert any("answers again" in line for line in ended.err.splitlines()), ended.err[-3000:]
    validated_before = {step for step, status in outages.get("mlflow-down").seen["before"].items()
                        if status == "validated"}
    with temporary_settings(updates={PREFECT_API_URL: outages.prefect.url}):
        resumed = _last_flow_run_id("outage-run")
        assert flow_run_state(run_id=resumed).is_completed()
        runs = task_runs(None, expect_at_least=EPOCHS - len(validated_before), run_id=resumed)
        validations = sorted((r.name for r in runs if r.name.startswith("validate-step-")),
                             key=lambda n: int(n.rsplit("-", 1)[1]))
        # every checkpoint without a verdict when the resume began, and none with one
        assert validations == [f"validate-step-{s}" for s in range(EPOCHS) if s not in validated_before], validations
        assert all(r.state.is_completed() for r in runs if r.name.startswith("validate-step-"))
        assert {"outage-checkpoints", "outage-promotion", "outage-chart",
                "outage-progress"} <= artifact_keys(None, run_id=resumed)


def _last_flow_run_id(name: str):
    """The id of the newest flow run named `name` (a resumed run's: each attempt has one of that name)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as c:
        runs = c.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])),
                                sort=FlowRunSort.EXPECTED_START_TIME_DESC)
    assert runs, f"no flow run named {name!r}"
    return runs[0].id


def test_promote_fails_when_prefect_is_lost_while_a_candidate_awaits_approval(outages):
    """`podium promote` with approval required loses the Prefect server while its candidate awaits a decision: no
    one could decide, nothing is promoted, and the command fails saying so (exit 1), not as a success."""
    ended = outages.get("approval")
    assert ended.rc == 1, f"exit {ended.rc}:\n{ended.err[-4000:]}"
    assert "Traceback" not in ended.out + ended.err, ended.err[-4000:]
    last = ended.err.strip().splitlines()[-1]
    assert last.startswith("podium: run 'outage' failed: the approval could not be asked for ("), last
    assert "nothing was promoted; `podium promote --run-name outage` asks again" in last, last
    result = ended.result()
    assert result["promoted"] is None
    assert result["promotion_reason"].startswith("undecided: the approval could not be asked for ("), result
    serving = ended.seen["serving"]
    assert not (serving / "CURRENT").exists()
    [tombstone] = (serving / "versions").iterdir()  # the staged copy is gone, its number kept
    assert sorted(os.listdir(tombstone)) == ["DISCARDED.json"]
    client = MlflowClient(outages.mlflow.url)
    [undecided] = client.search_model_versions("tags.`podium.approval` = 'undecided'")
    assert "approved-challenger" not in undecided.aliases
    assert "approved-challenger" not in client.get_registered_model(undecided.name).aliases


def test_prefect_server_down_for_good_the_work_finishes_and_says_so(outages):
    """The Prefect server lost at the run's first checkpoint for good: its work finishes (every checkpoint validated
    once and recorded, the best promoted, the MLflow run FINISHED), and it says it is not recorded in Prefect, once
    on the terminal and once in the log (exit 4)."""
    ended = outages.get("prefect-down")
    assert ended.rc == 4, f"exit {ended.rc}:\n{ended.err[-4000:]}"
    assert "Traceback" not in ended.out + ended.err, ended.err[-4000:]
    last = ended.err.strip().splitlines()[-1]
    assert last.startswith("podium: done, but not recorded in Prefect: the Prefect server " + outages.prefect.url), last
    result = ended.result()
    assert [c["step"] for c in result["checkpoints"]] == list(range(6))
    assert all(c["status"] == "validated" and "score" in c["metrics"] for c in result["checkpoints"])
    assert result["promoted"] is not None and result["prefect_not_recorded"]
    counts = collections.Counter(int(x) for x in ended.seen["calls"].read_text().split())
    assert counts == {step: 1 for step in range(6)}, counts
    folder = ended.seen["folder"]
    assert len(read_history(str(folder / "serving"))) == 1
    client = MlflowClient(ended.seen["tracking_uri"])
    (mlflow_run,) = client.search_runs([client.get_experiment_by_name("podium").experiment_id],
                                       filter_string=f"tags.`{TAG_RUN}` = 'prefect-down'")
    assert mlflow_run.info.status == "FINISHED", "the MLflow run must not be left RUNNING"
    # the outage is said once on the terminal and once in the log, not once per event or call
    assert sum("does not answer" in line for line in ended.err.splitlines()) == 1, ended.err[-4000:]
    log = (folder / "home" / "logs" / "podium.log").read_text(errors="replace")
    assert log.count("stopped answering") == 1, "the outage is logged once"
    assert "failed to process item" not in log and "Error logging to API" not in ended.err + log
    print(f"wall time with the Prefect server down from the first checkpoint: {result['wall_time_s']} s")
