"""Telling a tracking server that did not answer from one that answered with an error."""

from __future__ import annotations

import os
import pickle
import socket

import pytest
from mlflow.exceptions import MlflowException, RestException
from mlflow.tracking import MlflowClient
from prefect.states import Failed

from podium.errors import TrackingUnavailable
from podium.outages import is_unreachable
from podium.tasks.validate import retry_unless_tracking_down
from podium.tracking.client import HTTP_RETRY_DEFAULTS, apply_http_retry_defaults, reaching_tracking


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def test_refused_connection_becomes_tracking_unavailable_naming_the_server(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    uri = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(TrackingUnavailable) as caught:
        with reaching_tracking(uri, "writing validation metrics"):
            MlflowClient(uri).get_experiment_by_name("podium")
    exc = caught.value
    assert exc.tracking_uri == uri and exc.reason == "Connection refused"
    assert str(exc).startswith(f"MLflow tracking server {uri} unreachable while writing validation metrics")
    assert is_unreachable(exc.__cause__)


def test_an_answer_from_the_server_is_not_an_outage():
    answered = RestException({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "No run with id x"})
    assert not is_unreachable(answered)
    with pytest.raises(RestException):
        with reaching_tracking("http://mlflow:5000", "reading"):
            raise answered
    assert not is_unreachable(MlflowException("Invalid model version source"))


def test_retry_defaults_leave_the_environment_s_own_values(monkeypatch):
    for name in HTTP_RETRY_DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "45")
    apply_http_retry_defaults()
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "45"
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == HTTP_RETRY_DEFAULTS["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]


def test_tracking_unavailable_survives_pickling_and_stops_validation_retries():
    exc = TrackingUnavailable("http://mlflow:5000", "writing validation metrics", "Connection refused", 61.7)
    back = pickle.loads(pickle.dumps(exc))
    assert str(back) == str(exc) and back.waited_s == 61.7
    with_password = TrackingUnavailable("https://ci:hunter2@mlflow:5000", "reading", "Connection refused", 1.0)
    assert "hunter2" not in str(with_password) and "https://***@mlflow:5000" in str(with_password)
    # the state Prefect's task engine gives a retry condition when the task raised
    assert retry_unless_tracking_down(None, None, Failed(data=exc)) is False
    assert retry_unless_tracking_down(None, None, Failed(data=RuntimeError("validation data unavailable"))) is True
