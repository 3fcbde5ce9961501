"""What a KubeRay RayJob's status means in podium's terms: one pure function from what the Kubernetes API shows
to a Prefect flow-run state and the exit code of `podium run` (docs/commands.md).

A RayJob's status has two fields that matter, as KubeRay 1.7's controller writes them
(ray-operator/controllers/ray/rayjob_controller.go): `jobStatus`, the Ray job's own (PENDING, RUNNING, STOPPED,
SUCCEEDED, FAILED), copied from the dashboard while the deployment runs; and `jobDeploymentStatus`, KubeRay's (New,
Initializing, Running, Complete, Failed, ValidationFailed, Retrying, Suspending, Suspended, Waiting), with a
`reason` when it failed. Only `jobDeploymentStatus` ends a RayJob: Complete, Failed and ValidationFailed are
terminal; a terminal `jobStatus` under a deployment still Running is not (in K8sJobMode KubeRay waits for the
submitter to finish first). The reasons:

- ValidationFailed: the spec was refused before anything started (the status ValidationFailed too);
- DeadlineExceeded: activeDeadlineSeconds passed, whatever `jobStatus` last showed; never retried;
- AppFailed: the Ray job itself FAILED (the training raised);
- SubmissionFailed: the submitter Job failed while the Ray job had not failed: its `ray job submit` lost the
  head (or never reached it);
- JobStatusCheckTimeoutExceeded: the operator could not read the job's status from the head for its timeout;
- JobDeploymentStatusTransitionGracePeriodExceeded: the submitter finished but the Ray job never reached an end.

The last three mean the driver went with the cluster: podium's run resumes when it is run again (exit 3).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, cast

from podium.core.exits import EXIT_FAILED, EXIT_OK, EXIT_REFUSED, EXIT_UNREACHABLE
from podium.core.exits import EXIT_SIGTERM as EXIT_STOPPED  # as `podium run` stopped by SIGTERM

# how long past activeDeadlineSeconds a RayJob may still show Running before podium calls it stuck: the operator
# checks the deadline on its own reconcile loop, not to the second
DEADLINE_GRACE_S = 120.0

StateType = Literal["PENDING", "RUNNING", "PAUSED", "COMPLETED", "FAILED", "CRASHED", "CANCELLED"]
Phase = Literal["pending", "running", "head_not_ready", "stopping", "retrying", "suspended", "succeeded", "failed",
                "invalid", "timed_out", "stuck", "head_lost", "stopped", "cleaned_up"]

# the deployment statuses after which KubeRay changes nothing but deletions (IsJobDeploymentTerminal, and
# ValidationFailed, which Reconcile never requeues)
TERMINAL_DEPLOYMENT = frozenset({"Complete", "Failed", "ValidationFailed"})

# KubeRay's failure reasons that mean the Ray cluster (its head, with the driver) was lost, not the training
DRIVER_LOST = {
    "SubmissionFailed": "the RayJob's submitter lost the Ray head (KubeRay: SubmissionFailed)",
    "JobStatusCheckTimeoutExceeded": "KubeRay could not read the job's status from the Ray head "
                                     "(JobStatusCheckTimeoutExceeded)",
    "JobDeploymentStatusTransitionGracePeriodExceeded": "the submitter ended but the Ray job never did "
                                                        "(JobDeploymentStatusTransitionGracePeriodExceeded)",
}


@dataclass(frozen=True)
class RayJobObservation:
    """What one read of a RayJob showed (`found` False: the API answered 404, the RayJob is gone)."""

    found: bool
    job_status: str = ""
    deployment_status: str = ""
    reason: str = ""
    message: str = ""
    failed: int = 0
    start_time: datetime | None = None
    head_ready: bool | None = None  # the RayCluster's HeadPodReady condition; None where it is not shown
    active_deadline_s: int | None = None
    backoff_limit: int = 0


@dataclass(frozen=True)
class RayJobOutcome:
    """A RayJob's state in podium's terms: a Prefect flow-run state (type and name) and, once final, an exit code."""

    phase: Phase
    prefect_state: StateType
    prefect_state_name: str
    exit_code: int | None  # None while the RayJob is not over
    reason: str

    @property
    def final(self) -> bool:
        """Whether the RayJob is over (nothing it does later changes the outcome)."""
        return self.exit_code is not None


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def observe_rayjob(resource: dict[str, Any] | None) -> RayJobObservation:
    """The observation of a RayJob resource as the Kubernetes API returns it (None: 404, the RayJob is gone)."""
    if resource is None:
        return RayJobObservation(found=False)
    spec, status = resource.get("spec") or {}, resource.get("status") or {}
    cluster = status.get("rayClusterStatus") or {}
    head_ready = None
    for condition in cluster.get("conditions") or []:
        if condition.get("type") == "HeadPodReady":
            head_ready = condition.get("status") == "True"
    return RayJobObservation(
        found=True, job_status=str(status.get("jobStatus") or ""),
        deployment_status=str(status.get("jobDeploymentStatus") or ""), reason=str(status.get("reason") or ""),
        message=str(status.get("message") or ""), failed=int(status.get("failed") or 0),
        start_time=_time(status.get("startTime")), head_ready=head_ready,
        active_deadline_s=spec.get("activeDeadlineSeconds"), backoff_limit=int(spec.get("backoffLimit") or 0))


def rayjob_outcome(seen: RayJobObservation, now: datetime, last: RayJobOutcome | None = None) -> RayJobOutcome:
    """What the RayJob's status means for podium: its flow-run state and, once it is over, the exit code.

    `last` is the outcome of the previous read: a RayJob deleted after its end (ttlSecondsAfterFinished) keeps
    that end; one deleted before podium saw an end is a crash (exit 3: run it again, podium resumes the run)."""
    if not seen.found:
        if last is not None and last.final:
            return last
        return RayJobOutcome("cleaned_up", "CRASHED", "Crashed", EXIT_UNREACHABLE,
                             "the RayJob was deleted before its end was seen (a TTL cleanup or a delete): run it "
                             "again, the run resumes from its latest checkpoint")
    status, job = seen.deployment_status, seen.job_status
    attempts = seen.backoff_limit + 1
    said = f": {seen.message}" if seen.message else ""
    if status == "ValidationFailed":  # the controller's validateRayJob: nothing was created
        return RayJobOutcome("invalid", "FAILED", "Invalid", EXIT_REFUSED,
                             f"KubeRay refused the RayJob's spec, nothing started{said}")
    if status == "Complete" and job == "SUCCEEDED":
        return RayJobOutcome("succeeded", "COMPLETED", "Completed", EXIT_OK, "the training ran to its end")
    if status == "Complete" and job == "STOPPED":
        return RayJobOutcome("stopped", "CANCELLED", "Cancelled", EXIT_STOPPED, "the Ray job was stopped")
    if status == "Failed" or status == "Complete":
        if seen.reason == "DeadlineExceeded":  # set on the deployment status alone: jobStatus may still say RUNNING
            return RayJobOutcome("timed_out", "FAILED", "TimedOut", EXIT_FAILED,
                                 f"the RayJob ran past its activeDeadlineSeconds ({seen.active_deadline_s} s) and was "
                                 "stopped")
        if seen.reason in DRIVER_LOST or (seen.head_ready is False and job != "FAILED"):
            cause = DRIVER_LOST.get(seen.reason, "the Ray cluster's head was lost")
            return RayJobOutcome("head_lost", "CRASHED", "Crashed", EXIT_UNREACHABLE,
                                 f"{cause}: run it again, the run resumes from its latest checkpoint")
        tried = max(seen.failed, 1)
        detail = said or (f" ({seen.reason})" if seen.reason else "")
        return RayJobOutcome("failed", "FAILED", "Failed", EXIT_FAILED,
                             f"the training failed after {tried} of {attempts} attempt(s){detail}")
    if status == "Retrying":
        return RayJobOutcome("retrying", "RUNNING", "Retrying", None,
                             f"attempt {seen.failed} of {attempts} failed: a new cluster starts and the run resumes")
    if status in ("Suspending", "Suspended"):
        return RayJobOutcome("suspended", "PAUSED", "Suspended", None, "the RayJob is suspended (spec.suspend)")
    if status == "Running":
        if seen.active_deadline_s is not None and seen.start_time is not None:
            running_s = (now - seen.start_time).total_seconds()
            if running_s > seen.active_deadline_s + DEADLINE_GRACE_S:
                return RayJobOutcome("stuck", "FAILED", "TimedOut", EXIT_FAILED,
                                     f"the RayJob still runs {running_s:.0f} s after its start, past its "
                                     f"activeDeadlineSeconds ({seen.active_deadline_s} s): is the KubeRay operator "
                                     "running?")
        if job == "STOPPED":  # KubeRay ends the deployment once the submitter has finished too
            return RayJobOutcome("stopping", "RUNNING", "Stopping", None,
                                 "the Ray job stopped; KubeRay has not ended the RayJob yet")
        if seen.head_ready is False:  # one read is not an end: KubeRay recreates a lost head pod
            return RayJobOutcome("head_not_ready", "RUNNING", "Running", None,
                                 "the Ray head pod is not ready: KubeRay recreates it, or fails the RayJob")
        return RayJobOutcome("running", "RUNNING", "Running", None, "the training runs")
    return RayJobOutcome("pending", "PENDING", "Pending", None,
                         f"the Ray cluster is starting ({status or 'no status yet'})")


# a flow run's end as an exit code, as `podium run` exits for it (docs/commands.md)
FLOW_RUN_EXIT = {"COMPLETED": EXIT_OK, "FAILED": EXIT_FAILED, "CRASHED": EXIT_UNREACHABLE, "CANCELLED": EXIT_STOPPED}


@dataclass(frozen=True)
class FlowRunEnd:
    """What a RayJob's end does to the nightly's Prefect flow run: the outcome said and exited with, and whether
    its state is written on the flow run (False: podium's own record of the run's end stands)."""

    outcome: RayJobOutcome
    write: bool


def flow_run_end(outcome: RayJobOutcome, flow_state: str | None, flow_message: str = "") -> FlowRunEnd:
    """The flow run's state once the RayJob is over (`outcome` final), given the state type the nightly's flow run
    shows (None: the RayJob made none, `podium run` never started).

    A flow run already ended (Completed, Failed, Crashed, Cancelled) was ended by `podium run` itself, which knows
    what the run did: it stands. A RayJob cleaned up before its end was seen then ends as its flow run did (its
    exit code is that state's). A flow run still Running, Pending or Paused was left so by a driver that is gone
    with its cluster (head lost, the last attempt failed, the deadline passed, the RayJob deleted): it gets the
    RayJob's outcome, with the reason. None: a flow run in the outcome's state is made, so the night shows."""
    if flow_state is None or flow_state not in FLOW_RUN_EXIT:
        return FlowRunEnd(outcome, write=True)
    if outcome.phase == "cleaned_up":
        said = f": {flow_message}" if flow_message else ""
        name = flow_state.capitalize()
        return FlowRunEnd(RayJobOutcome("cleaned_up", cast(StateType, flow_state), name, FLOW_RUN_EXIT[flow_state],
                                        f"the RayJob was deleted after podium ended its flow run {name}{said}"),
                          write=False)
    return FlowRunEnd(outcome, write=False)
