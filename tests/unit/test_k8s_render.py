"""`podium k8s render`'s manifests validate offline, for three configs: Kubernetes' own kinds with
kubernetes-validate (strict, Kubernetes 1.37.0), the RayJob against the KubeRay CRD schema kept in
deployments/k8s_schemas (its pod templates as core/v1 PodTemplates), and the Prefect work pool's base job template
against prefect-kubernetes' own default template and its own worker's rendering of a flow run's Job."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import uuid
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import tomllib
from prefect.client.schemas.objects import FlowRun
from prefect_kubernetes.worker import KubernetesWorker, KubernetesWorkerJobConfiguration

from podium.cli.main import build_parser
from podium.config import PipelineConfig, build_config
from podium.core.redaction import SECRET_KEY
from podium.deployments.k8s import (
    KUBERNETES_VERSION,
    RAY_VERSION,
    ClusterSettings,
    check_renderable,
    instance_of,
    load_cluster_settings,
    render,
)
from podium.errors import ConfigError
from podium.flows.stop import STOP_GRACE_S

REPO = Path(__file__).resolve().parents[2]
RAYJOB_SCHEMA = json.loads((REPO / "deployments" / "k8s_schemas" / "rayjob.schema.json").read_text())
HOME = "/var/lib/podium/home"
DIGEST = "sha256:" + "0123456789abcdef" * 4
IMAGE = f"registry.example.com/ml/podium@{DIGEST}"


def local_defaults() -> tuple[PipelineConfig, ClusterSettings]:
    """Everything default: locations on the shared volume, an `mlflow server` and a Prefect server by name."""
    config = build_config({"storage": f"{HOME}/storage", "serving": f"{HOME}/serving/podium",
                           "data": {"train": f"{HOME}/data/train.parquet", "val": f"{HOME}/data/val.parquet"}})
    return config, ClusterSettings(image=IMAGE)


def s3_postgres_gpu() -> tuple[PipelineConfig, ClusterSettings]:
    """S3 (MinIO), MLflow's tracking store in PostgreSQL (its URI, with the password, in a Secret), GPU workers."""
    config = build_config({"run_name": "fraud", "model": "fraud", "storage": "s3://models/fraud/storage",
                           "serving": "s3://models/fraud/serving",
                           "data": {"train": "s3://data/fraud/train", "val": "s3://data/fraud/val"},
                           "scaling": {"num_workers": 4, "use_gpu": True, "cpus_per_worker": 4},
                           "validation": {"concurrency": 2, "num_gpus": 0.5}})
    cluster = load_cluster_settings({
        "namespace": "ml", "image": IMAGE, "shared_volume_claim": None,
        "mlflow_tracking_uri_secret": {"name": "mlflow-db", "key": "uri"}, "store_secrets": {"s3": "minio-creds"},
        "s3_endpoint_url": "http://minio.storage:9000", "worker_memory": "32Gi"})
    return config, cluster


def gcs_shadow() -> tuple[PipelineConfig, ClusterSettings]:
    """GCS for everything, promotion through a shadow stage, `podium serve` with three replicas, MLflow with auth."""
    config = build_config({"model": "churn", "storage": "gs://ml/churn/storage", "serving": "gs://ml/churn/serving",
                           "data": {"train": "gs://ml/churn/train.parquet", "val": "gs://ml/churn/val.parquet"},
                           "promotion": {"rollout": "shadow", "shadow": {"requests": 500}}})
    cluster = load_cluster_settings({"image": IMAGE, "store_secrets": {"gcs": "gcs-key"}, "mlflow_auth_secret": "mlflow-auth",
                                     "mlflow_tracking_uri": "https://mlflow.example.com", "serve_replicas": 3,
                                     "ray_address": "ray://podium-head-svc:10001", "shared_volume_claim": None})
    return config, cluster


CONFIGS = {"local-defaults": local_defaults, "s3-postgres-gpu": s3_postgres_gpu, "gcs-shadow": gcs_shadow}


def k8s_errors(resource: dict[str, Any]) -> list[str]:
    """kubernetes-validate's strict errors for one resource (empty: valid)."""
    try:
        kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{resource['kind']}/{resource['metadata'].get('name')}: {exc.message} at {list(exc.path)}"]
    return []


def pod_templates(rayjob: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pod template in a RayJob: the head's, each worker group's, the submitter's."""
    spec = rayjob["spec"]
    cluster = spec["rayClusterSpec"]
    return [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"]),
            spec["submitterPodTemplate"]]


def rayjob_errors(rayjob: dict[str, Any]) -> list[str]:
    """The RayJob against KubeRay's CRD schema (subset), and its pod templates as core/v1 PodTemplates."""
    errors = [f"RayJob: {e.message} at {list(e.path)}" for e in jsonschema.Draft7Validator(RAYJOB_SCHEMA).iter_errors(rayjob)]
    for i, template in enumerate(pod_templates(rayjob)):
        errors += k8s_errors({"apiVersion": "v1", "kind": "PodTemplate",
                              "metadata": {"name": f"template-{i}", "namespace": "x"}, "template": template})
    return errors


class NoServer:
    """A Prefect client that must not be used: the template names no block or variable for the worker to look up,
    so the worker's own rendering runs with no Prefect server (a unit test starts none)."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the template made Prefect's worker call its server ({name})")


def flow_run_job(template: dict[str, Any]) -> dict[str, Any]:
    """The batch/v1 Job Prefect's Kubernetes worker makes of the template for a flow run (its own code)."""
    configuration = asyncio.run(KubernetesWorkerJobConfiguration.from_template_and_values(template, {},
                                                                                          client=NoServer()))
    configuration.prepare_for_flow_run(FlowRun(flow_id=uuid.uuid4(), name="nightly-podium"))
    return configuration.job_manifest


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def rendered(request) -> dict[str, Any]:
    config, cluster = CONFIGS[request.param]()
    return render(config, cluster)


def kind_of(manifests: dict[str, Any], file: str, kind: str) -> dict[str, Any]:
    """The one resource of a kind in a rendered file."""
    (found,) = [doc for doc in manifests[file] if doc["kind"] == kind]
    return found


def resources(manifests: dict[str, Any]) -> list[dict[str, Any]]:
    return [doc for name, docs in manifests.items() if name.endswith(".yaml") for doc in docs]


def test_kubernetes_kinds_validate_strictly(rendered):
    errors = [e for doc in resources(rendered) if doc["apiVersion"] != "ray.io/v1" for e in k8s_errors(doc)]
    assert errors == []


def test_the_rayjob_validates_against_kuberays_schema(rendered):
    (rayjob,) = rendered["on-demand/rayjob-nightly.yaml"]
    assert rayjob_errors(rayjob) == []
    spec = rayjob["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    # the GPU cluster deleted as the job ends; the night's deadline shared among its attempts (KubeRay starts the
    # clock again with each new cluster)
    assert spec["ttlSecondsAfterFinished"] == 0 and spec["backoffLimit"] >= 0
    assert spec["activeDeadlineSeconds"] * (spec["backoffLimit"] + 1) <= 6 * 3600
    assert spec["rayClusterSpec"]["rayVersion"] == RAY_VERSION


def test_the_validators_catch_a_broken_manifest(rendered):
    """The test of the test: a misspelt field and a wrong type are errors for each validator."""
    (rayjob,) = rendered["on-demand/rayjob-nightly.yaml"]
    broken = json.loads(json.dumps(rayjob))
    broken["spec"]["shutdownAfterJobFinish"] = True
    broken["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["resource"] = {}
    assert len(rayjob_errors(broken)) == 2
    deployment = kind_of(rendered, "serve.yaml", "Deployment")
    bad = json.loads(json.dumps(deployment))
    bad["spec"]["replicas"] = "one"
    assert k8s_errors(bad)


def test_the_work_pool_template_references_every_variable(rendered):
    template = rendered["prefect/work-pool.json"]
    referenced = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", json.dumps(template["job_configuration"])))
    assert referenced == set(template["variables"]["properties"])


def test_the_work_pool_template_matches_prefects_kubernetes_worker(rendered):
    """Same variables as `prefect work-pool get-default-base-job-template --type kubernetes` (the same function's
    answer), each default valid under Prefect's own schema of it; the same job configuration keys."""
    default = KubernetesWorker.get_default_base_job_template()
    ours = rendered["prefect/work-pool.json"]
    assert set(ours["variables"]["properties"]) == set(default["variables"]["properties"])
    assert set(ours["job_configuration"]) == set(default["job_configuration"])
    definitions = default["variables"].get("definitions", {})
    for name, schema in default["variables"]["properties"].items():
        if "default" in ours["variables"]["properties"][name]:  # none: Prefect's own absence of a value
            jsonschema.validate(ours["variables"]["properties"][name]["default"], {**schema, "definitions": definitions})


def test_prefects_worker_makes_a_valid_job_of_the_template(rendered):
    job = flow_run_job(rendered["prefect/work-pool.json"])
    job["metadata"]["name"] = job["metadata"].pop("generateName", "x-").rstrip("-")
    # Prefect's worker requires these two in the pod spec (its own default template has them); strict validation
    # refuses them there, the API server drops them with a warning: everything else must be valid
    pod = job["spec"]["template"]["spec"]
    assert (pod.pop("completions"), pod.pop("parallelism")) == (1, 1)
    assert k8s_errors(job) == []
    (main,) = job["spec"]["template"]["spec"]["containers"]
    names = [e["name"] for e in main["env"]]
    assert {"PREFECT_API_URL", "MLFLOW_TRACKING_URI", "PODIUM_HOME", "PREFECT__FLOW_RUN_ID"} <= set(names)
    assert len(names) == len(set(names))


def test_no_credential_is_written_into_a_manifest(rendered):
    text = json.dumps(rendered)
    for doc in resources(rendered) + [rendered["prefect/work-pool.json"]]:
        for match in re.finditer(r'\{"name": "(\w+)", "value"', json.dumps(doc)):
            assert not SECRET_KEY.search(match.group(1)) or match.group(1) == "GOOGLE_APPLICATION_CREDENTIALS", match
    assert "password" not in text.lower()


def test_credentials_come_from_the_named_secrets():
    config, cluster = s3_postgres_gpu()
    (rayjob,) = render(config, cluster)["on-demand/rayjob-nightly.yaml"]
    for template in pod_templates(rayjob)[:2]:
        (main,) = template["spec"]["containers"]
        assert {"secretRef": {"name": "minio-creds"}} in main["envFrom"]
        uri = next(e for e in main["env"] if e["name"] == "MLFLOW_TRACKING_URI")
        assert uri["valueFrom"] == {"secretKeyRef": {"name": "mlflow-db", "key": "uri"}}
    workers = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert workers["replicas"] == 4
    assert workers["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    config, cluster = gcs_shadow()
    manifests = render(config, cluster)
    deployment = kind_of(manifests, "serve.yaml", "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert {"name": "store-key", "secret": {"secretName": "gcs-key"}} in pod["volumes"]
    env = manifests["prefect/work-pool.json"]["variables"]["properties"]["env"]["default"]
    assert env["RAY_ADDRESS"] == "ray://podium-head-svc:10001"


def test_the_entrypoints_are_podium_commands_its_parser_takes(rendered):
    (rayjob,) = rendered["on-demand/rayjob-nightly.yaml"]
    argv = shlex.split(rayjob["spec"]["entrypoint"])
    assert argv[0] == "podium"
    assert build_parser().parse_args(argv[1:]).command == "run"
    deployment = kind_of(rendered, "serve.yaml", "Deployment")
    (main,) = deployment["spec"]["template"]["spec"]["containers"]
    assert main["command"] == ["podium"] and build_parser().parse_args(main["args"]).command == "serve"
    (config_map,) = rendered["podium-config.yaml"]
    nightly = PipelineConfig.model_validate(json.loads(config_map["data"]["podium.json"]))
    assert nightly.run_name.endswith("{date}")


@pytest.mark.parametrize("change, field", [
    ({"storage": "/tmp/checkpoints"}, "storage"),
    ({"data": {"train": "relative/train.parquet", "val": f"{HOME}/v.parquet"}}, "data.train"),
    ({"serving": "s3://models/serving"}, "serving"),
])
def test_a_config_the_pods_could_not_run_is_refused_in_one_sentence(change, field):
    config, cluster = local_defaults()
    broken = build_config({**config.model_dump(mode="json"), **change})
    with pytest.raises(ConfigError) as caught:
        check_renderable(broken, cluster)
    message = str(caught.value)
    assert message.startswith(f"{field} = ") and "\n" not in message and "expected" in message


def test_credentials_in_the_cluster_settings_are_refused():
    with pytest.raises(ConfigError, match="mlflow_tracking_uri"):
        load_cluster_settings({"mlflow_tracking_uri": "postgresql://u:secret@db/mlflow"})


def containers_of(manifests: dict[str, Any]) -> list[dict[str, Any]]:
    """Every container of every pod the manifests make (the RayJob's templates, the Deployments')."""
    found = []
    for doc in resources(manifests):
        if doc["kind"] == "RayJob":
            found += [c for t in pod_templates(doc) for c in t["spec"]["containers"]]
        elif doc["kind"] == "Deployment":
            found += doc["spec"]["template"]["spec"]["containers"]
    return found


def test_every_pod_runs_the_image_by_its_digest(rendered):
    assert {c["image"] for c in containers_of(rendered)} == {IMAGE}
    assert rendered["prefect/work-pool.json"]["variables"]["properties"]["image"]["default"] == IMAGE


@pytest.mark.parametrize("image, expected", [
    (None, "the cluster settings give no image"),
    ("podium:0.1.0", "names no registry"),
    ("registry.example.com/ml/podium@sha256:abc", "malformed digest"),
    ("registry.example.com/ml/Podium:0.1.0", "not an image reference"),
])
def test_an_image_a_cluster_could_not_pull_is_refused_in_one_sentence(image, expected):
    config, _ = local_defaults()
    with pytest.raises(ConfigError) as caught:
        check_renderable(config, load_cluster_settings({} if image is None else {"image": image}))
    assert expected in str(caught.value)


@pytest.mark.parametrize("image", ["localhost/podium:0.1.0", "registry.example.com:5000/ml/podium:0.1.0",
                                   f"ghcr.io/team/podium:0.1.0@{DIGEST}"])
def test_registry_references_are_taken(image):
    assert load_cluster_settings({"image": image}).image == image


def test_the_image_installs_the_k8s_extra_which_names_what_every_pod_runs():
    """The Containerfile installs the wheelhouse pip resolved for podium[k8s] with constraints.txt (its recipe, and
    the container test's, tests/helpers/podman.py), with no index, and `pip check`s it; the extra brings Ray's
    dashboard (job submission, `ray start`), the Prefect Kubernetes worker and Ray Serve, each pinned."""
    containerfile = (REPO / "deployments" / "image" / "Containerfile").read_text()
    assert 'pip wheel -c constraints.txt -w image/wheels torch==2.13.0 ".[k8s]"' in containerfile
    assert "--no-index" in containerfile and "pip check" in containerfile
    assert 'f"{ROOT}[k8s]"' in (REPO / "tests" / "helpers" / "podman.py").read_text()
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    k8s = " ".join(extras["k8s"])
    assert "ray[default]" in k8s and "prefect-kubernetes" in k8s and "serve" in k8s
    pinned = {line.split("==")[0].lower().replace("_", "-") for line in (REPO / "constraints.txt").read_text().split()
              if "==" in line}
    assert {"ray", "prefect-kubernetes", "aiohttp-cors", "opencensus", "py-spy", "uvicorn"} <= pinned


def pods_of(manifests: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every pod spec the manifests make, by what makes it."""
    (rayjob,) = manifests["on-demand/rayjob-nightly.yaml"]
    head, worker, submitter = (t["spec"] for t in pod_templates(rayjob))
    cron = kind_of(manifests, "nightly.yaml", "CronJob")
    template = manifests["prefect/work-pool.json"]["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]
    return {"ray head": head, "ray worker": worker, "submitter": submitter,
            "nightly": cron["spec"]["jobTemplate"]["spec"]["template"]["spec"],
            "serve": kind_of(manifests, "serve.yaml", "Deployment")["spec"]["template"]["spec"],
            "prefect worker": kind_of(manifests, "prefect-worker.yaml", "Deployment")["spec"]["template"]["spec"],
            "flow run": template}


def test_each_component_has_its_own_service_account_and_only_the_api_callers_a_token(rendered):
    pods = pods_of(rendered)
    accounts = {what: pod["serviceAccountName"] for what, pod in pods.items()}
    assert accounts["flow run"] == "{{ service_account_name }}"
    assert len({accounts[w] for w in ("nightly", "serve", "prefect worker")} | {accounts["ray head"]}) == 4
    assert accounts["ray head"] == accounts["ray worker"] == accounts["submitter"]
    for what in ("ray head", "ray worker", "submitter", "serve", "flow run"):  # they never call the Kubernetes API
        assert pods[what]["automountServiceAccountToken"] is False, what
    for pod in pods.values():
        assert pod["securityContext"]["runAsNonRoot"] is True
        for c in pod["containers"]:
            assert c["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    roles = {doc["metadata"]["name"]: doc["rules"] for doc in resources(rendered) if doc["kind"] == "Role"}
    assert roles[accounts["nightly"]] == [{"apiGroups": ["ray.io"], "resources": ["rayjobs"],
                                           "verbs": ["create", "get", "list", "delete"]}]
    assert {g for rule in roles[accounts["prefect worker"]] for g in rule["apiGroups"]} == {"batch", ""}
    accounts_made = {doc["metadata"]["name"]: doc for doc in resources(rendered) if doc["kind"] == "ServiceAccount"}
    flow_run_default = rendered["prefect/work-pool.json"]["variables"]["properties"]["service_account_name"]["default"]
    assert {accounts["serve"], accounts["ray head"], flow_run_default} <= set(accounts_made)
    for name in (accounts["serve"], accounts["ray head"], flow_run_default):
        assert accounts_made[name]["automountServiceAccountToken"] is False


def test_the_prefect_auth_string_comes_from_its_secret_in_every_pod_that_talks_to_prefect():
    config, _ = local_defaults()
    cluster = load_cluster_settings({"image": IMAGE, "prefect_api_auth_secret": {"name": "prefect-auth",
                                                                                 "key": "auth-string"}})
    manifests = render(config, cluster)
    ref = {"name": "PREFECT_API_AUTH_STRING", "valueFrom": {"secretKeyRef": {"name": "prefect-auth",
                                                                             "key": "auth-string"}}}
    pods = pods_of(manifests)
    for what in ("ray head", "ray worker", "nightly", "serve", "prefect worker", "flow run"):
        assert ref in pods[what]["containers"][0]["env"], what
    assert ref in flow_run_job(manifests["prefect/work-pool.json"])["spec"]["template"]["spec"]["containers"][0]["env"]
    assert "auth-string" not in json.dumps(manifests["prefect/work-pool.json"]["variables"])


def test_the_worker_watches_its_namespace_only_and_reports_its_health(rendered):
    (worker,) = pods_of(rendered)["prefect worker"]["containers"]
    env = {e["name"]: e.get("value") for e in worker["env"]}
    namespace = kind_of(rendered, "prefect-worker.yaml", "Deployment")["metadata"]["namespace"]
    assert env["PREFECT_INTEGRATIONS_KUBERNETES_OBSERVER_NAMESPACES"] == namespace
    assert "--with-healthcheck" in worker["command"]
    assert worker["livenessProbe"]["httpGet"] == {"path": "/health", "port": int(env["PREFECT_WORKER_WEBSERVER_PORT"])}


def test_serving_is_ready_on_ping_rolls_one_pod_at_a_time_and_keeps_a_budget(rendered):
    deployment = kind_of(rendered, "serve.yaml", "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (main,) = pod["containers"]
    assert main["readinessProbe"]["httpGet"] == {"path": "/ping", "port": "http"}
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    budget = kind_of(rendered, "serve.yaml", "PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in main["volumeMounts"]
    for what in ("ray head", "ray worker"):
        assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pods_of(rendered)[what]["volumes"]


def test_a_gpu_head_tolerates_the_gpu_nodes_taint():
    config, cluster = s3_postgres_gpu()
    pods = pods_of(render(config, cluster))
    assert pods["ray head"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pods["ray head"]["tolerations"] == pods["ray worker"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    config, cluster = local_defaults()
    assert "tolerations" not in pods_of(render(config, cluster))["ray head"]


def test_two_models_share_a_namespace():
    config, cluster = local_defaults()
    churn = build_config({**config.model_dump(mode="json"), "model": "churn", "serving": f"{HOME}/serving/churn"})
    ours, theirs = render(config, cluster), render(churn, cluster)
    names = lambda m, shared: {(d["kind"], d["metadata"].get("name") or d["metadata"]["generateName"])
                               for f, docs in m.items() if f.endswith(".yaml") and (f == "prefect-worker.yaml") == shared
                               for d in docs}
    assert names(ours, False) and not names(ours, False) & names(theirs, False)
    assert ours["prefect-worker.yaml"] == theirs["prefect-worker.yaml"]  # one worker for the namespace's pool
    for m in (ours, theirs):
        service = kind_of(m, "serve.yaml", "Service")
        assert service["spec"]["selector"]["app.kubernetes.io/instance"] == service["metadata"]["name"].removesuffix(
            "-serve")


def test_the_night_is_scheduled_once_and_each_night_is_a_new_rayjob(rendered):
    cron = kind_of(rendered, "nightly.yaml", "CronJob")
    assert (cron["spec"]["schedule"], cron["spec"]["timeZone"], cron["spec"]["concurrencyPolicy"]) == (
        "0 2 * * *", "UTC", "Forbid")
    (main,) = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    args = build_parser().parse_args(main["command"][1:])
    assert (args.command, args.k8s_command) == ("k8s", "submit")
    (config_map,) = rendered["podium-config.yaml"]
    (rayjob,) = rendered["on-demand/rayjob-nightly.yaml"]
    assert json.loads(config_map["data"]["rayjob.json"]) == rayjob
    assert args.manifest == "/etc/podium/rayjob.json" and args.config == "/etc/podium/podium.json"
    assert "name" not in rayjob["metadata"] and len(rayjob["metadata"]["generateName"] + "20260101-0200") <= 47
    # the Prefect nightly schedules nothing here: the CronJob is the night's one schedule
    assert "schedule" not in json.dumps(rendered["prefect/work-pool.json"])


def test_a_flow_run_reaches_ray_through_rays_client():
    with pytest.raises(ConfigError, match="ray://"):
        load_cluster_settings({"ray_address": "podium-head-svc:6379"})


def test_odd_model_names_that_read_alike_once_made_dns_safe_get_different_names():
    """`fraud.v2` and `fraud_v2` both read `fraud-v2` as a DNS label: a short hash of the name keeps them apart; a
    name that is already a short label is kept as it is; every name stays a label within KubeRay's limit."""
    config, cluster = local_defaults()
    odd = [build_config({**config.model_dump(mode="json"), "model": model, "serving": f"{HOME}/serving/{i}"})
           for i, model in enumerate(["fraud.v2", "fraud_v2", "Fraud.V2", "a" * 80, "a" * 81])]
    rendered_names = [{d["metadata"].get("name") or d["metadata"]["generateName"]
                       for f, docs in render(c, cluster).items() if f.endswith(".yaml") and f != "prefect-worker.yaml"
                       for d in docs} for c in odd]
    for i, names in enumerate(rendered_names):
        assert all(re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?-?", n) and len(n) <= 63 for n in names), names
        assert all(not names & other for other in rendered_names[i + 1:]), names
        (rayjob,) = render(odd[i], cluster)["on-demand/rayjob-nightly.yaml"]
        assert len(rayjob["metadata"]["generateName"] + "20260101-0200") <= 47
    assert instance_of(config.model_copy(update={"model": "fraud"})) == "podium-fraud"


def test_the_head_runs_podiums_ray_head_whose_stop_reaches_the_driver_within_nested_grace_periods(rendered):
    """KubeRay keeps the head's command (the annotation BuildPod reads), `podium k8s ray-head`, a command podium's
    parser takes; the pod's grace > Ray's SIGTERM-to-SIGKILL of the driver > podium's own stop budget. The workers
    keep KubeRay's generated `ray start`."""
    (rayjob,) = rendered["on-demand/rayjob-nightly.yaml"]
    group = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert group["template"]["metadata"]["annotations"] == {"ray.io/overwrite-container-cmd": "true"}
    (head,) = group["template"]["spec"]["containers"]
    args = build_parser().parse_args(head["command"][1:])
    assert head["command"][0] == "podium" and (args.command, args.k8s_command) == ("k8s", "ray-head")
    wait = {e["name"]: e.get("value") for e in head["env"]}["RAY_JOB_STOP_WAIT_TIME_S"]
    assert group["template"]["spec"]["terminationGracePeriodSeconds"] > int(wait) > STOP_GRACE_S
    for worker in rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
        assert "annotations" not in worker["template"]["metadata"]
        assert "command" not in worker["template"]["spec"]["containers"][0]


def test_the_serve_pod_makes_its_serving_location_on_the_shared_volume_first():
    """A fresh volume has no serving location, which `podium serve` refuses (the pod would restart until the first
    night): an init container makes it, as podium's user, on the shared volume; a store's location needs none."""
    config, cluster = local_defaults()
    pod = kind_of(render(config, cluster), "serve.yaml", "Deployment")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["command"] == ["mkdir", "-p", config.serving]
    assert [m["mountPath"] for m in init["volumeMounts"]] == [cluster.shared_mount]
    assert pod["securityContext"]["runAsUser"] == 1000 and init["securityContext"]["allowPrivilegeEscalation"] is False
    config, cluster = s3_postgres_gpu()
    assert "initContainers" not in kind_of(render(config, cluster), "serve.yaml", "Deployment")["spec"]["template"][
        "spec"]


def test_network_policies_let_ray_pods_hear_only_each_other_and_the_submitter_and_serving_only_its_port(rendered):
    deny, ray, serve = rendered["network-policy.yaml"]
    instance = kind_of(rendered, "serve.yaml", "Service")["spec"]["selector"]["app.kubernetes.io/instance"]
    # nothing else: every pod of the model selected, no ingress rule
    assert deny["spec"] == {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "podium",
                                                            "app.kubernetes.io/instance": instance}},
                            "policyTypes": ["Ingress"]}
    pods = pods_of(rendered)
    (rayjob,) = rendered["on-demand/rayjob-nightly.yaml"]
    templates = dict(zip(["head", "worker", "submitter"], pod_templates(rayjob), strict=True))

    def picks(selector_: dict[str, Any], labels_: dict[str, str]) -> bool:
        return all(labels_.get(k) == v for k, v in selector_.get("matchLabels", {}).items()) and all(
            labels_.get(e["key"]) in e["values"] for e in selector_.get("matchExpressions", []))

    labels_of = {k: t["metadata"]["labels"] for k, t in templates.items()}
    assert picks(ray["spec"]["podSelector"], labels_of["head"]) and picks(ray["spec"]["podSelector"], labels_of["worker"])
    assert not picks(ray["spec"]["podSelector"], labels_of["submitter"])
    sources = [(r["from"][0]["podSelector"], r.get("ports")) for r in ray["spec"]["ingress"]]
    assert picks(sources[0][0], labels_of["worker"]) and sources[0][1] is None  # Ray's own ports are many
    assert picks(sources[1][0], labels_of["submitter"]) and sources[1][1] == [{"protocol": "TCP", "port": 8265}]
    serve_labels = kind_of(rendered, "serve.yaml", "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert picks(serve["spec"]["podSelector"], serve_labels) and not picks(serve["spec"]["podSelector"],
                                                                           labels_of["head"])
    port = kind_of(rendered, "serve.yaml", "Service")["spec"]["ports"][0]["port"]
    assert serve["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": port}]}]
    assert pods["serve"]["containers"][0]["ports"][0]["containerPort"] == port
