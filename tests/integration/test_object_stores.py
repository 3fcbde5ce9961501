"""GCS (gs://) and Azure Blob (az://) through their backends, against emulators on loopback (tests/helpers/object_stores).

The guarantees S3 has (test_s3.py) on the other stores: one lease holder at a time, built from the
store's own conditional writes (GCS generation preconditions, Azure ETags); a dead holder's lease taken
over once it expires; create-only writes; and no lease at all on a store whose conditions do not hold.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow.artifacts
import pytest
from helpers.checkpoints import make_trained_run, nightly_home
from helpers.commands import podium, podium_in_process
from helpers.object_stores import AZURE_ACCOUNT, start_azurite, start_gcs_emulator
from helpers.servers import MlflowServer
from mlflow.tracking import MlflowClient
from podium_nightly_code import FEATURES, write_data

from podium.serving.layout import read_current, read_history
from podium.storage.backends import backend_for
from podium.storage.backends.base import Conflict
from podium.storage.errors import StorageError
from podium.storage.lease import ObjectLease, location_lock
from podium.storage.locations import fsspec_filesystem

pytestmark = pytest.mark.integration

BUCKET = "podium-test"
# what points a `podium` process at the emulators
STORE_ENV = ("STORAGE_EMULATOR_HOST", "FSSPEC_GCS_TOKEN", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT",
             "AZURE_STORAGE_CONNECTION_STRING")


@pytest.fixture(scope="module")
def gcs_server(tmp_path_factory):
    server = start_gcs_emulator(tmp_path_factory.mktemp("gcs") / "gcs.log", BUCKET, preconditions=True)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def azure_server(tmp_path_factory):
    server = start_azurite(tmp_path_factory.mktemp("azurite") / "azurite.log")
    yield server
    server.stop()


@pytest.fixture(params=["gs", "az"])
def store(request, monkeypatch) -> str:
    """The root URI of a bucket (GCS) or container (Azure) on its emulator, this process pointed at it."""
    if request.param == "gs":
        request.getfixturevalue("gcs_server").point_here(monkeypatch)
    else:
        request.getfixturevalue("azure_server").point_here(monkeypatch)
        fs, _ = fsspec_filesystem(f"az://{BUCKET}")
        if not fs.exists(BUCKET):
            fs.mkdir(BUCKET)
    return f"{request.param}://{BUCKET}"


HOLDER = """
import os, sys, time
from podium.storage.lease import LeaseError, location_lock
go, hold_s = sys.argv[2], float(sys.argv[3])
open(f"{go}.ready.{os.getpid()}", "w").close()
while not os.path.exists(go):
    time.sleep(0.01)
try:
    with location_lock(sys.argv[1], ".promotion.lock", 3, "promotion") as check:
        print("won", flush=True)
        time.sleep(hold_s)
        check()
except LeaseError as exc:
    print(f"lost: {exc}", flush=True)
"""


def _holders(tmp_path: Path, location: str, count: int, hold_s: float) -> list[subprocess.Popen]:
    """`count` processes that each try to take `location`'s promotion lock at the same moment."""
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, str(script), location, str(go), str(hold_s)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(count)]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("go.ready.*"))) < count:  # all imported and waiting, however slow the machine
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
            [p.stderr.read()[-2000:] for p in procs if p.poll() is not None]
        time.sleep(0.05)
    go.touch()
    return procs


def test_two_promoters_racing_for_one_lease_exactly_one_wins_and_the_loser_names_it(store, tmp_path):
    serving = f"{store}/{tmp_path.name}/serving"
    procs = _holders(tmp_path, serving, count=2, hold_s=8)
    outs = {}
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        outs[p.pid] = out.strip()
    winners = [pid for pid, out in outs.items() if out == "won"]
    assert len(winners) == 1, outs
    (loser,) = set(outs) - set(winners)
    assert outs[loser].startswith(f"lost: promotion: {serving}/.promotion.lock is held by pid {winners[0]} on ")
    fs, path = fsspec_filesystem(serving)
    assert not fs.exists(f"{path}/.promotion.lock")  # the winner released it


def test_lease_of_a_holder_that_died_is_taken_over_once_it_expires(store, tmp_path, monkeypatch):
    monkeypatch.setenv("PODIUM_LEASE_TTL_S", "2")
    serving = f"{store}/{tmp_path.name}/serving"
    (holder,) = _holders(tmp_path, serving, count=1, hold_s=600)
    assert holder.stdout.readline().strip() == "won"
    holder.send_signal(signal.SIGKILL)  # no release: its lease object stays behind, no longer renewed
    holder.wait()
    fs, path = fsspec_filesystem(serving)
    assert fs.exists(f"{path}/.promotion.lock")
    with location_lock(serving, ".promotion.lock", 15, "promotion") as check:
        check()
    assert not fs.exists(f"{path}/.promotion.lock")


def test_a_lease_holder_stalled_past_its_ttl_learns_it_lost_the_lease(store, tmp_path):
    uri = f"{store}/{tmp_path.name}/serving/.promotion.lock"
    stalled = ObjectLease(uri, ttl_s=1.0).acquire(timeout_s=5)
    stalled._stop.set()  # its renewals stop, as in a process frozen longer than its TTL
    stalled._renewer.join()
    time.sleep(1.5)
    with ObjectLease(uri, ttl_s=30).acquire(timeout_s=10) as ours:
        # the stalled holder's next renewal is conditional on the version it wrote: it fails
        backend = backend_for(uri)
        with pytest.raises(Conflict):
            backend.replace_versioned(stalled.fs, stalled.path, b"{}", stalled._etag)
        ours.check()


def test_create_only_writes_refuse_an_existing_object(store, tmp_path):
    fs, path = fsspec_filesystem(f"{store}/{tmp_path.name}/versions/v000001/CLAIM")
    backend = backend_for(store)
    backend.create(fs, path, b"first")
    with pytest.raises(FileExistsError):
        backend.create(fs, path, b"second")
    assert fs.cat_file(path) == b"first"


def test_a_store_that_ignores_conditional_writes_gets_no_lease(tmp_path, monkeypatch):
    server = start_gcs_emulator(tmp_path / "gcs.log", BUCKET, preconditions=False)
    server.point_here(monkeypatch)
    try:
        serving = f"gs://{BUCKET}/{tmp_path.name}/serving"
        with pytest.raises(StorageError, match="ignores conditional writes .* two promoters could both switch"):
            with location_lock(serving, ".promotion.lock", 5, "promotion"):
                pass
        fs, path = fsspec_filesystem(serving)
        assert backend_for(serving).read_versioned(fs, f"{path}/.promotion.lock") is None  # refused before taking
    finally:
        server.stop()


def test_workers_get_the_store_settings_and_no_credentials(monkeypatch, azure_server):
    from podium.storage.backends import worker_environment

    azure_server.point_here(monkeypatch)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "podiumtest")
    env = worker_environment()
    assert env["STORAGE_EMULATOR_HOST"] == "http://127.0.0.1:1" and env["AZURE_STORAGE_ACCOUNT_NAME"] == "podiumtest"
    assert not any(os.environ["AZURE_STORAGE_CONNECTION_STRING"] in v for v in env.values())
    assert "AZURE_STORAGE_CONNECTION_STRING" not in env


# --------------------------------------------------------------------------------------------
# `podium promote` of a made run (no training) to a serving location on each store


@pytest.fixture(scope="module")
def made_run(prefect_api, shared_ray, tmp_path_factory, mlflow_template_db):
    """A home, an MLflow store and a run of two made checkpoints (epoch 1 the better) in local storage, and the
    environment of a `podium` process that uses them (the session's Prefect server and Ray head)."""
    root = tmp_path_factory.mktemp("object-store-promotions")
    env = nightly_home(root, mlflow_template_db, prefect_api, shared_ray.driver_env())
    made = make_trained_run(_run_config(root, str(root / "trained"), "made-train"), env["MLFLOW_TRACKING_URI"])
    assert [r.status for r in made.records] == ["validated", "validated"], made.records
    return root, env


def _run_config(root: Path, serving: str, registered_model: str) -> dict:
    return {"run_name": "made", "model": "made", "storage": str(root / "storage"), "serving": serving,
            "data": {"train": str(root / "train.parquet"), "val": str(root / "val.parquet"),
                     "feature_columns": list(FEATURES)},
            "training": {"train_loop": "podium_nightly_code:train_func",
                         "train_loop_config": {"epochs": 2, "angle_deg": 20.0}},
            "scaling": {"num_workers": 1}, "validation": {"fn": "podium_nightly_code:validate_fn"},
            "promotion": {"metric": "accuracy", "mode": "max", "verify": "hashes",
                          "registered_model": registered_model}}


def test_two_podium_promotes_racing_to_one_serving_location_promote_once(store, made_run, tmp_path):
    root, env = made_run
    env = {**env, **{k: os.environ[k] for k in STORE_ENV if k in os.environ}}
    serving = f"{store}/{tmp_path.name}/serving"
    config = root / f"{tmp_path.name}.json"
    config.write_text(json.dumps(_run_config(root, serving, f"made-{tmp_path.name}")))
    procs = [subprocess.Popen([sys.executable, "-m", "podium.cli", "promote", "--json", "--config", str(config)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, f"exit {p.returncode}:\n{out[-2000:]}\n{err[-4000:]}"
        outs.append(json.loads(out))
    # one promoted epoch 1's checkpoint; the other, inside the lock after it, found it champion already
    assert sorted(str((o.get("promoted") or {}).get("version")) for o in outs) == ["None", "v000001"], outs
    current = read_current(serving)
    assert current is not None and current.version == "v000001"
    assert [h["version"] for h in read_history(serving)] == ["v000001"]
    history = json.loads(podium_in_process(["history", "--json", "--serving", serving], env).stdout)  # a read
    assert history["current"] == "v000001"
    fs, path = fsspec_filesystem(serving)
    assert backend_for(serving).read_versioned(fs, f"{path}/.promotion.lock") is None


# --------------------------------------------------------------------------------------------
# MLflow's artifact store on each store: the server proxies the served model's files there

MLFLOW_ARTIFACTS = {"gs": f"gs://{BUCKET}/mlflow-artifacts",
                    "az": f"wasbs://{BUCKET}@{AZURE_ACCOUNT}.blob.core.windows.net/mlflow-artifacts"}


def test_a_promotion_logs_the_served_model_into_an_mlflow_artifact_store_on_the_store(store, mlflow_template_db,
                                                                                      prefect_api, shared_ray, tmp_path):
    """An MLflow server whose artifacts live on GCS or Azure (`--artifacts-destination`, its credentials from its
    own environment, as the SDK reads them): a run made in it, `podium promote`d, leaves the served MLflow model
    in that store, and the registry's alias loads it back from there through the server."""
    scheme = store.split("://")[0]
    server = MlflowServer(tmp_path / "mlflow", mlflow_template_db, artifacts=MLFLOW_ARTIFACTS[scheme])
    server.start()
    try:
        env = nightly_home(tmp_path, mlflow_template_db, prefect_api, shared_ray.driver_env())
        env = {**env, "MLFLOW_TRACKING_URI": server.url, **{k: os.environ[k] for k in STORE_ENV if k in os.environ}}
        config = _run_config(tmp_path, f"{store}/{tmp_path.name}/serving", f"artifacts-{scheme}")
        made = make_trained_run(config, server.url)
        assert [r.status for r in made.records] == ["validated", "validated"], made.records
        (tmp_path / "run.json").write_text(json.dumps(config))
        promoted = json.loads(podium(["promote", "--json", "--config", str(tmp_path / "run.json")], env).stdout)
        assert promoted["promoted"]["version"] == "v000001", promoted

        # the served model's files are objects of the store, under the server's artifact root
        fs, root = fsspec_filesystem(f"{store}/mlflow-artifacts")
        names = [os.path.basename(p) for p in fs.find(root)]
        assert "MLmodel" in names and "manifest.json" not in names, names  # the model, not the serving copy
        # and come back from there: the version the alias serving systems follow names, downloaded through the server
        client = MlflowClient(server.url, registry_uri=server.url)
        version = client.get_model_version_by_alias(f"artifacts-{scheme}", "champion")
        uri = client.get_model_version_download_uri(version.name, version.version)
        local = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(tmp_path / "dl"),
                                                    tracking_uri=server.url)
        assert (Path(local) / "MLmodel").is_file(), uri
        # no credential of the store in the server's records of the run (the connection string holds the key)
        secret = os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "").partition("AccountKey=")[2].partition(";")[0]
        run = client.get_run(made.tracking.run_id)
        assert not secret or secret not in json.dumps({**run.data.params, **run.data.tags, **version.tags})
    finally:
        server.kill()


def test_parquet_data_on_the_store_is_inspected_digested_and_read_as_a_local_copy_is(store, tmp_path):
    """The data checks a run makes before it starts (schema, rows, classes, the digest its lineage records) and the
    served model's input example, on a dataset of two Parquet files in the store, give what they give on the same
    files on local disk."""
    from podium.tasks.plan import inspect_once
    from podium.training.data import open_dataset

    local = tmp_path / "val"
    for i in range(2):
        write_data(str(local / f"part-{i}.parquet"), 300, 0.1, seed=i)
    remote = f"{store}/{tmp_path.name}/val"
    fs, path = fsspec_filesystem(remote)
    fs.put(str(local) + "/", path, recursive=True)
    on_store, store_digest = inspect_once(remote, "label", list(FEATURES))
    on_disk, disk_digest = inspect_once(str(local), "label", list(FEATURES))
    assert (on_store.num_rows, on_store.num_classes, on_store.feature_columns) == \
        (on_disk.num_rows, on_disk.num_classes, on_disk.feature_columns) == (600, 2, list(FEATURES))
    assert store_digest is not None and disk_digest is not None
    assert (store_digest.files, store_digest.rows, store_digest.row_groups) == (2, 600, disk_digest.row_groups)
    assert open_dataset(remote).head(5).equals(open_dataset(str(local)).head(5))
