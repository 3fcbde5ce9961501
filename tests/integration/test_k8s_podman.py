"""`podium k8s render`'s manifests run in real containers: podium's image built here with no registry image
(tests/helpers/podman.py: a debootstrap rootfs of Debian, the Containerfile, a wheelhouse made here) and the
rendered YAML played with `podman kube play` on a network of its own, as docs/production.md's steps from an empty
namespace do, as far as podman reaches:

- the shared volume (the PersistentVolumeClaim's name: a podman volume) and the training data put on it by a pod;
- the ConfigMap and the serve Deployment (its init container makes the serving location on the fresh volume;
  `podium serve` runs, answering /ping 503 and not restarted, until a champion is there);
- a night: what KubeRay would make of the night's RayJob (the ConfigMap's rayjob.json), a head pod and a worker pod
  of its rayClusterSpec templates started with the `ray start` commands KubeRay generates, and the submitter's
  `ray job submit` of the entrypoint; the night trains, validates and promotes to the shared volume, and the serve
  pod answers /invocations with the promoted version;
- a second night, a night whose head pod is stopped midway (SIGTERM, as Kubernetes sends, then SIGKILL after the
  grace period): the head's first process, `podium k8s ray-head`, stops the night's job through Ray's job API, so
  that `podium run` gets the SIGTERM and ends the night as podium's stop does (MLflow run KILLED, flow run
  Cancelled, CURRENT and @champion unchanged); and a night after it that goes on.

What podman cannot stand in for is written in docs/production.md ("Not run here"): the KubeRay operator itself
(this test does its part: names, pods, commands), the CronJob's schedule, RBAC, Services (hostAliases give the head's
service names its address) and probes' effect on routing. The test's Prefect server listens on loopback: a relay on
the network's gateway is the pods' way to it. MLflow is the shared volume's SQLite store (one machine: its locks hold).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from tests.helpers.commands import podium
from tests.helpers.live import call
from tests.helpers.podman import (
    CACHE,
    RayClusterNames,
    Relay,
    container_state,
    ensure_image,
    pod_ip,
    podman,
    podman_env,
    podman_present,
    ray_node_pod,
    submitter_pod,
    wait_exited,
    write_manifests,
)

pytestmark = [pytest.mark.integration, pytest.mark.podman,
              pytest.mark.skipif(podman_present() is not None, reason=f"podman: {podman_present()}")]

NAMESPACE = "ml"
NETWORK = "podium-k8s-test"
VOLUME = "podium-shared"
MOUNT = "/var/lib/podium"
CONFIG = """run_name = "k8s-podman-{datetime}"
model = "podman"
[data]
train = "/var/lib/podium/home/data/train.parquet"
val = "/var/lib/podium/home/data/val.parquet"
[training]
epochs = 2
[scaling]
num_workers = 1
[validation]
concurrency = 1
"""


def wait_for(what: str, check, timeout_s: float, every_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every_s)
    raise AssertionError(f"not within {timeout_s:g} s: {what}")


def without_shm(doc: dict) -> dict:
    """A pod spec as podman can run it: without its memory-backed /dev/shm emptyDir (podman makes an emptyDir a
    root-owned 0755 volume, where Kubernetes' is world-writable tmpfs, which podium's user could not write: the
    container's own /dev/shm is used) and without its containerPorts (podman 4.3 publishes each on the machine's
    own port of that number, where the Ray head's 6379 may be taken; pods are reached at their own addresses)."""
    spec = doc["spec"]["template"]["spec"] if doc["kind"] == "Deployment" else doc["spec"]
    spec["volumes"] = [v for v in spec.get("volumes", []) if v["name"] != "dshm"]
    for c in spec["containers"]:
        c["volumeMounts"] = [m for m in c.get("volumeMounts", []) if m["name"] != "dshm"]
        c.pop("ports", None)
    return doc


def init_always(doc: dict) -> dict:
    """A Deployment whose init container podman 4.3 can play: its default init type, `once`, removes the init
    container as soon as it ended, racing its own end ("cannot remove container ... as it is running"); `always`
    runs it at each start of the pod, as a kubelet does, and keeps it."""
    if doc["kind"] == "Deployment" and doc["spec"]["template"]["spec"].get("initContainers"):
        for meta in (doc["metadata"], doc["spec"]["template"]["metadata"]):
            meta.setdefault("annotations", {})["io.podman.annotations.init.container.type"] = "always"
    return doc


class Namespace:
    """What an empty namespace became: the network, the volume with the data, the rendered manifests."""

    def __init__(self, folder: Path, env: dict[str, str], image: str, prefect_api: str):
        self.folder, self.env, self.image = folder, env, image
        self.played: list[Path] = []
        self.stopped_run: str | None = None
        self.head_logs = ""  # the stopped night's head pod's log (`podium k8s ray-head`)
        self.first_night_served = False  # the nights after the first are not tried where the first failed
        self.costs: dict[str, float] = {}
        podman(["network", "create", NETWORK], env)
        self.gateway = json.loads(podman(["network", "inspect", NETWORK], env).stdout)[0]["subnets"][0]["gateway"]
        target = prefect_api.removeprefix("http://").split("/")[0].rsplit(":", 1)
        self.relay = Relay(self.gateway, (target[0], int(target[1])))
        self.prefect_api = f"http://{self.gateway}:{self.relay.address[1]}/api"
        config = folder / "podium.toml"
        config.write_text(CONFIG)
        cluster = folder / "cluster.toml"
        cluster.write_text(f'namespace = "{NAMESPACE}"\nimage = "{image}"\nprefect_api_url = "{self.prefect_api}"\n'
                           f'mlflow_tracking_uri = "sqlite:///{MOUNT}/home/mlflow.db"\n'
                           f'shared_volume_claim = "{VOLUME}"\nhead_memory = "3Gi"\nworker_memory = "3Gi"\n'
                           'serve_pods = 1\nserve_memory = "3Gi"\n')
        self.k8s = folder / "k8s"
        # 1. podium k8s render (production.md's first step)
        podium(["k8s", "render", "--config", str(config), "--cluster", str(cluster), "--out", str(self.k8s)],
               dict(os.environ))
        (self.config_map,) = yaml.safe_load_all((self.k8s / "podium-config.yaml").read_text())
        self.rayjob = json.loads(self.config_map["data"]["rayjob.json"])
        self.night = json.loads(self.config_map["data"]["podium.json"])
        self.pod_env = {e["name"]: e["value"] for e in
                        self.rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0][
                            "env"] if "value" in e}

    def put_data(self, mlflow_db: Path) -> None:
        """The shared volume and the training data on it, through a pod of podium's image (kubectl run, cp); and the
        MLflow store that stands in for the cluster's MLflow server, its schema made (as an MLflow server's is)."""
        from podium.training.data import make_classification_data

        podman(["volume", "create", VOLUME], self.env)
        local = self.folder / "data"
        train, val = make_classification_data(str(local), train_rows=4000, val_rows=1000)
        podman(["run", "-d", "--name", "podium-data", "--network", NETWORK, "--user", "1000:1000", "-v",
                f"{VOLUME}:{MOUNT}", self.image, "sleep", "600"], self.env)
        try:
            podman(["exec", "--user", "0", "podium-data", "mkdir", "-p", f"{MOUNT}/home/data"], self.env)
            for path in (train, val):
                podman(["cp", path, f"podium-data:{MOUNT}/home/data/{Path(path).name}"], self.env)
            podman(["cp", str(mlflow_db), f"podium-data:{MOUNT}/home/mlflow.db"], self.env)
            podman(["exec", "--user", "0", "podium-data", "chown", "-R", "1000:1000", f"{MOUNT}/home"], self.env)
        finally:
            podman(["rm", "-f", "-t", "0", "podium-data"], self.env)

    def play(self, path: Path) -> None:
        """`kubectl apply -f path`, as podman plays it: the ConfigMap passed along for the pods that mount it;
        `--replace`: a pod of the same name that an earlier `kube down` left half removed (podman 4.3 left one
        in state Created, its name still taken) is removed first, as apply replaces what it finds."""
        started = time.monotonic()
        podman(["kube", "play", "--replace", "--network", NETWORK, "--configmap", str(self.k8s / "podium-config.yaml"),
                str(path)], self.env, timeout=300)
        self.played.append(path)
        self.costs["play_s"] = self.costs.get("play_s", 0.0) + time.monotonic() - started

    def down(self, path: Path) -> None:
        podman(["kube", "down", str(path)], self.env, check=False, timeout=120)
        if path in self.played:
            self.played.remove(path)

    def podium_in_pod(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A podium command in a pod of the image with the pods' environment, the volume and the ConfigMap's config
        (kubectl exec)."""
        config_dir = self.folder / "etc-podium"
        config_dir.mkdir(exist_ok=True)
        (config_dir / "podium.json").write_text(self.config_map["data"]["podium.json"])
        env_args = [a for k, v in self.pod_env.items() for a in ("-e", f"{k}={v}")]
        return podman(["run", "--rm", "--network", NETWORK, "--user", "1000:1000", "-v", f"{VOLUME}:{MOUNT}", "-v",
                       f"{config_dir}:/etc/podium:ro", *env_args, self.image, "podium", *args], self.env, check=False)

    def close(self) -> None:
        for path in list(self.played):
            self.down(path)
        self.relay.close()
        podman(["network", "rm", "-f", NETWORK], self.env, check=False)
        # the shared volume, and the volume podman made of the ConfigMap (kube down leaves it)
        podman(["volume", "rm", "-f", VOLUME, self.config_map["metadata"]["name"]], self.env, check=False)


@pytest.fixture(scope="module")
def cluster_ns(tmp_path_factory, prefect_api, mlflow_template_db, request):
    folder = tmp_path_factory.mktemp("k8s-podman")
    env = podman_env(folder)
    # what a run killed before its end left: its pods (all named podium-*), the network, the volume
    pods = podman(["pod", "ps", "-q", "--filter", "name=^podium-"], env).stdout.split()
    if pods:
        podman(["pod", "rm", "-f", *pods], env, check=False)
    podman(["network", "rm", "-f", NETWORK], env, check=False)
    podman(["volume", "rm", "-f", VOLUME], env, check=False)
    image = ensure_image(env, CACHE)
    ns = Namespace(folder, env, image.tag, prefect_api)
    try:
        ns.put_data(mlflow_template_db)
        yield ns
    finally:
        ns.close()
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        line = (f"k8s podman: image {'built' if image.built else 'cached'} in {image.build_s:.0f} s "
                f"({image.size_mb:.0f} MiB), kube play {ns.costs.get('play_s', 0):.0f} s, nights "
                + ", ".join(f"{k} {v:.0f} s" for k, v in ns.costs.items() if k.startswith("night")))
        if reporter:
            reporter.write_line(line)
        (CACHE / "last-cost.txt").write_text(line + "\n")


def run_night(ns: Namespace, label: str, stop_when: str | None = None) -> tuple[int, str]:
    """One night as KubeRay runs the night's RayJob: a cluster (the head pod, then the worker group's pods, which
    reach the head by its service's names), the submitter's `ray job submit`, the cluster deleted at the end
    (ttlSecondsAfterFinished 0). `stop_when`: the head pod is stopped (SIGTERM, SIGKILL 10 s later) once the job's
    logs show this. (the submitter's exit code, its output)"""
    started = time.monotonic()
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    names = RayClusterNames(f"{ns.rayjob['metadata']['generateName']}{stamp}", NAMESPACE)
    spec = ns.rayjob["spec"]["rayClusterSpec"]
    head = without_shm(ray_node_pod(ns.rayjob, names, "head", names.head_pod, spec["headGroupSpec"]))
    paths = [write_manifests(ns.folder / f"{label}-head.yaml", [head])]
    ns.play(paths[0])
    ip = pod_ip(names.head_pod, NETWORK, ns.env)
    wait_for("the head's dashboard", lambda: call(f"http://{ip}:8265/api/version", timeout_s=5).status == 200, 120)
    aliases = [{"ip": ip, "hostnames": [names.head_fqdn, names.head_service]}]
    workers = [without_shm(ray_node_pod(ns.rayjob, names, "worker", names.worker_pod(g["groupName"], i), g, aliases))
               for g in spec["workerGroupSpecs"] for i in range(g["replicas"])]
    paths.append(write_manifests(ns.folder / f"{label}-workers.yaml", workers))
    ns.play(paths[-1])
    submitter = submitter_pod(ns.rayjob, names, f"{names.rayjob}-job", aliases)
    paths.append(write_manifests(ns.folder / f"{label}-submitter.yaml", [submitter]))
    ns.play(paths[-1])
    container = f"{submitter['metadata']['name']}-ray-job-submitter"
    try:
        if stop_when is not None:
            wait_for(f"{stop_when!r} in the night's logs",
                     lambda: stop_when in podman(["logs", container], ns.env, check=False).stdout, 600, 2)
            # the pod's stop as the kubelet does it: SIGTERM to the container's first process, SIGKILL after
            # terminationGracePeriodSeconds, the pod's network (its sandbox) kept until the container has ended.
            # Not `podman pod stop`: it stops the pod's infra container at once, and its network goes with it,
            # under the head's Ray (the dashboard then reached neither the GCS nor the job's agent)
            grace = head["spec"]["terminationGracePeriodSeconds"]
            podman(["stop", "-t", str(grace), f"{names.head_pod}-ray-head"], ns.env, timeout=grace + 60)
            ns.head_logs = podman(["logs", f"{names.head_pod}-ray-head"], ns.env, check=False).stdout
            # the submitter sees its job STOPPED, or loses the head; KubeRay's submitter Job ends then (its
            # backoffLimit): here the submitter is given a minute, then stopped as its Job's end would
            try:
                code = wait_exited(container, ns.env, 60)
            except subprocess.TimeoutExpired:
                podman(["stop", "-t", "5", container], ns.env, timeout=60)
                code = wait_exited(container, ns.env, 60) or 1
        else:
            code = wait_exited(container, ns.env, 600)
        logs = podman(["logs", container], ns.env).stdout
        ns.costs[f"night {label}"] = time.monotonic() - started
        return code, logs
    finally:
        for path in paths:
            ns.down(path)


def night_outcome(logs: str) -> dict:
    """podium run's --json outcome, the last JSON line of the job's logs."""
    for line in reversed(logs.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(f"no outcome in the night's logs:\n{logs[-4000:]}")


def deployment_pod(ns: Namespace, file: str) -> str:
    """The pod podman made of a file's Deployment (`<name>-pod`, or `<name>-pod-0` in podman 4.3)."""
    (deployment,) = [d for d in yaml.safe_load_all((ns.k8s / file).read_text()) if d["kind"] == "Deployment"]
    name = deployment["metadata"]["name"]
    (pod,) = [p for p in podman(["pod", "ps", "--format", "{{.Name}}"], ns.env).stdout.split()
              if p in (f"{name}-pod", f"{name}-pod-0")]
    return pod


def serve_pod(ns: Namespace) -> str:
    return pod_ip(deployment_pod(ns, "serve.yaml"), NETWORK, ns.env)


def invocation(ns: Namespace) -> bytes:
    import pyarrow.parquet as pq

    table = pq.read_table(ns.folder / "data" / "val.parquet").slice(0, 2).to_pandas()
    features = [c for c in table.columns if c != "label"]
    return json.dumps({"dataframe_split": {"columns": features, "data": table[features].values.tolist()}}).encode()


def test_a_night_in_containers_is_promoted_and_served_by_the_serve_pod(cluster_ns):
    """2. kubectl apply -f k8s/ on a fresh volume: the ConfigMap, serving (the CronJob is the nights here, the worker
    its own test). The serve pod's init container makes the serving location, so that `podium serve` runs before
    the first promotion, not ready (/ping 503) and not restarted; the first night promotes and the pod serves it."""
    ns = cluster_ns
    serve = ns.k8s / "serve-played.yaml"
    write_manifests(serve, [init_always(without_shm(d)) if d["kind"] == "Deployment" else d
                            for d in yaml.safe_load_all((ns.k8s / "serve.yaml").read_text())])
    ns.play(serve)
    ip = serve_pod(ns)
    wait_for("the serve pod runs, not ready (no champion yet)",
             lambda: call(f"http://{ip}:8000/ping", timeout_s=5).status == 503, 300, 2)
    serve_container = f"{deployment_pod(ns, 'serve.yaml')}-podium-serve"
    state = container_state(serve_container, ns.env)
    assert state["Status"] == "running", state
    assert json.loads(podman(["inspect", serve_container], ns.env).stdout)[0]["RestartCount"] == 0
    # the serve pod's Ray is taken away while the night trains (2 cores: the night's driver's 5-s check of the
    # Prefect server timed out under its load), then played again (kubectl rollout restart)
    ns.down(serve)
    code, logs = run_night(ns, "first")
    ns.play(serve)
    ip = serve_pod(ns)
    assert code == 0, logs[-4000:]
    outcome = night_outcome(logs)
    assert outcome["promoted"]["version"] == "v000001", outcome
    answer = wait_for("the serve pod serves the promoted version",
                      lambda: (a := call(f"http://{ip}:8000/invocations", invocation(ns))).status == 200 and a, 300, 2)
    assert answer.version == "v000001" and len(json.loads(answer.body)["predictions"]) == 2, answer
    assert call(f"http://{ip}:8000/ping").status == 200
    ns.first_night_served = True


def test_the_prefect_workers_pod_picks_up_a_flow_run_of_the_work_pool(cluster_ns, prefect_api):
    """production.md's work pool steps against the test's Prefect server, and the worker's Deployment played: its
    pod polls the pool and takes the flow run. The Job it would then make needs a Kubernetes API, which podman has
    not: the flow run ends Crashed with the worker's reason (not run here: the flow run's Job)."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    ns = cluster_ns
    env = {**os.environ, "PREFECT_API_URL": prefect_api}
    pool = json.loads((ns.k8s / "prefect" / "work-pool.json").read_text())
    pool_name = pool["job_configuration"]["job_manifest"]["spec"]["template"]["metadata"]["labels"][
        "app.kubernetes.io/instance"]
    prefect = str(Path(sys.executable).parent / "prefect")
    subprocess.run([prefect, "work-pool", "create", pool_name, "--type", "kubernetes", "--base-job-template",
                    str(ns.k8s / "prefect" / "work-pool.json")], env=env, check=True, capture_output=True)
    deployed = subprocess.run([sys.executable, "-m", "podium.deployments", "deploy", "--pool", pool_name, "--config",
                               str(ns.folder / "podium.toml"), "--home", f"{MOUNT}/home"], env=env,
                              capture_output=True, text=True)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    ns.play(ns.k8s / "prefect-worker.yaml")
    flow_run = run_deployment("promote-run/promote-on-demand", timeout=0)

    def taken():
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(flow_run.id).state
        return state if state is not None and state.type.value not in ("SCHEDULED",) else None

    state = wait_for("the worker's pod takes the flow run", taken, 180, 2)
    logs = podman(["logs", f"{deployment_pod(ns, 'prefect-worker.yaml')}-prefect-worker"], ns.env, check=False)
    assert str(flow_run.id) in logs.stdout + logs.stderr, logs.stdout[-3000:] + logs.stderr[-3000:]
    assert state.type.value in ("PENDING", "RUNNING", "CRASHED", "FAILED"), state


def on_volume(ns: Namespace, path: str) -> Path:
    """A file of the shared volume, where this machine's podman keeps it (a pod's `path` under the mount)."""
    mountpoint = podman(["volume", "inspect", VOLUME, "--format", "{{.Mountpoint}}"], ns.env).stdout.strip()
    return Path(mountpoint) / Path(path).relative_to(MOUNT)


def registry_state(ns: Namespace, run_name: str | None = None) -> tuple[str, list, list]:
    """(the serving location's CURRENT, the model's aliases, the MLflow statuses of `run_name`'s runs), read from
    the shared volume (the MLflow store is its SQLite file: a copy is read, the pods may be writing)."""
    import shutil
    import sqlite3

    current = on_volume(ns, f"{ns.night['serving']}/CURRENT")
    copy = ns.folder / "mlflow-read.db"
    shutil.copyfile(on_volume(ns, f"{MOUNT}/home/mlflow.db"), copy)
    with sqlite3.connect(copy) as db:
        aliases = db.execute("SELECT alias, version FROM registered_model_aliases WHERE name = ? ORDER BY alias",
                             (ns.night["model"],)).fetchall()
        runs = db.execute("SELECT status FROM runs WHERE name = ?", (run_name,)).fetchall()
    return (current.read_text() if current.exists() else ""), aliases, [r[0] for r in runs]


def test_a_night_whose_head_pod_is_stopped_ends_as_podiums_stop_does(cluster_ns):
    """The head pod, where the night's `podium run` drives, stopped (SIGTERM, as a deletion, an eviction or a
    drain sends) once a checkpoint is saved: its first process, `podium k8s ray-head`, stops the night's job
    through Ray's job API, so that `podium run` gets the SIGTERM and ends the night as podium's stop does: the
    MLflow run KILLED, the flow run Cancelled, CURRENT and @champion as before, the served version the one before
    the night."""
    from tests.helpers.prefect_queries import flow_run_state

    ns = cluster_ns
    if not ns.first_night_served:
        pytest.skip("the first night was not served")
    before = call(f"http://{serve_pod(ns)}:8000/invocations", invocation(ns)).version
    current_before, champion_before, _ = registry_state(ns)
    assert current_before and champion_before, (current_before, champion_before)
    code, logs = run_night(ns, "stopped", stop_when="checkpoint step")
    run_names = re.findall(r"k8s-podman-\d{8}-\d{6}", logs)
    assert run_names, logs[-4000:]
    ns.stopped_run = run_names[0]
    said = ns.head_logs + logs
    # the pod's SIGTERM reached the head's first process, which stopped the job; Ray SIGTERMed the driver, and
    # podium's own stop ended the night (its line, in the job's log the head shows)
    assert "podium k8s ray-head: SIGTERM: stopping the running jobs first" in ns.head_logs, ns.head_logs[-4000:]
    assert re.search(r"podium k8s ray-head: job \S+: STOPPED", ns.head_logs), ns.head_logs[-4000:]
    assert "podium: stopped by SIGTERM" in said, said[-4000:]
    current_after, champion_after, statuses = registry_state(ns, ns.stopped_run)
    assert statuses == ["KILLED"], statuses
    state = flow_run_state(f"{ns.stopped_run}-run", timeout=60)
    assert state is not None and state.type.value == "CANCELLED", state
    assert (current_after, champion_after) == (current_before, champion_before)
    assert call(f"http://{serve_pod(ns)}:8000/invocations", invocation(ns)).version == before


def test_the_next_night_runs_on_a_new_cluster(cluster_ns):
    """A second whole night after the stopped one: a new cluster, a run of its own, the serve pod still serving."""
    if not cluster_ns.first_night_served:
        pytest.skip("the first night was not served")
    code, logs = run_night(cluster_ns, "second")
    assert code == 0, logs[-4000:]
    outcome = night_outcome(logs)
    assert outcome["run_name"].startswith("k8s-podman-"), outcome
    assert outcome["run_name"] != cluster_ns.stopped_run, outcome
    answer = call(f"http://{serve_pod(cluster_ns)}:8000/invocations", invocation(cluster_ns))
    assert answer.status == 200 and answer.version in ("v000001", "v000002"), answer
