"""Follow a KubeRay RayJob through the Kubernetes API until it is over, saying each change in podium's terms
(`podium.core.rayjob`): `podium k8s watch podium-nightly`.

It reads the RayJob (GET .../apis/ray.io/v1/namespaces/NS/rayjobs/NAME) every `poll_s` seconds; in a pod it uses
the pod's service account (its token and CA), elsewhere the API URL and token it is given (`kubectl proxy` serves
one with neither).
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from podium.core.rayjob import RayJobOutcome, observe_rayjob, rayjob_outcome

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
IN_CLUSTER_API = "https://kubernetes.default.svc"


class KubernetesApiError(Exception):
    """The Kubernetes API did not answer, or answered something other than the RayJob or a 404."""


def in_cluster_api() -> tuple[str, str | None, ssl.SSLContext | None]:
    """(API URL, bearer token, TLS context) of the pod's service account, or of `kubectl proxy` outside a pod."""
    token_file = SERVICE_ACCOUNT / "token"
    if token_file.is_file():
        context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
        return IN_CLUSTER_API, token_file.read_text().strip(), context
    return "http://127.0.0.1:8001", None, None  # kubectl proxy's default address


def read_rayjob(api_url: str, namespace: str, name: str, token: str | None = None,
                context: ssl.SSLContext | None = None, timeout_s: float = 10.0) -> dict[str, Any] | None:
    """The RayJob resource, or None when the API says it does not exist (404)."""
    url = f"{api_url.rstrip('/')}/apis/ray.io/v1/namespaces/{namespace}/rayjobs/{name}"
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise KubernetesApiError(f"the Kubernetes API at {api_url} answered {exc.code} for RayJob "
                                 f"{namespace}/{name}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise KubernetesApiError(f"the Kubernetes API at {api_url} did not answer ({exc})") from None


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
