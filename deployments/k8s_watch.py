"""Follow a KubeRay RayJob through the Kubernetes API until it is over, saying each change in podium's terms
(`podium.core.rayjob`): `podium k8s watch podium-nightly`.

It reads the RayJob (GET .../apis/ray.io/v1/namespaces/NS/rayjobs/NAME) every `poll_s` seconds; in a pod it uses
the pod's service account (its token and CA), elsewhere the API URL and token it is given (`kubectl proxy` serves
one with neither).
"""

from __future__ import annotations

import json
import re
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from podium import prefect_api
from podium.config import RUN_NAME_PLACEHOLDERS, expand_run_name
from podium.core.rayjob import TERMINAL_DEPLOYMENT, RayJobOutcome, flow_run_end, observe_rayjob, rayjob_outcome
from podium.errors import PodiumError

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
IN_CLUSTER_API = "https://kubernetes.default.svc"
NIGHTLY_FLOW = "train-validate-promote"  # the flow `podium run` runs (podium.flows.pipeline; a unit test holds it)
# the RayJob's start is the cluster's, before `podium run` makes its flow run: a flow run that seems to start up to
# this long before it (the two clocks apart) is still this RayJob's
CLOCK_SKEW = timedelta(minutes=2)
PATTERNS = {"date": r"\d{8}", "datetime": r"\d{8}-\d{6}"}


class KubernetesApiError(PodiumError):
    """The Kubernetes API did not answer, or answered something other than the RayJob or a 404."""


def in_cluster_api() -> tuple[str, str | None, ssl.SSLContext | None]:
    """(API URL, bearer token, TLS context) of the pod's service account, or of `kubectl proxy` outside a pod."""
    token_file = SERVICE_ACCOUNT / "token"
    if token_file.is_file():
        context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
        return IN_CLUSTER_API, token_file.read_text().strip(), context
    return "http://127.0.0.1:8001", None, None  # kubectl proxy's default address


def _call(api_url: str, path: str, token: str | None, context: ssl.SSLContext | None, method: str = "GET",
          body: dict[str, Any] | None = None, timeout_s: float = 10.0) -> tuple[int, dict[str, Any] | None]:
    """(status, JSON body) of one request to the Kubernetes API; KubernetesApiError when it does not answer."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{api_url.rstrip('/')}{path}", data=data, method=method,
                                     headers={"Accept": "application/json", "Content-Type": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise KubernetesApiError(f"the Kubernetes API at {api_url} did not answer ({exc})") from None


def rayjobs_path(namespace: str, name: str = "") -> str:
    """The API path of a namespace's RayJobs, or of one."""
    return f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs" + (f"/{name}" if name else "")


def read_rayjob(api_url: str, namespace: str, name: str, token: str | None = None,
                context: ssl.SSLContext | None = None, timeout_s: float = 10.0) -> dict[str, Any] | None:
    """The RayJob resource, or None when the API says it does not exist (404)."""
    code, body = _call(api_url, rayjobs_path(namespace, name), token, context, timeout_s=timeout_s)
    if code == 404:
        return None
    if code != 200 or body is None:
        raise KubernetesApiError(f"the Kubernetes API at {api_url} answered {code} for RayJob {namespace}/{name}")
    return body


def night_name(template: dict[str, Any], when: datetime) -> str:
    """Tonight's RayJob's name: the template's generateName with the date and minute (one night, one name: a
    CronJob's pod started again finds the RayJob it made)."""
    prefix = str((template.get("metadata") or {}).get("generateName") or "podium-nightly-")
    return f"{prefix}{when:%Y%m%d-%H%M}"


def create_rayjob(api_url: str, namespace: str, template: dict[str, Any], name: str, token: str | None = None,
                  context: ssl.SSLContext | None = None) -> bool:
    """Make the RayJob `name` of the template; False when it already exists (this night's was made already)."""
    meta = {k: v for k, v in (template.get("metadata") or {}).items() if k != "generateName"}
    body = {**template, "metadata": {**meta, "name": name, "namespace": namespace}}
    code, _ = _call(api_url, rayjobs_path(namespace), token, context, method="POST", body=body)
    if code == 409:
        return False
    if code not in (200, 201):
        raise KubernetesApiError(f"the Kubernetes API at {api_url} answered {code} to making RayJob "
                                 f"{namespace}/{name}")
    return True


def prune_rayjobs(api_url: str, namespace: str, prefix: str, keep: int, token: str | None = None,
                  context: ssl.SSLContext | None = None) -> list[str]:
    """Delete the finished RayJobs named `prefix…` beyond the `keep` newest (by name: the night's date and time);
    the RayJobs still running are never touched. Returns the names deleted."""
    code, body = _call(api_url, rayjobs_path(namespace), token, context)
    if code != 200 or body is None:
        raise KubernetesApiError(f"the Kubernetes API at {api_url} answered {code} for the RayJobs of {namespace}")
    finished = sorted(item["metadata"]["name"] for item in body.get("items") or []
                      if item["metadata"]["name"].startswith(prefix)
                      and observe_rayjob(item).deployment_status in TERMINAL_DEPLOYMENT)
    doomed = finished[:max(0, len(finished) - keep)]
    for name in doomed:
        _call(api_url, rayjobs_path(namespace, name), token, context, method="DELETE")
    return doomed


def watch_rayjob(read: Callable[[], dict[str, Any] | None], poll_s: float = 10.0,
                 on_change: Callable[[RayJobOutcome], None] = lambda outcome: None,
                 now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
                 sleep: Callable[[float], None] = time.sleep) -> RayJobOutcome:
    """Read the RayJob until its outcome is final; `on_change` hears every change of phase. Returns the final
    outcome (its Prefect state and exit code)."""
    last: RayJobOutcome | None = None
    while True:
        outcome = rayjob_outcome(observe_rayjob(read()), now(), last)
        if last is None or outcome.phase != last.phase:
            on_change(outcome)
        if outcome.final:
            return outcome
        last = outcome
        sleep(poll_s)


@dataclass(frozen=True)
class Recorded:
    """The RayJob's end as podium says it and exits with, and one line saying what its flow run shows now."""

    outcome: RayJobOutcome
    line: str


def flow_run_name_pattern(run_name: str) -> re.Pattern[str]:
    """The names of the flow runs `podium run` makes for a run name ({date}, {datetime} filled: any night's)."""
    pattern = re.escape(run_name)
    for key in RUN_NAME_PLACEHOLDERS:
        pattern = pattern.replace(re.escape("{" + key + "}"), PATTERNS[key])
    return re.compile(pattern + "-run")


def record_rayjob_end(outcome: RayJobOutcome, rayjob: str, run_name: str, started: datetime | None) -> Recorded:
    """Record a RayJob's end (`outcome`, final) as the state of the nightly's Prefect flow run: the latest flow run
    of `run_name` (the RayJob's config's, {date} filled at any night) that started after the RayJob did. Which
    state it gets is `podium.core.rayjob.flow_run_end`'s; a RayJob that never started `podium run` gets a flow run
    made in its end state. Nothing is recorded (the line says why) when the RayJob's start was never seen (its
    flow run cannot be told from another night's) or the Prefect server does not answer."""
    if started is None:
        return Recorded(outcome, "not recorded in Prefect: the RayJob's start was never seen, so its flow run "
                                 "cannot be told from another night's")
    server = prefect_api.link().api_url
    runs = prefect_api.flow_runs_named_like(NIGHTLY_FLOW, run_name.split("{", 1)[0], started - CLOCK_SKEW)
    if runs is None:
        return Recorded(outcome, f"not recorded in Prefect: the Prefect server {server} does not answer")
    pattern = flow_run_name_pattern(run_name)
    latest = next((r for r in runs if pattern.fullmatch(r.name)), None)
    end = flow_run_end(outcome, latest.state_type if latest else None, latest.message if latest else "")
    ended = end.outcome
    kind = ended.prefect_state.capitalize()
    state = kind if ended.prefect_state_name == kind else f"{ended.prefect_state_name} ({kind})"
    message = f"RayJob {rayjob}: {ended.reason}"
    if latest is not None and not end.write:
        return Recorded(ended, f"flow run {latest.name}: {state}, as podium run ended it")
    if latest is not None:
        if prefect_api.record_flow_state(latest.id, ended.prefect_state, ended.prefect_state_name, message):
            return Recorded(ended, f"flow run {latest.name}: {state} recorded")
        return Recorded(ended, f"not recorded in Prefect: the Prefect server {server} did not take flow run "
                               f"{latest.name}'s state")
    name = f"{expand_run_name(run_name, started)}-run"
    if prefect_api.create_ended_flow_run(NIGHTLY_FLOW, name, ended.prefect_state, ended.prefect_state_name, message):
        return Recorded(ended, f"flow run {name}: {state} recorded (podium run never started one)")
    return Recorded(ended, f"not recorded in Prefect: the Prefect server {server} did not take flow run {name}")
