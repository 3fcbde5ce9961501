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

import hashlib
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
from podium.deployments.k8s_node import (
    DASHBOARD_PORT,
    HEAD_STOP_GRACE_S,
    JOB_STOP_WAIT_ENV,
    JOB_STOP_WAIT_S,
    OVERWRITE_COMMAND_ANNOTATION,
)
from podium.errors import ConfigError
from podium.storage.backends import store_of  # the kind of store a location lives in: storage's own answer

RAY_VERSION = "2.60.0"  # the Ray podium pins (pyproject.toml): the cluster's Ray must be the driver's
KUBERNETES_VERSION = "1.37.0"  # the API version the manifests are validated against (tests/unit/test_k8s_render.py)
CONFIG_FILE = "podium.json"
RAYJOB_FILE = "rayjob.json"  # the nightly's RayJob, in the ConfigMap: `podium k8s submit` makes each night's of it
CONFIG_DIR = "/etc/podium"
STORE_KEY_DIR = "/var/run/secrets/podium/store"  # a GCS service account's key file, mounted from its Secret
GCS_KEY_FILE = "key.json"
PART_OF = "podium"
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # an RFC 1123 label: names, namespaces
IMAGE_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
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
    prefect_api_url: str = Field("http://prefect-server:4200/api", description="PREFECT_API_URL of every pod.")
    prefect_api_auth_secret: SecretKey | None = Field(
        None, description="PREFECT_API_AUTH_STRING of every pod (a Prefect server started with "
        "server.api.auth_string), from a Secret: the worker, the flow runs, the nightly's driver.")
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
    schedule: str = Field("0 2 * * *", min_length=9, description="When the nightly RayJob is made (the CronJob's "
                          "schedule: the one place the night's schedule lives).")
    timezone: str = Field("UTC", min_length=1, description="Time zone of the schedule (the CronJob's timeZone).")
    active_deadline_s: int = Field(6 * 3600, ge=1, description="The night's deadline, all attempts together: a "
                                   "training running longer fails (podium's outcome: timed out, exit 1). KubeRay "
                                   "starts activeDeadlineSeconds again with each attempt, so each gets its share.")
    backoff_limit: int = Field(1, ge=0, description="RayJob backoffLimit: new attempts, each on a new cluster, after "
                               "a failed one; podium resumes the run from its latest checkpoint.")
    ttl_after_finished_s: int = Field(0, ge=0, description="RayJob ttlSecondsAfterFinished: the finished Ray cluster "
                                      "(its GPUs) is deleted this long after the end; the RayJob stays, with its "
                                      "status, until `podium k8s submit` prunes it.")
    keep_nights: int = Field(7, ge=1, description="Finished nightly RayJobs kept (with their status) for `kubectl "
                             "get rayjobs`; older ones are deleted by the next night's `podium k8s submit`.")
    work_pool: str = Field("", description="Prefect Kubernetes work pool (default: podium's work pool name).")
    flow_run_ttl_s: int = Field(86400, ge=0, description="finished_job_ttl of the work pool's flow-run Jobs.")
    flow_run_cpu: str = Field("2", description="CPU request of a flow-run pod (the flow runs a local Ray when "
                              "ray_address is None).")
    flow_run_memory: str = Field("8Gi", description="Memory request of a flow-run pod.")
    ray_address: str | None = Field(None, description="RAY_ADDRESS of the work pool's flow runs, a RayCluster's Ray "
                                    "client address (ray://podium-head-svc:10001): a flow-run pod is not a Ray node. "
                                    "None: each flow run starts Ray in its pod.")
    serve_pods: int = Field(2, ge=1, description="Pods of `podium serve` (each its own Ray), updated one at a time; "
                            "a PodDisruptionBudget keeps all but one serving through a node's drain.")
    serve_replicas: int = Field(1, ge=1, description="Replicas of the model in each `podium serve` pod (Ray Serve "
                                "replicas).")
    serve_cpus: float = Field(1.0, gt=0, description="CPUs of each Serve replica.")
    serve_memory: str = Field("4Gi", description="Memory of the `podium serve` pod.")
    serve_port: int = Field(8000, ge=1, le=65535, description="HTTP port of `podium serve` and its Service.")

    @field_validator("image")
    @classmethod
    def _check_image(cls, v: str | None) -> str | None:
        if v is not None:
            check_image(v)
        return v

    @field_validator("ray_address")
    @classmethod
    def _ray_client(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("ray://"):
            raise ValueError("a flow-run pod is not a Ray node, and reaches a Ray cluster through Ray's client: "
                             "expected ray://<head service>:10001")
        return v

    @field_validator("schedule")
    @classmethod
    def _cron(cls, v: str) -> str:
        if len(v.split()) != 5:
            raise ValueError("expected a cron expression of five fields, e.g. \"0 2 * * *\"")
        return v

    @field_validator("namespace")
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
    if digest and not IMAGE_DIGEST_RE.match(digest):
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


MODEL_SLUG_MAX = 16  # KubeRay refuses a RayJob name over 47 characters: podium-<model>-nightly-<yyyymmdd-hhmm>


MODEL_HASH_CHARS = 5  # hex digits of the model name's sha256 that keep a changed slug unique


def model_slug(model: str) -> str:
    """The model's name as a DNS label of at most MODEL_SLUG_MAX characters: itself where it is one, else its
    letters and digits with a short hash of the whole name (`Fraud_v2.1` -> `fraud-v2-1-3c72e`), so that two names
    that read alike after the change (`fraud.v2`, `fraud_v2`) still name different resources."""
    slug = re.sub(r"[^a-z0-9-]+", "-", model.lower()).strip("-")
    if slug == model and len(slug) <= MODEL_SLUG_MAX:
        return slug
    digest = hashlib.sha256(model.encode()).hexdigest()[:MODEL_HASH_CHARS]
    head = slug[:MODEL_SLUG_MAX - MODEL_HASH_CHARS - 1].strip("-")
    return f"{head}-{digest}" if head else f"model-{digest}"


def instance_of(config: PipelineConfig) -> str:
    """The prefix of every name of one model's resources (`podium-<model slug>`), so that two models share a
    namespace."""
    slug = model_slug(config.model)
    return slug if slug == PART_OF or slug.startswith(f"{PART_OF}-") else f"{PART_OF}-{slug}"


def labels(component: str, instance: str) -> dict[str, str]:
    """The recommended app.kubernetes.io labels of one of podium's resources (`instance`: the model's prefix, or
    the work pool's for the Prefect worker, which every model's flow runs share)."""
    return {"app.kubernetes.io/name": "podium", "app.kubernetes.io/instance": instance,
            "app.kubernetes.io/component": component, "app.kubernetes.io/part-of": PART_OF,
            "app.kubernetes.io/version": podium_version, "app.kubernetes.io/managed-by": "podium-k8s-render"}


def selector(component: str, instance: str) -> dict[str, str]:
    """The labels that pick one instance's pods of a component (a Service's, a Deployment's, a budget's)."""
    return {k: v for k, v in labels(component, instance).items() if k in (
        "app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component")}


def metadata(name: str, component: str, instance: str, cluster: ClusterSettings) -> dict[str, Any]:
    """A resource's name, namespace and labels."""
    return {"name": name, "namespace": cluster.namespace, "labels": labels(component, instance)}


def service_account(name: str, component: str, instance: str, cluster: ClusterSettings,
                    token: bool) -> dict[str, Any]:
    """A component's own service account; `token` False: its pods get no API token (they never call the API)."""
    account: dict[str, Any] = {"apiVersion": "v1", "kind": "ServiceAccount",
                               "metadata": metadata(name, component, instance, cluster)}
    if not token:
        account["automountServiceAccountToken"] = False
    return account


def role_for(name: str, component: str, instance: str, cluster: ClusterSettings,
             rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A namespaced Role with `rules` and its binding to the service account of the same name."""
    meta = metadata(name, component, instance, cluster)
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": rules}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
               "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": cluster.namespace}]}
    return [role, binding]


def stores_used(config: PipelineConfig) -> set[str]:
    """The object stores of the config's locations."""
    return {s for s in (store_of(u) for u in config_locations(config).values()) if s in ("s3", "gcs", "azure")}


def secret_env(name: str, ref: SecretKey) -> dict[str, Any]:
    """An environment variable read from one key of a Secret."""
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}


def prefect_env(cluster: ClusterSettings) -> list[dict[str, Any]]:
    """How a pod reaches the Prefect server: its URL, and its auth string from a Secret where the server wants one."""
    env: list[dict[str, Any]] = [{"name": "PREFECT_API_URL", "value": cluster.prefect_api_url}]
    if cluster.prefect_api_auth_secret:
        env.append(secret_env("PREFECT_API_AUTH_STRING", cluster.prefect_api_auth_secret))
    return env


def pod_env(config: PipelineConfig, cluster: ClusterSettings) -> list[dict[str, Any]]:
    """The environment of every podium pod: Prefect and MLflow, podium's home, the stores' endpoints; values with
    credentials only as references to Secrets."""
    env = prefect_env(cluster)
    if cluster.mlflow_tracking_uri_secret:
        env.append(secret_env("MLFLOW_TRACKING_URI", cluster.mlflow_tracking_uri_secret))
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


def config_map_name(config: PipelineConfig) -> str:
    """The ConfigMap of one model's nightly: its podium config and its RayJob."""
    return f"{instance_of(config)}-config"


def pod_volumes(config: PipelineConfig, cluster: ClusterSettings, with_config: bool = True,
                shm: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volume mounts) of a podium pod: the config, the shared volume, a GCS key file, and (`shm`) a
    memory-backed /dev/shm for Ray's object store (a container's own is 64 MiB)."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if with_config:
        volumes.append({"name": "podium-config", "configMap": {"name": config_map_name(config)}})
        mounts.append({"name": "podium-config", "mountPath": CONFIG_DIR, "readOnly": True})
    if cluster.shared_volume_claim:
        volumes.append({"name": "podium-shared", "persistentVolumeClaim": {"claimName": cluster.shared_volume_claim}})
        mounts.append({"name": "podium-shared", "mountPath": cluster.shared_mount})
    if "gcs" in stores_used(config):
        volumes.append({"name": "store-key", "secret": {"secretName": cluster.store_secrets["gcs"]}})
        mounts.append({"name": "store-key", "mountPath": STORE_KEY_DIR, "readOnly": True})
    if shm:
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    return volumes, mounts


# podium's image runs as uid 1000 (deployments/image/Containerfile); nothing in a pod needs more
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def container(name: str, config: PipelineConfig, cluster: ClusterSettings, resources: dict[str, Any],
              with_config: bool = True, shm: bool = False, **extra: Any) -> dict[str, Any]:
    """A podium container: the image, the environment, the mounts, the resources, no privileges."""
    _, mounts = pod_volumes(config, cluster, with_config, shm)
    out: dict[str, Any] = {"name": name, "image": cluster.image, "imagePullPolicy": cluster.image_pull_policy,
                           "env": pod_env(config, cluster), "resources": resources,
                           "securityContext": CONTAINER_SECURITY, **extra}
    env_from = pod_env_from(config, cluster)
    if env_from:
        out["envFrom"] = env_from
    if mounts:
        out["volumeMounts"] = mounts
    return out


def pod_spec(containers: list[dict[str, Any]], config: PipelineConfig, cluster: ClusterSettings, account: str,
             with_config: bool = True, shm: bool = False, **extra: Any) -> dict[str, Any]:
    """A pod spec of a component's service account (with no API token: podium's pods never call the Kubernetes
    API but for the nightly's submitter, which says so), with podium's volumes, running as podium's user."""
    volumes, _ = pod_volumes(config, cluster, with_config, shm)
    spec: dict[str, Any] = {"serviceAccountName": account, "automountServiceAccountToken": False,
                            "securityContext": POD_SECURITY, "containers": containers, **extra}
    if volumes:
        spec["volumes"] = volumes
    return spec


def config_map(config: PipelineConfig, cluster: ClusterSettings) -> dict[str, Any]:
    """The ConfigMap of a model's nightly, mounted at /etc/podium: its podium config (podium.json) and its RayJob
    (rayjob.json), which the nightly's `podium k8s submit` makes each night."""
    body = json.dumps(nightly_config(config).model_dump(mode="json"), indent=2, sort_keys=True)
    rayjob = json.dumps(ray_job(config, cluster), indent=2)
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": metadata(config_map_name(config), "config", instance_of(config), cluster),
            "data": {CONFIG_FILE: body, RAYJOB_FILE: rayjob}}


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


RAY_CLIENT_PORT = 10001  # Ray's client server, for flow runs given ray_address
HEAD_COMMAND = ["podium", "k8s", "ray-head"]  # the RayJob head's container (podium.deployments.k8s_node)
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _gpus(res: dict[str, Any], params: dict[str, str], count: int) -> None:
    res["limits"]["nvidia.com/gpu"] = res["requests"]["nvidia.com/gpu"] = str(count)
    params["num-gpus"] = str(count)


def ray_account(config: PipelineConfig) -> str:
    """The service account of a model's Ray pods and KubeRay's submitter: no role, no token."""
    return f"{instance_of(config)}-ray"


def ray_cluster_spec(config: PipelineConfig, cluster: ClusterSettings) -> dict[str, Any]:
    """KubeRay's RayClusterSpec for a training: a head (driver, validations) and one worker group of
    scaling.num_workers pods, each with the CPUs (and GPU) of one Ray Train worker."""
    cpus = head_cpus(config)
    head_gpus = math.ceil(config.validation.concurrency * config.validation.num_gpus)
    head_res: dict[str, Any] = {"requests": {"cpu": str(cpus), "memory": cluster.head_memory},
                                "limits": {"cpu": str(cpus), "memory": cluster.head_memory}}
    head_params = {"dashboard-host": "0.0.0.0", "num-cpus": str(cpus)}
    if head_gpus:
        _gpus(head_res, head_params, head_gpus)
    worker_cpus = _cpus(config.scaling.cpus_per_worker)
    worker_res: dict[str, Any] = {"requests": {"cpu": str(worker_cpus), "memory": cluster.worker_memory},
                                  "limits": {"cpu": str(worker_cpus), "memory": cluster.worker_memory}}
    worker_params = {"num-cpus": str(worker_cpus)}
    if config.scaling.use_gpu:
        _gpus(worker_res, worker_params, 1)
    ports = [{"containerPort": 6379, "name": "gcs-server"}, {"containerPort": DASHBOARD_PORT, "name": "dashboard"},
             {"containerPort": RAY_CLIENT_PORT, "name": "client"}]
    account = ray_account(config)
    # the head's first process is podium's (podium.deployments.k8s_node): a pod's stop (SIGTERM) reaches the night's
    # driver through Ray's job API before Ray stops; KubeRay keeps this command for the annotation below, and hands
    # it its generated `ray start` in KUBERAY_GEN_RAY_START_CMD. The grace periods nest: the pod's, then Ray's
    # SIGTERM-to-SIGKILL of the driver, then podium's own stop.
    head_env = [{"name": JOB_STOP_WAIT_ENV, "value": str(JOB_STOP_WAIT_S)}]
    head_main = container("ray-head", config, cluster, head_res, shm=True, ports=ports, command=HEAD_COMMAND)
    head_main["env"] = [*head_main["env"], *head_env]
    head = pod_spec([head_main], config, cluster, account, shm=True, terminationGracePeriodSeconds=HEAD_STOP_GRACE_S)
    worker = pod_spec([container("ray-worker", config, cluster, worker_res, shm=True)], config, cluster, account,
                      shm=True)
    if head_gpus:  # the GPU nodes' taint: the head's validations run on a GPU too
        head["tolerations"] = [GPU_TOLERATION]
    if config.scaling.use_gpu:
        worker["tolerations"] = [GPU_TOLERATION]
    n = config.scaling.num_workers
    instance = instance_of(config)
    return {
        "rayVersion": RAY_VERSION,
        "headGroupSpec": {"rayStartParams": head_params,
                          "template": {"metadata": {"labels": labels("ray-head", instance),
                                                    "annotations": {OVERWRITE_COMMAND_ANNOTATION: "true"}},
                                       "spec": head}},
        "workerGroupSpecs": [{"groupName": "gpu-workers" if config.scaling.use_gpu else "workers",
                              "replicas": n, "minReplicas": n, "maxReplicas": n, "rayStartParams": worker_params,
                              "template": {"metadata": {"labels": labels("ray-worker", instance)}, "spec": worker}}],
    }


def attempt_deadline_s(cluster: ClusterSettings) -> int:
    """activeDeadlineSeconds of each attempt: KubeRay starts the clock again when a retry makes a new cluster
    (initRayJobStatusIfNeed sets startTime), so the night's deadline is shared out among its attempts."""
    return max(1, cluster.active_deadline_s // (cluster.backoff_limit + 1))


def nightly_name(config: PipelineConfig) -> str:
    """The prefix of a model's nightly RayJobs; each night's RayJob adds its date and time."""
    return f"{instance_of(config)}-nightly"


def ray_job(config: PipelineConfig, cluster: ClusterSettings) -> dict[str, Any]:
    """The nightly training as a KubeRay RayJob: a cluster made for the run, `podium run` submitted to it (the
    train-validate-promote flow run, in Prefect), the cluster deleted when the job ends; a failed attempt retried on
    a new cluster (the run resumes from its latest checkpoint), a night past its deadline failed. Named by
    `generateName`: each night's is a new RayJob (`kubectl create`, or `podium k8s submit` with the night's name)."""
    submitter_res = {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}
    instance = instance_of(config)
    meta = metadata("", "training", instance, cluster)
    del meta["name"]
    return {
        "apiVersion": "ray.io/v1", "kind": "RayJob",
        "metadata": {"generateName": f"{nightly_name(config)}-", **meta},
        "spec": {
            "entrypoint": shlex.join(training_entrypoint()),
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": cluster.ttl_after_finished_s,
            "activeDeadlineSeconds": attempt_deadline_s(cluster),
            "backoffLimit": cluster.backoff_limit,
            "submissionMode": "K8sJobMode",
            "rayClusterSpec": ray_cluster_spec(config, cluster),
            "submitterPodTemplate": {
                "metadata": {"labels": labels("submitter", instance)},
                "spec": {"serviceAccountName": ray_account(config), "automountServiceAccountToken": False,
                         "securityContext": POD_SECURITY, "restartPolicy": "Never",
                         "containers": [{"name": "ray-job-submitter", "image": cluster.image,
                                         "imagePullPolicy": cluster.image_pull_policy,
                                         "securityContext": CONTAINER_SECURITY, "resources": submitter_res}]}},
        },
    }


def submit_command(config: PipelineConfig, cluster: ClusterSettings) -> list[str]:
    """The nightly CronJob's command: make tonight's RayJob from the ConfigMap's, follow it to its end, record
    the end on the night's flow run, prune the finished RayJobs beyond `keep_nights`."""
    return ["podium", "k8s", "submit", "--manifest", f"{CONFIG_DIR}/{RAYJOB_FILE}", "--namespace", cluster.namespace,
            "--config", f"{CONFIG_DIR}/{CONFIG_FILE}", "--keep", str(cluster.keep_nights)]


def nightly_resources(config: PipelineConfig, cluster: ClusterSettings) -> list[dict[str, Any]]:
    """The night's schedule (a CronJob), the service account of its submitter (which may make, read and delete
    this namespace's RayJobs, nothing else) and the Ray pods' own (no role, no token)."""
    instance, name = instance_of(config), nightly_name(config)
    rules = [{"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["create", "get", "list", "delete"]}]
    res = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "500m", "memory": "512Mi"}}
    main = container("podium-nightly", config, cluster, res, command=submit_command(config, cluster))
    pod = pod_spec([main], config, cluster, name, restartPolicy="Never")
    pod["automountServiceAccountToken"] = True  # the one pod that calls the Kubernetes API
    cron = {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": metadata(name, "nightly", instance, cluster),
            "spec": {"schedule": cluster.schedule, "timeZone": cluster.timezone, "concurrencyPolicy": "Forbid",
                     "startingDeadlineSeconds": 3600, "successfulJobsHistoryLimit": 3, "failedJobsHistoryLimit": 3,
                     "jobTemplate": {"metadata": {"labels": labels("nightly", instance)},
                                     "spec": {"backoffLimit": 0, "template": {
                                         "metadata": {"labels": labels("nightly", instance)}, "spec": pod}}}}}
    return [service_account(name, "nightly", instance, cluster, token=True),
            *role_for(name, "nightly", instance, cluster, rules), cron,
            service_account(ray_account(config), "ray", instance, cluster, token=False)]


def serve_command(config: PipelineConfig, cluster: ClusterSettings) -> list[str]:
    """`podium serve` of the config's serving location, listening on every address of its pod."""
    return ["podium", "serve", "--serving", config.serving, "--host", "0.0.0.0", "--port", str(cluster.serve_port),
            "--replicas", str(cluster.serve_replicas), "--num-cpus", f"{cluster.serve_cpus:g}"]


def serving_location_init(config: PipelineConfig, cluster: ClusterSettings) -> dict[str, Any] | None:
    """The serve pod's init container that makes its serving location on the shared volume, where it is a local
    path: `podium serve` refuses a location that is not there (a fresh volume, before the first promotion), and the
    pod would restart until the first night (CrashLoopBackOff); with the folder there it runs, not ready (/ping 503),
    until a champion is promoted. None: the location is in an object store, which needs no folder made."""
    if store_of(config.serving) is not None or not cluster.shared_volume_claim:
        return None
    _, mounts = pod_volumes(config, cluster, with_config=False)
    return {"name": "serving-location", "image": cluster.image, "imagePullPolicy": cluster.image_pull_policy,
            "command": ["mkdir", "-p", config.serving.removeprefix("file://")],
            "volumeMounts": [m for m in mounts if m["name"] == "podium-shared"],
            "securityContext": CONTAINER_SECURITY,
            "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}}}


def serve_deployment(config: PipelineConfig, cluster: ClusterSettings) -> list[dict[str, Any]]:
    """`podium serve` as a Deployment of `serve_pods` pods (each its own Ray, Ray Serve's replicas in it), its
    Service and a PodDisruptionBudget. A pod is ready when `GET /ping` answers 200 (a model loaded; 503 before), so
    a rolling update takes an old pod away only once a new one serves; the champion's switch is podium's, from the
    serving location, in every pod."""
    cpus = _cpus(cluster.serve_cpus * cluster.serve_replicas + 1)  # the replicas, and Serve's proxy and controller
    res = {"requests": {"cpu": str(cpus), "memory": cluster.serve_memory},
           "limits": {"cpu": str(cpus), "memory": cluster.serve_memory}}
    ping = {"httpGet": {"path": "/ping", "port": "http"}, "periodSeconds": 5, "failureThreshold": 3}
    alive = {"tcpSocket": {"port": "http"}, "periodSeconds": 10, "failureThreshold": 3}
    main = container("podium-serve", config, cluster, res, with_config=False, shm=True,
                     args=serve_command(config, cluster)[1:], command=["podium"],
                     ports=[{"containerPort": cluster.serve_port, "name": "http"}],
                     # ready: a model answers; alive: the process listens (no champion yet is not a crash)
                     readinessProbe=ping, livenessProbe=alive, startupProbe={**alive, "failureThreshold": 60})
    instance = instance_of(config)
    name = f"{instance}-serve"
    picked = selector("serve", instance)
    pod = pod_spec([main], config, cluster, name, with_config=False, shm=True, restartPolicy="Always",
                   terminationGracePeriodSeconds=60)
    init = serving_location_init(config, cluster)
    if init is not None:
        pod["initContainers"] = [init]
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata(name, "serve", instance, cluster),
        "spec": {"replicas": cluster.serve_pods, "selector": {"matchLabels": picked},
                 "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                 "template": {"metadata": {"labels": labels("serve", instance)}, "spec": pod}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": metadata(name, "serve", instance, cluster),
               "spec": {"selector": picked, "ports": [{"name": "http", "port": cluster.serve_port,
                                                        "targetPort": "http"}]}}
    budget = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
              "metadata": metadata(name, "serve", instance, cluster),
              "spec": {"maxUnavailable": 1, "selector": {"matchLabels": picked}}}
    return [service_account(name, "serve", instance, cluster, token=False), deployment, service, budget]


def network_policies(config: PipelineConfig, cluster: ClusterSettings) -> list[dict[str, Any]]:
    """Who may reach a model's pods: nothing by default; the Ray pods from each other (every port: Ray's workers
    listen on ports of their own), from the night's submitter (the job API) and, where flow runs are given a Ray
    address, from the work pool's flow runs (Ray's client port); the serve pods on their HTTP port. Egress is left
    open (the servers, the stores, the registry are the team's). Needs a network plugin that enforces
    NetworkPolicy (Calico, Cilium...): without one they are accepted and do nothing."""
    instance = instance_of(config)
    meta = lambda name, component: metadata(f"{instance}-{name}", component, instance, cluster)
    ours = {"app.kubernetes.io/name": "podium", "app.kubernetes.io/instance": instance}
    ray_pods = {"matchLabels": ours, "matchExpressions": [
        {"key": "app.kubernetes.io/component", "operator": "In", "values": ["ray-head", "ray-worker"]}]}
    submitter = {"matchLabels": {**ours, "app.kubernetes.io/component": "submitter"}}
    ray_from = [{"from": [{"podSelector": ray_pods}]},
                {"from": [{"podSelector": submitter}], "ports": [{"protocol": "TCP", "port": DASHBOARD_PORT}]}]
    if cluster.ray_address:
        flow_runs = {"matchLabels": selector("flow-run", work_pool_name(cluster))}
        ray_from.append({"from": [{"podSelector": flow_runs}],
                         "ports": [{"protocol": "TCP", "port": RAY_CLIENT_PORT}]})
    return [
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta("deny-ingress", "network"),
         "spec": {"podSelector": {"matchLabels": ours}, "policyTypes": ["Ingress"]}},
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta("ray", "network"),
         "spec": {"podSelector": ray_pods, "policyTypes": ["Ingress"], "ingress": ray_from}},
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta("serve", "network"),
         "spec": {"podSelector": {"matchLabels": selector("serve", instance)}, "policyTypes": ["Ingress"],
                  "ingress": [{"ports": [{"protocol": "TCP", "port": cluster.serve_port}]}]}},
    ]


def work_pool_name(cluster: ClusterSettings) -> str:
    """The Kubernetes work pool's name: the cluster settings', else podium's work pool with `-k8s`."""
    return cluster.work_pool or f"{WORK_POOL}-k8s"


def flow_run_account(cluster: ClusterSettings) -> str:
    """The service account of the work pool's flow-run Jobs: no role, no token."""
    return f"{work_pool_name(cluster)}-flow-run"


WORKER_HEALTH_PORT = 8080  # PREFECT_WORKER_WEBSERVER_PORT's default: `--with-healthcheck` serves /health there


def worker_resources(cluster: ClusterSettings) -> list[dict[str, Any]]:
    """The Prefect Kubernetes worker of the work pool: its service account, what it may do in the namespace (Jobs
    and their pods, events), its Deployment (`prefect worker start --type kubernetes --with-healthcheck`, its
    observer kept to the namespace), and the flow runs' own service account (no role, no token)."""
    pool = work_pool_name(cluster)
    name = f"{pool}-worker"
    meta = lambda n: metadata(n, "prefect-worker", pool, cluster)
    rules = [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "create", "delete",
                                                                      "patch"]},
             {"apiGroups": [""], "resources": ["pods", "pods/log", "pods/status"], "verbs": ["get", "list", "watch"]},
             {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]}]
    health = {"httpGet": {"path": "/health", "port": WORKER_HEALTH_PORT}, "periodSeconds": 30, "failureThreshold": 3,
              "initialDelaySeconds": 30}
    worker = {"name": "prefect-worker", "image": cluster.image, "imagePullPolicy": cluster.image_pull_policy,
              "command": ["prefect", "worker", "start", "--pool", pool, "--type", "kubernetes", "--with-healthcheck"],
              # prefect-kubernetes' observer watches every namespace unless told, which the namespaced Role forbids
              "env": [*prefect_env(cluster),
                      {"name": "PREFECT_INTEGRATIONS_KUBERNETES_OBSERVER_NAMESPACES", "value": cluster.namespace},
                      {"name": "PREFECT_WORKER_WEBSERVER_HOST", "value": "0.0.0.0"},
                      {"name": "PREFECT_WORKER_WEBSERVER_PORT", "value": str(WORKER_HEALTH_PORT)}],
              "ports": [{"containerPort": WORKER_HEALTH_PORT, "name": "health"}], "livenessProbe": health,
              "securityContext": CONTAINER_SECURITY,
              "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(name),
                  "spec": {"replicas": 1, "selector": {"matchLabels": selector("prefect-worker", pool)},
                           "template": {"metadata": {"labels": labels("prefect-worker", pool)},
                                        "spec": {"serviceAccountName": name, "securityContext": POD_SECURITY,
                                                 "containers": [worker]}}}}
    return [service_account(name, "prefect-worker", pool, cluster, token=True),
            *role_for(name, "prefect-worker", pool, cluster, rules), deployment,
            service_account(flow_run_account(cluster), "flow-run", pool, cluster, token=False)]


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
    from_secrets = [e for e in pod_env(config, cluster) if "valueFrom" in e]
    volumes, mounts = pod_volumes(config, cluster, with_config=False)
    job_container: dict[str, Any] = {
        "name": "prefect-job", "image": _var("image"), "imagePullPolicy": _var("image_pull_policy"),
        "args": _var("command"), "env": from_secrets, "securityContext": CONTAINER_SECURITY,
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
                           "automountServiceAccountToken": False, "securityContext": POD_SECURITY,
                           "containers": [job_container], "completions": 1, "parallelism": 1}
    if volumes:
        pod["volumes"] = volumes
    job_manifest = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"generateName": _var("name") + "-", "namespace": _var("namespace"), "labels": _var("labels"),
                     "annotations": _var("annotations")},
        "spec": {"backoffLimit": _var("backoff_limit"), "ttlSecondsAfterFinished": _var("finished_job_ttl"),
                 "template": {"metadata": {"labels": labels("flow-run", work_pool_name(cluster))}, "spec": pod}}}
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
        "labels": {"title": "Labels", **string_map, "default": labels("flow-run", work_pool_name(cluster))},
        "command": text("Command", None, "The flow run's command (Prefect's own when empty)."),
        "annotations": {"title": "Annotations", **string_map},
        "namespace": {"title": "Namespace", "type": "string", "default": cluster.namespace},
        "image": text("Image", cluster.image, "Image with podium installed."),
        "service_account_name": text("Service Account Name", flow_run_account(cluster),
                                     "Service account of the Job (no role, no token)."),
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
    base job template (JSON, not a Kubernetes resource) and the on-demand RayJob, each in a folder of its own, which
    `kubectl apply -f DIR` does not read. Refuses (ConfigError) what check_renderable refuses."""
    check_renderable(config, cluster)
    return {
        "podium-config.yaml": [config_map(config, cluster)],
        "nightly.yaml": nightly_resources(config, cluster),
        "serve.yaml": serve_deployment(config, cluster),
        "prefect-worker.yaml": worker_resources(cluster),
        "network-policy.yaml": network_policies(config, cluster),
        # a night on demand (`kubectl create -f`: its generateName makes a new RayJob each time; `apply` refuses it)
        "on-demand/rayjob-nightly.yaml": [ray_job(config, cluster)],
        "prefect/work-pool.json": work_pool_template(config, cluster),
    }
