"""Faults injected for real: the flow process killed or stopped, a user's code raising, the Ray head lost, a disk
full. (A training worker process killed: test_ray_examples, on a loop of Ray's guides.)

Trains 5 times (Ray Train starts), all for one run name, `faults` (the module's `chain`): five `podium run`
processes, each resuming what the one before left, each ended by another fault, at the moment that loses the most
where there is one (a verdict of its own recorded, more checkpoints waiting for theirs):

  attempt     ended by                                              its test
  raises      the training loop raising at epoch 3, the validation   test_user_code_errors_are_shown_once_with_the_
              function at epoch 1 (exit 1)                           users_own_frames
  killed      SIGKILL to the process group (an OOM killer, kill -9)  test_a_killed_run_leaves_no_duplicate_and_the_
                                                                     next_attempt_marks_it_crashed
  ctrl-c      SIGINT to the process group (a terminal's Ctrl-C)      test_ctrl_c_stops_the_run_cleanly_and_says_how_to_
                                                                     resume
  head-lost   the Ray head's GCS killed                              test_ray_head_lost_mid_run_ends_it_clearly
  finish      nothing: on a new head it finishes                     test_the_last_attempt_finishes_each_checkpoint_
                                                                     once_without_asking_a_verdict_again

The run keeps its checkpoints in Google Cloud Storage (gcp-storage-emulator) and serves its champion from Azure Blob
(Azurite), each on loopback: a resume after each fault works on an object store, where nothing is renamed into place
(test_a_run_killed_and_resumed_on_gcs_promotes_its_best_checkpoint_onto_azure); local disk, the embedded default,
is every other training module's.

The kill and Ctrl-C run on podium's own local Ray (the signals reach it as a user's would), the others on a
`ray start` head of the module's own (the fault is the user's code's or the cluster's). Ray waits a fixed 30 s for a
new node to register: a local Ray that did not start in time on a loaded machine ("The current node timed out during
startup", seen in attempt 2 under a load of 30 on 2 cores) has its attempt started again, once (no Ray Train start
is lost: training had not begun). Each test reads what its attempt left (exit,
output, the stores right after it), so each fails on its own; an attempt the chain did not reach fails its test,
saying why.

A scheduler's SIGTERM (to podium's process only) is not one of the attempts: the flow takes it with the same handler
as Ctrl-C (podium.flows.stop.stop_on_signals: the stop of the training, the validations' grace, the MLflow run
KILLED and the exit are the same code for both), and what is SIGTERM's own, podium's handler taking over from
Prefect's engine and the exit 143, has its real-process test in test_promotion_state
(test_a_stop_while_the_candidate_awaits_approval_withdraws_it[SIGTERM]) and its start-up one in test_cli_alone.

The disk-full tests train nothing: the checkpoints they promote are written straight into storage and recorded in
the test's MLflow store with podium's own recording functions; the champion is promoted in the test's process, the
promotion that meets the full disk by `podium promote` (a real process).
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from azure.storage.blob import BlobServiceClient
from helpers.commands import podium_in_process
from helpers.object_stores import start_azurite, start_gcs_emulator
from helpers.servers import RayHead, fill_filesystem, small_tmpfs
from mlflow.tracking import MlflowClient

from podium.core.events import CheckpointEvent
from podium.serving.layout import read_current, read_history, read_pointer
from podium.serving.staging import verify_files
from podium.storage.fingerprint import dataset_digest
from podium.storage.locations import fsspec_filesystem
from podium.tracking.client import TAG_CHECKPOINT, TAG_METRICS, TAG_STATUS, TAG_STEP
from podium.tracking.records import merge_validation, record_checkpoint
from podium.tracking.runs import open_tracking_run

# the chain's five attempts run in the first test's setup: about 10 minutes on a quiet machine, 16 on one with a load
# of 20 on 2 cores (pytest-timeout counts a fixture's setup in its first test's time)
pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]


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


def _flow_run_states(name: str) -> dict[str, str]:
    """The state of each flow run named `name`, by id, oldest first."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as c:
        runs = c.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))
    return {str(r.id): r.state.type.value for r in sorted(runs, key=lambda r: r.created) if r.state}


def _podium_env(prefect_api, locations, home):
    """A `podium` process's environment (PODIUM_HOME under `home`): podium's own local Ray, as a user's would be,
    unless the caller adds a head's."""
    env = {**os.environ, "PODIUM_HOME": str(home / "home"), "PREFECT_API_URL": prefect_api,
           "MLFLOW_TRACKING_URI": locations["tracking_uri"],
           # the user's own module is importable, as it would be for a user running podium
           "PYTHONPATH": os.pathsep.join(filter(None, [os.path.dirname(__file__), os.environ.get("PYTHONPATH")]))}
    env.pop("RAY_ADDRESS", None)
    return env


def _group_gone(pgid: int, timeout_s: float = 60) -> bool:
    """Whether no process of the process group `pgid` is left (reaped, not only killed) within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _statuses(tracking_uri) -> dict[str, str]:
    return {name: models[0].tags.get(TAG_STATUS) for name, models in _models_by_checkpoint(tracking_uri).items()}


# ---- the chain: one run name, five `podium run` processes, each ended by another fault

NAME = "faults"
BUCKET = "podium-faults"  # the GCS bucket of the run's checkpoints, and the Azure container of its serving location
EPOCHS = 16  # enough for each attempt to train some: each resumes from the newest checkpoint
RAISING_EPOCH, FAILING_VALIDATION = 3, 1  # the first attempt's training loop and validation function raise there
RAY_START_TIMEOUT = "The current node timed out during startup"


@dataclass
class Ended:
    """What one attempt left: its exit code (negative: the signal that killed it), its output, and the stores right
    after it ended."""

    rc: int
    out: str
    err: str
    records: dict[str, list]  # the MLflow records (LoggedModels) of each checkpoint, by checkpoint name
    mlflow_runs: list[str]  # the statuses of the experiment's MLflow runs
    flow_runs: dict[str, str]  # the state of each of the run's flow runs, by id, oldest first
    promotions: int  # entries in the serving location's history
    log: str  # what podium's log file got during the attempt
    took_s: float = 0.0  # from the fault to the process's end
    group_gone: bool = True  # no process of its process group left after it (a kill)
    own: str = ""  # the id of its own flow run (the newest)
    frozen: dict[int, int] = field(default_factory=dict)  # the chain's `frozen` right after it

    def statuses(self) -> dict[int, str]:
        """The status of each checkpoint's record, by step."""
        return {int(m[0].tags[TAG_STEP]): m[0].tags.get(TAG_STATUS) for m in self.records.values()}

    def last_line(self) -> str:
        lines = self.err.strip().splitlines()
        return lines[-1] if lines else ""


@dataclass
class Chain:
    """The attempts of the run `faults` and what each left (`ended`), the validations each checkpoint had when its
    verdict was first seen (`frozen`), and why the chain stopped early, if it did (`broken`)."""

    root: object
    locations: dict[str, str]
    prefect_api: str
    dataset: tuple[str, str]
    ended: dict[str, Ended] = field(default_factory=dict)
    frozen: dict[int, int] = field(default_factory=dict)
    broken: str | None = None
    procs: list[subprocess.Popen] = field(default_factory=list)
    ray_start_retried: bool = False  # a local Ray did not start in Ray's 30 s, and its attempt was started again

    @property
    def uri(self) -> str:
        return self.locations["tracking_uri"]

    @property
    def calls(self):
        return self.root / "validations.log"

    @property
    def log_file(self):
        return self.root / "home" / "logs" / "podium.log"

    def get(self, attempt: str) -> Ended:
        """What `attempt` left; its test fails if the chain did not reach it."""
        if attempt not in self.ended:
            pytest.fail(f"the attempt {attempt!r} was not reached: {self.broken}")
        return self.ended[attempt]

    def write_config(self, validate_s: float = 2, **loop_extra) -> str:
        """The run's config; the first attempt's loop raises, the others' epochs take 1 s (a fixed user's code), and
        their validations `validate_s` each (the faults come while verdicts are being written)."""
        validate = {"calls_log": str(self.calls), "fail_epoch": FAILING_VALIDATION,
                    "sleep_s": 0 if "raise_at_epoch" in loop_extra else validate_s}
        config = _user_config(NAME, self.dataset, self.locations, epochs=EPOCHS, loop_extra=loop_extra,
                              validate_extra=validate)
        config["scaling"]["max_failures"] = 0
        config["validation"].update(retries=0, concurrency=1)
        path = self.root / "podium.json"
        path.write_text(json.dumps(config))
        return str(path)

    def start(self, env: dict[str, str], *more: str) -> subprocess.Popen:
        self.log_from = self.log_file.stat().st_size if self.log_file.exists() else 0
        self.procs.append(_podium(["run", "--json", "--config", str(self.root / "podium.json"), *more], env))
        return self.procs[-1]

    def start_then_wait_for_a_new_verdict(self, env: dict[str, str]) -> subprocess.Popen:
        """`podium run` started; returns once it recorded a verdict of its own and more checkpoints wait for
        theirs (the moment a stop or a kill loses the most)."""
        had = {name for name, status in _statuses(self.uri).items() if status == "validated"}
        proc = self.start(env)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            statuses = _statuses(self.uri)
            validated = {name for name, status in statuses.items() if status == "validated"}
            if validated - had and "pending" in statuses.values():
                return proc
            if proc.poll() is not None:
                err = proc.stderr.read()
                # Ray waits a fixed 30 s for its new node to register (ray/_private/node.py); on a loaded machine
                # that can pass: the machine's fault, not podium's. Started again, once: the run resumes
                assert RAY_START_TIMEOUT in err and not self.ray_start_retried, \
                    f"exit {proc.returncode} before a new verdict:\n{err[-3000:]}"
                self.ray_start_retried = True
                proc = self.start(env)
            time.sleep(0.2)
        raise AssertionError(f"no new verdict with more checkpoints waiting after 300 s: {_statuses(self.uri)}")

    def end(self, attempt: str, proc: subprocess.Popen, timeout_s: float, since: float | None = None) -> Ended:
        """Wait for `proc`, then keep what it left as `attempt`'s, and the validations of each new verdict."""
        if proc.returncode is None or proc.returncode >= 0:
            out, err = proc.communicate(timeout=timeout_s)
        else:  # killed: what it wrote is not read (a process it started outside its group may hold the pipes)
            out, err = "", ""
        took = time.monotonic() - since if since is not None else 0.0
        client = MlflowClient(self.uri)
        experiment = client.get_experiment_by_name("podium")
        runs = client.search_runs([experiment.experiment_id]) if experiment else []
        log = self.log_file.read_bytes()[self.log_from:].decode(errors="replace") if self.log_file.exists() else ""
        ended = Ended(rc=proc.returncode, out=out, err=err, records=dict(_models_by_checkpoint(self.uri)),
                      mlflow_runs=[r.info.status for r in runs], flow_runs=_flow_run_states(f"{NAME}-run"),
                      promotions=len(read_history(self.locations["serving"])), log=log, took_s=took)
        ended.own = next(reversed(ended.flow_runs), "")
        self.ended[attempt] = ended
        counts = self.validations()
        for step, status in ended.statuses().items():
            if status != "pending":
                self.frozen.setdefault(step, counts[step])
        ended.frozen = dict(self.frozen)
        return ended

    def validations(self) -> collections.Counter:
        """The validations of each step so far (each call of the validation function writes its step)."""
        return collections.Counter(int(x) for x in self.calls.read_text().split()) if self.calls.exists() \
            else collections.Counter()

    def run(self, head: RayHead) -> None:
        env = _podium_env(self.prefect_api, self.locations, self.root)
        # 1. the user's training loop raises, and so does their validation function: no retries of either. On the
        # module's head (podium's own local Ray is the next two attempts')
        head.start()
        on_head = {**head.env, "RAY_gcs_rpc_server_reconnect_timeout_s": "20"}
        address = ["--ray-address", f"127.0.0.1:{head.port}"]
        self.write_config(raise_at_epoch=RAISING_EPOCH)
        self.end("raises", self.start(on_head, *address), 600)

        # 2. the user fixed the loop (epochs of 1 s, validations of 2 s, one at a time): killed
        self.write_config(epoch_s=1.0)
        proc = self.start_then_wait_for_a_new_verdict(env)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        ended = self.end("killed", proc, 60)
        ended.group_gone = _group_gone(proc.pid)  # the killed run's Ray processes share the driver's fate

        # 3. Ctrl-C: SIGINT to the whole process group, as a terminal sends it (Ray's processes block it)
        proc = self.start_then_wait_for_a_new_verdict(env)
        os.killpg(proc.pid, signal.SIGINT)
        self.end("ctrl-c", proc, 180)

        # 4. on the head again, whose GCS dies once this attempt recorded a checkpoint of its own. Ray's window
        # shrunk from 60 s to 20 s (podium acts 15 s before it ends): only the test's wait shrinks
        before = len(_models_by_checkpoint(self.uri))
        proc = self.start(on_head, *address)
        deadline = time.monotonic() + 300
        while len(_models_by_checkpoint(self.uri)) <= before:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
            time.sleep(0.2)
        head.kill("gcs_server")
        self.end("head-lost", proc, 120, since=time.monotonic())

        # 5. what is left of the old head killed, a new one on the same port: the same command finishes the run. No
        # fault is left to come: its epochs and validations take no time of their own
        head.kill()
        head.start()
        self.write_config(validate_s=0)
        self.end("finish", self.start(on_head, *address), 600)

    def kill_left(self) -> None:
        """The attempts' processes still running (a chain that broke): killed with their process groups."""
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture(scope="module")
def chain(prefect_api, dataset, tmp_path_factory, mlflow_template_db) -> Iterator[Chain]:
    """The run `faults` through its five attempts (this module's docstring): what each left. Its checkpoints are
    kept in Google Cloud Storage and its champion served from Azure Blob, each an emulator on loopback."""
    root = tmp_path_factory.mktemp("faults")
    shutil.copy(mlflow_template_db, root / "mlflow.db")
    gcs = start_gcs_emulator(root / "gcs.log", BUCKET, preconditions=True)
    azure = start_azurite(root / "azurite.log")
    with pytest.MonkeyPatch.context() as patch:  # this process reads the stores too (the serving history)
        gcs.point_here(patch)
        azure.point_here(patch)
        BlobServiceClient.from_connection_string(azure.env()["AZURE_STORAGE_CONNECTION_STRING"]).create_container(BUCKET)
        locations = {"storage": f"gs://{BUCKET}/storage", "serving": f"az://{BUCKET}/serving",
                     "tracking_uri": f"sqlite:///{root / 'mlflow.db'}"}
        chain = Chain(root, locations, prefect_api, dataset)
        head = RayHead(root, _podium_env(prefect_api, locations, root))
        try:
            chain.run(head)
        except Exception as exc:  # the attempts not reached fail their own tests, saying this
            chain.broken = f"{type(exc).__name__}: {exc}"
        finally:
            chain.kill_left()
            head.stop()
        try:
            yield chain
        finally:
            gcs.stop()
            azure.stop()


def _check_no_duplicate_and_no_verdict_invented(ended: Ended, killed: bool = False) -> None:
    """Every record written whole (its training metrics there) and none duplicated; the only verdicts besides
    `validated` the first attempt's failed validation. A record whose writer was killed between MLflow's two
    requests (the LoggedModel with its tags, then its metrics) has its metrics in podium's own copy, the tag
    written with the create; the next command that finds it makes it whole (records._completed)."""
    assert ended.records and all(len(v) == 1 for v in ended.records.values()), "no MLflow record duplicated"
    for (model,) in ended.records.values():
        whole = "loss" in {m.key for m in model.metrics or []}
        assert whole or (killed and "loss" in json.loads(model.tags.get(TAG_METRICS, "{}"))), model.tags
    statuses = ended.statuses()
    assert statuses.get(FAILING_VALIDATION) == "failed", statuses
    others = {status for step, status in statuses.items() if step != FAILING_VALIDATION}
    assert others <= {"validated", "pending"}, f"a stop or a lost cluster is no verdict: {statuses}"


def _check_ended_clearly(ended: Ended, rc: int, says: str, mlflow_status: str, flow_run_state: str) -> None:
    """A run ended by a stop or a lost cluster: exit `rc`, no traceback, one last line starting with `says` and
    naming the run to resume; its records whole and no verdict invented; its MLflow run and flow run ended in
    `mlflow_status` and `flow_run_state`; nothing promoted."""
    assert ended.rc == rc, f"exit {ended.rc} after {ended.took_s:.0f} s:\n{ended.err[-4000:]}"
    assert "Traceback" not in ended.out + ended.err, ended.err[-4000:]
    last = ended.last_line()
    assert last.startswith(says) and f"--run-name ({NAME}) to resume" in last, last
    _check_no_duplicate_and_no_verdict_invented(ended)
    assert ended.mlflow_runs == [mlflow_status], ended.mlflow_runs
    assert ended.flow_runs[ended.own] == flow_run_state, ended.flow_runs
    assert ended.promotions == 0, "nothing promoted by a run that ended so"


def test_user_code_errors_are_shown_once_with_the_users_own_frames(chain):
    """A training loop that raises, and a validation function that raises: each is reported as the user's
    exception with their own frames, once; Ray's frames stay in the log file."""
    ended = chain.get("raises")
    err, shown = ended.err, ended.out + ended.err
    assert ended.rc == 1, f"exit {ended.rc}:\n{err[-4000:]}"
    # the training loop's error: once, on stderr, with the user's frames and none of Ray's
    assert err.count(f"ValueError: bad batch at epoch {RAISING_EPOCH}") == 1, err[-4000:]
    assert "podium: the training loop podium_user_code:train_func (rank 0" in err, err[-4000:]
    assert 'podium_user_code.py", line' in err and "in _check_batch" in err and "in train_func" in err
    # the validation function's error: once, with the user's frames and none of Ray's or podium's
    assert shown.count(f"RuntimeError: validation data unavailable for epoch {FAILING_VALIDATION}") == 1, shown[-4000:]
    assert "in validate_fn" in shown and "validation_call.py" not in shown, shown[-6000:]
    assert shown.count("Traceback (most recent call last)") == 2, shown[-6000:]
    assert "site-packages/ray" not in shown and "WorkerGroupError" not in shown, shown[-6000:]
    assert len(shown.splitlines()) < 60, f"more than a screen:\n{shown}"
    assert "WorkerGroupError" in ended.log and "site-packages/ray" in ended.log, "the full Ray trace goes to the log file"
    assert ended.statuses().get(FAILING_VALIDATION) == "failed", ended.statuses()


def test_a_killed_run_leaves_no_duplicate_and_the_next_attempt_marks_it_crashed(chain):
    """SIGKILL to the process group at the moment that loses the most: the killed run's Ray processes end with it,
    every record it wrote is whole and none duplicated, each verdict so far was asked for once, and the next
    attempt marks the killed flow run Crashed and takes over."""
    ended = chain.get("killed")
    assert ended.rc == -signal.SIGKILL, f"exit {ended.rc}:\n{ended.err[-3000:]}"
    assert ended.group_gone, "processes of the killed run's group still there after 60 s"
    _check_no_duplicate_and_no_verdict_invented(ended, killed=True)
    assert ended.frozen and set(ended.frozen.values()) == {1}, ended.frozen  # one attempt's validation each so far
    assert ended.flow_runs[ended.own] == "RUNNING", ended.flow_runs  # the kill wrote nothing
    assert chain.get("ctrl-c").flow_runs[ended.own] == "CRASHED", "the killed attempt marked Crashed"


def test_ctrl_c_stops_the_run_cleanly_and_says_how_to_resume(chain):
    """Ctrl-C (SIGINT to the process group): the running validation records its verdict or stays pending, the flow
    run ends Cancelled, the MLflow run KILLED, nothing promoted, one line says how to resume, exit 130."""
    _check_ended_clearly(chain.get("ctrl-c"), 128 + signal.SIGINT, "podium: stopped by SIGINT", "KILLED", "CANCELLED")


def test_ray_head_lost_mid_run_ends_it_clearly(chain):
    """The head of the Ray cluster podium runs on dies (its GCS killed) mid-run: podium says so, ends the run
    (MLflow run FAILED, flow run Failed, checkpoints without a verdict pending, exit code 3) before Ray's own
    reconnect window ends the process with nothing said."""
    ended = chain.get("head-lost")
    _check_ended_clearly(ended, 3, "podium: Ray's head at ", "FAILED", "FAILED")
    assert ended.took_s < 20, f"{ended.took_s:.0f} s: Ray's window ended the process, not podium"


def test_the_last_attempt_finishes_each_checkpoint_once_without_asking_a_verdict_again(chain):
    """After a failure, a kill, a stop and a lost cluster, the same command on a new head finishes the run: every
    checkpoint recorded once and validated at most twice (once more only where a kill or a lost cluster came
    before its verdict was written), a verdict already recorded never asked for again, the best promoted once."""
    ended = chain.get("finish")
    assert ended.rc == 0, ended.err[-3000:]
    result = json.loads(ended.out.strip().splitlines()[-1])
    assert [c["step"] for c in result["checkpoints"]] == list(range(EPOCHS))
    statuses = {c["step"]: c["status"] for c in result["checkpoints"]}
    assert statuses == {step: "failed" if step == FAILING_VALIDATION else "validated" for step in range(EPOCHS)}
    assert len(ended.records) == EPOCHS and all(len(v) == 1 for v in ended.records.values()), \
        "no MLflow record duplicated"
    counts = chain.validations()
    assert set(counts) == set(range(EPOCHS)) and max(counts.values()) <= 2, counts
    before = {step: n for step, n in chain.frozen.items() if step in chain.get("head-lost").statuses()
              and chain.get("head-lost").statuses()[step] != "pending"}
    for step, n in before.items():  # a verdict recorded before a stop, a kill or a failure is never asked again
        assert counts[step] == n, f"step {step} validated again after its verdict: {counts[step]} times"
    assert result["promoted"] is not None and ended.promotions == 1
    assert ended.mlflow_runs == ["FINISHED"], ended.mlflow_runs
    assert ended.flow_runs[ended.own] == "COMPLETED", ended.flow_runs
    assert "RUNNING" not in ended.flow_runs.values(), ended.flow_runs


def test_a_run_killed_and_resumed_on_gcs_promotes_its_best_checkpoint_onto_azure(chain):
    """The chain's stores: every checkpoint of the finished run, through the raise, the kill, the stop and the lost
    cluster, is in Google Cloud Storage where its record says, and the champion, promoted from one of them, is
    served whole from Azure Blob (its files as the manifest says), CURRENT and the history naming it."""
    ended = chain.get("finish")
    result = json.loads(ended.out.strip().splitlines()[-1])
    storage, serving = chain.locations["storage"], chain.locations["serving"]
    gcs, _ = fsspec_filesystem(storage)
    for checkpoint in result["checkpoints"]:
        assert checkpoint["uri"].startswith(f"{storage}/{NAME}/checkpoint_"), checkpoint["uri"]
        assert gcs.ls(checkpoint["uri"], detail=False), f"{checkpoint['uri']}: nothing there"
    promoted, current = result["promoted"], read_current(serving)
    assert promoted["uri"].startswith(f"{serving}/versions/") and current.version == promoted["version"], promoted
    assert current.manifest["source"] in {c["uri"] for c in result["checkpoints"]}, current.manifest
    verify_files(f"{serving}/versions/{current.version}", current.manifest)
    [switch] = read_history(serving)
    assert switch["version"] == promoted["version"], switch


# ---- a disk full at the serving location: checkpoints made in storage, promoted by `podium promote`

@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs: a filesystem that fills up for real (mounting it needs root)."""
    with small_tmpfs(tmp_path / "small-disk") as mnt:
        yield mnt


def _validated_checkpoint(locations, dataset, run_name: str, score: float, pad_bytes: int = 0) -> None:
    """A checkpoint of the run `run_name` written straight into storage (no training: only its promotion is tested),
    recorded in MLflow with podium's own functions and validated on the run's validation data."""
    path = os.path.join(locations["storage"], run_name, "checkpoint_000000")
    os.makedirs(path)
    with open(os.path.join(path, "weights.json"), "w") as f:
        json.dump({"w": [score]}, f)
    if pad_bytes:  # a bigger checkpoint, for a disk that runs out of space
        with open(os.path.join(path, "pad.bin"), "wb") as f:
            f.write(os.urandom(pad_bytes))
    tracking = open_tracking_run(locations["tracking_uri"], "podium", run_name, {})
    record = record_checkpoint(tracking, CheckpointEvent(run_name=run_name, step=0, metrics={"loss": 1.0},
                                                         checkpoint_uri=path, checkpoint_name="checkpoint_000000"))
    merge_validation(tracking, record, {"score": score}, dataset_digest(dataset[1]))


def test_disk_full_at_serving_says_where_removes_the_partial_version_keeps_the_champion(
        prefect_api, dataset, locations, tmp_path, small_disk):
    serving = str(small_disk / "serving")
    env = _podium_env(prefect_api, locations, tmp_path)  # promotion only: no Ray
    _validated_checkpoint(locations, dataset, "disk-first", 0.5)
    first = _user_config("disk-first", dataset, {**locations, "serving": serving})
    (tmp_path / "first.json").write_text(json.dumps(first))
    # the champion, promoted in this process: what is tested is the next promotion, through the command
    podium_in_process(["promote", "--config", str(tmp_path / "first.json")], env)
    assert (read_pointer(serving) or {}).get("version") == "v000001"

    fill_filesystem(small_disk, leave_bytes=512 * 1024)  # the next champion's 2 MiB checkpoint does not fit
    _validated_checkpoint(locations, dataset, "disk-second", 0.4, pad_bytes=2 * 1024 * 1024)
    second = _user_config("disk-second", dataset, {**locations, "serving": serving})
    second["promotion"]["always"] = True
    (tmp_path / "second.json").write_text(json.dumps(second))
    proc = _podium(["promote", "--config", str(tmp_path / "second.json")], env)
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
