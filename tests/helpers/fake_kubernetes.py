"""A fake Kubernetes API on loopback for one RayJob: each GET of it answers the next status of a sequence (the
last one repeats); None in the sequence answers 404, as the API does once a RayJob is deleted."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def rayjob(status: dict[str, Any] | None, deadline_s: int = 3600, backoff_limit: int = 1) -> dict[str, Any] | None:
    """A RayJob resource with this status (None: none, the RayJob is gone)."""
    if status is None:
        return None
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "podium-nightly", "namespace": "podium"},
            "spec": {"activeDeadlineSeconds": deadline_s, "backoffLimit": backoff_limit}, "status": status}


class JsonHandler(BaseHTTPRequestHandler):
    """A handler that answers JSON, quietly."""

    def _answer(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """The URL of a loopback server of `handler` while the block runs."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# The statuses KubeRay 1.7's RayJob controller writes, each as the code that writes it sets its fields
# (ray-project/kuberay, ray-operator/controllers/ray/rayjob_controller.go; the constants in
# ray-operator/apis/ray/v1/rayjob_types.go: JobDeploymentStatus, JobFailedReason). `startTime` is set once per
# attempt by initRayJobStatusIfNeed (New -> Initializing); a test adds it.
KUBERAY = {
    # initRayJobStatusIfNeed: JobStatusNew (""), then Initializing while the RayCluster is not Ready
    "initializing": {"jobDeploymentStatus": "Initializing", "jobStatus": ""},
    # Reconcile, case JobDeploymentStatusRunning: jobStatus copied from the dashboard's GetJobInfo
    "running": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"},
    # the same, the head pod lost: the RayCluster's status (HeadPodReady False) is copied into rayClusterStatus;
    # the deployment stays Running while KubeRay recreates the head
    "head not ready": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING",
                       "rayClusterStatus": {"conditions": [{"type": "HeadPodReady", "status": "False"}]}},
    # the same: a terminal jobStatus in K8sJobMode keeps the deployment Running until the submitter has finished
    # (`isJobTerminal = isJobTerminal && finishedAt != nil`)
    "stopped while deploying": {"jobDeploymentStatus": "Running", "jobStatus": "STOPPED"},
    # the same, terminal: jobStatus SUCCEEDED or STOPPED -> Complete; FAILED -> Failed with reason AppFailed
    "succeeded": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"},
    "stopped": {"jobDeploymentStatus": "Complete", "jobStatus": "STOPPED"},
    "app failed": {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed",
                   "message": "the training loop raised"},
    # checkBackoffLimitAndUpdateStatusIfNeeded: Failed, failed < backoffLimit + 1, reason not DeadlineExceeded
    "retrying": {"jobDeploymentStatus": "Retrying", "jobStatus": "FAILED", "reason": "AppFailed"},
    # validateRayJob failing: JobDeploymentStatusValidationFailed, reason ValidationFailed, message the error;
    # Reconcile returns without requeueing
    "validation failed": {"jobDeploymentStatus": "ValidationFailed", "jobStatus": "", "reason": "ValidationFailed",
                          "message": "The RayJob metadata is invalid: RayJob name should be no more than 47 "
                                     "characters"},
    # checkActiveDeadlineAndUpdateStatusIfNeeded: only jobDeploymentStatus, reason and message change, so jobStatus
    # keeps what the last read of the dashboard gave (RUNNING); never retried (checkBackoffLimit...)
    "deadline exceeded": {"jobDeploymentStatus": "Failed", "jobStatus": "RUNNING", "reason": "DeadlineExceeded",
                          "message": "The RayJob has passed the activeDeadlineSeconds."},
    # checkSubmitterAndUpdateStatusIfNeeded, K8sJobMode: the submitter Job failed and jobStatus is not FAILED
    "submission failed": {"jobDeploymentStatus": "Failed", "jobStatus": "RUNNING", "reason": "SubmissionFailed",
                          "message": "Job submission has failed. Reason: BackoffLimitExceeded. Message: Job has "
                                     "reached the specified backoff limit"},
    # the reason the issue on KubeRay 1.7 names for a head lost while the operator polls the job's status (its
    # GET of the job timed out); the controller source the tests could read has no such constant: written as the
    # other Failed reasons are (deployment Failed, jobStatus as last read)
    "status check timed out": {"jobDeploymentStatus": "Failed", "jobStatus": "RUNNING",
                               "reason": "JobStatusCheckTimeoutExceeded"},
}


@contextmanager
def fake_kubernetes_api(namespace: str, name: str, sequence: list[dict[str, Any] | None]) -> Iterator[str]:
    """The fake API's URL while the block runs; it serves `sequence` (RayJob resources, None for a 404) at the
    RayJob's path, one per GET."""
    path = f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/{name}"
    served = iter(sequence)
    last: list[dict[str, Any] | None] = [None]

    class Handler(JsonHandler):
        def do_GET(self) -> None:
            if self.path != path:
                self._answer(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
                return
            last[0] = next(served, last[0])
            if last[0] is None:
                self._answer(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
            else:
                self._answer(200, last[0])

    with serving(Handler) as url:
        yield url


@contextmanager
def fake_rayjob_api(namespace: str, existing: list[dict[str, Any]],
                    sequence: list[dict[str, Any] | None]) -> Iterator[tuple[str, dict[str, Any]]]:
    """A fake API of a namespace's RayJobs for `podium k8s submit`: `existing` RayJobs listed; a POST makes one
    (409 when its name exists), whose GETs answer `sequence`'s statuses in turn (the last repeats); a DELETE removes
    one. Yields the URL and what happened: {"made": [bodies], "deleted": [names]}."""
    base = f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs"
    jobs = {job["metadata"]["name"]: job for job in existing}
    happened: dict[str, Any] = {"made": [], "deleted": []}
    served = iter(sequence)
    last: list[dict[str, Any] | None] = [None]

    class Handler(JsonHandler):
        def do_GET(self) -> None:
            if self.path == base:
                self._answer(200, {"kind": "RayJobList", "items": list(jobs.values())})
                return
            name = self.path.removeprefix(base + "/")
            if name not in jobs:
                self._answer(404, {"kind": "Status", "code": 404})
                return
            if any(made["metadata"]["name"] == name for made in happened["made"]):
                last[0] = next(served, last[0])
                if last[0] is None:
                    self._answer(404, {"kind": "Status", "code": 404})
                    return
                jobs[name] = {**jobs[name], "status": last[0]}
            self._answer(200, jobs[name])

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            name = body["metadata"]["name"]
            if self.path != base or name in jobs:
                self._answer(409, {"kind": "Status", "code": 409, "reason": "AlreadyExists"})
                return
            jobs[name] = body
            happened["made"].append(body)
            self._answer(201, body)

        def do_DELETE(self) -> None:
            name = self.path.removeprefix(base + "/")
            happened["deleted"].append(name)
            self._answer(200 if jobs.pop(name, None) else 404, {"kind": "Status"})

    with serving(Handler) as url:
        yield url, happened
