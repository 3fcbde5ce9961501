"""What podium reads from a report's `validation=`, and how a failure reads (no Ray is started).

Importing podium.training.raytrain imports Ray Train."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
import ray.train
from ray.train import ValidationTaskConfig

from podium.core.events import CheckpointEvent, CheckpointPayload, ValidationRequest
from podium.core.failures import describe_failure, plain_text
from podium.training import raytrain


def test_each_form_of_validation_becomes_a_request():
    assert raytrain.validation_request(raytrain.NOT_STATED) == ValidationRequest(requested=True, stated=False)
    assert raytrain.validation_request(True) == ValidationRequest(requested=True, stated=True)
    assert raytrain.validation_request(False) == ValidationRequest(requested=False, stated=True)
    got = raytrain.validation_request(ValidationTaskConfig(fn_kwargs={"epoch": 2}, timeout_s=9.0))
    assert got == ValidationRequest(requested=True, stated=True, fn_kwargs={"epoch": 2}, timeout_s=9.0)


def test_the_carried_request_reads_as_no_validation_to_ray():
    carried = raytrain._ReportedValidation(ValidationRequest(fn_kwargs={"dataset": object()}), 3)
    assert not carried  # Ray's "validation_config was not set" check and its checkpoint manager skip it
    assert "object at" not in repr(carried)  # Ray logs every report: the arguments themselves stay out


def test_reports_default_tells_not_stated_from_false():
    fn = inspect.unwrap(ray.train.report)
    before = fn.__defaults__
    try:
        raytrain._default_validation_to_not_stated()
        assert inspect.signature(fn).parameters["validation"].default is raytrain.NOT_STATED
        raytrain._default_validation_to_not_stated()  # twice is the same
        assert inspect.signature(fn).parameters["validation"].default is raytrain.NOT_STATED
    finally:
        fn.__defaults__ = before


LIGHTNING_CALLBACK_DEFAULT = """
import inspect, sys
from podium.training import raytrain
if sys.argv[1] == "before":
    import ray.train.lightning
raytrain._framework_callbacks_to_not_stated()
raytrain._framework_callbacks_to_not_stated()  # twice is the same
from ray.train.lightning import RayTrainReportCallback
from ray.train.lightning import _lightning_utils
default = inspect.signature(RayTrainReportCallback.__init__).parameters["validation"].default
assert default is raytrain.NOT_STATED, default
assert "class RayTrainReportCallback" in inspect.getsource(_lightning_utils)  # tracebacks still show its code
print("ok")
"""


@pytest.mark.parametrize("imported", ["before", "after"])
def test_lightnings_callback_default_reads_as_not_stated_and_only_a_written_false_opts_out(imported):
    """Ray's Lightning RayTrainReportCallback passes `validation=self.validation`, False unless the user
    writes otherwise: in podium's workers its default is NOT_STATED, whether the user's module imported it
    before podium's worker callback ran or imports it after (a fresh interpreter for each), so that
    `RayTrainReportCallback()` is validated and `RayTrainReportCallback(validation=False)` is not."""
    pytest.importorskip("lightning")
    proc = subprocess.run([sys.executable, "-c", LIGHTNING_CALLBACK_DEFAULT, imported], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
    assert raytrain.validation_request(False) == ValidationRequest(requested=False, stated=True)


def test_the_request_stays_out_of_event_payloads():
    event = CheckpointEvent(run_name="r", step=1, metrics={}, checkpoint_uri="/c", checkpoint_name="c",
                            validation=ValidationRequest(requested=False, stated=True, fn_kwargs={"ds": object()}))
    payload = event.to_dict()
    assert "validation" not in payload and payload["validation_requested"] is False
    assert CheckpointPayload(**payload).event().validation == ValidationRequest(requested=False, stated=True)


def test_failures_read_as_plain_text_one_line_per_rank():
    class WorkerGroupError(Exception):
        def __init__(self, failures):
            super().__init__("Training failed due to worker errors")
            self.worker_failures = failures

    remote = RuntimeError("\x1b[36mray::RayTrainWorker.run()\x1b[39m\nTraceback (most recent call last):\n"
                          "  File \"loop.py\", line 3\nValueError: bad batch")
    died = RuntimeError("A worker health check failed.\nWorker info: ...")
    assert describe_failure(WorkerGroupError({1: died, 0: remote})) == (
        "rank 0: ValueError: bad batch; rank 1: A worker health check failed.")
    assert plain_text("\x1b[31mred\x1b[0m plain") == "red plain"
    assert describe_failure(None) == "unknown cause"


def test_a_local_ray_starts_without_ray_trains_preemption_watcher_unless_the_user_set_it(monkeypatch):
    """A local Ray of podium's own is one machine that no provider drains: its processes start with Ray Train's
    preemption watcher off (an actor fewer per run); a user's own setting wins; the environment is restored."""
    import os

    from podium.training import cluster

    name = cluster.PREEMPTION_WATCHER_ENV
    monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYTHONPATH", "/theirs")
    with cluster._start_environment(["/user/code"]):
        assert os.environ[name] == "0" and os.environ["PYTHONPATH"] == os.pathsep.join(["/user/code", "/theirs"])
    assert name not in os.environ and os.environ["PYTHONPATH"] == "/theirs"
    monkeypatch.setenv(name, "1")
    with cluster._start_environment([]):
        assert os.environ[name] == "1"
    assert os.environ[name] == "1"
