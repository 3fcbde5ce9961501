"""`podium k8s` through the real `podium` process: render writes the manifests (or refuses a config in one
sentence, exit 2); the RayJob's entrypoint is a podium command the real process takes with the mounted config (as
rendered, up to the cluster's Prefect server; with `promote` for `run`, against the test's servers, promoting a
night's made checkpoints), and the serve Deployment's `podium serve` answers for the promoted version on the test's
Ray; `podium k8s watch` records a RayJob's end, read from a fake Kubernetes API, on the night's flow run of a real
Prefect server and exits with podium's code for it.

No training here: the night's checkpoints are made (helpers.checkpoints), as its `podium run` would have left them."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from tests.helpers.commands import podium
from tests.helpers.fake_kubernetes import KUBERAY, fake_kubernetes_api, fake_rayjob_api, rayjob

MOUNT = "/var/lib/podium"
IMAGE = "registry.example.com/ml/podium:0.1.0"


def write_inputs(tmp_path: Path) -> tuple[Path, Path]:
    config = tmp_path / "podium.toml"
    config.write_text('run_name = "fraud"\nstorage = "s3://models/fraud/storage"\nserving = "s3://models/fraud/serving"\n'
                      '[data]\ntrain = "s3://data/train"\nval = "s3://data/val"\n[scaling]\nuse_gpu = true\n')
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(f'namespace = "ml"\nimage = "{IMAGE}"\nshared_volume_claim = "podium-shared"\n'
                       '[store_secrets]\ns3 = "minio-creds"\n')
    return config, cluster


def test_render_writes_every_manifest_and_the_stream_for_kubectl(tmp_path):
    config, cluster = write_inputs(tmp_path)
    out = tmp_path / "k8s"
    written = podium(["k8s", "render", "--config", str(config), "--cluster", str(cluster), "--out", str(out)],
                     dict(os.environ)).stdout.split()
    assert sorted(Path(p).relative_to(out).as_posix() for p in written) == [
        "network-policy.yaml", "nightly.yaml", "on-demand/rayjob-nightly.yaml", "podium-config.yaml",
        "prefect-worker.yaml", "prefect/work-pool.json", "serve.yaml"]
    assert json.loads((out / "prefect" / "work-pool.json").read_text())["job_configuration"]["job_manifest"]["kind"] == "Job"
    stream = podium(["k8s", "render", "--config", str(config), "--cluster", str(cluster)], dict(os.environ)).stdout
    kinds = [doc["kind"] for doc in yaml.safe_load_all(stream)]
    # what `kubectl apply -f -` takes: the on-demand RayJob (generateName, for `kubectl create`) is not in it
    assert kinds == ["ConfigMap", "ServiceAccount", "Role", "RoleBinding", "CronJob", "ServiceAccount",
                     "ServiceAccount", "Deployment", "Service", "PodDisruptionBudget", "ServiceAccount", "Role",
                     "RoleBinding", "Deployment", "ServiceAccount", "NetworkPolicy", "NetworkPolicy", "NetworkPolicy"]
    assert {doc["metadata"]["namespace"] for doc in yaml.safe_load_all(stream)} == {"ml"}
    # the set `kubectl apply` takes, as the command wrote it, strictly valid (the NetworkPolicies among them)
    import kubernetes_validate

    from podium.deployments.k8s import KUBERNETES_VERSION

    for doc in yaml.safe_load_all(stream):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    # rendered in a folder of this machine: none of its paths in any manifest (the pods' home is the volume's)
    for path in out.rglob("*.*"):
        assert str(tmp_path) not in path.read_text() and os.getcwd() not in path.read_text(), path


def test_a_config_the_pods_could_not_run_is_refused_before_anything_is_written(tmp_path):
    config, cluster = write_inputs(tmp_path)
    config.write_text('storage = "/home/me/checkpoints"\n')
    out = tmp_path / "k8s"
    proc = podium(["k8s", "render", "--config", str(config), "--cluster", str(cluster), "--out", str(out)],
                  dict(os.environ), check=False)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("podium: storage = '/home/me/checkpoints' is a local path outside the shared volume")
    assert not out.exists()


def test_the_rayjobs_entrypoint_is_a_podium_command_that_reads_the_mounted_config(tmp_path):
    """The entrypoint, run by the real `podium` with the rendered pod's environment and the ConfigMap's config at
    the path the pod mounts it (here under tmp_path): it reads the config and checks the run's inputs."""
    config, cluster = write_inputs(tmp_path)
    cluster.write_text(f'namespace = "ml"\nimage = "{IMAGE}"\n')  # the local-style defaults: all on the shared volume
    config.write_text('run_name = "nightly"\n[training]\nepochs = 1\n')
    stream = podium(["k8s", "render", "--config", str(config), "--cluster", str(cluster)], dict(os.environ)).stdout
    docs = {doc["kind"]: doc for doc in yaml.safe_load_all(stream)}
    docs["RayJob"] = json.loads(docs["ConfigMap"]["data"]["rayjob.json"])  # the RayJob each night makes
    root = tmp_path / "pod"
    mounted = lambda text: text.replace(MOUNT, str(root / MOUNT.strip("/")))
    body = docs["ConfigMap"]["data"]["podium.json"]
    argv = shlex.split(mounted(docs["RayJob"]["spec"]["entrypoint"].replace("/etc/podium", str(root / "etc/podium"))))
    (root / "etc/podium").mkdir(parents=True)
    (root / "etc/podium/podium.json").write_text(mounted(body))
    head = docs["RayJob"]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    env.update({e["name"]: mounted(e["value"]) for e in head["env"] if "value" in e})
    # the cluster's MLflow service (http://mlflow:5000) is not here: the test's own store stands in for it
    assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert argv[:2] == ["podium", "run"]
    proc = podium(argv[1:], env, check=False, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    # the run it checked is the nightly config's (its {date} filled), its data where the pod's volume has them
    # its checks of the config, data and code passed; it stopped at the cluster's Prefect server, which is not here
    assert "run nightly-" in proc.stderr  # with --json, the progress lines go to stderr
    assert proc.stderr.strip().splitlines()[-1] == ("podium: PREFECT_API_URL = 'http://prefect-server:4200/api': "
                                                    "the Prefect server does not answer at /health")
    assert "Traceback" not in proc.stderr


NIGHT_CONFIG = """run_name = "k8s-night"
model = "k8snight"
[data]
train = "/var/lib/podium/data/train.parquet"
val = "/var/lib/podium/data/val.parquet"
feature_columns = ["f0", "f1", "f2", "f3"]
[training]
train_loop = "podium_nightly_code:train_func"
train_loop_config = { epochs = 2, angle_deg = 20.0 }
[scaling]
num_workers = 1
[validation]
fn = "podium_nightly_code:validate_fn"
[promotion]
metric = "accuracy"
mode = "max"
verify = "load"
model_loader = "podium_nightly_code:load_linear"
"""


def test_the_rendered_commands_promote_a_made_run_and_serve_it_on_the_tests_ray(tmp_path, prefect_api, shared_ray,
                                                                                mlflow_template_db):
    """What the rendered pods run, run here: the RayJob's entrypoint (`podium run --config <the mounted ConfigMap>
    --json`) with `promote` for `run` (no training: the night's checkpoints are made, as its `podium run` would have
    left them on the shared volume), with the head pod's environment but for the servers (the test's Prefect,
    MLflow store and Ray); then the Deployment's `podium serve` arguments, parsed by podium's own parser and run on
    the test's Ray: the promoted model answers."""
    from helpers.checkpoints import INTEGRATION, make_trained_run
    from helpers.live import call, serving
    from podium_nightly_code import FEATURES, write_data

    from podium.cli.main import build_parser
    from podium.config import expand_run_name
    from podium.serving.layout import read_current

    config, cluster = write_inputs(tmp_path)
    config.write_text(NIGHT_CONFIG)
    cluster.write_text(f'namespace = "ml"\nimage = "{IMAGE}"\n')  # the local-style defaults: all on the shared volume
    stream = podium(["k8s", "render", "--config", str(config), "--cluster", str(cluster)], dict(os.environ)).stdout
    docs = list(yaml.safe_load_all(stream))
    kinds = {doc["kind"]: doc for doc in docs}
    kinds["RayJob"] = json.loads(kinds["ConfigMap"]["data"]["rayjob.json"])  # the RayJob each night makes
    root = tmp_path / "pod"
    mounted = lambda text: text.replace(MOUNT, str(root / MOUNT.strip("/"))).replace("/etc/podium",
                                                                                   str(root / "etc/podium"))
    (root / "etc/podium").mkdir(parents=True)
    (root / "etc/podium/podium.json").write_text(mounted(kinds["ConfigMap"]["data"]["podium.json"]))
    night = json.loads((root / "etc/podium/podium.json").read_text())
    (root / MOUNT.strip("/") / "data").mkdir(parents=True)
    write_data(night["data"]["train"], 100, 0.0, seed=1)
    write_data(night["data"]["val"], 400, 0.1, seed=2)
    shutil.copy(mlflow_template_db, tmp_path / "mlflow.db")
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert night["run_name"] == "k8s-night-{date}"
    run_name = expand_run_name(night["run_name"], datetime.now(timezone.utc))  # as the entrypoint's command fills it
    made = make_trained_run({**night, "run_name": run_name}, tracking_uri)
    assert [r.status for r in made.records] == ["validated", "validated"], made.records

    head = kinds["RayJob"]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    env.update({e["name"]: mounted(e["value"]) for e in head["env"] if "value" in e})
    # the cluster's servers (prefect-server, mlflow, the RayJob's own head) are the test's
    assert (env["PREFECT_API_URL"], env["MLFLOW_TRACKING_URI"]) == ("http://prefect-server:4200/api",
                                                                    "http://mlflow:5000")
    env.update({"PREFECT_API_URL": prefect_api, "MLFLOW_TRACKING_URI": tracking_uri, **shared_ray.driver_env(),
                "PYTHONPATH": os.pathsep.join(filter(None, [str(INTEGRATION), os.environ.get("PYTHONPATH")]))})
    argv = shlex.split(mounted(kinds["RayJob"]["spec"]["entrypoint"]))
    assert argv[:2] == ["podium", "run"]
    proc = podium(["promote", *argv[2:]], env, cwd=tmp_path)
    promoted = json.loads(proc.stdout.strip().splitlines()[-1])
    assert promoted["run_name"] == run_name and promoted["promoted"]["version"] == "v000001", promoted
    assert read_current(night["serving"]).version == "v000001"  # on the shared volume, where the serve pod reads

    (deployment,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "podium-k8snight-serve"]
    (main,) = deployment["spec"]["template"]["spec"]["containers"]
    assert main["command"] == ["podium"]
    args = [mounted(a) for a in main["args"]]
    parsed = build_parser().parse_args(args)
    assert (parsed.command, parsed.serving, parsed.host, parsed.port) == ("serve", night["serving"], "0.0.0.0", 8000)
    # the rendered flags but the location and the port (a free one here): --host, --replicas, --num-cpus
    rest = [a for i, a in enumerate(args) if a not in ("--serving", "--port") and args[i - 1] not in ("--serving",
                                                                                                        "--port")]
    body = json.dumps({"dataframe_split": {"columns": FEATURES, "data": [[1.0, 0.2, 0.0, 0.0]]}}).encode()
    with serving(night["serving"], env, *rest[1:]) as served:
        answer = call(f"{served.url}/invocations", body)
    assert (answer.status, answer.version) == (200, "v000001"), answer
    assert len(json.loads(answer.body)["predictions"]) == 1, answer.body


def _flow_run(name: str, state) -> str:
    """A flow run of `podium run`'s flow as its driver leaves it (Running: the driver is gone with its cluster)."""
    from prefect import Flow
    from prefect.client.orchestration import get_client

    from podium.deployments.k8s_watch import NIGHTLY_FLOW

    with get_client(sync_client=True) as client:
        return str(client.create_flow_run(Flow(lambda: None, name=NIGHTLY_FLOW), name=name, state=state).id)


def _flow_runs(name: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))


def _status(jobDeploymentStatus: str, jobStatus: str = "", started_s_ago: float = 60, **more) -> dict:
    started = (datetime.now(timezone.utc) - timedelta(seconds=started_s_ago)).isoformat()
    return {"jobDeploymentStatus": jobDeploymentStatus, "jobStatus": jobStatus, "startTime": started, **more}


# each case: the flow run the night's driver left (None: none), the RayJob's statuses as the API serves them,
# the exit code, the lines of podium's phases, and the flow run's state (type, name) after the watch
WATCHED = {
    "stuck past its deadline": ("RUNNING", [rayjob(_status("Running", "RUNNING", started_s_ago=400), deadline_s=60)],
                                1, ["TimedOut (stuck)"], ("FAILED", "TimedOut")),
    "failed with backoff": ("RUNNING", [rayjob(_status("Running", "RUNNING")),
                                        rayjob(_status("Retrying", "FAILED", failed=1)),
                                        rayjob(_status("Failed", "FAILED", failed=2, reason="AppFailed",
                                                       message="the training loop raised"))],
                            1, ["Running (running)", "Retrying (retrying)", "Failed (failed)"], ("FAILED", "Failed")),
    # as KubeRay's controller writes it (tests/helpers/fake_kubernetes.KUBERAY): the head not ready is read and
    # waited out; the submitter's failure ends the RayJob (SubmissionFailed)
    "head lost": ("RUNNING", [rayjob(_status(**KUBERAY["running"])), rayjob(_status(**KUBERAY["head not ready"])),
                              rayjob(_status(**KUBERAY["submission failed"], failed=2))],
                  3, ["Running (running)", "Running (head_not_ready)", "Crashed (head_lost)"], ("CRASHED", "Crashed")),
    "refused by KubeRay's validation": (None, [rayjob(_status(**KUBERAY["validation failed"]))],
                                        2, ["Invalid (invalid)"], ("FAILED", "Invalid")),
    "cleaned up after podium ended it": ("COMPLETED", [rayjob(_status("Running", "RUNNING")), None],
                                         0, ["Running (running)", "Completed (cleaned_up)"],
                                         ("COMPLETED", "Completed")),
    "cleaned up with its driver gone": ("RUNNING", [rayjob(_status("Running", "RUNNING")), None],
                                        3, ["Running (running)", "Crashed (cleaned_up)"], ("CRASHED", "Crashed")),
    "deadline passed before podium started": (None, [rayjob(_status("Initializing", started_s_ago=3700)),
                                                     rayjob(_status("Failed", "STOPPED", started_s_ago=3700,
                                                                    reason="DeadlineExceeded"))],
                                              1, ["Pending (pending)", "TimedOut (timed_out)"], ("FAILED", "TimedOut")),
}


@pytest.mark.parametrize("case", list(WATCHED))
def test_watch_records_the_rayjobs_end_on_the_nightly_flow_run_and_exits_with_podiums_code(case, prefect_api,
                                                                                             tmp_path):
    """`podium k8s watch` through the real process, reading a fake Kubernetes API: its lines, its exit code, and the
    state of the night's flow run on a real Prefect server afterwards."""
    from prefect.states import Completed, Running

    from podium.config import expand_run_name

    left, sequence, code, phases, (state_type, state_name) = WATCHED[case]
    template = f"k8s-{case.replace(' ', '-')}-{{date}}"
    # a flow run `podium run` made is named at its start; one the watch makes, at the RayJob's
    started = datetime.fromisoformat(sequence[0]["status"]["startTime"]) if left is None else datetime.now(timezone.utc)
    name = f"{expand_run_name(template, started)}-run"
    if left is not None:
        _flow_run(name, Running() if left == "RUNNING" else Completed(message="promoted step 1 as v000001"))
    env = {**os.environ, "PREFECT_API_URL": prefect_api}
    named = ["--run-name", template]
    if case == "head lost":  # the run named by the config the manifests were rendered from, as the docs run it
        (tmp_path / "podium.toml").write_text(f'run_name = "{template.removesuffix("-{date}")}"\n')
        named = ["--config", str(tmp_path / "podium.toml")]
    with fake_kubernetes_api("podium", "podium-nightly", sequence) as url:
        proc = podium(["k8s", "watch", "podium-nightly", "--api-url", url, "--poll-s", "0.1", *named], env,
                      check=False, cwd=tmp_path)
    assert proc.returncode == code, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split(": ")[1] for line in lines[:-1]] == phases, proc.stdout
    (run,) = _flow_runs(name)
    assert (run.state.type.value, run.state.name) == (state_type, state_name), run.state
    if left == "COMPLETED":  # podium's own end stands
        assert run.state.message == "promoted step 1 as v000001"
        assert lines[-1] == f"podium/podium-nightly: flow run {name}: Completed, as podium run ended it"
    else:  # the reason podium's last line gave
        assert run.state.message == f"RayJob podium/podium-nightly: {lines[-2].split(': ', 2)[2]}", run.state.message
        assert lines[-1].startswith(f"podium/podium-nightly: flow run {name}: ") and "recorded" in lines[-1]


def test_watch_without_a_run_name_or_a_server_records_nothing_and_says_so():
    done = [rayjob(_status("Complete", "SUCCEEDED"))]
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    with fake_kubernetes_api("podium", "podium-nightly", done) as url:
        proc = podium(["k8s", "watch", "podium-nightly", "--api-url", url, "--poll-s", "0.1"], env)
        assert proc.stdout.splitlines()[-1] == ("podium/podium-nightly: not recorded in Prefect: give --config (or "
                                                "--run-name) to name the run")
        proc = podium(["k8s", "watch", "podium-nightly", "--api-url", url, "--run-name", "n-{date}"], env)
        assert proc.stdout.splitlines()[-1] == ("podium/podium-nightly: not recorded in Prefect: PREFECT_API_URL is "
                                                "not set")


def test_the_prefect_template_the_unit_tests_compare_with_is_the_commands(tmp_path):
    """tests/unit/test_k8s_render.py compares the work pool's template with prefect-kubernetes'
    get_default_base_job_template(): it is what `prefect work-pool get-default-base-job-template --type
    kubernetes` prints, offline."""
    from prefect_kubernetes.worker import KubernetesWorker

    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    proc = subprocess.run([str(Path(sys.executable).parent / "prefect"), "work-pool", "get-default-base-job-template",
                           "--type", "kubernetes"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == KubernetesWorker.get_default_base_job_template()


def test_submit_makes_each_night_a_new_rayjob_follows_it_and_prunes_the_old_nights(tmp_path):
    """The nightly CronJob's `podium k8s submit`, through the real process against a fake API of the namespace's
    RayJobs: tonight's RayJob is the ConfigMap's with the night's name (a second night, and a tenth, make new ones:
    nothing to delete by hand), followed to its end, the finished nights beyond --keep deleted, a running one
    never; the same night submitted again follows the RayJob it made instead of making another."""
    config, cluster = write_inputs(tmp_path)
    out = tmp_path / "k8s"
    podium(["k8s", "render", "--config", str(config), "--cluster", str(cluster), "--out", str(out)], dict(os.environ))
    (config_map,) = yaml.safe_load((out / "podium-config.yaml").read_text()),
    manifest = tmp_path / "rayjob.json"
    manifest.write_text(config_map["data"]["rayjob.json"])
    template = json.loads(manifest.read_text())
    prefix = template["metadata"]["generateName"]

    def night(stamp: str, deployment_status: str) -> dict:
        job = rayjob({"jobDeploymentStatus": deployment_status, "jobStatus": "RUNNING"})
        return {**job, "metadata": {**job["metadata"], "name": f"{prefix}{stamp}", "namespace": "ml"}}

    old = [night("20251230-0200", "Complete"), night("20251231-0200", "Failed"), night("20251229-0200", "Running")]
    sequence = [_status(**KUBERAY["initializing"]), _status(**KUBERAY["running"]), _status(**KUBERAY["succeeded"])]
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    argv = ["k8s", "submit", "--manifest", str(manifest), "--namespace", "ml", "--run-name", "fraud-{date}",
            "--keep", "2", "--poll-s", "0.1"]
    with fake_rayjob_api("ml", old, sequence) as (url, happened):
        proc = podium([*argv, "--api-url", url], env, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        (made,) = happened["made"]
        assert made["metadata"]["name"].startswith(prefix) and made["spec"] == template["spec"]
        assert proc.stdout.splitlines()[0] == f"ml/{made['metadata']['name']}: made"
        # finished: the two old nights and tonight's; two kept; the running night untouched
        assert happened["deleted"] == [f"{prefix}20251230-0200"]
        again = podium([*argv, "--api-url", url], env, check=False)
    if again.stdout.splitlines()[0].endswith("made already, followed"):  # the same minute: the night's own RayJob
        assert again.returncode == 0 and len(happened["made"]) == 1, again.stdout
    else:  # the minute turned: a second night, a RayJob of its own
        assert [m["metadata"]["name"] for m in happened["made"]][0] != happened["made"][-1]["metadata"]["name"]


def test_a_watch_stopped_by_sigterm_exits_143_at_once_and_leaves_the_rayjob_going(tmp_path):
    """The CronJob's pod stopped while it follows the night (SIGTERM): the command ends at once, 143, one line,
    no traceback; the RayJob is not touched (a watch started again follows it)."""
    import signal
    import time

    running = [rayjob(_status("Running", "RUNNING"))]
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    with fake_kubernetes_api("podium", "podium-nightly", running) as url:
        proc = subprocess.Popen([sys.executable, "-m", "podium.cli", "k8s", "watch", "podium-nightly", "--api-url", url,
                                 "--poll-s", "0.2", "--run-name", "n-{date}"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert "Running (running)" in first, first
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, first + out + err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "podium: stopped by SIGTERM", err
