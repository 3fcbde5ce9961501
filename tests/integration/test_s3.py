"""Object storage for real: storage, data and serving on an S3 server on loopback (moto in server mode).

Nothing is mocked in this process: every request goes over HTTP to the server,
as it would to MinIO or AWS. Crashes are injected by raising (or, in one case,
by SIGKILL of a separate promoting process) at the step under test.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import torch
from helpers.s3_server import FAKE_KEY_ID, FAKE_SECRET, Relay, S3Server, free_port, start_s3_server
from mlflow.tracking import MlflowClient

from podium.config import build_config
from podium.core.events import CheckpointEvent
from podium.errors import ConfigError
from podium.serving.layout import read_current, read_history
from podium.serving.staging import stage_version
from podium.storage.backends.s3_client import MiB, s3_filesystem
from podium.storage.backends.s3_transfer import MultipartWriter, open_range_reader
from podium.storage.locations import arrow_filesystem
from podium.tasks.plan import BUILTIN_LOOP, RunPlan, plan_run
from podium.tasks.promote import promote_best_checkpoint
from podium.tracking.records import merge_validation, record_checkpoint
from podium.tracking.runs import open_tracking_run
from podium.training.checkpoint import CheckpointMeta, save_checkpoint
from podium.training.data import load_arrays, make_classification_data
from podium.training.model import ModelSpec, build_model
from podium.training.promoted import fetch_version, load_promoted_model

pytestmark = pytest.mark.integration

BUCKET = "podium-test"


@pytest.fixture(scope="module")
def s3(tmp_path_factory) -> S3Server:
    """An S3 server for this module, with the AWS chain (and MLflow) of this process pointed at it."""
    server = start_s3_server(tmp_path_factory.mktemp("moto") / "moto.log")
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    server.create_bucket(BUCKET)
    try:
        yield server
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


@pytest.fixture(scope="module")
def ray_with_s3(s3, _ray_stopped_at_end):
    """Ray workers inherit the environment of the process that starts Ray: restart it with the S3 variables.

    Its workers also get their own TMPDIR, so the test can see what validation
    left behind there. Yields that folder.
    """
    import ray

    from podium.training import raytrain

    worker_tmp = tempfile.mkdtemp(prefix="podium-s3-")
    saved = {k: os.environ.get(k) for k in ("TMPDIR", "RAY_TMPDIR")}
    ray.shutdown()
    os.environ["RAY_TMPDIR"] = saved["RAY_TMPDIR"] or tempfile.gettempdir()  # Ray's own files stay where they were
    os.environ["TMPDIR"] = worker_tmp
    try:
        raytrain.ensure_ray(5, ["podium_user_code:train_func"])
        yield worker_tmp
    finally:
        ray.shutdown()  # the next user starts Ray again without these variables
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _leaks(text: str) -> list[str]:
    return [s for s in (FAKE_SECRET, FAKE_KEY_ID) if s in text]


# --------------------------------------------------------------------------------------------
# The whole pipeline on S3


def test_full_run_with_storage_data_and_serving_on_s3(s3, ray_with_s3, pipeline, tmp_path):
    from helpers.prefect_queries import flow_run_id
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, LogFilter, LogFilterFlowRunId

    from podium.services import prepare_mlflow

    train, val = make_classification_data(f"s3://{BUCKET}/data", train_rows=3000, val_rows=1000)
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    prepare_mlflow(tracking_uri)
    MlflowClient(tracking_uri).create_experiment("podium", artifact_location=f"s3://{BUCKET}/mlflow")
    storage, serving = f"s3://{BUCKET}/storage", f"s3://{BUCKET}/serving"
    summary = pipeline({"run_name": "s3-e2e", "storage": storage, "serving": serving,
                        "data": {"train": train, "val": val}, "training": {"epochs": 3},
                        "validation": {"concurrency": 2}, "checkpoints": {"keep": 1}}, tracking_uri)

    records = summary.checkpoints
    assert len(records) == 3 and all(r.status == "validated" for r in records)
    # the 2 workers read the data from the bucket through Ray Data; its statistics, from one streaming
    # pass, are saved with the run and in every checkpoint
    fs = s3_filesystem()
    saved = json.loads(fs.cat_file(f"{BUCKET}/storage/.podium-runs/s3-e2e.feature-stats.json"))
    x_train, _ = load_arrays(train, "label", [f"f{i:02d}" for i in range(16)])
    assert saved["rows"] == 3000 and saved["mean"] == pytest.approx(x_train.astype("float64").mean(0).tolist())
    meta = json.loads(fs.cat_file(records[-1].uri.removeprefix("s3://") + "/podium.json"))
    assert meta["config"]["feature_stats"] == saved
    # Ray Train wrote the checkpoints into the bucket; the MLflow records point there. checkpoints.keep = 1:
    # the bucket keeps the best and the newest, the others were deleted there once validated, their records kept
    best = min(records, key=lambda r: (r.metrics["val_loss"], -r.step))  # ties: the later step
    kept = {best.uri, records[-1].uri}
    for r in records:
        assert r.uri.startswith(f"{storage}/s3-e2e/checkpoint_")
        key = r.uri.removeprefix(f"s3://{BUCKET}/")
        files = {k.rsplit("/", 1)[1] for k in s3.keys(BUCKET, key + "/")}
        if r.uri in kept:
            assert {"model.pt", "optimizer.pt", "podium.json"} <= files and not r.deleted
        else:
            assert not files and r.deleted and "checkpoints.keep = 1" in r.deleted

    # serving on S3: versioned prefix, manifest, pointer, history; the champion loads and predicts as recorded
    promoted = summary.promotion.promoted
    assert promoted.step == best.step and promoted.uri == f"{serving}/versions/v000001/model"
    assert read_current(serving).version == "v000001" and len(read_history(serving)) == 1
    layout = set(s3.keys(BUCKET, "serving/"))
    assert {"serving/CURRENT", "serving/versions/v000001/MANIFEST.json", "serving/versions/v000001/model/MLmodel",
            "serving/versions/v000001/model/data/model/model.pt2"} <= layout
    assert not [k for k in layout if k.endswith("optimizer.pt")]  # the served model, not the checkpoint
    # the same MLflow model was logged into the checkpoint's LoggedModel, in the experiment's S3 location
    assert any(k.endswith(f"models/{best.model_id}/artifacts/MLmodel") for k in s3.keys(BUCKET, "mlflow/"))
    model = load_promoted_model(serving)
    x, y = load_arrays(val, "label", [f"f{i:02d}" for i in range(16)])
    with torch.no_grad():
        accuracy = (model(torch.from_numpy(x)).argmax(1).numpy() == y).mean()
    assert accuracy == pytest.approx(best.metrics["val_accuracy"], abs=1e-6)

    # MLflow: the alias names the champion's LoggedModel, whose artifacts (the served model) are in the bucket,
    # and the served copy by its tag; the run's artifacts went to the bucket too
    client = MlflowClient(tracking_uri, registry_uri=tracking_uri)
    champion = client.get_model_version_by_alias("podium", "champion")
    assert champion.source.startswith(f"s3://{BUCKET}/mlflow/")
    assert f"{best.model_id}/artifacts/served/v000001-" in champion.source  # this promotion's own build
    assert champion.tags["podium.served_uri"] == promoted.uri
    run_id = summary.tracking.run_id
    assert any(k.endswith(f"{run_id}/artifacts/podium/promotion_report.md") for k in s3.keys(BUCKET, "mlflow/"))

    # validation downloaded each checkpoint once (the promoted one is read once more, to build the served
    # model from it) and left no temporary copy behind
    for r in records:
        gets = s3.requests("GET", f"{BUCKET}/storage/s3-e2e/{r.uri.rsplit('/', 1)[1]}/model.pt")
        assert len(gets) == 1 + (r.step == promoted.step), gets
    assert not glob.glob(os.path.join(ray_with_s3, "checkpoint_tmp_*"))

    # no credential anywhere: MLflow params and tags, Prefect parameters, logs and artifacts
    run = client.get_run(run_id)
    exp = client.get_experiment_by_name("podium")
    models = client.search_logged_models([exp.experiment_id], max_results=100)
    assert not _leaks(json.dumps([run.data.params, run.data.tags, [(m.tags, m.params) for m in models]]))
    fid = flow_run_id("s3-e2e")
    with get_client(sync_client=True) as c:
        parameters = c.read_flow_run(fid).parameters
        logs = c.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[fid])), limit=200)
        artifacts = c.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[fid])))
    assert logs and artifacts
    assert not _leaks(json.dumps(parameters, default=str))
    assert not _leaks("\n".join(log.message for log in logs))
    assert not _leaks(json.dumps([a.data for a in artifacts], default=str))


# --------------------------------------------------------------------------------------------
# Promotion interrupted at each step


class Died(Exception):
    """Stands for the promoting process dying at this point: nothing after it runs."""


def _upload_checkpoint(tmp_path: Path, uri: str, seed: int) -> None:
    """A podium checkpoint, persisted the way Ray Train does it (pyarrow copy_files onto podium's filesystem)."""
    spec = ModelSpec(in_features=3, num_classes=2, hidden_size=8)
    torch.manual_seed(seed)
    model = build_model(spec)
    meta = CheckpointMeta(model=spec, epoch=1, step=seed, metrics={}, config={}, feature_columns=["a", "b", "c"],
                          label_column="label")
    local = tmp_path / f"local-{seed}"
    save_checkpoint(str(local), model, torch.optim.Adam(model.parameters()), meta)
    fs, path = arrow_filesystem(uri)
    pafs.copy_files(str(local), path, destination_filesystem=fs)


def _outputs(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.linspace(-1, 1, 15).reshape(5, 3))


def _reference_outputs(tmp_path: Path, seed: int) -> torch.Tensor:
    from podium.training.checkpoint import load_model

    return _outputs(load_model(str(tmp_path / f"local-{seed}"))[0])


@pytest.fixture(scope="module")
def tracking_store(tmp_path_factory) -> str:
    """One MLflow store for the promotion tests (each uses its own run and registered model)."""
    from podium.services import prepare_mlflow

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    prepare_mlflow(uri)
    return uri


@pytest.fixture
def promotion_setup(s3, tracking_store, tmp_path):
    """A champion (step 1) already promoted to an S3 serving location, and a better checkpoint (step 2) recorded."""
    name = tmp_path.name
    prefix = f"s3://{BUCKET}/{name}"
    tracking = open_tracking_run(tracking_store, "podium", name, {})
    config = build_config({"run_name": name, "storage": f"{prefix}/storage", "serving": f"{prefix}/serving",
                           "data": {"train": "unused", "val": "unused"},
                           "promotion": {"verify": False, "registered_model": name}})
    plan = RunPlan(config=config, storage=config.storage, serving=config.serving, train_loop=BUILTIN_LOOP,
                   loop_config={}, validate_kwargs={})

    def add(step: int, val_loss: float) -> None:
        uri = f"{prefix}/storage/{name}/checkpoint_{step:08d}"
        _upload_checkpoint(tmp_path, uri, seed=step)
        event = CheckpointEvent(run_name=name, step=step, metrics={"loss": 1.0}, checkpoint_uri=uri,
                                checkpoint_name=uri.rsplit("/", 1)[1])
        merge_validation(tracking, record_checkpoint(tracking, event), {"val_loss": val_loss})

    add(1, 0.5)
    first = promote_best_checkpoint(plan, tracking)
    assert first.promoted.version == "v000001"
    add(2, 0.3)
    return plan, tracking


STEPS = ["mid-copy", "before-manifest", "before-pointer", "before-alias"]


@pytest.mark.parametrize("die_at", STEPS)
def test_interrupted_promotion_keeps_a_readable_champion_and_rerun_finishes(promotion_setup, tmp_path, monkeypatch,
                                                                             die_at):
    import podium.serving.layout
    import podium.serving.staging
    import podium.tasks.carry_out
    import podium.tracking.ledger

    plan, tracking = promotion_setup
    serving = plan.serving
    with monkeypatch.context() as m:
        if die_at == "mid-copy":  # one file of the served model uploaded, then the process is gone
            calls = []
            open_write = podium.serving.staging._open_write

            def write_then_die(*args, **kwargs):
                calls.append(1)
                if len(calls) > 1:
                    raise Died()
                return open_write(*args, **kwargs)

            m.setattr(podium.serving.staging, "_open_write", write_then_die)
            m.setattr(podium.serving.layout, "PARALLEL_FILES", 1)
        else:
            target = {"before-manifest": (podium.serving.layout, "seal_version"),
                      "before-pointer": (podium.serving.layout, "switch_current"),
                      "before-alias": (podium.tracking.ledger, "promote_version")}[die_at]
            m.setattr(*target, lambda *a, **k: (_ for _ in ()).throw(Died()))
        with pytest.raises(Died):
            promote_best_checkpoint(plan, tracking)

    # a reader still gets a complete champion, every file matching its manifest
    current = read_current(serving)
    expected_step = 2 if die_at == "before-alias" else 1  # the pointer had switched: the new champion is complete
    assert current.manifest["step"] == expected_step
    fetch_version(current, str(tmp_path / f"read-{die_at}"))
    assert torch.allclose(_outputs(load_promoted_model(serving)), _reference_outputs(tmp_path, expected_step))

    # promotion again finishes the job: step 2 is current, and the registry's alias names it
    again = promote_best_checkpoint(plan, tracking)
    current = read_current(serving)
    assert current.manifest["step"] == 2
    assert torch.allclose(_outputs(load_promoted_model(serving)), _reference_outputs(tmp_path, 2))
    assert [h["version"] for h in read_history(serving)] == ["v000001", current.version]
    client = MlflowClient(tracking.tracking_uri, registry_uri=tracking.tracking_uri)
    model_name = plan.config.promotion.registered_model
    assert client.get_model_version_by_alias(model_name, "champion").tags["podium.served_uri"] == current.uri
    assert again.promoted is None or again.promoted.version == current.version


def test_promoter_killed_mid_copy_leaves_champion_intact(promotion_setup, s3, tmp_path, monkeypatch):
    """The same with a real SIGKILL: no exception handler, no cleanup, multipart uploads left open, and
    the dead promoter's lease left behind (taken over once it expires: 3 s here, 30 s by default)."""
    monkeypatch.setenv("PODIUM_S3_LEASE_TTL_S", "3")
    plan, tracking = promotion_setup
    script = tmp_path / "promote_and_die.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal
        import podium.serving.layout as layout, podium.serving.staging as staging
        from podium.tasks.plan import RunPlan
        from podium.tasks.promote import promote_best_checkpoint
        from podium.tasks.tracking import TrackingRun

        open_write, calls = staging._open_write, []
        def write_then_die(*args, **kwargs):
            calls.append(1)
            if len(calls) > 1:
                os.kill(os.getpid(), signal.SIGKILL)
            return open_write(*args, **kwargs)
        staging._open_write, layout.PARALLEL_FILES = write_then_die, 1
        plan = RunPlan.model_validate_json({plan.model_dump_json()!r})
        promote_best_checkpoint(plan, TrackingRun(**{dataclasses.asdict(tracking)!r}))
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    current = read_current(plan.serving)
    assert current.version == "v000001" and current.manifest["step"] == 1
    assert torch.allclose(_outputs(load_promoted_model(plan.serving)), _reference_outputs(tmp_path, 1))
    assert s3_filesystem().exists(f"{plan.serving}/.promotion.lock")  # the dead promoter's lease
    promote_best_checkpoint(plan, tracking)
    assert read_current(plan.serving).manifest["step"] == 2
    assert not s3_filesystem().exists(f"{plan.serving}/.promotion.lock")


# --------------------------------------------------------------------------------------------
# Checkpoint transfers: what Ray Train does with podium's filesystem


def test_checkpoint_round_trip_in_parallel_parts(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("PODIUM_S3_PART_SIZE_MB", "5")
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    files = {"model.pt": os.urandom(12 * MiB + 3), "empty": b"", "sub/meta.json": b"{}"}
    for name, data in files.items():
        (src / name).write_bytes(data)
    fs, path = arrow_filesystem(f"s3://{BUCKET}/roundtrip/ck")
    pafs.copy_files(str(src), path, destination_filesystem=fs)  # Ray's upload: pyarrow copy_files
    etag = s3.client().head_object(Bucket=BUCKET, Key="roundtrip/ck/model.pt")["ETag"]
    assert "-" in etag, "more than a part's worth: a multipart upload"
    dst = tmp_path / "dst"
    pafs.copy_files(path, str(dst), source_filesystem=fs)  # Ray's download (Checkpoint.to_directory)
    assert {n: (dst / n).read_bytes() for n in files} == files


def test_upload_dropped_before_close_publishes_nothing(s3):
    fs = s3_filesystem()
    writer = MultipartWriter(fs, f"{BUCKET}/dropped/model.pt", part_size=5 * MiB, concurrency=2)
    writer.write(os.urandom(11 * MiB))  # two parts on their way
    del writer  # an error while copying: nobody calls close
    assert s3.keys(BUCKET, "dropped/") == []
    assert not s3.client().list_multipart_uploads(Bucket=BUCKET).get("Uploads")


def test_reader_refuses_an_object_replaced_while_read(s3, monkeypatch):
    monkeypatch.setenv("PODIUM_S3_PART_SIZE_MB", "5")
    monkeypatch.setenv("PODIUM_S3_CONCURRENCY", "1")
    fs = s3_filesystem()
    fs.pipe_file(f"{BUCKET}/replaced.bin", os.urandom(11 * MiB))
    reader = open_range_reader(fs, f"{BUCKET}/replaced.bin")
    reader.read(5 * MiB)  # the first range; the second is already requested, the third is not
    fs.pipe_file(f"{BUCKET}/replaced.bin", os.urandom(11 * MiB))
    with pytest.raises(OSError, match="pre-condition"):
        reader.read()


def test_large_object_copied_part_by_part_keeps_its_etag(s3):
    from podium.storage.backends.s3 import copy_object

    fs = s3_filesystem()
    writer = MultipartWriter(fs, f"{BUCKET}/big/src.bin", part_size=5 * MiB, concurrency=4)
    data = os.urandom(12 * MiB)
    for start in range(0, len(data), 5 * MiB):  # three parts: 5, 5 and 2 MiB
        writer.write(data[start:start + 5 * MiB])
    writer.close()
    info = fs.info(f"{BUCKET}/big/src.bin")
    # a limit of 0 bytes forces the path S3 takes above 5 GiB: UploadPartCopy, mirroring the source's parts
    assert copy_object(fs, f"{BUCKET}/big/src.bin", f"{BUCKET}/big/dst.bin", info["size"], info["ETag"],
                       single_copy_limit=0) is None
    assert info["ETag"].strip('"').endswith("-3")
    assert fs.info(f"{BUCKET}/big/dst.bin")["ETag"] == info["ETag"]
    assert fs.cat_file(f"{BUCKET}/big/dst.bin") == data


# --------------------------------------------------------------------------------------------
# Fail early: before anything trains, a clear error naming the location; nothing written


@pytest.fixture(scope="module")
def strict_s3(tmp_path_factory) -> dict:
    """A second S3 server that checks signatures and IAM policies: a writer, a read-only user, a bucket."""
    server = start_s3_server(tmp_path_factory.mktemp("moto-iam") / "moto.log")
    server.create_bucket("podium-strict")
    writer = server.add_user("writer", ["s3:*"])
    reader = server.add_user("reader", ["s3:GetObject", "s3:ListBucket"])
    server.enforce_iam()
    try:
        yield {"server": server, "writer": writer, "reader": reader}
    finally:
        server.stop()


CASES = {
    "wrong-key": ("storage", "AKIAWRONGWRONGWRONG", None, "rejected the credentials (InvalidAccessKeyId)"),
    "wrong-secret": ("storage", "writer", "not-the-secret", "rejected the credentials (SignatureDoesNotMatch)"),
    "missing-bucket": ("storage", "writer", None, "bucket 'podium-no-such-bucket' does not exist"),
    "missing-data-bucket": ("data.train", "writer", None, "bucket 'podium-no-such-bucket' does not exist"),
    "unreachable-endpoint": ("storage", "writer", None, "cannot reach the S3 endpoint"),
    "read-only": ("serving", "reader", None, "access denied writing (s3:PutObject)"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_unusable_location_fails_before_training_and_writes_nothing(strict_s3, dataset, tmp_path, monkeypatch, case):
    server = strict_s3["server"]
    field, user, secret, expected = CASES[case]
    key_id, key_secret = strict_s3[user] if user in ("writer", "reader") else (user, FAKE_SECRET)
    endpoint = f"http://127.0.0.1:{free_port()}" if case == "unreachable-endpoint" else server.endpoint
    for k, v in server.env(key_id, secret or key_secret).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    bucket = "podium-no-such-bucket" if "missing" in case else "podium-strict"
    locations = {"data": {"train": dataset[0], "val": dataset[1]}, "storage": f"s3://podium-strict/{case}/storage",
                 "serving": f"s3://podium-strict/{case}/serving"}
    if field == "data.train":
        locations["data"]["train"] = f"s3://{bucket}/data/train.parquet"
    elif field == "storage":
        locations["storage"] = f"s3://{bucket}/{case}/storage"
    else:
        locations["storage"] = str(tmp_path / "storage")  # storage is fine; serving is read-only

    with pytest.raises(ConfigError) as err:
        plan_run(build_config({"run_name": "strict", **locations}))
    message = str(err.value)
    location = locations["data"]["train"] if field == "data.train" else locations[field]
    assert field in message and location in message and expected in message, message
    assert not _leaks(message) and (secret or key_secret) not in message

    # nothing half-written: no object under the run's prefixes, no bucket created
    writer = server.client(key_id=strict_s3["writer"][0], secret=strict_s3["writer"][1])
    assert not writer.list_objects_v2(Bucket="podium-strict", Prefix=f"{case}/").get("Contents")
    assert "podium-no-such-bucket" not in {b["Name"] for b in writer.list_buckets()["Buckets"]}


# --------------------------------------------------------------------------------------------
# The promotion lock on S3: a lease object written with conditional PUTs

LEASE_HOLDER = """
import sys, time
from podium.storage.lease import LeaseError, ObjectLease
lease = ObjectLease(sys.argv[1], ttl_s=float(sys.argv[2])).acquire(timeout_s=30)
print("held", flush=True)
while True:
    time.sleep(0.1)
    try:
        lease.check()
    except LeaseError as exc:
        print("lost:", exc, flush=True)
        sys.exit(3)
"""


def _hold_lease(tmp_path: Path, uri: str, ttl_s: float) -> subprocess.Popen:
    script = tmp_path / "hold_lease.py"
    script.write_text(LEASE_HOLDER)
    proc = subprocess.Popen([sys.executable, str(script), uri, str(ttl_s)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_s3_lease_excludes_others_and_is_taken_over_when_its_holder_dies(s3, tmp_path):
    from podium.storage.lease import LeaseError, ObjectLease

    uri = f"s3://{BUCKET}/{tmp_path.name}/serving/.promotion.lock"
    holder = _hold_lease(tmp_path, uri, ttl_s=2.0)
    try:
        # alive and renewing: nobody else gets it, and the error names the holder
        with pytest.raises(LeaseError, match=f"held by pid {holder.pid} on "):
            ObjectLease(uri, ttl_s=2.0).acquire(timeout_s=3)  # longer than the TTL: renewals keep it held
    finally:
        holder.kill()  # SIGKILL: no release, the lease object stays behind
        holder.wait()
    fs = s3_filesystem()
    assert fs.exists(uri)
    # once the dead holder's lease has expired, the next promoter takes it over
    lease = ObjectLease(uri, ttl_s=2.0).acquire(timeout_s=15)
    assert json.loads(fs.cat_file(uri))["owner"] == lease.owner
    lease.release()
    assert not fs.exists(uri)


def test_s3_lease_holder_that_stalls_past_its_ttl_learns_it_lost_the_lease(s3, tmp_path):
    from podium.storage.lease import ObjectLease

    uri = f"s3://{BUCKET}/{tmp_path.name}/serving/.promotion.lock"
    holder = _hold_lease(tmp_path, uri, ttl_s=1.5)
    try:
        holder.send_signal(signal.SIGSTOP)  # a promoter frozen (GC pause, VM stall) longer than its TTL
        with ObjectLease(uri, ttl_s=30).acquire(timeout_s=15) as ours:
            holder.send_signal(signal.SIGCONT)
            out, _ = holder.communicate(timeout=30)
            # its next renewal fails its If-Match: it knows, and stops before touching serving
            assert holder.returncode == 3 and "taken over" in out
            ours.check()
            assert json.loads(s3_filesystem().cat_file(uri))["owner"] == ours.owner
    finally:
        holder.kill()
        holder.wait()


PROMOTER = """
import os, sys, time, json
from podium.tasks.plan import RunPlan
from podium.tasks.promote import promote_best_checkpoint
from podium.tasks.tracking import TrackingRun
plan = RunPlan.model_validate_json(open(sys.argv[1]).read())
tracking = TrackingRun(**json.load(open(sys.argv[2])))
open(f"{sys.argv[3]}.ready.{os.getpid()}", "w").close()  # imported: waiting for the go
while not os.path.exists(sys.argv[3]):
    time.sleep(0.01)
out = promote_best_checkpoint(plan, tracking)
print(json.dumps({"promoted": out.promoted.version if out.promoted else None, "reason": out.reason}), flush=True)
"""


def test_two_promoters_at_once_on_s3_leave_one_consistent_champion(promotion_setup, tmp_path):
    plan, tracking = promotion_setup
    (tmp_path / "plan.json").write_text(plan.model_dump_json())
    (tmp_path / "tracking.json").write_text(json.dumps(dataclasses.asdict(tracking)))
    (tmp_path / "promoter.py").write_text(PROMOTER)
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, str(tmp_path / "promoter.py"), str(tmp_path / "plan.json"),
                               str(tmp_path / "tracking.json"), str(go)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    deadline = time.monotonic() + 300
    while len(list(tmp_path.glob("go.ready.*"))) < 2:  # both imported and waiting, however slow the machine
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
            [p.stderr.read()[-2000:] for p in procs if p.poll() is not None]
        time.sleep(0.1)
    go.touch()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-2000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    # exactly one promoted step 2; the other, inside the lock, saw it as the champion already
    assert sorted(str(o["promoted"]) for o in outs) == ["None", "v000002"]
    current = read_current(plan.serving)
    assert current.version == "v000002" and current.manifest["step"] == 2
    assert [h["version"] for h in read_history(plan.serving)] == ["v000001", "v000002"]
    client = MlflowClient(tracking.tracking_uri, registry_uri=tracking.tracking_uri)
    champion = client.get_model_version_by_alias(plan.config.promotion.registered_model, "champion")
    assert champion.tags["podium.served_uri"] == current.uri
    fs = s3_filesystem()
    attempts = fs.ls(f"{plan.serving}/attempts")
    assert len(attempts) == 3  # the setup's first promotion and both of these
    assert not fs.exists(f"{plan.serving}/.promotion.lock")


# --------------------------------------------------------------------------------------------
# The store briefly unreachable: podium's S3 retries (podium.storage.backends.s3_client.S3_RETRIES) ride it out


@pytest.fixture
def relayed(s3, monkeypatch):
    """podium's S3 traffic goes through a relay that the test can cut off (the server keeps its data)."""
    relay = Relay(int(s3.endpoint.rsplit(":", 1)[1]))
    monkeypatch.setenv("AWS_ENDPOINT_URL", relay.endpoint)
    for name in ("AWS_RETRY_MODE", "AWS_MAX_ATTEMPTS"):
        monkeypatch.delenv(name, raising=False)
    yield relay
    relay.down()


def test_a_checkpoint_on_s3_is_staged_into_a_local_serving_location(s3, tmp_path):
    """Across stores: each file read from S3 once, hashed as it is written to the local disk, read back as written."""
    import hashlib

    from podium.training.promoted import load_version_model

    source = f"s3://{BUCKET}/{tmp_path.name}/ckpt"
    _upload_checkpoint(tmp_path, source, seed=1)
    version = stage_version(str(tmp_path / "serving"), source, {"step": 1})
    copied = {p.name: p.read_bytes() for p in Path(version.uri).iterdir()}
    assert {rel: (hashlib.sha256(b).hexdigest(), len(b)) for rel, b in copied.items()} == {
        rel: (entry["sha256"], entry["size"]) for rel, entry in version.manifest["files"].items()}
    assert torch.allclose(_outputs(load_version_model(version)), _reference_outputs(tmp_path, 1))


def test_store_unreachable_for_seconds_is_ridden_out_and_nothing_is_lost(relayed, tmp_path):
    import threading

    from podium.training.promoted import load_version_model

    prefix = f"s3://{BUCKET}/{tmp_path.name}"
    source = f"{prefix}/storage/run/checkpoint_000001"
    _upload_checkpoint(tmp_path, source, seed=1)
    relayed.down()  # connections refused, for 8 s
    threading.Timer(8, relayed.up).start()
    started = time.monotonic()
    version = stage_version(f"{prefix}/serving", source, {"step": 1})  # list, hash, claim, copy, verify
    assert time.monotonic() - started > 7, "the outage was hit"
    assert torch.allclose(_outputs(load_version_model(version)), _reference_outputs(tmp_path, 1))


def test_store_that_stays_down_fails_with_a_message_naming_it(relayed, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")  # the retry window of this test: seconds, not a minute
    relayed.down()
    with pytest.raises(Exception) as failed:
        stage_version(f"s3://{BUCKET}/{tmp_path.name}/serving", f"s3://{BUCKET}/{tmp_path.name}/ckpt", {"step": 1})
    assert relayed.endpoint in str(failed.value)


def test_dataset_digest_reads_only_listings_and_footers(s3, tmp_path):
    """The digest of a Parquet folder on S3: ranged GETs of each file's footer (HTTP 206), never the whole file."""
    from podium.storage.fingerprint import TAIL_READ, dataset_digest

    make_classification_data(str(tmp_path), train_rows=30000, val_rows=10)
    fs = s3_filesystem()
    for i in range(3):
        fs.put_file(str(tmp_path / "train.parquet") if i else str(tmp_path / "val.parquet"), f"{BUCKET}/ds/part-{i}.parquet")
    fs.pipe_file(f"{BUCKET}/ds/_SUCCESS", b"")
    parts = rf"{BUCKET}/ds/part-\d\.parquet"
    before = len(s3.requests("GET", parts))
    d = dataset_digest(f"s3://{BUCKET}/ds")
    gets = s3.requests("GET", parts)[before:]
    assert len(gets) == 3 and all('" 206 ' in line for line in gets), gets  # one partial read per file: its tail
    assert (d.files, d.rows) == (3, 60010)
    tails = sum(min(TAIL_READ, p.stat().st_size) for p in (tmp_path / "val.parquet", tmp_path / "train.parquet",
                                                           tmp_path / "train.parquet"))
    assert d.bytes_read == tails
    # an ETag is a hash of the bytes: the same data elsewhere, or written again, is the same dataset
    for i in range(3):
        fs.copy(f"{BUCKET}/ds/part-{i}.parquet", f"{BUCKET}/copy/part-{i}.parquet")
    assert dataset_digest(f"s3://{BUCKET}/copy").digest == d.digest
    fs.put_file(str(tmp_path / "train.parquet"), f"{BUCKET}/ds/part-1.parquet")
    assert dataset_digest(f"s3://{BUCKET}/ds").digest == d.digest
    fs.put_file(str(tmp_path / "val.parquet"), f"{BUCKET}/ds/part-1.parquet")
    assert dataset_digest(f"s3://{BUCKET}/ds").digest != d.digest
