"""Every known failure a user can meet before training, through the real `podium` process: one sentence on stderr,
the exit code docs/commands.md gives it, no traceback, and nothing left running.

No training: each failure is provoked for real, and cheaply.

- a bad configuration (a metric the built-in validation does not report): exit 2, refused in the plan
- an MLflow tracking server that does not answer (a port nothing listens on): exit 2, after podium's minute of waiting
- a Prefect server that does not answer (PREFECT_API_URL on such a port): exit 2
- a store that ignores conditional writes (gcp-storage-emulator as shipped, without tests/helpers/gcs_emulator.py's
  preconditions): exit 2 from `podium run` and `podium promote`, in the preflight, before any server starts, nothing
  written
- a Ray address that does not answer (--ray-address on a port nothing listens on): exit 2
- a local Ray start that times out (Ray's own GCS wait, RAY_gcs_server_port_wait_time_s = 0): tried twice, exit 3

and apart (it takes Ray's fixed 30 s twice): a local Ray whose raylet cannot start (its allocator aborts on a
configuration Ray passes it: RAY_JEMALLOC_CONF for the raylet alone), Ray's own "The current node timed out during
startup": podium stops what the first start left before it starts again, then exit 3 and what to do.

The kinds are started side by side (each mostly waits); a marker in each one's environment, which every process it
starts inherits, finds what it left running.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers.object_stores import start_gcs_emulator
from helpers.s3_server import free_port

from podium.errors import EXIT_REFUSED, EXIT_UNREACHABLE
from podium.storage.locations import fsspec_filesystem

pytestmark = pytest.mark.integration

BUCKET = "podium-audit"
MARK = "PODIUM_AUDIT_MARK"


@dataclass
class Kind:
    """One failure: the command, what its environment changes, and what it must say with which exit code."""

    args: list[str]
    exit_code: int
    says: list[str]
    env: dict[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()


def _processes_marked(mark: str) -> list[str]:
    """The processes (pid and name) whose environment holds `MARK=mark`: the command's and all it started."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/comm") as f:
                found.append(f"{pid} {f.read().strip()}")
        except OSError:  # gone meanwhile, or a zombie
            continue
    return found


def _no_core_files() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a raylet made to abort leaves no core file


def _start(args: list[str], env: dict[str, str], mark: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "podium.cli", *args], env={**env, MARK: mark},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_no_core_files)


def _one_sentence(name: str, proc: subprocess.Popen, out: str, err: str, kind: Kind) -> str:
    """The command's one `podium: ...` message, checked: exit code, no traceback, what it must say."""
    shown = f"{name}: exit {proc.returncode}\n{out[-3000:]}\n{err[-5000:]}"
    assert proc.returncode == kind.exit_code, shown
    assert "Traceback" not in out + err, shown
    said = [line for line in err.splitlines() if line.startswith("podium: ")]
    assert len(said) == 1, shown
    message = err[err.index(said[0]):]
    for words in kind.says:
        assert words in message, f"{name}: {words!r} not said\n{shown}"
    return message


@pytest.fixture(scope="module")
def careless_store(tmp_path_factory):
    """gcp-storage-emulator as shipped: it ignores GCS's generation preconditions."""
    server = start_gcs_emulator(tmp_path_factory.mktemp("gcs") / "gcs.log", BUCKET, preconditions=False)
    yield server
    server.stop()


def test_each_known_failure_is_one_sentence_with_its_exit_code_and_leaves_nothing_running(
        prefect_api, dataset, careless_store, mlflow_template_db, tmp_path, monkeypatch):
    base = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PREFECT_API_URL")}
    base["PREFECT_API_URL"] = prefect_api
    data = ["--train-data", dataset[0], "--val-data", dataset[1], "--epochs", "1", "--num-workers", "1"]

    def local(name: str) -> list[str]:
        return ["--storage", str(tmp_path / name / "storage"), "--serving", str(tmp_path / name / "serving")]

    on_store = ["--storage", f"gs://{BUCKET}/audit/storage", "--serving", f"gs://{BUCKET}/audit/serving"]
    silent = free_port()  # nothing listens there
    kinds = {
        "bad-config": Kind(["run", *data, *local("bad-config"), "--metric", "val_acc"], EXIT_REFUSED,
                           ["promotion.metric = 'val_acc': no such metric"]),
        "tracking-server-silent": Kind(["promote", "--run-name", "r", *data, *local("tracking")], EXIT_REFUSED,
                                       [f"MLflow tracking server http://127.0.0.1:{silent} is not reachable"],
                                       {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{silent}"}),
        "prefect-server-silent": Kind(["promote", "--run-name", "r", *data, *local("prefect")], EXIT_REFUSED,
                                      [f"PREFECT_API_URL = 'http://127.0.0.1:{silent}/api': the Prefect server "
                                       "does not answer"],
                                      {"PREFECT_API_URL": f"http://127.0.0.1:{silent}/api"}),
        "store-ignores-preconditions-run": Kind(
            ["run", *data, *on_store], EXIT_REFUSED,
            [f"storage = 'gs://{BUCKET}/audit/storage': this gcs store ignores conditional writes",
             "expected a store that refuses a create-only write of an object that exists"], careless_store.env()),
        "store-ignores-preconditions-promote": Kind(
            ["promote", "--run-name", "r", *data, *on_store], EXIT_REFUSED,
            ["this gcs store ignores conditional writes"], careless_store.env()),
        "ray-address-silent": Kind(["run", *data, *local("address"), "--ray-address", f"127.0.0.1:{silent}"],
                                   EXIT_REFUSED,
                                   [f"RAY_ADDRESS = '127.0.0.1:{silent}': the Ray cluster there does not answer",
                                    "ray start --head"],
                                   {"RAY_gcs_server_port_wait_time_s": "3"}),
        "ray-start-times-out": Kind(["run", *data, *local("ray-start")], EXIT_UNREACHABLE,
                                    ["Ray did not start on this machine (2 attempts; the last: Timed out waiting for "
                                     "file", "ray start --head", "RAY_ADDRESS", "when-things-go-wrong"],
                                    {"RAY_gcs_server_port_wait_time_s": "0"}),
    }
    marks = {name: uuid.uuid4().hex for name in kinds}
    procs = {}
    for name, kind in kinds.items():
        (tmp_path / name).mkdir()
        shutil.copy(mlflow_template_db, tmp_path / name / "mlflow.db")  # a store of its own: they run side by side
        env = {**base, "PODIUM_HOME": str(tmp_path / name / "home"),
               "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / name / 'mlflow.db'}", **kind.env}
        procs[name] = _start(kind.args, env, marks[name])
    ended = {name: proc.communicate(timeout=300) for name, proc in procs.items()}

    for name, kind in kinds.items():
        _one_sentence(name, procs[name], *ended[name], kind)
        assert _processes_marked(marks[name]) == [], f"{name}: left running: {_processes_marked(marks[name])}"

    # the store that ignores preconditions was refused before any server or Ray started, and nothing was written
    for name in ("store-ignores-preconditions-run", "store-ignores-preconditions-promote"):
        out = ended[name][0]
        assert "checking its data" in out and "starting" not in out, f"{name}: {out}"
        assert not (tmp_path / name / "home").exists(), sorted(str(p) for p in (tmp_path / name).rglob("*"))
    careless_store.point_here(monkeypatch)
    fs, path = fsspec_filesystem(f"gs://{BUCKET}/audit")
    assert fs.find(path) == [], fs.find(path)  # no probe, no lock, no version left


def test_a_local_ray_whose_node_never_starts_is_tried_twice_then_said_in_one_sentence(prefect_api, dataset, tmp_path):
    """Ray's "The current node timed out during startup", for real: a raylet that cannot start (its allocator aborts
    on a configuration Ray gives the raylet alone), so that Ray waits its fixed 30 s for the node, twice. The first
    start's processes (its GCS) are gone before the second starts; none is left after the command."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PREFECT_API_URL")}
    env.update({"PREFECT_API_URL": prefect_api, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
                "PODIUM_HOME": str(tmp_path / "home"),
                "RAY_JEMALLOC_PROFILE": "raylet", "RAY_JEMALLOC_CONF": "abort_conf:true,podium_no_such_option:1"})
    mark = uuid.uuid4().hex
    proc = _start(["run", "--train-data", dataset[0], "--val-data", dataset[1], "--epochs", "1",
                   "--storage", str(tmp_path / "storage"), "--serving", str(tmp_path / "serving")], env, mark)
    seen: set[str] = set()
    most_at_once = 0
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        gcs = {p for p in _processes_marked(mark) if p.endswith(" gcs_server")}
        seen |= gcs
        most_at_once = max(most_at_once, len(gcs))
        time.sleep(0.25)
    out, err = proc.communicate(timeout=60)
    message = _one_sentence("node-never-starts", proc, out, err, Kind(
        [], EXIT_UNREACHABLE, ["Ray did not start on this machine (2 attempts; the last: The current node timed out "
                               "during startup", "Ray's logs: ", "ray start --head", "RAY_ADDRESS"]))
    assert len(seen) == 2 and most_at_once == 1, (seen, most_at_once, message)  # two starts, never side by side
    assert _processes_marked(mark) == [], _processes_marked(mark)
    log = (Path(env["PODIUM_HOME"]) / "logs" / "podium.log").read_text()
    assert "stopped what that start left (" in log and "gcs_server (pid" in log and "starting Ray again" in log, \
        log[-3000:]
    assert not (tmp_path / "storage" / "podium-demo").exists()  # nothing trained
