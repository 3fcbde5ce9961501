"""Kubernetes manifests of podium's jobs: a KubeRay RayJob for the nightly training, a Deployment for
`podium serve`, a Prefect Kubernetes worker and its work pool's base job template.

    podium k8s render --config podium.toml --cluster cluster.toml --out k8s/

Every function here is pure: a podium config and the cluster's settings in, plain dicts out (the CLI writes them
as YAML and JSON). Nothing here talks to a cluster. Credentials never appear in a manifest: pods read them from
Secrets the team creates (`secretKeyRef`, `envFrom`, a mounted key file), named in the cluster settings.

What podium's deployments declare (the nightly run name gets `-{date}`, the nightly keeps a bounded number of
checkpoints, the work pool's name) is read from `podium.deployments.definitions`, so that a RayJob's run and a
Prefect deployment's run of the same config are the same run.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from podium.config import PipelineConfig, format_validation_error
from podium.core.redaction import has_password
from podium.core.version import __version__ as podium_version
from podium.deployments.definitions import WORK_POOL, nightly_config
from podium.errors import ConfigError

RAY_VERSION = "2.60.0"  # the Ray podium pins (pyproject.toml): the cluster's Ray must be the driver's
KUBERNETES_VERSION = "1.37.0"  # the API version the manifests are validated against (tests/unit/test_k8s_render.py)
CONFIG_FILE = "podium.json"
CONFIG_DIR = "/etc/podium"
STORE_KEY_DIR = "/var/run/secrets/podium/store"  # a GCS service account's key file, mounted from its Secret
GCS_KEY_FILE = "key.json"
PART_OF = "podium"
# object stores by the schemes podium accepts for them (podium.storage.backends)
STORE_SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure"}
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # an RFC 1123 label: names, namespaces
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
# registry[:port]/path[:tag]: the path lower-case (distribution's reference grammar, simplified)
NAME_REF_RE = re.compile(r"^[A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)+(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$")


class SecretKey(BaseModel):
    """One key of a Secret: a value a pod reads from the Secret, never from the manifest."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1, description="The Secret's name.")
    key: str = Field(min_length=1, description="The key inside it.")


class ClusterSettings(BaseModel):
    """Where podium's pods run and what they reach: a TOML file beside the podium config (`--cluster`)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    namespace: str = Field("podium", description="Namespace of every resource.")
    image: str | None = Field(None, description="podium's image (deployments/image/Containerfile: podium with the "
                              f"k8s extra, Ray {RAY_VERSION} on every node and the driver), in a registry the cluster "
                              "pulls from: registry/repository:tag, or better registry/repository@sha256:<digest>, "
                              "which every pod then runs unchanged. Required to render.")
    image_pull_policy: Literal["IfNotPresent", "Always", "Never"] = "IfNotPresent"
    service_account: str = Field("podium", description="Service account of podium's pods and of the Prefect worker.")
    prefect_api_url: str = Field("http://prefect-server:4200/api", description="PREFECT_API_URL of every pod.")
    mlflow_tracking_uri: str = Field("http://mlflow:5000", description="MLFLOW_TRACKING_URI of every pod, when it "
                                     "holds no credentials (an `mlflow server`).")
    mlflow_tracking_uri_secret: SecretKey | None = Field(
        None, description="The tracking URI from a Secret instead (a database URI with its password, "
        "postgresql://user:password@host/db): it wins over mlflow_tracking_uri.")
    mlflow_auth_secret: str | None = Field(
        None, description="A Secret holding MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (MLflow's "
        "basic-auth app), read whole into each pod's environment.")
    store_secrets: dict[Literal["s3", "gcs", "azure"], str] = Field(
        default_factory=dict, description="The Secret of each object store the config uses: s3 (keys "
        "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), azure (AZURE_STORAGE_CONNECTION_STRING, or "
        "AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY), read whole into the environment; gcs (a "
        f"service account's key under `{GCS_KEY_FILE}`), mounted as a file for GOOGLE_APPLICATION_CREDENTIALS.")
    s3_endpoint_url: str | None = Field(None, description="An S3-compatible endpoint (MinIO, Ceph): "
                                        "PODIUM_S3_ENDPOINT_URL and MLFLOW_S3_ENDPOINT_URL. None: AWS S3.")
    shared_volume_claim: str | None = Field(
        "podium-shared", description="A ReadWriteMany PersistentVolumeClaim mounted on every pod at shared_mount: "
        "where local paths of the config live (podium's home, storage and serving by default). None: no volume; "
        "every location of the config must then be an object store.")
    shared_mount: str = Field("/var/lib/podium", description="Where the shared volume is mounted.")
    head_memory: str = Field("8Gi", description="Memory of the Ray head (the driver, validations, Ray Data).")
    worker_memory: str = Field("8Gi", description="Memory of each training worker's pod.")
    active_deadline_s: int = Field(6 * 3600, ge=1, description="RayJob activeDeadlineSeconds: a training running "
                                   "longer fails (podium's outcome: timed out, exit 1).")
    backoff_limit: int = Field(1, ge=0, description="RayJob backoffLimit: new attempts, each on a new cluster, after "
                               "a failed one; podium resumes the run from its latest checkpoint.")
    ttl_after_finished_s: int = Field(3600, ge=0, description="RayJob ttlSecondsAfterFinished: the finished cluster "
                                      "and job are deleted this long after the end.")
    work_pool: str = Field("", description="Prefect Kubernetes work pool (default: podium's work pool name).")
    flow_run_ttl_s: int = Field(86400, ge=0, description="finished_job_ttl of the work pool's flow-run Jobs.")
    flow_run_cpu: str = Field("2", description="CPU request of a flow-run pod (the flow runs a local Ray when "
                              "ray_address is None).")
    flow_run_memory: str = Field("8Gi", description="Memory request of a flow-run pod.")
    ray_address: str | None = Field(None, description="RAY_ADDRESS of the work pool's flow runs (a RayCluster's head "
                                    "service, e.g. podium-head-svc:6379). None: each flow run starts Ray in its pod.")
    serve_replicas: int = Field(1, ge=1, description="Replicas of the model in `podium serve` (Ray Serve replicas "
                                "in its pod).")
    serve_cpus: float = Field(1.0, gt=0, description="CPUs of each Serve replica.")
    serve_memory: str = Field("4Gi", description="Memory of the `podium serve` pod.")
    serve_port: int = Field(8000, ge=1, le=65535, description="HTTP port of `podium serve` and its Service.")

    @field_validator("image")
    @classmethod
    def _check_image(cls, v: str | None) -> str | None:
        if v is not None:
            check_image(v)
        return v

    @field_validator("namespace", "service_account")
    @classmethod
    def _check_name(cls, v: str) -> str:
        if not NAME_RE.match(v) or len(v) > 63:
            raise ValueError("expected a Kubernetes name: lower-case letters, digits and '-', at most 63")
        return v

    @field_validator("prefect_api_url", "mlflow_tracking_uri", "s3_endpoint_url")
    @classmethod
    def _no_credentials(cls, v: str | None) -> str | None:
        if v is not None and has_password(v):
            raise ValueError("credentials in a manifest are not accepted: put the URI in a Secret and name it in "
                             "mlflow_tracking_uri_secret (or the store's secret)")
        return v

    @field_validator("shared_mount")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("expected an absolute path")
        return v.rstrip("/") or "/"


def check_image(image: str) -> None:
    """Refuse (ValueError) an image reference a cluster could not pull reproducibly: one without a registry (a bare
    `podium:0.1.0` means Docker Hub's library, which holds no podium), or a digest that is not a sha256 one."""
    name, _, digest = image.partition("@")
    if digest and not DIGEST_RE.match(digest):
        raise ValueError(f"{image!r} has a malformed digest: expected @sha256: and 64 hex digits")
    first, slash, _ = name.partition("/")
    if not slash or not ("." in first or ":" in first or first == "localhost"):
        raise ValueError(f"{image!r} names no registry: expected registry/repository:tag or "
                         "registry/repository@sha256:<digest> (e.g. registry.example.com/ml/podium:0.1.0), the image "
                         "built from deployments/image/Containerfile and pushed where the cluster pulls from")
    if not NAME_REF_RE.match(name):
        raise ValueError(f"{image!r} is not an image reference: expected registry/repository[:tag][@sha256:<digest>]")


def load_cluster_settings(data: dict[str, Any]) -> ClusterSettings:
    """The cluster settings of a parsed TOML/JSON table; ConfigError naming each bad field."""
    try:
        return ClusterSettings.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, "cluster.").replace("invalid configuration", "invalid cluster "
                                                                               "settings", 1)) from None


def home_of(cluster: ClusterSettings) -> str:
    """PODIUM_HOME of every pod: on the shared volume, where the config's default locations are filled from."""
    return str(PurePosixPath(cluster.shared_mount) / "home") if cluster.shared_volume_claim else "/tmp/podium-home"


def config_locations(config: PipelineConfig) -> dict[str, str]:
    """Every location of the config by its field: storage, serving, the data and the loop's datasets."""
    found = {"storage": config.storage, "serving": config.serving, "data.train": config.data.train,
             "data.val": config.data.val}
    found.update({f"training.loop_datasets.{k}": v for k, v in config.training.loop_datasets.items()})
    return {field: uri for field, uri in found.items() if uri}


def store_of(uri: str) -> str | None:
    """'s3', 'gcs', 'azure', 'userfs' for a URI, None for a local path."""
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
    if scheme == "file" or not scheme:
        return None
    return STORE_SCHEMES.get(scheme, scheme)


def check_renderable(config: PipelineConfig, cluster: ClusterSettings) -> None:
    """Refuse, in one sentence (ConfigError), a config whose pods could not run: a local path that pods on other
    nodes cannot reach, an object store without the Secret of its credentials."""
    if cluster.image is None:
        raise ConfigError("the cluster settings give no image: expected image = \"<registry>/<repository>@sha256:"
                          "<digest>\" (or :<tag>), podium's image built from deployments/image/Containerfile and "
                          "pushed where the cluster pulls from (or --image)")
    mount = PurePosixPath(cluster.shared_mount)
    for field, uri in config_locations(config).items():
        store = store_of(uri)
        if store is None:
            path = PurePosixPath(uri.removeprefix("file://"))
            if not cluster.shared_volume_claim:
                raise ConfigError(f"{field} = {uri!r} is a local path, and the cluster settings mount no shared "
                                  "volume (shared_volume_claim): expected an object-store URI (s3://, gs://, az://)")
            if not path.is_absolute() or not path.is_relative_to(mount):
                raise ConfigError(f"{field} = {uri!r} is a local path outside the shared volume mounted at {mount}, "
                                  "which pods on other nodes cannot reach: expected a path under "
                                  f"{mount} or an object-store URI (s3://, gs://, az://)")
        elif store in ("s3", "gcs", "azure") and store not in cluster.store_secrets:
            raise ConfigError(f"{field} = {uri!r} is on {store}, and the cluster settings name no Secret for its "
                              f"credentials: expected store_secrets.{store} = \"<the Secret's name>\" (credentials "
                              "are never written into a manifest)")
    if config.training.train_loop_config and any(
            isinstance(v, str) and has_password(v) for v in config.training.train_loop_config.values()):
        raise ConfigError("training.train_loop_config holds a URI with credentials, which the ConfigMap would "
                          "show: expected the credentials in a Secret, read from the environment")


def labels(component: str, cluster: ClusterSettings) -> dict[str, str]:
    """The recommended app.kubernetes.io labels of one of podium's resources."""
    return {"app.kubernetes.io/name": "podium", "app.kubernetes.io/instance": cluster.namespace,
            "app.kubernetes.io/component": component, "app.kubernetes.io/part-of": PART_OF,
            "app.kubernetes.io/version": podium_version, "app.kubernetes.io/managed-by": "podium-k8s-render"}


def metadata(name: str, component: str, cluster: ClusterSettings) -> dict[str, Any]:
    """A resource's name, namespace and labels."""
    return {"name": name, "namespace": cluster.namespace, "labels": labels(component, cluster)}


def stores_used(config: PipelineConfig) -> set[str]:
    """The object stores of the config's locations."""
    return {s for s in (store_of(u) for u in config_locations(config).values()) if s in ("s3", "gcs", "azure")}


def pod_env(config: PipelineConfig, cluster: ClusterSettings) -> list[dict[str, Any]]:
    """The environment of every podium pod: Prefect and MLflow, podium's home, the stores' endpoints; values with
    credentials only as references to Secrets."""
    env: list[dict[str, Any]] = [{"name": "PREFECT_API_URL", "value": cluster.prefect_api_url}]
    if cluster.mlflow_tracking_uri_secret:
        ref = cluster.mlflow_tracking_uri_secret
        env.append({"name": "MLFLOW_TRACKING_URI", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    else:
        env.append({"name": "MLFLOW_TRACKING_URI", "value": cluster.mlflow_tracking_uri})
    env.append({"name": "PODIUM_HOME", "value": home_of(cluster)})
    stores = stores_used(config)
    if "s3" in stores and cluster.s3_endpoint_url:
        env += [{"name": "PODIUM_S3_ENDPOINT_URL", "value": cluster.s3_endpoint_url},
                {"name": "MLFLOW_S3_ENDPOINT_URL", "value": cluster.s3_endpoint_url}]
    if "gcs" in stores:
        env.append({"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": f"{STORE_KEY_DIR}/{GCS_KEY_FILE}"})
    return env


def pod_env_from(config: PipelineConfig, cluster: ClusterSettings) -> list[dict[str, Any]]:
    """Secrets read whole into the environment: the S3 and Azure credentials, MLflow's basic auth."""
    names = [cluster.store_secrets[s] for s in ("s3", "azure") if s in stores_used(config)]
    if cluster.mlflow_auth_secret:
        names.append(cluster.mlflow_auth_secret)
    return [{"secretRef": {"name": name}} for name in dict.fromkeys(names)]


def pod_volumes(config: PipelineConfig, cluster: ClusterSettings,
                with_config: bool = True) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volume mounts) of a podium pod: the config, the shared volume, a GCS key file."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if with_config:
        volumes.append({"name": "podium-config", "configMap": {"name": "podium-config"}})
        mounts.append({"name": "podium-config", "mountPath": CONFIG_DIR, "readOnly": True})
    if cluster.shared_volume_claim:
        volumes.append({"name": "podium-shared", "persistentVolumeClaim": {"claimName": cluster.shared_volume_claim}})
        mounts.append({"name": "podium-shared", "mountPath": cluster.shared_mount})
    if "gcs" in stores_used(config):
        volumes.append({"name": "store-key", "secret": {"secretName": cluster.store_secrets["gcs"]}})
        mounts.append({"name": "store-key", "mountPath": STORE_KEY_DIR, "readOnly": True})
    return volumes, mounts


def container(name: str, config: PipelineConfig, cluster: ClusterSettings, resources: dict[str, Any],
              with_config: bool = True, **extra: Any) -> dict[str, Any]:
    """A podium container: the image, the environment, the mounts, the resources."""
    _, mounts = pod_volumes(config, cluster, with_config)
    out: dict[str, Any] = {"name": name, "image": cluster.image, "imagePullPolicy": cluster.image_pull_policy,
                           "env": pod_env(config, cluster), "resources": resources, **extra}
    env_from = pod_env_from(config, cluster)
    if env_from:
        out["envFrom"] = env_from
    if mounts:
        out["volumeMounts"] = mounts
    return out


def pod_spec(containers: list[dict[str, Any]], config: PipelineConfig, cluster: ClusterSettings,
             with_config: bool = True, **extra: Any) -> dict[str, Any]:
    """A pod spec of podium's service account, with podium's volumes."""
    volumes, _ = pod_volumes(config, cluster, with_config)
    spec: dict[str, Any] = {"serviceAccountName": cluster.service_account, "containers": containers, **extra}
    if volumes:
        spec["volumes"] = volumes
    return spec


def config_map(config: PipelineConfig, cluster: ClusterSettings) -> dict[str, Any]:
    """The ConfigMap holding the nightly run's podium config, mounted at /etc/podium/podium.json."""
    body = json.dumps(nightly_config(config).model_dump(mode="json"), indent=2, sort_keys=True)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata("podium-config", "config", cluster),
            "data": {CONFIG_FILE: body}}


def training_entrypoint() -> list[str]:
    """The nightly training's command: `podium run` with the mounted config, JSON outcome on stdout."""
    return ["podium", "run", "--config", f"{CONFIG_DIR}/{CONFIG_FILE}", "--json"]


def _cpus(value: float) -> int:
    return max(1, math.ceil(value))


def head_cpus(config: PipelineConfig) -> int:
    """Ray CPUs of the head: the driver's Ray Data reads and every concurrent validation (training runs on the
    workers)."""
    v = config.validation
    return _cpus(config.scaling.data_cpus + v.concurrency * (v.num_cpus + v.inner_cpus))


def quantity(value: float) -> str:
    """A CPU count as a Kubernetes quantity ('2', '1500m')."""
    return str(int(value)) if float(value).is_integer() else f"{round(value * 1000)}m"


def ray_cluster_spec(config: PipelineConfig, cluster: ClusterSettings) -> dict[str, Any]:
    """KubeRay's RayClusterSpec for a training: a head (driver, validations) and one worker group of
    scaling.num_workers pods, each with the CPUs (and GPU) of one Ray Train worker."""
    cpus = head_cpus(config)
    head_gpus = math.ceil(config.validation.concurrency * config.validation.num_gpus)
    head_res: dict[str, Any] = {"requests": {"cpu": str(cpus), "memory": cluster.head_memory},
                                "limits": {"cpu": str(cpus), "memory": cluster.head_memory}}
    head_params = {"dashboard-host": "0.0.0.0", "num-cpus": str(cpus)}
    if head_gpus:
        head_res["limits"]["nvidia.com/gpu"] = str(head_gpus)
        head_res["requests"]["nvidia.com/gpu"] = str(head_gpus)
        head_params["num-gpus"] = str(head_gpus)
    worker_cpus = _cpus(config.scaling.cpus_per_worker)
    worker_res: dict[str, Any] = {"requests": {"cpu": str(worker_cpus), "memory": cluster.worker_memory},
                                  "limits": {"cpu": str(worker_cpus), "memory": cluster.worker_memory}}
    worker_params = {"num-cpus": str(worker_cpus)}
    if config.scaling.use_gpu:
        worker_res["limits"]["nvidia.com/gpu"] = "1"
        worker_res["requests"]["nvidia.com/gpu"] = "1"
        worker_params["num-gpus"] = "1"
    ports = [{"containerPort": 6379, "name": "gcs-server"}, {"containerPort": 8265, "name": "dashboard"},
             {"containerPort": 10001, "name": "client"}]
    head = pod_spec([container("ray-head", config, cluster, head_res, ports=ports)], config, cluster)
    worker = pod_spec([container("ray-worker", config, cluster, worker_res)], config, cluster)
    if config.scaling.use_gpu:
        worker["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    n = config.scaling.num_workers
    return {
        "rayVersion": RAY_VERSION,
        "headGroupSpec": {"rayStartParams": head_params,
                          "template": {"metadata": {"labels": labels("ray-head", cluster)}, "spec": head}},
        "workerGroupSpecs": [{"groupName": "gpu-workers" if config.scaling.use_gpu else "workers",
                              "replicas": n, "minReplicas": n, "maxReplicas": n, "rayStartParams": worker_params,
                              "template": {"metadata": {"labels": labels("ray-worker", cluster)}, "spec": worker}}],
    }


def ray_job(config: PipelineConfig, cluster: ClusterSettings) -> dict[str, Any]:
    """The nightly training as a KubeRay RayJob: a cluster made for the run, `podium run` submitted to it, the
    cluster deleted when the job ends; a failed attempt retried on a new cluster (the run resumes from its latest
    checkpoint), a run past its deadline failed, the finished RayJob deleted after a while."""
    submitter_res = {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}
    return {
        "apiVersion": "ray.io/v1", "kind": "RayJob",
        "metadata": metadata("podium-nightly", "training", cluster),
        "spec": {
            "entrypoint": shlex.join(training_entrypoint()),
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": cluster.ttl_after_finished_s,
            "activeDeadlineSeconds": cluster.active_deadline_s,
            "backoffLimit": cluster.backoff_limit,
            "submissionMode": "K8sJobMode",
            "rayClusterSpec": ray_cluster_spec(config, cluster),
            "submitterPodTemplate": {
                "metadata": {"labels": labels("submitter", cluster)},
                "spec": {"serviceAccountName": cluster.service_account, "restartPolicy": "Never",
                         "containers": [{"name": "ray-job-submitter", "image": cluster.image,
                                         "imagePullPolicy": cluster.image_pull_policy,
                                         "resources": submitter_res}]}},
        },
    }


def serve_command(config: PipelineConfig, cluster: ClusterSettings) -> list[str]:
    """`podium serve` of the config's serving location, listening on every address of its pod."""
    return ["podium", "serve", "--serving", config.serving, "--host", "0.0.0.0", "--port", str(cluster.serve_port),
            "--replicas", str(cluster.serve_replicas), "--num-cpus", f"{cluster.serve_cpus:g}"]


def serve_deployment(config: PipelineConfig, cluster: ClusterSettings) -> list[dict[str, Any]]:
    """`podium serve` as a Deployment (one pod: its own Ray, Ray Serve's replicas in it) and its Service. One pod,
    recreated on update: the champion's switch is podium's, from the serving location, not a rolling update's."""
    cpus = _cpus(cluster.serve_cpus * cluster.serve_replicas + 1)  # the replicas, and Serve's proxy and controller
    res = {"requests": {"cpu": str(cpus), "memory": cluster.serve_memory},
           "limits": {"cpu": str(cpus), "memory": cluster.serve_memory}}
    probe = {"tcpSocket": {"port": "http"}, "periodSeconds": 10, "failureThreshold": 3}
    main = container("podium-serve", config, cluster, res, with_config=False, args=serve_command(config, cluster)[1:],
                     command=["podium"], ports=[{"containerPort": cluster.serve_port, "name": "http"}],
                     readinessProbe=probe, livenessProbe={**probe, "initialDelaySeconds": 120},
                     startupProbe={**probe, "failureThreshold": 60})
    selector = {"app.kubernetes.io/name": "podium", "app.kubernetes.io/component": "serve"}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata("podium-serve", "serve", cluster),
        "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": selector},
                 "template": {"metadata": {"labels": labels("serve", cluster)},
                              "spec": pod_spec([main], config, cluster, with_config=False,
                                               restartPolicy="Always", terminationGracePeriodSeconds=60)}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": metadata("podium-serve", "serve", cluster),
               "spec": {"selector": selector,
                        "ports": [{"name": "http", "port": cluster.serve_port, "targetPort": "http"}]}}
    return [deployment, service]


def work_pool_name(cluster: ClusterSettings) -> str:
    """The Kubernetes work pool's name: the cluster settings', else podium's work pool with `-k8s`."""
    return cluster.work_pool or f"{WORK_POOL}-k8s"


def worker_resources(cluster: ClusterSettings) -> list[dict[str, Any]]:
    """The Prefect Kubernetes worker: its service account, what it may do in the namespace (Jobs and their pods),
    and its Deployment (`prefect worker start --type kubernetes`)."""
    meta = lambda name: metadata(name, "prefect-worker", cluster)
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(cluster.service_account)}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta("podium-prefect-worker"),
            "rules": [{"apiGroups": ["batch"], "resources": ["jobs"],
                       "verbs": ["get", "list", "watch", "create", "delete", "patch"]},
                      {"apiGroups": [""], "resources": ["pods", "pods/log", "pods/status", "events"],
                       "verbs": ["get", "list", "watch"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": meta("podium-prefect-worker"),
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "podium-prefect-worker"},
               "subjects": [{"kind": "ServiceAccount", "name": cluster.service_account,
                             "namespace": cluster.namespace}]}
    selector = {"app.kubernetes.io/name": "podium", "app.kubernetes.io/component": "prefect-worker"}
    worker = {"name": "prefect-worker", "image": cluster.image, "imagePullPolicy": cluster.image_pull_policy,
              "command": ["prefect", "worker", "start", "--pool", work_pool_name(cluster), "--type", "kubernetes"],
              "env": [{"name": "PREFECT_API_URL", "value": cluster.prefect_api_url}],
              "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta("podium-prefect-worker"),
                  "spec": {"replicas": 1, "selector": {"matchLabels": selector},
                           "template": {"metadata": {"labels": labels("prefect-worker", cluster)},
                                        "spec": {"serviceAccountName": cluster.service_account,
                                                 "containers": [worker]}}}}
    return [account, role, binding, deployment]


def _var(name: str) -> str:
    return "{{ " + name + " }}"


def work_pool_template(config: PipelineConfig, cluster: ClusterSettings) -> dict[str, Any]:
    """The base job template of podium's Prefect Kubernetes work pool (`prefect work-pool create --type kubernetes
    --base-job-template`): each flow run of podium's deployments is a batch/v1 Job of podium's image, with podium's
    environment. Every variable is referenced in the job configuration (Prefect drops a value the template does not
    reference, silently); the plain environment is the `env` variable's default, the Secrets are written into the
    container (Prefect's worker keeps a hard-coded `valueFrom` and adds its own variables before it)."""
    plain = {e["name"]: e["value"] for e in pod_env(config, cluster) if "value" in e}
    if cluster.ray_address:
        plain["RAY_ADDRESS"] = cluster.ray_address
    secret_env = [e for e in pod_env(config, cluster) if "valueFrom" in e]
    volumes, mounts = pod_volumes(config, cluster, with_config=False)
    job_container: dict[str, Any] = {
        "name": "prefect-job", "image": _var("image"), "imagePullPolicy": _var("image_pull_policy"),
        "args": _var("command"), "env": secret_env,
        "resources": {"requests": {"cpu": _var("cpu_request"), "memory": _var("memory_request")},
                      "limits": {"cpu": _var("cpu_limit"), "memory": _var("memory_limit")}}}
    env_from = pod_env_from(config, cluster)
    if env_from:
        job_container["envFrom"] = env_from
    if mounts:
        job_container["volumeMounts"] = mounts
    # Prefect's worker refuses a template without these two (they belong to the Job's spec, not the pod's: the API
    # server drops them with a warning, as it does for Prefect's own default template)
    pod: dict[str, Any] = {"restartPolicy": "Never", "serviceAccountName": _var("service_account_name"),
                           "containers": [job_container], "completions": 1, "parallelism": 1}
    if volumes:
        pod["volumes"] = volumes
    job_manifest = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"generateName": _var("name") + "-", "namespace": _var("namespace"), "labels": _var("labels"),
                     "annotations": _var("annotations")},
        "spec": {"backoffLimit": _var("backoff_limit"), "ttlSecondsAfterFinished": _var("finished_job_ttl"),
                 "template": {"metadata": {"labels": labels("flow-run", cluster)}, "spec": pod}}}
    job_configuration: dict[str, Any] = {name: _var(name) for name in ("command", "env", "labels", "name",
                                                                        "annotations", "namespace")}
    job_configuration.update({"job_manifest": job_manifest, **{name: _var(name) for name in (
        "cluster_config", "job_watch_timeout_seconds", "pod_watch_timeout_seconds", "stream_output")}})

    def text(title: str, default: str | None, description: str) -> dict[str, Any]:
        return {"title": title, "anyOf": [{"type": "string"}, {"type": "null"}], "default": default,
                "description": description}

    string_map = {"type": "object", "additionalProperties": {"type": "string"}}
    variables = {"type": "object", "properties": {
        "name": text("Name", None, "Name given to the flow run's Job (Prefect's default: the flow run's)."),
        "env": {"title": "Environment Variables", "type": "object", "default": plain,
                "additionalProperties": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "description": "Environment of the flow run (podium's: Prefect, MLflow, its home, the stores). "
                               "Credentials are not here: the pods read them from Secrets."},
        "labels": {"title": "Labels", **string_map, "default": labels("flow-run", cluster)},
        "command": text("Command", None, "The flow run's command (Prefect's own when empty)."),
        "annotations": {"title": "Annotations", **string_map},
        "namespace": {"title": "Namespace", "type": "string", "default": cluster.namespace},
        "image": text("Image", cluster.image, "Image with podium installed."),
        "service_account_name": text("Service Account Name", cluster.service_account, "Service account of the Job."),
        "image_pull_policy": {"title": "Image Pull Policy", "type": "string", "default": cluster.image_pull_policy,
                              "enum": ["IfNotPresent", "Always", "Never"]},
        # a failed flow run is not started again as a new pod: podium resumes a run when it is run again
        "backoff_limit": {"title": "Backoff Limit", "type": "integer", "minimum": 0, "default": 0},
        "finished_job_ttl": {"title": "Finished Job TTL", "anyOf": [{"type": "integer"}, {"type": "null"}],
                             "default": cluster.flow_run_ttl_s},
        "job_watch_timeout_seconds": {"title": "Job Watch Timeout Seconds",
                                      "anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
        "pod_watch_timeout_seconds": {"title": "Pod Watch Timeout Seconds", "type": "integer", "default": 300},
        "stream_output": {"title": "Stream Output", "type": "boolean", "default": True},
        "cluster_config": {"title": "Cluster Config", "anyOf": [{"type": "object"}, {"type": "null"}],
                           "default": None, "description": "None: the worker's in-cluster configuration."},
        "cpu_request": text("CPU Request", cluster.flow_run_cpu, "CPU request of the flow run's pod."),
        "cpu_limit": text("CPU Limit", cluster.flow_run_cpu, "CPU limit of the flow run's pod."),
        "memory_request": text("Memory Request", cluster.flow_run_memory, "Memory request of the flow run's pod."),
        "memory_limit": text("Memory Limit", cluster.flow_run_memory, "Memory limit of the flow run's pod."),
    }}
    return {"job_configuration": job_configuration, "variables": variables}


def render(config: PipelineConfig, cluster: ClusterSettings) -> dict[str, list[dict[str, Any]] | dict[str, Any]]:
    """Every manifest, by the file it is written to: lists of Kubernetes resources (YAML), and the work pool's
    base job template (JSON, not a Kubernetes resource: in a folder of its own, which `kubectl apply -f DIR` does
    not read). Refuses (ConfigError) what check_renderable refuses."""
    check_renderable(config, cluster)
    return {
        "podium-config.yaml": [config_map(config, cluster)],
        "rayjob-nightly.yaml": [ray_job(config, cluster)],
        "serve.yaml": serve_deployment(config, cluster),
        "prefect-worker.yaml": worker_resources(cluster),
        "prefect/work-pool.json": work_pool_template(config, cluster),
    }
