"""The failures podium knows map to one sentence and their documented exit codes (podium.cli.errors.known_failure);
through the real process: tests/integration/test_failure_audit.py."""

from __future__ import annotations

import socket
import time

import pytest

from podium.cli.errors import known_failure
from podium.errors import EXIT_REFUSED, EXIT_UNREACHABLE, RayClusterUnreachable, RayStartFailed
from podium.outages import is_unreachable
from podium.storage.errors import ConditionalWritesIgnored


def test_each_known_failure_has_its_exit_code_and_its_own_words():
    said = "Ray did not start on this machine (2 attempts; the last: The current node timed out during startup)"
    for exc, code in ((RayStartFailed(said), EXIT_UNREACHABLE),
                      (RayClusterUnreachable("RAY_ADDRESS = '10.0.0.5:6379': the Ray cluster there does not answer"),
                       EXIT_REFUSED),
                      (ConditionalWritesIgnored("gs://b/serving", "this gcs store ignores conditional writes"),
                       EXIT_REFUSED)):
        failure = known_failure(exc)
        assert failure is not None and failure.exit_code == code and str(failure) == str(exc)
    assert known_failure(RuntimeError("something else")) is None  # not podium's to word: its traceback stands


def test_every_podium_error_a_command_meets_has_a_code_in_the_one_table():
    """Each of podium's user-facing errors is a PodiumError (those that were OSError or ValueError still are, for the
    callers that catch those), and the table gives it its documented code."""
    from podium.cli.errors import EXIT_CODES, exit_code_of
    from podium.errors import (
        EXIT_FAILED,
        EXIT_NOT_RECORDED,
        ConfigError,
        EndNotRecorded,
        HistoryError,
        PodiumError,
        ServingError,
        TrackingUnavailable,
        UnfinishedRun,
    )
    from podium.imports import ImportPathError
    from podium.storage.documents import DocumentError
    from podium.storage.errors import StorageError
    from podium.storage.fingerprint import DatasetError
    from podium.storage.lease import LeaseError
    from podium.training.checkpoint import CheckpointFormatError
    from podium.training.data import DataSchemaError
    from podium.training.export import ExportError
    from podium.training.loaders import LoaderError
    from podium.training.sharded import ShardedCheckpointError

    for kind in (StorageError, DocumentError, DatasetError, LeaseError, ImportPathError, CheckpointFormatError,
                 DataSchemaError, ExportError, LoaderError, ShardedCheckpointError):
        assert issubclass(kind, PodiumError), kind
    assert issubclass(StorageError, OSError) and issubclass(DatasetError, ValueError)
    assert all(issubclass(kind, PodiumError) for kind, _ in EXIT_CODES)
    for exc, code in ((StorageError("/a/file/x", "a file stands where --out expects a folder"), EXIT_REFUSED),
                      (ConfigError("data.train = 'x': no such file"), EXIT_REFUSED),
                      (ServingError("no such serving location"), EXIT_REFUSED),
                      (HistoryError("nothing earlier"), EXIT_REFUSED),
                      (TrackingUnavailable("http://mlflow:5000", "reading", "refused", 30), EXIT_UNREACHABLE),
                      (UnfinishedRun("nothing validated", None), EXIT_FAILED),
                      (EndNotRecorded("not recorded", None), EXIT_NOT_RECORDED)):
        assert exit_code_of(exc) == code, exc
        assert known_failure(exc) is not None and str(known_failure(exc)) == str(exc)


def test_a_ray_start_that_failed_is_not_read_as_a_server_that_stopped_answering():
    # a flow that raises it must not be reported as the Prefect server's outage (podium.cli.run._flow_result)
    assert not is_unreachable(RayStartFailed("Ray did not start"))
    assert not is_unreachable(RayClusterUnreachable("RAY_ADDRESS = 'x:1': does not answer"))


def test_a_ray_address_where_nothing_listens_is_said_within_rays_join_window(monkeypatch):
    from podium.training.cluster import GCS_WAIT_ENV, _check_cluster_answers

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    monkeypatch.setenv(GCS_WAIT_ENV, "1")
    began = time.monotonic()
    with pytest.raises(RayClusterUnreachable, match=rf"RAY_ADDRESS = '127.0.0.1:{port}': the Ray cluster there does "
                                                    r"not answer \(.* for 1 s\): start it"):
        _check_cluster_answers(f"127.0.0.1:{port}")
    assert time.monotonic() - began < 10
    with socket.socket() as listening:  # one that listens answers at once (Ray, and the probe, go to this
        listening.bind(("0.0.0.0", 0))  # machine's node address for 127.0.0.1, as a GCS listens on every address)
        listening.listen()
        _check_cluster_answers(f"127.0.0.1:{listening.getsockname()[1]}")
