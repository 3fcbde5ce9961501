"""The production profile against real servers on loopback, started and stopped by this module:

- a `prefect server` keeping its state in PostgreSQL (a database made for this module),
- an `mlflow server` on PostgreSQL (another database), artifacts on an S3 server (moto) it proxies,
- a Ray cluster of two nodes: `ray start --head` plus `ray start --address` (two raylets on this
  machine, 2 CPUs each) that share no folder podium uses: checkpoints (`storage`) are kept in Azure Blob
  (Azurite) and the serving location and the train/val Parquet data in Google Cloud Storage
  (gcp-storage-emulator), both on loopback; each node reads the stores' endpoints and the Azure account's
  credentials from its own environment, given when it starts, as a real cluster's nodes would,
- podium's deployments registered with `python -m podium.deployments deploy` on a process work pool, and
  a worker (`podium worker --ray-address ...`) that runs them on that cluster.

Authentication is on in all three servers: Prefect's basic auth, MLflow's `basic-auth` app, Ray's token;
Azurite checks the Azure account's key. The secrets are made for this module and reach servers and
clients in environment variables only; the last tests check that each server refuses a client without
them, and that no secret (the Azure key included) shows in a log, an MLflow or Prefect record, an
artifact or a process's arguments.

Cost: about 3 to 5 minutes on 2 busy cores, most of it starting the servers (their schema
migrations) and the flow-run processes the worker starts.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pytest
import requests
from azure.core.exceptions import HttpResponseError
from azure.storage.blob import BlobServiceClient
from helpers.object_stores import AZURE_ACCOUNT, Emulator, start_azurite, start_gcs_emulator
from helpers.prefect_queries import checkpoint_events, flow_run_logs, task_runs
from helpers.s3_server import S3Server
from helpers.served_checks import check_served_champion
from helpers.servers import wait_http_ok
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, WorkPoolFilter, WorkPoolFilterName
from prefect.deployments import run_deployment

from podium.config import expand_run_name
from podium.core.events import CheckpointEvent
from podium.deployments.definitions import NIGHTLY, PROMOTE_ON_DEMAND, VALIDATE
from podium.flows.validate_announced import RECORD_LOCK
from podium.prefect_events import EVENT_PERSISTED
from podium.serving.layout import read_current
from podium.settings import count_start
from podium.storage.locations import fsspec_filesystem, join
from podium.tracking.client import TAG_CHECKPOINT
from podium.tracking.records import list_records, merge_validation, record_checkpoint
from podium.tracking.runs import find_tracking_run, open_tracking_run

pytestmark = [pytest.mark.integration, pytest.mark.production]

PG_HOST, PG_PORT = "127.0.0.1", 5432
POOL = "podium-test"
BIN = Path(sys.executable).parent
MLFLOW_USER = "podium"  # the MLflow auth app's admin, whom podium's clients sign in as
BUCKET = CONTAINER = "podium-prod"  # the GCS bucket (serving, data) and the Azure container (storage)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _postgres_reachable() -> bool:
    try:
        with socket.create_connection((PG_HOST, PG_PORT), timeout=2):
            return True
    except OSError:
        return False


def _stop_group(pgid: int, grace_s: float = 8.0) -> None:
    """SIGTERM a process group this module started, then SIGKILL what is left of it."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.3)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ---------------------------------------------------------------------------------------- servers


@pytest.fixture(scope="module")
def databases():
    """PostgreSQL databases made for this module (Prefect's, MLflow's and its auth app's), dropped afterwards."""
    if not _postgres_reachable():
        pytest.skip(f"PostgreSQL is not reachable on {PG_HOST}:{PG_PORT}")
    import psycopg

    suffix = uuid.uuid4().hex[:8]
    names = {"prefect": f"podium_prefect_{suffix}", "mlflow": f"podium_mlflow_{suffix}",
             "mlflow_auth": f"podium_mlflow_auth_{suffix}"}
    admin = f"postgresql://postgres@{PG_HOST}:{PG_PORT}/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        for name in names.values():
            conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield names
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            for name in names.values():
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _basic_auth(user_password: str) -> str:
    """What an Authorization header carries for HTTP basic auth."""
    return base64.b64encode(user_password.encode()).decode()


@dataclass(frozen=True)
class Credentials:
    """This module's secrets, made per test session. Servers and clients get them in environment
    variables only, never on a command line; pytest's report of a failure does not show them."""

    # "user:password": PREFECT_SERVER_API_AUTH_STRING / PREFECT_API_AUTH_STRING
    prefect_auth: str = field(repr=False)
    mlflow_password: str = field(repr=False)  # of the MLflow auth app's admin, MLFLOW_USER
    mlflow_secret_key: str = field(repr=False)  # the MLflow auth app's CSRF key (MLFLOW_FLASK_SERVER_SECRET_KEY)
    ray_token: str = field(repr=False)
    azure_key: str = field(repr=False)  # the Azure Blob account's key (base64), Azurite's and its clients'

    def client_env(self) -> dict[str, str]:
        """What podium's clients (the worker, its flow runs, `podium`, these tests) need for Prefect and MLflow."""
        return {"PREFECT_API_AUTH_STRING": self.prefect_auth,
                "MLFLOW_TRACKING_USERNAME": MLFLOW_USER, "MLFLOW_TRACKING_PASSWORD": self.mlflow_password}

    def findable(self) -> dict[str, str]:
        """Each secret by name, with the Authorization header values that would carry the passwords."""
        return {"the Prefect password": self.prefect_auth.partition(":")[2],
                "the Prefect Authorization header": _basic_auth(self.prefect_auth),
                "the MLflow password": self.mlflow_password,
                "the MLflow Authorization header": _basic_auth(f"{MLFLOW_USER}:{self.mlflow_password}"),
                "the MLflow server's secret key": self.mlflow_secret_key,
                "the Ray token": self.ray_token,
                "the Azure account key": self.azure_key}


@pytest.fixture(scope="module")
def credentials():
    """The secrets; the client ones are set in this process's environment (its children inherit them)."""
    made = Credentials(prefect_auth=f"podium:{secrets.token_hex(16)}", mlflow_password=secrets.token_hex(16),
                       mlflow_secret_key=secrets.token_hex(32), ray_token=secrets.token_hex(32),
                       azure_key=base64.b64encode(secrets.token_bytes(32)).decode())
    with pytest.MonkeyPatch.context() as mp:
        for name, value in made.client_env().items():
            mp.setenv(name, value)
        yield made


class CommandLines:
    """Every process's command line on this machine, sampled every 0.2 s from start to stop."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="command-lines", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            lines = set()
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if raw:
                    lines.add(raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace"))
            with self._lock:
                self._seen |= lines

    def seen(self) -> set[str]:
        """The distinct command lines sampled so far."""
        with self._lock:
            return set(self._seen)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture(scope="module")
def command_lines():
    """Process arguments, sampled from before the servers start until the module ends."""
    sampler = CommandLines()
    try:
        yield sampler
    finally:
        sampler.stop()


@dataclass
class Stores:
    """The object stores on loopback: checkpoints in Azure Blob, serving and data in Google Cloud Storage."""

    gcs: Emulator
    azure: Emulator
    root: Path  # their logs

    def env(self) -> dict[str, str]:
        """What a process that reaches the stores reads from its environment (a Ray node, the worker, these
        tests): the GCS emulator's endpoint, and the Azure account's connection string, its key included."""
        return {**self.gcs.env(), **self.azure.env()}


@pytest.fixture(scope="module")
def stores(credentials, command_lines, tmp_path_factory):
    """The GCS emulator (generation preconditions honoured, for the promotion lease) with its bucket, and
    Azurite with an account whose key is this module's secret and a container. Their settings are not put in
    this process's environment here: the servers started next get none; the Ray nodes get them explicitly,
    the worker and these tests from `team`."""
    root = tmp_path_factory.mktemp("stores")
    gcs = start_gcs_emulator(root / "gcs.log", BUCKET, preconditions=True)
    try:
        azure = start_azurite(root / "azurite.log", key=credentials.azure_key)
    except BaseException:
        gcs.stop()
        raise
    made = Stores(gcs, azure, root)
    try:
        BlobServiceClient.from_connection_string(made.env()["AZURE_STORAGE_CONNECTION_STRING"]) \
            .create_container(CONTAINER)
        yield made
    finally:
        gcs.stop()
        azure.stop()


def start_prefect_server(root: Path, database: str, auth: str):
    """`prefect server start` with PREFECT_API_DATABASE_CONNECTION_URL on PostgreSQL and basic auth."""
    from podium.services import ensure_prefect_server, stop_prefect_server

    url = ensure_prefect_server(root, _free_port(), timeout_s=400, env={
        "PREFECT_API_DATABASE_CONNECTION_URL": f"postgresql+asyncpg://postgres@{PG_HOST}:{PG_PORT}/{database}",
        "PREFECT_SERVER_API_AUTH_STRING": auth})
    return url, lambda: stop_prefect_server(root)


def start_mlflow_server(root: Path, database: str, auth_database: str, credentials: Credentials):
    """`mlflow server` with its backend store on PostgreSQL and artifacts in a bucket of an S3 server (moto),
    which it proxies: clients (podium, `mlflow models serve`) reach the artifacts through it, with no S3
    credentials of their own. Its authentication app keeps users in a PostgreSQL database of its own; the
    admin's password and the app's secret key come from the environment. Returns (URL, S3 server), stop."""
    from helpers.s3_server import start_s3_server

    s3 = start_s3_server(root / "moto.log")
    s3.create_bucket("mlflow-artifacts")
    auth_config = root / "mlflow-auth.ini"
    auth_config.touch(mode=0o600)
    auth_config.write_text(
        "[mlflow]\ndefault_permission = NO_PERMISSIONS\n"
        f"database_uri = postgresql+psycopg://postgres@{PG_HOST}:{PG_PORT}/{auth_database}\n"
        f"admin_username = {MLFLOW_USER}\n"
        # a password checked once a minute per worker, not on every request (a PBKDF2 hash each time)
        "auth_cache_ttl_seconds = 60\n")
    port, log = _free_port(), root / "mlflow-server.log"
    proc = subprocess.Popen(
        [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "2",
         "--backend-store-uri", f"postgresql+psycopg://postgres@{PG_HOST}:{PG_PORT}/{database}",
         "--artifacts-destination", "s3://mlflow-artifacts/mlflow", "--app-name", "basic-auth"],
        env={**os.environ, **s3.env(), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
             "MLFLOW_AUTH_CONFIG_PATH": str(auth_config), "MLFLOW_AUTH_ADMIN_PASSWORD": credentials.mlflow_password,
             "MLFLOW_FLASK_SERVER_SECRET_KEY": credentials.mlflow_secret_key},
        stdout=log.open("wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    count_start("mlflow_server")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(f"{url}/health", proc, log, timeout_s=400)
    except BaseException:
        _stop_group(proc.pid)
        s3.stop()
        raise

    def stop() -> None:
        _stop_group(proc.pid)
        s3.stop()

    return (url, s3), stop


@dataclass
class RayCluster:
    address: str
    env: dict[str, str]  # what a driver needs besides RAY_ADDRESS: the cluster's auth token
    nodes: list[dict]
    temp: Path  # the nodes' temp dir: their logs


def _ray_node_args(head: bool) -> list[str]:
    flags = ["--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
             "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port"]
    if head:
        flags.append("--dashboard-port")
    # every port distinct: each socket stays bound until all are chosen (one at a time, the kernel may hand
    # out the same free port twice, and Ray refuses a node whose components share one)
    sockets = [socket.socket() for _ in flags]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        ports = [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
    return [a for flag, port in zip(flags, ports) for a in (flag, str(port))]


def _kill_ray_processes_under(temp: Path) -> None:
    """SIGKILL processes writing their output under this cluster's own temp dir (its Ray workers)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            targets = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in (1, 2)}
        except OSError:
            continue
        if any(t.startswith(str(temp)) for t in targets):
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass


def start_ray_cluster(token: str, stores_env: dict[str, str]):
    """A head node and a second node, 2 CPUs each, in process groups and a temp dir of their own.

    Never `ray stop`: it would stop every Ray on this machine. Ray 2.60 enables token authentication
    on `ray start --head`; the cluster gets a token of its own. The nodes get no MLflow credentials
    (nothing podium runs on the cluster talks to MLflow), but Prefect's: the controller of a job with a
    PrefectEventSink emits its events from a node. Each node gets `stores_env` (the stores' endpoints, the
    Azure account's connection string) in its own environment when it starts: its Ray workers, which write
    and read checkpoints and data, inherit it; podium hands them no credential."""
    temp = Path(tempfile.mkdtemp(prefix="podium-ray-", dir="/tmp"))  # Ray's socket paths must stay short
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    proc_env = {**os.environ, **env, **stores_env}  # this process has no store settings of its own
    for name in ("RAY_ADDRESS", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        proc_env.pop(name, None)
    port = _free_port()
    address = f"127.0.0.1:{port}"
    common = ["--num-cpus", "2", "--temp-dir", str(temp), "--disable-usage-stats", "--node-ip-address", "127.0.0.1"]
    groups: list[int] = []
    late = ""  # what a second node's `ray start` said when it gave up waiting for its node to register

    def stop() -> None:
        for pgid in groups:
            _stop_group(pgid, grace_s=3)
        _kill_ray_processes_under(temp)
        shutil.rmtree(temp, ignore_errors=True)

    try:
        for args in (["--head", "--port", str(port), "--include-dashboard=false", *_ray_node_args(True)],
                     ["--address", address, *_ray_node_args(False)]):
            proc = subprocess.Popen([str(BIN / "ray"), "start", *args, *common], env=proc_env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True)
            groups.append(proc.pid)
            out, _ = proc.communicate(timeout=300)
            if proc.returncode == 0:
                continue
            # `ray start` gives a new node 30 s (fixed in Ray) to register with the head; on a loaded machine
            # its raylet, which keeps running, can register later: the wait below decides
            if args[0] == "--head" or "timed out during startup" not in out:
                raise RuntimeError(f"ray start {args[0]} exited {proc.returncode}:\n{out[-3000:]}")
            late = f"ray start {args[0]} exited {proc.returncode}:\n{out[-3000:]}"
        nodes = json.loads(_ray_driver("""
import json, time, ray
ray.init()
deadline = time.monotonic() + 240
while True:
    nodes = [n for n in ray.nodes() if n["Alive"]]
    if len(nodes) >= 2 or time.monotonic() > deadline:
        break
    time.sleep(1)
print(json.dumps([{"id": n["NodeID"], "cpus": n["Resources"].get("CPU")} for n in nodes]))
""", {**proc_env, "RAY_ADDRESS": address}).splitlines()[-1])
        if len(nodes) < 2:
            raise RuntimeError(f"the cluster has {len(nodes)} live node(s) of 2 after 240 s\n{late}")
    except BaseException:
        stop()
        raise
    return RayCluster(address, env, nodes, temp), stop


def _ray_driver(code: str, env: dict[str, str], *args: str, timeout_s: float = 300) -> str:
    """Run `code` as a Ray driver of its own (this test process keeps its own Ray, if any)."""
    proc = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                          timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"Ray driver exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return proc.stdout


@dataclass
class Stack:
    prefect: str
    mlflow: str
    ray: RayCluster
    root: Path
    artifacts: S3Server  # where the MLflow server keeps its artifacts
    stores: Stores  # where the team keeps checkpoints, data and the serving location


@pytest.fixture(scope="module")
def stack(databases, credentials, command_lines, stores, tmp_path_factory):
    """The three servers, authentication on, started side by side (their start-up is mostly waiting),
    stopped at the end."""
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    root = tmp_path_factory.mktemp("production")
    starters = {"prefect": lambda: start_prefect_server(root / "prefect-home", databases["prefect"],
                                                        credentials.prefect_auth),
                "mlflow": lambda: start_mlflow_server(root, databases["mlflow"], databases["mlflow_auth"],
                                                      credentials),
                "ray": lambda: start_ray_cluster(credentials.ray_token, stores.env())}
    with ThreadPoolExecutor(len(starters)) as pool:
        futures = {name: pool.submit(start) for name, start in starters.items()}
    started, stops, errors = {}, [], []
    for name, future in futures.items():
        try:
            started[name], stop = future.result()
            stops.append(stop)
        except Exception as exc:  # the others are stopped below, then this is reported
            errors.append(f"{name}: {exc}")
    try:
        if errors:
            raise RuntimeError("could not start the production stack:\n" + "\n".join(errors))
        mlflow_url, artifacts = started["mlflow"]
        # this process's Prefect settings were read when prefect was imported, before the credentials were made
        with temporary_settings(updates={PREFECT_API_URL: started["prefect"],
                                         PREFECT_API_AUTH_STRING: credentials.prefect_auth}):
            yield Stack(started["prefect"], mlflow_url, started["ray"], root, artifacts, stores)
    finally:
        with ThreadPoolExecutor(len(starters)) as pool:
            list(pool.map(lambda stop: stop(), stops))


# ------------------------------------------------------------------------------ team setup


@pytest.fixture(scope="module")
def team(stack):
    """What a team's operator sets up: data, a config file, the deployments, a worker. The data and the serving
    location are in GCS, checkpoints in Azure Blob: no folder is shared between the nodes or with the worker.
    The stores' settings and credentials are in the environment of the worker (its flow runs inherit them)
    and of this process (the tests read the stores) while the module runs."""
    from podium.training.data import make_classification_data

    with pytest.MonkeyPatch.context() as mp:
        stack.stores.gcs.point_here(mp)
        stack.stores.azure.point_here(mp)
        train, val = make_classification_data(f"gs://{BUCKET}/data", train_rows=2000, val_rows=500)
        config = {
            "run_name": "nightly",
            "storage": f"az://{CONTAINER}/storage",
            "serving": f"gs://{BUCKET}/serving",
            "data": {"train": train, "val": val},
            "training": {"epochs": 2},
            # 1.5 CPUs per training worker: the two workers cannot share a 2-CPU node, so one runs on each;
            # Ray Data's read tasks then fit in the half CPU left on a node
            "scaling": {"num_workers": 2, "cpus_per_worker": 1.5, "data_cpus": 0.5},
            "validation": {"concurrency": 2, "num_cpus": 0.5},
        }
        config_file = stack.root / "podium.json"
        config_file.write_text(json.dumps(config))
        now = datetime.now(timezone.utc)
        cron = f"{now.minute} {(now.hour + 12) % 24} * * *"  # half a day away: no scheduled run during the test
        env = {**os.environ, "PREFECT_API_URL": stack.prefect, "MLFLOW_TRACKING_URI": stack.mlflow,
               "PODIUM_HOME": str(stack.root / "podium-home")}
        env.pop("RAY_ADDRESS", None)
        deploy = subprocess.run([sys.executable, "-m", "podium.deployments", "deploy", "--pool", POOL, "--config",
                                 str(config_file), "--cron", cron, "--timezone", "UTC"],
                                env=env, capture_output=True, text=True, timeout=600)
        assert deploy.returncode == 0, f"deploy failed:\n{deploy.stdout}\n{deploy.stderr[-4000:]}"
        assert f"export PREFECT_API_URL={stack.prefect}" in deploy.stdout, deploy.stdout  # says which server

        log = stack.root / "worker.log"
        worker = subprocess.Popen(
            [sys.executable, "-m", "podium.cli", "worker", "--pool", POOL, "--ray-address", stack.ray.address,
             "--limit", "4"],
            env={**env, **stack.ray.env, "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "5"},
            stdout=log.open("wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            yield {"config": config, "cron": cron, "worker_log": log, "home": Path(env["PODIUM_HOME"])}
        finally:
            _stop_group(worker.pid)


def _wait_flow_run(flow_run_id, worker_log: Path, timeout_s: float = 480):
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            run = client.read_flow_run(flow_run_id)
            if run.state and run.state.is_final():
                assert run.state.is_completed(), (
                    f"flow run {run.name} ended {run.state.type.value}: {run.state.message}\n"
                    f"worker log:\n{worker_log.read_text()[-6000:]}")
                return run
            assert time.monotonic() < deadline, (
                f"flow run {run.name} still {run.state.type.value if run.state else None}\n"
                f"worker log:\n{worker_log.read_text()[-6000:]}")
            time.sleep(2)


def _deployment(name: str):
    with get_client(sync_client=True) as client:
        return client.read_deployment_by_name(name)


# -------------------------------------------------------------------------------------- tests


def test_deployments_build_and_register_on_a_process_pool(team):
    with get_client(sync_client=True) as client:
        pool = client.read_work_pool(POOL)
        assert pool.type == "process"
        deployments = {d.name: d for d in client.read_deployments(
            work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[POOL])))}
        assert set(deployments) == {NIGHTLY, VALIDATE, PROMOTE_ON_DEMAND}
        nightly = deployments[NIGHTLY]
        (schedule,) = nightly.schedules
        assert schedule.active and schedule.schedule.cron == team["cron"] and schedule.schedule.timezone == "UTC"
        for name, d in deployments.items():
            # the scheduled deployment trains a dated run of its own each night
            assert d.parameters["config"]["run_name"] == ("nightly-{date}" if name == NIGHTLY else "nightly")
            assert d.parameters["config"]["scaling"]["cpus_per_worker"] == 1.5
            assert "." in d.entrypoint and ":" not in d.entrypoint  # module path: the installed podium
        # the validation deployment's trigger is an automation on the checkpoint event
        automations = client.read_automations_by_name("validate-announced-checkpoint")
        assert len(automations) == 1
        trigger = automations[0].trigger
        assert trigger.expect == {EVENT_PERSISTED}
        assert trigger.match.get("podium.validation") == ["deployment"]  # as the server stores it
        (action,) = automations[0].actions
        assert action.deployment_id == deployments[VALIDATE].id
        assert action.parameters == {"checkpoint": "{{ event.payload }}"}  # the payload whole: CheckpointPayload
        assert client.read_global_concurrency_limit_by_name(RECORD_LOCK).limit == 1


def test_sixteen_concurrent_validators_lose_no_metric(stack):
    """16 validations finishing at once, each recording its checkpoint and merging 8 metrics through the
    MLflow server on PostgreSQL: every record, metric value and status is there afterwards."""
    tracking = open_tracking_run(stack.mlflow, "concurrency", "sixteen", {"validation": {"concurrency": 16}})
    events = [CheckpointEvent(run_name="sixteen", step=step, metrics={"loss": 1.0 / (step + 1)},
                              checkpoint_uri=f"az://{CONTAINER}/storage/sixteen/checkpoint_{step:08d}",
                              checkpoint_name=f"checkpoint_{step:08d}") for step in range(16)]
    start = threading.Barrier(len(events))

    def validator(event: CheckpointEvent):
        start.wait()
        record = record_checkpoint(tracking, event)
        return merge_validation(tracking, record, {f"val_m{k}": event.step * 100.0 + k for k in range(8)})

    with ThreadPoolExecutor(len(events)) as pool:
        list(pool.map(validator, events))

    records = list_records(tracking)
    assert [r.step for r in records] == list(range(16))
    for r in records:
        assert r.status == "validated"
        assert r.metrics == {"loss": 1.0 / (r.step + 1), **{f"val_m{k}": r.step * 100.0 + k for k in range(8)}}
    client = MlflowClient(stack.mlflow)
    for k in range(8):  # the run's metric history too: one value per step, none lost
        history = client.get_metric_history(tracking.run_id, f"val_m{k}")
        assert sorted((m.step, m.value) for m in history) == [(s, s * 100.0 + k) for s in range(16)]


def test_scheduled_training_runs_on_the_two_node_cluster_and_promotes(stack, team, monkeypatch):
    assert len(stack.ray.nodes) == 2 and all(n["cpus"] == 2 for n in stack.ray.nodes)
    flow_run = run_deployment(f"train-validate-promote/{NIGHTLY}", timeout=0)
    _wait_flow_run(flow_run.id, team["worker_log"])
    with get_client(sync_client=True) as client:
        ran = client.read_flow_run(flow_run.id)
    run_name = expand_run_name("nightly-{date}", ran.expected_start_time)  # what the flow named this night's run
    # named as `podium run` names its flow runs, not at random; podium's own lines in its log, as for a CLI run
    assert ran.name == f"{run_name}-run", ran.name
    messages = "\n".join(flow_run_logs(flow_run.id, until=("training done:", "promotion: step")))
    assert f"run {run_name}: MLflow run" in messages and "training done:" in messages, messages[-3000:]
    assert "promotion: step" in messages, messages[-3000:]

    tracking = find_tracking_run(stack.mlflow, "podium", run_name)
    records = list_records(tracking)
    assert [r.status for r in records] == ["validated", "validated"]
    storage, serving = join(team["config"]["storage"], run_name), team["config"]["serving"]
    for r in records:  # checkpoints in Azure Blob, written by the workers on both nodes, validated from there
        assert r.uri.rsplit("/", 1)[0] == storage, r.uri
        fs, path = fsspec_filesystem(r.uri)
        assert fs.isfile(f"{path}/model.pt"), r.uri
        assert {"val_loss", "val_accuracy"} <= set(r.metrics)
    current = read_current(serving)
    best = min(records, key=lambda r: (r.metrics["val_loss"], -r.step))  # ties: the later step
    assert current.version == "v000001" and current.manifest["step"] == best.step
    # promoted from Azure Blob into GCS: the manifest names the checkpoint, the served copy is in the bucket
    assert current.manifest["source"] == best.uri and current.uri.startswith(f"{serving}/versions/"), current.uri
    fs, path = fsspec_filesystem(current.uri)
    assert fs.ls(path, detail=False), f"{current.uri}: nothing there"
    # its final state says what it did; the project's log file has podium's lines, as for `podium run`
    assert ran.state.message.startswith(f"promoted step {best.step} (val_loss=") and "as v000001" in ran.state.message
    log_file = (team["home"] / "logs" / "podium.log").read_text(errors="replace")
    assert f"run {run_name}: MLflow run" in log_file and "training done:" in log_file, log_file[-3000:]
    # the deployment's run recorded where it came from, with no configuration of its own
    lineage = current.manifest["lineage"]["tags"]
    assert lineage["podium.prefect.flow_run_id"] == str(flow_run.id)
    assert lineage["podium.prefect.deployment"] == f"train-validate-promote/{NIGHTLY}"
    assert best.val_digest and current.manifest["datasets"]["val"]["digest"] == best.val_digest
    champion = MlflowClient(stack.mlflow, registry_uri=stack.mlflow).get_model_version_by_alias("podium", "champion")
    # the version's files are this promotion's build, inside the champion checkpoint's LoggedModel (on S3 behind the
    # server): the bytes the serving copy holds; the serving copy is named by a tag
    logged = MlflowClient(stack.mlflow).get_logged_model(best.model_id).artifact_location.rstrip("/")
    assert champion.source == f"{logged}/served/{current.version}-{current.manifest['version_uid']}", champion.source
    assert champion.tags["podium.served_uri"] == current.uri
    check_served_champion(stack.mlflow, "podium", serving, team["config"]["data"]["val"],
                          stack.root, {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, monkeypatch)
    validations = [r for r in task_runs(ran.name, expect_at_least=2) if r.name.startswith("validate-step-")]
    assert sorted(r.name for r in validations) == sorted(f"validate-step-{r.step}" for r in records)

    # promotion on demand, naming only the run: the deployment's own config gives every other setting
    # (Prefect replaces a parameter whole; podium merges what a run names over the deployment's)
    again = run_deployment(f"promote-run/{PROMOTE_ON_DEMAND}", parameters={"config": {"run_name": run_name}}, timeout=0)
    _wait_flow_run(again.id, team["worker_log"])
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(again.id).name == f"{run_name}-promote"
    messages = "\n".join(flow_run_logs(again.id, until=("already the champion",)))
    assert "promotion:" in messages and "already the champion" in messages, messages[-3000:]
    assert read_current(serving).version == "v000001"


EXTERNAL_JOB = """
# A training job of its own, outside any podium flow: plain Ray Train with podium's announcer and
# a Prefect event sink, as in docs/operations.md. Its checkpoints go to the team's storage on Azure Blob
# through the filesystem podium gives Ray Train (RunConfig's storage_filesystem, as in Ray Train's
# persistent-storage guide); the announcer names them as the location is spelled (az://...).
import json, sys
import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from podium.prefect_events import PrefectEventSink
from podium.tasks.plan import plan_run
from podium.config import PipelineConfig
from podium.storage.locations import arrow_filesystem
from podium.training.ingest import builtin_datasets, dataset_config
from podium.training.loop import train_loop_per_worker
from podium.training.raytrain import CheckpointAnnouncer

config = PipelineConfig.model_validate(json.loads(sys.argv[1]))
ray.init()  # RAY_ADDRESS
loop_config = plan_run(config).loop_config
fs, path = arrow_filesystem(config.storage)
trainer = TorchTrainer(
    train_loop_per_worker,
    train_loop_config=loop_config,
    scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1.5}),
    run_config=RunConfig(name=config.run_name, storage_path=path, storage_filesystem=fs,
                         callbacks=[CheckpointAnnouncer(config.run_name, [PrefectEventSink()],
                                                        storage=config.storage)]),
    # the built-in loop reads its shard from Ray Data, here in the half CPU a node has left
    datasets=builtin_datasets(loop_config, data_cpus=0.5),
    dataset_config=dataset_config(data_cpus=0.5),
)
trainer.fit()
"""


def test_checkpoints_of_an_outside_job_each_trigger_one_validation_run(stack, team):
    config = {**team["config"], "run_name": "outside-job"}
    env = {**os.environ, **stack.ray.env, "RAY_ADDRESS": stack.ray.address, "PREFECT_API_URL": stack.prefect}
    _ray_driver(EXTERNAL_JOB, env, json.dumps(config), timeout_s=600)

    events = checkpoint_events("outside-job", expect=2)
    assert len(events) == 2
    by_step = {int(e.resource["podium.step"]): e for e in events}
    for event in events:  # persisted in Azure Blob by the job's workers, named as the team's storage is spelled
        uri = event.payload["checkpoint_uri"]
        assert uri == join(config["storage"], "outside-job", event.payload["checkpoint_name"]), uri
        fs, path = fsspec_filesystem(uri)
        assert fs.ls(path, detail=False), f"{uri}: nothing there"

    # the trigger made exactly one flow run per event, with the event's checkpoint as typed parameters
    validate_id = _deployment(f"validate-announced-checkpoint/{VALIDATE}").id
    deadline = time.monotonic() + 480
    while True:
        with get_client(sync_client=True) as client:
            runs = [r for r in client.read_flow_runs(
                flow_run_filter=FlowRunFilter(deployment_id={"any_": [validate_id]}))]
        ours = [r for r in runs if r.parameters.get("checkpoint", {}).get("run_name") == "outside-job"]
        if (len(ours) >= 2 and all(r.state and r.state.is_final() for r in ours)) or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert sorted(r.parameters["checkpoint"]["step"] for r in ours) == sorted(by_step)
    for run in ours:
        checkpoint = run.parameters["checkpoint"]
        event = by_step[checkpoint["step"]]
        assert isinstance(checkpoint["step"], int)
        assert checkpoint == event.payload  # the payload whole, its time included
        assert run.name == f"outside-job-validate-step-{checkpoint['step']}"
        _wait_flow_run(run.id, team["worker_log"], timeout_s=10)
    # the pipeline flow's own checkpoint events (the nightly run above) asked for no validation run
    assert not [r for r in runs if str(r.parameters.get("checkpoint", {}).get("run_name", "")).startswith("nightly")]

    # recorded and validated the same way as inside the pipeline: one MLflow run, one record per checkpoint
    client = MlflowClient(stack.mlflow)
    experiment = client.get_experiment_by_name("podium")
    mlflow_runs = client.search_runs([experiment.experiment_id], filter_string="tags.`podium.run_name` = 'outside-job'")
    assert len(mlflow_runs) == 1
    tracking = find_tracking_run(stack.mlflow, "podium", "outside-job")
    records = list_records(tracking)
    assert sorted(r.step for r in records) == sorted(by_step)
    assert all(r.status == "validated" and {"loss", "val_loss", "val_accuracy"} <= set(r.metrics) for r in records)
    models = [m for m in client.search_logged_models([experiment.experiment_id], max_results=100)
              if m.source_run_id == tracking.run_id]
    assert sorted(m.tags[TAG_CHECKPOINT] for m in models) == sorted(e.payload["checkpoint_name"] for e in events)


RAY_CONNECT = "import ray; ray.init(); print('connected', flush=True)"


def _prefect_status(url: str, auth: str | None) -> int:
    """The HTTP status of a Prefect API read (POST /flows/filter), with this basic auth or none."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Basic {_basic_auth(auth)}"} if auth else {})}
    request = urllib.request.Request(f"{url}/flows/filter", data=b"{}", headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_each_server_refuses_a_client_without_its_credentials(stack, credentials, monkeypatch, tmp_path):
    wrong = secrets.token_hex(16)
    assert _prefect_status(stack.prefect, None) == 401
    assert _prefect_status(stack.prefect, f"podium:{wrong}") == 401
    assert _prefect_status(stack.prefect, credentials.prefect_auth) == 200

    search = f"{stack.mlflow}/api/2.0/mlflow/experiments/search"
    assert requests.get(search, params={"max_results": 1}, timeout=10).status_code == 401
    assert requests.get(search, params={"max_results": 1}, auth=(MLFLOW_USER, wrong), timeout=10).status_code == 401
    assert requests.get(search, params={"max_results": 1}, auth=(MLFLOW_USER, credentials.mlflow_password),
                        timeout=10).status_code == 200
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME")
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
    with pytest.raises(MlflowException, match="401"):
        MlflowClient(stack.mlflow).search_experiments(max_results=1)

    # a Ray driver without the token, and one with another token; HOME elsewhere: no ~/.ray/auth_token either
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update({"RAY_ADDRESS": stack.ray.address, "HOME": str(tmp_path)})
    drivers = [subprocess.Popen([sys.executable, "-c", RAY_CONNECT], env={**env, **token_env}, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for token_env in ({}, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": wrong})]
    for driver in drivers:
        out, err = driver.communicate(timeout=120)
        assert driver.returncode != 0 and "connected" not in out, out + err[-3000:]
    assert "connected" in _ray_driver(RAY_CONNECT, {**env, **stack.ray.env})

    # Azurite: a client signing with another key for the account is refused (403), one with the module's let in
    endpoint = stack.stores.azure.endpoint
    for key, refused in ((base64.b64encode(secrets.token_bytes(32)).decode(), True), (credentials.azure_key, False)):
        blobs = BlobServiceClient(endpoint, credential={"account_name": AZURE_ACCOUNT, "account_key": key})
        if refused:
            with pytest.raises(HttpResponseError) as refusal:
                list(blobs.list_containers())
            assert refusal.value.status_code == 403 and refusal.value.error_code == "AuthorizationFailure"
        else:
            assert CONTAINER in [c.name for c in blobs.list_containers()]


def test_no_secret_in_logs_records_artifacts_or_process_arguments(stack, team, credentials, command_lines):
    """After the pipeline's runs above: no secret (nor an Authorization header made of one) in any file this
    module's servers, worker, flow runs (their output is in the worker's log), `mlflow models serve`, Ray
    nodes and the store emulators wrote, in the stores' objects (checkpoints, data, served copies), in
    MLflow's runs, models and artifacts, in Prefect's flow runs, deployments, artifacts and logs, or in any
    process's arguments."""
    findable = credentials.findable()
    leaks: dict[str, list[str]] = {}

    def check(where: str, text: str) -> None:
        found = [name for name, value in findable.items() if value in text]
        if found:
            for value in findable.values():
                where = where.replace(value, "***")
            leaks[where] = found

    files = [p for base in (stack.root, stack.ray.temp, stack.stores.root) for p in base.rglob("*") if p.is_file()]
    written = {p.name for p in files}
    assert {"server.log", "mlflow-server.log", "worker.log", "serve-podium.log", "raylet.out", "gcs_server.out",
            "azurite.log", "gcs.log"} <= written, sorted(written)
    for path in files:
        try:
            check(str(path), path.read_bytes().decode("latin-1"))
        except FileNotFoundError:  # a Ray log rotated away meanwhile
            continue

    client = MlflowClient(stack.mlflow, registry_uri=stack.mlflow)
    experiment_ids = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiment_ids, max_results=1000)
    models = client.search_logged_models(experiment_ids, max_results=1000)
    versions = client.search_model_versions()
    assert runs and models and versions
    for run in runs:
        check(f"MLflow run {run.info.run_name}", json.dumps([run.data.params, run.data.tags]))
    for model in models:
        check(f"MLflow logged model {model.model_id}", json.dumps([model.params, model.tags]))
    for version in versions:
        check(f"MLflow model version {version.version}", json.dumps([version.tags, version.description]))
    keys = stack.artifacts.keys("mlflow-artifacts")
    assert keys
    s3 = stack.artifacts.client()
    for key in keys:
        check(f"MLflow artifact {key}", s3.get_object(Bucket="mlflow-artifacts", Key=key)["Body"].read().decode("latin-1"))
    for store in (f"az://{CONTAINER}", f"gs://{BUCKET}"):  # checkpoints; data, served copies, CURRENT, history
        fs, path = fsspec_filesystem(store)
        objects = fs.find(path)
        assert objects, store
        for key in objects:
            check(f"{store} object {key}", fs.cat_file(key).decode("latin-1"))

    with get_client(sync_client=True) as prefect:
        flow_runs = prefect.read_flow_runs(limit=200)
        artifacts = prefect.read_artifacts(limit=200)
        logs, offset = [], 0
        while page := prefect.read_logs(limit=200, offset=offset):
            logs += page
            offset += len(page)
        deployments = prefect.read_deployments()
    assert flow_runs and artifacts and logs
    for run in flow_runs:
        check(f"Prefect flow run {run.name}", json.dumps([run.parameters, run.job_variables], default=str))
    for artifact in artifacts:
        check(f"Prefect artifact {artifact.key}", json.dumps([artifact.data, artifact.description], default=str))
    check("Prefect flow-run logs", "\n".join(log.message for log in logs))
    for deployment in deployments:
        check(f"Prefect deployment {deployment.name}",
              json.dumps([deployment.parameters, deployment.job_variables], default=str))

    lines = command_lines.seen()
    # the sampler saw the servers, the worker, its flow runs, the Ray nodes and Ray's workers
    for kind in ("prefect server start", "mlflow server", "prefect worker start", "prefect.engine", "raylet",
                 "ray::", "models serve"):
        assert any(kind in line for line in lines), f"no process {kind!r} among {len(lines)} sampled"
    for line in lines:
        check(f"the arguments of {line[:200]}", line)
    assert not leaks, f"secrets found: {leaks}"
