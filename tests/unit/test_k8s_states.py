"""A RayJob's states in podium's terms (podium.core.rayjob): each one's Prefect flow-run state and exit code, and
the watcher following a status sequence served by a fake Kubernetes API."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from prefect.client.schemas.objects import State, StateType

from podium import errors
from podium.core import rayjob as states
from podium.core.rayjob import DEADLINE_GRACE_S, FlowRunEnd, flow_run_end, observe_rayjob, rayjob_outcome
from podium.deployments.k8s_watch import NIGHTLY_FLOW, flow_run_name_pattern, read_rayjob, watch_rayjob
from tests.helpers.fake_kubernetes import fake_kubernetes_api, rayjob

START = datetime(2026, 1, 1, 2, 0, tzinfo=timezone.utc)
HEAD_LOST = {"conditions": [{"type": "HeadPodReady", "status": "False"}]}


def status(deployment: str, job: str = "", **more) -> dict:
    return {"jobDeploymentStatus": deployment, "jobStatus": job, "startTime": "2026-01-01T02:00:00Z", **more}


CASES = {  # name: (status, seconds since the start, phase, Prefect state type, state name, exit code)
    "pending": (status("Initializing"), 10, "pending", "PENDING", "Pending", None),
    "running": (status("Running", "RUNNING"), 60, "running", "RUNNING", "Running", None),
    "retrying": (status("Retrying", "FAILED", failed=1), 60, "retrying", "RUNNING", "Retrying", None),
    "succeeded": (status("Complete", "SUCCEEDED"), 600, "succeeded", "COMPLETED", "Completed", 0),
    "failed after backoff": (status("Failed", "FAILED", failed=2, reason="AppFailed"), 600, "failed", "FAILED",
                             "Failed", 1),
    "deadline exceeded": (status("Failed", "STOPPED", reason="DeadlineExceeded"), 3700, "timed_out", "FAILED",
                          "TimedOut", 1),
    "stuck past its deadline": (status("Running", "RUNNING"), 3600 + DEADLINE_GRACE_S + 1, "stuck", "FAILED",
                                "TimedOut", 1),
    "head lost": (status("Running", "RUNNING", rayClusterStatus=HEAD_LOST), 60, "head_lost", "CRASHED", "Crashed", 3),
    "stopped": (status("Complete", "STOPPED"), 60, "stopped", "CANCELLED", "Cancelled", 143),
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
    ([status("New"), status("Initializing"), status("Running", "RUNNING"), status("Retrying", "FAILED", failed=1),
      status("Running", "RUNNING", failed=1), status("Complete", "SUCCEEDED", failed=1)],
     ["pending", "running", "retrying", "running", "succeeded"], 0),
    ([status("Running", "RUNNING"), status("Retrying", "FAILED", failed=1),
      status("Failed", "FAILED", failed=2, reason="AppFailed", message="the training loop raised")],
     ["running", "retrying", "failed"], 1),
    ([status("Running", "RUNNING"), status("Running", "RUNNING", rayClusterStatus=HEAD_LOST)],
     ["running", "head_lost"], 3),
    ([status("Running", "RUNNING"), None], ["running", "cleaned_up"], 3),
])
def test_the_watcher_follows_the_fake_apis_sequence_to_its_end(sequence, phases, code):
    seen = []
    with fake_kubernetes_api("podium", "podium-nightly", [rayjob(s) for s in sequence]) as url:
        outcome = watch_rayjob(lambda: read_rayjob(url, "podium", "podium-nightly"), poll_s=0,
                               on_change=lambda o: seen.append(o.phase), now=lambda: START + timedelta(minutes=5))
    assert seen == phases
    assert outcome.exit_code == code


def _final(name: str):
    seen, after_s, *_ = CASES[name]
    return rayjob_outcome(observe_rayjob(rayjob(seen)), START + timedelta(seconds=after_s))


@pytest.mark.parametrize("flow_state", ["RUNNING", "PENDING", "PAUSED", "SCHEDULED", None])
@pytest.mark.parametrize("name", ["failed after backoff", "stuck past its deadline", "head lost", "succeeded"])
def test_a_flow_run_its_driver_left_unended_gets_the_rayjobs_end(name, flow_state):
    end = flow_run_end(_final(name), flow_state)
    assert end.write and end.outcome == _final(name)


@pytest.mark.parametrize("flow_state, code", [("COMPLETED", 0), ("FAILED", 1), ("CRASHED", 3), ("CANCELLED", 143)])
def test_a_flow_run_podium_ended_stands_and_a_cleaned_up_rayjob_ends_as_it_did(flow_state, code):
    assert flow_run_end(_final("head lost"), flow_state) == FlowRunEnd(_final("head lost"), write=False)
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
