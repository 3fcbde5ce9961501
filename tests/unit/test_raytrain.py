"""What podium reads from a report's `validation=`, and how a failure reads (no Ray is started).

Importing podium.training.raytrain imports Ray Train."""

from __future__ import annotations

import inspect

import ray.train
from ray.train import ValidationTaskConfig

from podium.core.events import CheckpointEvent, ValidationRequest
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


def test_the_request_stays_out_of_event_payloads():
    event = CheckpointEvent(run_name="r", step=1, metrics={}, checkpoint_uri="/c", checkpoint_name="c",
                            validation=ValidationRequest(requested=False, stated=True, fn_kwargs={"ds": object()}))
    payload = event.to_dict()
    assert "validation" not in payload and payload["validation_requested"] is False
    assert CheckpointEvent.from_dict(payload).validation == ValidationRequest(requested=False, stated=True)


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
