"""The point of no return of a promotion, without servers: the carry-out asks the flow's stop before each step up to
the switch and never after it; the flow's words for a stop before and after it; a signal handler that only records
the stop (the process, end to end: tests/integration/test_stop_points.py)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from podium.errors import RunStopped
from podium.flows.stop import StopRequest, stop_on_signals
from podium.flows.summary import late_stop, stopped_before_switch
from podium.tasks import carry_out as co
from podium.tasks.carry_out import Promoted, PromotionOutcome, Rollout


def _rollout(stop: StopRequest) -> Rollout:
    return Rollout(plan=None, tracking=None, still_locked=lambda: None, record=None, value=1.0,  # type: ignore[arg-type]
                   reason="test", policy=None, stop=stop)  # type: ignore[arg-type]


def _steps(ran: list[str], stop: StopRequest, stop_after: str):
    """Steps named as the carry-out's, that record that they ran; `stop_after` asks for a stop as it ends."""

    def make(name: str):
        def step(r: Rollout) -> None:
            ran.append(name)
            if name == stop_after:
                stop.request(signal.SIGINT)

        step.__name__ = name
        return step

    return [make(n) for n in ("stage", "verify", "seal", "switch", "alias")]


def test_a_stop_before_the_switch_ends_the_carry_out_before_its_next_step(monkeypatch):
    stop, ran = StopRequest(), []
    steps = _steps(ran, stop, stop_after="verify")
    monkeypatch.setattr(co, "POINTS_OF_NO_RETURN", (steps[3],))
    with pytest.raises(RunStopped):
        co.carry_out(steps, _rollout(stop))
    assert ran == ["stage", "verify"]  # nothing was staged by these steps (no version): nothing to withdraw


def test_a_stop_after_the_switch_lets_the_promotion_run_to_its_end(monkeypatch):
    stop, ran = StopRequest(), []
    steps = _steps(ran, stop, stop_after="switch")
    monkeypatch.setattr(co, "POINTS_OF_NO_RETURN", (steps[3],))
    co.carry_out(steps, _rollout(stop))
    assert ran == ["stage", "verify", "seal", "switch", "alias"]


def test_without_a_stop_every_step_runs():
    ran: list[str] = []
    co.carry_out(_steps(ran, StopRequest(), stop_after=""), _rollout(StopRequest()))
    assert ran == ["stage", "verify", "seal", "switch", "alias"]


def test_the_flow_says_what_a_stop_did_on_either_side_of_the_switch():
    promoted = Promoted(version="v000002", uri="/s/versions/v000002", step=1, metric="accuracy", value=0.9,
                        checkpoint_uri="/c")
    assert late_stop(signal.SIGINT, PromotionOutcome(promoted=promoted, reason="r")) == \
        "SIGINT after the switch: v000002 promoted; the run is complete"
    assert late_stop(signal.SIGTERM, PromotionOutcome(promoted=None, reason="r")) is None  # the stop ends the run
    assert late_stop(None, PromotionOutcome(promoted=promoted, reason="r")) is None
    assert stopped_before_switch(signal.SIGTERM) == "stopped before the switch: nothing was promoted (SIGTERM)"


def test_the_pause_hook_waits_for_the_stop_only_at_its_point(monkeypatch, tmp_path):
    stop = StopRequest()
    marker = tmp_path / "paused"
    monkeypatch.setenv(co.PAUSE_AT, "after-switch")
    monkeypatch.setenv(co.PAUSE_FILE, str(marker))
    co.pause_for_tests("before-switch", _rollout(stop))  # another point: no wait, no file
    assert not marker.exists()
    stop.request(signal.SIGINT)
    co.pause_for_tests("after-switch", _rollout(stop))  # asked already: it goes on at once
    assert marker.read_text() == "after-switch"


def test_a_signal_during_the_run_only_records_the_stop():
    with stop_on_signals() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 5
        while not stop.requested and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stop.requested and stop.signum == signal.SIGINT
        with pytest.raises(RunStopped):
            stop.check()


def test_a_command_that_is_gone_has_its_open_mlflow_run_ended_killed_saying_why_and_no_other(tmp_path):
    """The next command that settles what a killed command left (a watch, a staged version) ends the MLflow run that
    command left RUNNING (podium.tasks.reconcile): the run its flow run trained, and no run of another flow run."""
    from podium.tracking.client import TAG_FLOW_RUN, TAG_REASON
    from podium.tracking.runs import TAG_ENDED_BY, kill_orphan_runs, open_tracking_run

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    gone = open_tracking_run(uri, "stops", "killed", {})
    alive = open_tracking_run(uri, "stops", "running", {})
    gone.client().set_tag(gone.run_id, TAG_FLOW_RUN, "flow-run-of-the-killed-command")
    alive.client().set_tag(alive.run_id, TAG_FLOW_RUN, "flow-run-still-running")

    assert kill_orphan_runs(uri, "flow-run-of-the-killed-command", "its watch was settled") == [gone.run_id]
    ended = gone.client().get_run(gone.run_id)
    assert ended.info.status == "KILLED" and ended.data.tags[TAG_ENDED_BY] == "its watch was settled"
    assert ended.data.tags[TAG_REASON] == "its watch was settled"  # `podium status`'s "why:" says it, not a stale one
    assert alive.client().get_run(alive.run_id).info.status == "RUNNING"
    assert kill_orphan_runs(uri, "flow-run-of-the-killed-command", "again") == []  # ended once


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_once_the_run_s_body_ended_is_kept_for_the_command_to_say_not_raised(signum):
    """After its run's body (the flow run's end being recorded by Prefect's engine, the command writing its output), a
    command's signal is recorded on the run's request, as during the run: the command ends with its outcome's exit
    code and says the signal came (`late_stop`), instead of dying of it (or Prefect's engine crashing a flow run that
    ended). Before the run (start-up) it still raises."""
    from podium.cli import signals
    from podium.flows import stop
    from podium.flows.stop import SIGNALS

    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signals.stop_before_the_run()
        with stop_on_signals() as request:
            assert not request.requested
        os.kill(os.getpid(), signum)  # after the body: kept, not raised
        time.sleep(0.05)
        assert request.signum == signum and stop.STOP is request
        signals.stop_before_the_run()  # the next command: a start-up signal raises again
        with pytest.raises(KeyboardInterrupt if signum == signal.SIGINT else SystemExit):
            os.kill(os.getpid(), signum)
            time.sleep(0.05)
    finally:
        signals.end_command()  # pytest's process runs in-process flows after this test: no command's state outlives it
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
