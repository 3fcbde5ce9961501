"""`podium k8s` through the real `podium` process: render writes the manifests (or refuses a config in one
sentence, exit 2), the RayJob's entrypoint is a podium command the real process takes with the mounted config,
and `podium k8s watch` exits with podium's code for a RayJob's end, read from a fake Kubernetes API.

No training here: the entrypoint runs through `podium run`'s checks of its config, data and code, and stops at
the cluster's Prefect server (not on this machine), where a real pod would start the run."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import yaml

from tests.helpers.commands import podium
from tests.helpers.fake_kubernetes import fake_kubernetes_api, rayjob

MOUNT = "/var/lib/podium"


def write_inputs(tmp_path: Path) -> tuple[Path, Path]:
    config = tmp_path / "podium.toml"
    config.write_text('run_name = "fraud"\nstorage = "s3://models/fraud/storage"\nserving = "s3://models/fraud/serving"\n'
                      '[data]\ntrain = "s3://data/train"\nval = "s3://data/val"\n[scaling]\nuse_gpu = true\n')
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('namespace = "ml"\nshared_volume_claim = "podium-shared"\n[store_secrets]\ns3 = "minio-creds"\n')
    return config, cluster


def test_render_writes_every_manifest_and_the_stream_for_kubectl(tmp_path):
    config, cluster = write_inputs(tmp_path)
    out = tmp_path / "k8s"
    written = podium(["k8s", "render", "--config", str(config), "--cluster", str(cluster), "--out", str(out)],
                     dict(os.environ)).stdout.split()
    assert sorted(Path(p).relative_to(out).as_posix() for p in written) == [
        "podium-config.yaml", "prefect-worker.yaml", "prefect/work-pool.json", "rayjob-nightly.yaml", "serve.yaml"]
    assert json.loads((out / "prefect" / "work-pool.json").read_text())["job_configuration"]["job_manifest"]["kind"] == "Job"
    stream = podium(["k8s", "render", "--config", str(config), "--cluster", str(cluster)], dict(os.environ)).stdout
    kinds = [doc["kind"] for doc in yaml.safe_load_all(stream)]
    assert kinds == ["ConfigMap", "RayJob", "Deployment", "Service", "ServiceAccount", "Role", "RoleBinding",
                     "Deployment"]
    assert {doc["metadata"]["namespace"] for doc in yaml.safe_load_all(stream)} == {"ml"}


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
    cluster.write_text('namespace = "ml"\n')  # the local-style defaults: every location on the shared volume
    config.write_text('run_name = "nightly"\n[training]\nepochs = 1\n')
    stream = podium(["k8s", "render", "--config", str(config), "--cluster", str(cluster)], dict(os.environ)).stdout
    docs = {doc["kind"]: doc for doc in yaml.safe_load_all(stream)}
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


def test_watch_exits_with_podiums_code_for_the_rayjobs_end():
    started = datetime.now(timezone.utc).isoformat()  # the watch reads the clock: a RayJob well within its deadline
    failed = {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "failed": 2, "reason": "AppFailed",
              "startTime": started}
    running = {**failed, "jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "failed": 0}
    retrying = {**failed, "jobDeploymentStatus": "Retrying", "failed": 1}
    with fake_kubernetes_api("podium", "podium-nightly", [rayjob(running), rayjob(retrying), rayjob(failed)]) as url:
        proc = podium(["k8s", "watch", "podium-nightly", "--api-url", url, "--poll-s", "0.1"], dict(os.environ),
                      check=False)
    assert proc.returncode == 1, proc.stderr
    assert [line.split(": ")[1] for line in proc.stdout.splitlines()] == ["Running (running)", "Retrying (retrying)",
                                                                           "Failed (failed)"]
    with fake_kubernetes_api("podium", "podium-nightly", [rayjob(running), None]) as url:
        proc = podium(["k8s", "watch", "podium-nightly", "--api-url", url, "--poll-s", "0.1"], dict(os.environ),
                      check=False)
    assert proc.returncode == 3 and "deleted before its end" in proc.stdout


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
