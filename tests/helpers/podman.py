"""podman standing in for a Kubernetes node (tests/integration/test_k8s_podman.py).

- podium's image built with no registry image: a debootstrap rootfs of Debian bookworm (python3 3.11, as the venv's
  cp311 wheels want) imported as the base, then deployments/image/Containerfile from a wheelhouse made here. Each
  piece is cached by a hash of its inputs: the base by its package list, the wheelhouse by constraints.txt and
  pyproject.toml, the image by those, the Containerfile and podium's source (podium's own wheel is the image's last
  layer: a code change rebuilds that layer only).
- podman's settings for this machine: runc (crun refuses its hybrid cgroups), netavark with aardvark-dns (names
  between pods), default ulimits within the hard limits.
- KubeRay's part, which podman cannot play: the head and worker pods of a RayJob's rayClusterSpec, started with the
  `ray start` commands KubeRay generates from rayStartParams, and the submitter's `ray job submit`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.helpers.s3_server import pipe  # one direction of a relayed connection

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "deployments" / "image" / "Containerfile"
# the base: Debian's minimal system and what the Containerfile and Ray use (venv, useradd, ps)
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-venv", "passwd", "procps", "ca-certificates")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# the wheelhouse's requirements beside podium[k8s]: torch pinned first (a bare torch is a CUDA build of GBs), and
# redis's async-timeout, which it needs on the image's Python (bookworm's 3.11.2, before 3.11.3) and a newer Python
# resolving the wheelhouse leaves out (the Containerfile's `pip check` refuses the image without it)
WHEELS = ("torch==2.13.0", "async-timeout")
# podium's own code, installed in the image's last layer
SOURCE_DIRS = ("podium", "flows", "tasks", "training", "deployments")
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]

[network]
network_backend = "netavark"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
helper_binaries_dir = ["/usr/lib/podman", "/usr/libexec/podman"]
"""


def podman_present() -> str | None:
    """Why the podman tests cannot run here (None: they can): podman, runc, netavark, aardvark-dns, debootstrap and
    iptables (netavark's firewall) are Debian packages that .ci/run installs."""
    missing = [tool for tool in ("podman", "runc", "debootstrap", "iptables") if shutil.which(tool) is None]
    missing += [name for name in ("netavark", "aardvark-dns") if not any(
        Path(d, name).exists() for d in ("/usr/lib/podman", "/usr/libexec/podman"))]
    return f"not installed: {', '.join(missing)} (apt-get install podman runc netavark aardvark-dns debootstrap " \
           "iptables)" if missing else None


def podman_env(folder: Path) -> dict[str, str]:
    """The environment of podman commands: this machine's containers.conf (CONTAINERS_CONF)."""
    folder.mkdir(parents=True, exist_ok=True)
    conf = folder / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def podman(args: list[str], env: dict[str, str], check: bool = True, timeout: float = 600,
           stdin: Any = None) -> subprocess.CompletedProcess[str]:
    """One podman command; its output in the failure's message."""
    proc = subprocess.run(["podman", *args], env=env, capture_output=True, text=True, timeout=timeout, stdin=stdin)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {shlex.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:16]


def _files_digest(paths: list[Path]) -> str:
    return _digest(*(p.relative_to(ROOT).as_posix().encode() + b"\0" + p.read_bytes() for p in paths))


def _source_files() -> list[Path]:
    return sorted(p for d in SOURCE_DIRS for p in (ROOT / d).rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


def image_exists(tag: str, env: dict[str, str]) -> bool:
    return podman(["image", "exists", tag], env, check=False).returncode == 0


def ensure_base(env: dict[str, str], cache: Path) -> str:
    """The base image, a debootstrap rootfs of Debian imported (`podman import`, its PATH set: a bare rootfs has no
    environment); made once per package list."""
    tag = f"localhost/podium-base:{DEBIAN_SUITE}-{_digest(DEBIAN_SUITE.encode(), ' '.join(BASE_PACKAGES).encode())}"
    if image_exists(tag, env):
        return tag
    rootfs = Path(tempfile.mkdtemp(prefix="rootfs-", dir=cache))
    try:
        subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", DEBIAN_SUITE,
                        str(rootfs), DEBIAN_MIRROR], check=True, capture_output=True, timeout=900)
        for cached in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in (rootfs / cached).glob("*"):
                if item.is_file():
                    item.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        podman(["import", "--change", f"ENV=PATH={PATH}", "--change", 'CMD=["/bin/bash"]', "-", tag], env,
               stdin=tar.stdout)
        assert tar.wait() == 0
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)
    return tag


def ensure_wheelhouse(cache: Path) -> Path:
    """podium's dependencies as wheels (torch first, pinned: the CPU build), resolved by pip with constraints.txt;
    made once per constraints.txt and pyproject.toml."""
    key = _digest(_files_digest([ROOT / "constraints.txt", ROOT / "pyproject.toml"]).encode(), *map(str.encode, WHEELS))
    house = cache / f"wheels-{key}"
    if house.is_dir():
        return house
    building = Path(tempfile.mkdtemp(prefix="wheels-", dir=cache))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "-c", str(ROOT / "constraints.txt"), "-w",
                    str(building), *WHEELS[:1], f"{ROOT}[k8s]", *WHEELS[1:]], check=True, capture_output=True,
                   timeout=900)
    for own in building.glob("podium-*.whl"):  # podium itself is the image's last layer
        own.unlink()
    for old in cache.glob("wheels-*"):  # the wheelhouses of older inputs (not the one just made)
        if old != building:
            shutil.rmtree(old, ignore_errors=True)
    building.rename(house)
    return house


def _can_build_here() -> bool:
    """Whether this Python builds podium's wheel without an isolated build environment: pyproject.toml's setuptools
    (>= 68) with a bdist_wheel (its own from 70.1, else the `wheel` package). Otherwise pip makes one from the index."""
    if importlib.util.find_spec("setuptools") is None:
        return False
    from importlib.metadata import version

    major_minor = tuple(int(p) for p in version("setuptools").split(".")[:2] if p.isdigit())
    return major_minor >= (70, 1) or (major_minor >= (68,) and importlib.util.find_spec("wheel") is not None)


@dataclass
class Image:
    tag: str
    built: bool  # False: the cached image of the same inputs
    build_s: float
    size_mb: float


def ensure_image(env: dict[str, str], cache: Path) -> Image:
    """podium's image of this checkout, `localhost/podium:<hash of its inputs>`: built when no image of the same
    inputs is there (the base, the wheelhouse and the dependency layer each cached apart)."""
    cache.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    key = _files_digest([CONTAINERFILE, ROOT / "constraints.txt", ROOT / "pyproject.toml", *_source_files()])
    tag = f"localhost/podium:{key}"
    built = not image_exists(tag, env)
    if built:
        base = ensure_base(env, cache)
        house = ensure_wheelhouse(cache)
        context = Path(tempfile.mkdtemp(prefix="context-", dir=cache))
        try:
            shutil.copytree(house, context / "wheels", copy_function=os.link)  # hard links: no copy of 500 MB
            isolation = ["--no-build-isolation"] if _can_build_here() else []
            subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w",
                            str(context / "dist"), str(ROOT)], check=True, capture_output=True, timeout=300)
            podman(["build", "--build-arg", f"BASE={base}", "-f", str(CONTAINERFILE), "-t", tag, str(context)], env,
                   timeout=1200)
        finally:
            shutil.rmtree(context, ignore_errors=True)
        # the images of older inputs (their dependency layer stays while the new image shares it)
        for line in podman(["images", "--format", "{{.Repository}}:{{.Tag}}", "localhost/podium"], env).stdout.split():
            if line != tag:
                podman(["rmi", line], env, check=False)
    size = json.loads(podman(["image", "inspect", tag], env).stdout)[0]["Size"]
    return Image(tag, built, time.monotonic() - started, size / 2**20)


# --- KubeRay's part: the pods of a RayJob's cluster, as its controller makes them --------------------------------

def memory_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity in bytes ('3Gi' -> 3221225472), as resource.Quantity.Value() gives it."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    for unit, factor in units.items():
        if quantity.endswith(unit):
            return int(float(quantity[: -len(unit)]) * factor)
    return int(quantity)


def ray_start_command(node_type: str, params: dict[str, str], resources: dict[str, Any], head_fqdn: str,
                      head_port: str = "6379") -> str:
    """The `ray start` command KubeRay 1.x puts in a Ray container, from the group's rayStartParams and the
    container's resources: ray-operator/controllers/ray/common/pod.go, setMissingRayStartParams (a worker's
    `address` is the head service's FQDN and port; the head's `dashboard-host` 0.0.0.0; `metrics-export-port` 8080;
    `block`; `dashboard-agent-listen-port` 52365), generateRayStartCommand (`num-cpus` and `memory` from the
    limits, `num-gpus` from a limit named *gpu) and convertParamMap (flags sorted, "true" as a bare flag); BuildPod
    runs it as `ulimit -n ${RAY_START_ULIMIT_OPEN_FILES:-65536}; <command>` in `/bin/bash -lc --`, unless the
    template's ray.io/overwrite-container-cmd annotation is "true" (the container's own command is kept; the
    generated one is in KUBERAY_GEN_RAY_START_CMD either way)."""
    params = dict(params)
    if node_type == "worker":
        params.setdefault("address", f"{head_fqdn}:{head_port}")
    else:
        params.setdefault("dashboard-host", "0.0.0.0")
    params.setdefault("metrics-export-port", "8080")
    params["block"] = "true"
    params.setdefault("dashboard-agent-listen-port", "52365")
    limits = resources.get("limits", {})
    if "num-cpus" not in params and "cpu" in limits:
        params["num-cpus"] = str(int(float(limits["cpu"])))
    if "memory" not in params and "memory" in limits:
        params["memory"] = str(memory_bytes(limits["memory"]))
    for key in sorted(limits):
        if key.endswith("gpu") and "num-gpus" not in params:
            params["num-gpus"] = str(limits[key])
    flags = []
    for option in sorted(params):
        value = params[option]
        if value.lower() in ("true", "false") and option not in ("log-color", "include-dashboard"):
            if value.lower() == "true":
                flags.append(f"--{option}")
        else:
            flags.append(f"--{option}={value}")
    return f"ray start {'--head ' if node_type == 'head' else ''}{' '.join(flags)}"


@dataclass
class RayClusterNames:
    """KubeRay's names of one RayJob's cluster (utils.GenerateRayClusterName, GenerateHeadServiceName)."""

    rayjob: str
    namespace: str

    @property
    def cluster(self) -> str:
        return f"{self.rayjob}-rc"

    @property
    def head_pod(self) -> str:
        return f"{self.cluster}-head"

    @property
    def head_service(self) -> str:
        return f"{self.cluster}-head-svc"

    @property
    def head_fqdn(self) -> str:
        return f"{self.head_service}.{self.namespace}.svc.cluster.local"

    def worker_pod(self, group: str, index: int) -> str:
        return f"{self.cluster}-{group}-worker-{index}"


def ray_node_pod(rayjob: dict[str, Any], names: RayClusterNames, node_type: str, pod_name: str,
                 group: dict[str, Any], host_aliases: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Ray node's Pod as KubeRay's BuildPod makes it of a group's template: the Ray container's command replaced by
    the generated `ray start`, KubeRay's environment added (RAY_ADDRESS, FQ_RAY_IP, KUBERAY_GEN_RAY_START_CMD...).
    `host_aliases` stands in for the head's Service (the head pod's address under its service's names)."""
    template = json.loads(json.dumps(group["template"]))
    spec = template["spec"]
    ray = spec["containers"][0]
    start = ray_start_command(node_type, group.get("rayStartParams", {}), ray.get("resources", {}), names.head_fqdn)
    # BuildPod keeps the container's own command where the template says so (the ray.io/overwrite-container-cmd
    # annotation: the rendered head's `podium k8s ray-head`, which runs KUBERAY_GEN_RAY_START_CMD itself)
    overwrite = template.get("metadata", {}).get("annotations", {}).get("ray.io/overwrite-container-cmd", "")
    if overwrite.lower() != "true":
        ray["command"] = ["/bin/bash", "-lc", "--"]
        ray["args"] = [f"ulimit -n ${{RAY_START_ULIMIT_OPEN_FILES:-65536}}; {start}"]
    env = ray.setdefault("env", [])
    env += [{"name": "RAY_CLUSTER_NAME", "value": names.cluster},
            {"name": "KUBERAY_GEN_RAY_START_CMD", "value": start}, {"name": "RAY_PORT", "value": "6379"},
            {"name": "RAY_USAGE_STATS_ENABLED", "value": "0"}]
    if node_type == "head":
        env.append({"name": "RAY_ADDRESS", "value": "127.0.0.1:6379"})
    else:
        env += [{"name": "FQ_RAY_IP", "value": names.head_fqdn}, {"name": "RAY_IP", "value": names.head_service},
                {"name": "RAY_ADDRESS", "value": f"{names.head_fqdn}:6379"}]
    if host_aliases:
        spec["hostAliases"] = host_aliases
    labels = {**template.get("metadata", {}).get("labels", {}), "ray.io/cluster": names.cluster,
              "ray.io/node-type": node_type, "ray.io/group": group.get("groupName", "headgroup")}
    meta: dict[str, Any] = {"name": pod_name, "namespace": names.namespace, "labels": labels}
    if template.get("metadata", {}).get("annotations"):
        meta["annotations"] = template["metadata"]["annotations"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def submitter_pod(rayjob: dict[str, Any], names: RayClusterNames, submission_id: str,
                  host_aliases: list[dict[str, Any]]) -> dict[str, Any]:
    """The RayJob's submitter (submissionMode K8sJobMode) of its submitterPodTemplate, with the command KubeRay's
    ray-operator/controllers/ray/common/job.go GetK8sJobCommand builds: follow the job if it was submitted, else
    `ray job submit --address http://<head service>:8265 --submission-id <id> -- <entrypoint>`."""
    template = json.loads(json.dumps(rayjob["spec"]["submitterPodTemplate"]))
    spec = template["spec"]
    address = f"http://{names.head_fqdn}:8265"
    entrypoint = rayjob["spec"]["entrypoint"].strip()
    command = (f"if ray job status --address {address} {submission_id} >/dev/null 2>&1 ; then ray job logs "
               f"--address {address} --follow {submission_id} ; else ray job submit --address {address} "
               f"--submission-id {submission_id} -- {entrypoint} ; fi")
    spec["containers"][0].update(command=["/bin/bash", "-c", "--"], args=[command],
                                 env=[{"name": "RAY_DASHBOARD_ADDRESS", "value": address},
                                      {"name": "RAY_JOB_SUBMISSION_ID", "value": submission_id}])
    spec["hostAliases"] = host_aliases
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{names.rayjob}-submitter", "namespace": names.namespace,
                         "labels": template.get("metadata", {}).get("labels", {})}, "spec": spec}


def write_manifests(path: Path, docs: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def pod_ip(pod: str, network: str, env: dict[str, str]) -> str:
    """A pod's address on the network (its infra container's)."""
    infra = json.loads(podman(["pod", "inspect", pod], env).stdout)
    infra = infra[0] if isinstance(infra, list) else infra
    info = json.loads(podman(["inspect", infra["InfraContainerID"]], env).stdout)[0]
    return info["NetworkSettings"]["Networks"][network]["IPAddress"]


def container_state(container: str, env: dict[str, str]) -> dict[str, Any]:
    return json.loads(podman(["inspect", container], env).stdout)[0]["State"]


def wait_exited(container: str, env: dict[str, str], timeout_s: float) -> int:
    """The exit code of a container that runs to its end (`podman wait`)."""
    out = podman(["wait", container], env, timeout=timeout_s).stdout.strip()
    return int(out.splitlines()[-1])


class Relay:
    """A TCP relay from an address the pods reach (the network's gateway, on this machine) to a server of the test
    that listens on loopback (the test's Prefect server): what a Service in front of an external server is."""

    def __init__(self, listen_host: str, target: tuple[str, int]):
        self.target = target
        self.server = socket.socket()
        # IP_FREEBIND: the gateway's address is on the network's bridge only once a pod joins the network
        self.server.setsockopt(socket.SOL_IP, getattr(socket, "IP_FREEBIND", 15), 1)
        self.server.bind((listen_host, 0))
        self.server.listen()
        self.address = self.server.getsockname()[:2]
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=pipe, args=(a, b), daemon=True).start()

    def close(self) -> None:
        self.stopped.set()
        self.server.close()


CACHE = Path(os.environ.get("PODIUM_IMAGE_CACHE", Path.home() / ".cache" / "podium-image"))


# `.ci/run` builds the image ahead of the podman test, beside its other steps (python -m tests.helpers.podman)
if __name__ == "__main__":
    import tempfile as _tempfile

    if podman_present() is not None:
        print(f"podium's image not built: {podman_present()}")
        sys.exit(0)
    with _tempfile.TemporaryDirectory() as work:
        made = ensure_image(podman_env(Path(work)), CACHE)
    print(f"podium's image {made.tag}: {'built' if made.built else 'cached'} in {made.build_s:.0f} s "
          f"({made.size_mb:.0f} MiB)")
