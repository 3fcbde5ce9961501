"""A RayJob's states in podium's terms (podium.core.rayjob): each one's Prefect flow-run state and exit code, and
the watcher following a status sequence served by a fake Kubernetes API."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from prefect.client.schemas.objects import State, StateType

from podium import errors
from podium.core import exits
from podium.core import rayjob as states
from podium.core.rayjob import DEADLINE_GRACE_S, FlowRunEnd, flow_run_end, observe_rayjob, rayjob_outcome
from podium.deployments.k8s_watch import NIGHTLY_FLOW, flow_run_name_pattern, read_rayjob, watch_rayjob
from tests.helpers.fake_kubernetes import KUBERAY, fake_kubernetes_api, rayjob

START = datetime(2026, 1, 1, 2, 0, tzinfo=timezone.utc)


def status(deployment: str, job: str = "", **more) -> dict:
    return {"jobDeploymentStatus": deployment, "jobStatus": job, "startTime": "2026-01-01T02:00:00Z", **more}


def kuberay(name: str, **more) -> dict:
    """A status as KubeRay's controller writes it (tests/helpers/fake_kubernetes.KUBERAY names the source)."""
    return {**KUBERAY[name], "startTime": "2026-01-01T02:00:00Z", **more}


CASES = {  # name: (status, seconds since the start, phase, Prefect state type, state name, exit code)
    "pending": (kuberay("initializing"), 10, "pending", "PENDING", "Pending", None),
    "running": (kuberay("running"), 60, "running", "RUNNING", "Running", None),
    "head not ready": (kuberay("head not ready"), 60, "head_not_ready", "RUNNING", "Running", None),
    "stopped while deploying": (kuberay("stopped while deploying"), 60, "stopping", "RUNNING", "Stopping", None),
    "retrying": (kuberay("retrying", failed=1), 60, "retrying", "RUNNING", "Retrying", None),
    "succeeded": (kuberay("succeeded"), 600, "succeeded", "COMPLETED", "Completed", exits.EXIT_OK),
    "failed after backoff": (kuberay("app failed", failed=2), 600, "failed", "FAILED", "Failed", exits.EXIT_FAILED),
    "validation failed": (kuberay("validation failed"), 1, "invalid", "FAILED", "Invalid", exits.EXIT_REFUSED),
    "deadline exceeded, job still RUNNING": (kuberay("deadline exceeded"), 3700, "timed_out", "FAILED", "TimedOut",
                                             exits.EXIT_FAILED),
    "submission failed": (kuberay("submission failed", failed=2), 600, "head_lost", "CRASHED", "Crashed",
                          exits.EXIT_UNREACHABLE),
    "status check timed out": (kuberay("status check timed out", failed=2), 600, "head_lost", "CRASHED", "Crashed",
                               exits.EXIT_UNREACHABLE),
    "stuck past its deadline": (kuberay("running"), 3600 + DEADLINE_GRACE_S + 1, "stuck", "FAILED", "TimedOut",
                                exits.EXIT_FAILED),
    "stopped": (kuberay("stopped"), 60, "stopped", "CANCELLED", "Cancelled", exits.EXIT_SIGTERM),
    "suspended": (status("Suspended"), 60, "suspended", "PAUSED", "Suspended", None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_rayjob_state_has_its_flow_run_state_and_exit_code(name):
    seen, after_s, phase, state_type, state_name, code = CASES[name]
    outcome = rayjob_outcome(observe_rayjob(rayjob(seen)), START + timedelta(seconds=after_s))
    assert (outcome.phase, outcome.prefect_state, outcome.prefect_state_name, outcome.exit_code) == (
        phase, state_type, state_name, code)
    assert outcome.final == (code is not None)
    assert State(type=StateType(outcome.prefect_state), name=outcome.prefect_state_name)  # a state Prefect takes


def test_a_rayjob_cleaned_up_keeps_the_end_seen_and_is_a_crash_before_one():
    ended = rayjob_outcome(observe_rayjob(rayjob(status("Complete", "SUCCEEDED"))), START)
    assert rayjob_outcome(observe_rayjob(None), START, last=ended) == ended
    running = rayjob_outcome(observe_rayjob(rayjob(status("Running", "RUNNING"))), START)
    gone = rayjob_outcome(observe_rayjob(None), START, last=running)
    assert (gone.phase, gone.prefect_state, gone.exit_code) == ("cleaned_up", "CRASHED", 3)


def test_the_exit_codes_are_podiums():
    assert (states.EXIT_FAILED, states.EXIT_UNREACHABLE) == (errors.EXIT_FAILED, errors.EXIT_UNREACHABLE)


@pytest.mark.parametrize("sequence, phases, code", [
    ([status("New"), kuberay("initializing"), kuberay("running"), kuberay("retrying", failed=1),
      kuberay("running", failed=1), kuberay("succeeded", failed=1)],
     ["pending", "running", "retrying", "running", "succeeded"], exits.EXIT_OK),
    ([kuberay("running"), kuberay("retrying", failed=1), kuberay("app failed", failed=2)],
     ["running", "retrying", "failed"], exits.EXIT_FAILED),
    # one read of the head not ready is not an end: KubeRay recreates the head, the job goes on
    ([kuberay("running"), kuberay("head not ready"), kuberay("running"), kuberay("succeeded")],
     ["running", "head_not_ready", "running", "succeeded"], exits.EXIT_OK),
    # the head lost for good: the submitter fails, KubeRay fails the RayJob (SubmissionFailed)
    ([kuberay("running"), kuberay("head not ready"), kuberay("submission failed", failed=2)],
     ["running", "head_not_ready", "head_lost"], exits.EXIT_UNREACHABLE),
    ([kuberay("running"), kuberay("status check timed out", failed=2)], ["running", "head_lost"],
     exits.EXIT_UNREACHABLE),
    # STOPPED while the deployment runs ends nothing: KubeRay waits for the submitter, then says Complete
    ([kuberay("running"), kuberay("stopped while deploying"), kuberay("stopped while deploying"), kuberay("stopped")],
     ["running", "stopping", "stopped"], exits.EXIT_SIGTERM),
    ([status("New"), kuberay("validation failed")], ["pending", "invalid"], exits.EXIT_REFUSED),
    ([kuberay("initializing"), kuberay("running"), kuberay("deadline exceeded")], ["pending", "running", "timed_out"],
     exits.EXIT_FAILED),
    ([kuberay("running"), None], ["running", "cleaned_up"], exits.EXIT_UNREACHABLE),
])
def test_the_watcher_follows_the_fake_apis_sequence_to_its_end(sequence, phases, code):
    seen = []
    with fake_kubernetes_api("podium", "podium-nightly", [rayjob(s) for s in sequence]) as url:
        outcome = watch_rayjob(lambda: read_rayjob(url, "podium", "podium-nightly"), poll_s=0,
                               on_change=lambda o: seen.append(o.phase), now=lambda: START + timedelta(minutes=5))
    assert seen == phases
    assert outcome.exit_code == code


def test_a_validation_failure_says_kuberays_message():
    outcome = rayjob_outcome(observe_rayjob(rayjob(kuberay("validation failed"))), START)
    assert outcome.reason.startswith("KubeRay refused the RayJob's spec, nothing started: The RayJob metadata")


def _final(name: str):
    seen, after_s, *_ = CASES[name]
    return rayjob_outcome(observe_rayjob(rayjob(seen)), START + timedelta(seconds=after_s))


@pytest.mark.parametrize("flow_state", ["RUNNING", "PENDING", "PAUSED", "SCHEDULED", None])
@pytest.mark.parametrize("name", ["failed after backoff", "stuck past its deadline", "submission failed", "succeeded"])
def test_a_flow_run_its_driver_left_unended_gets_the_rayjobs_end(name, flow_state):
    end = flow_run_end(_final(name), flow_state)
    assert end.write and end.outcome == _final(name)


@pytest.mark.parametrize("flow_state, code", [("COMPLETED", 0), ("FAILED", 1), ("CRASHED", 3), ("CANCELLED", 143)])
def test_a_flow_run_podium_ended_stands_and_a_cleaned_up_rayjob_ends_as_it_did(flow_state, code):
    assert flow_run_end(_final("submission failed"), flow_state) == FlowRunEnd(_final("submission failed"), write=False)
    gone = rayjob_outcome(observe_rayjob(None), START,
                          last=rayjob_outcome(observe_rayjob(rayjob(status("Running", "RUNNING"))), START))
    end = flow_run_end(gone, flow_state, "nightly-20260101: done")
    assert not end.write
    assert (end.outcome.phase, end.outcome.prefect_state, end.outcome.exit_code) == ("cleaned_up", flow_state, code)
    assert end.outcome.reason.endswith(f"ended its flow run {flow_state.capitalize()}: nightly-20260101: done")


def test_the_flow_run_names_of_a_nightly_run_name():
    pattern = flow_run_name_pattern("fraud.v2-{date}")
    assert pattern.fullmatch("fraud.v2-20260101-run")
    assert not pattern.fullmatch("fraudxv2-20260101-run") and not pattern.fullmatch("fraud.v2-20260101-promote")
    assert flow_run_name_pattern("n-{datetime}").fullmatch("n-20260101-020000-run")


def test_the_flow_the_watch_records_on_is_podium_runs():
    from podium.flows.pipeline import train_validate_promote

    assert NIGHTLY_FLOW == train_validate_promote.name
