"""Writes that a retried HTTP request can deliver twice: the second delivery is success, never a second record.

MLflow's HTTP client retries every method after a read timeout, POSTs included, so a request the server had
already taken arrives again. Here the second delivery is made by calling the same write twice on a real
MLflow store (SQLite), as the server would see it.
"""

from __future__ import annotations

import pytest
from mlflow.entities import LoggedModelOutput
from mlflow.exceptions import MlflowException

from podium.core.records import CheckpointRecord
from podium.tracking.client import TAG_SERVED_URI
from podium.tracking.records import list_as_output
from podium.tracking.registry import register_champion
from podium.tracking.runs import open_tracking_run


@pytest.fixture
def tr(tmp_path):
    return open_tracking_run(f"sqlite:///{tmp_path / 'mlflow.db'}", "retried", "retried-writes", {})


def test_an_output_listed_twice_is_listed_once(tr):
    client = tr.client()
    model = client.create_logged_model(tr.experiment_id, source_run_id=tr.run_id)
    client.log_outputs(tr.run_id, [LoggedModelOutput(model.model_id, 3)])
    with pytest.raises(MlflowException, match="UNIQUE constraint"):  # what MLflow answers a second delivery
        client.log_outputs(tr.run_id, [LoggedModelOutput(model.model_id, 3)])
    list_as_output(tr, model.model_id, 3)
    assert [o.model_id for o in client.get_run(tr.run_id).outputs.model_outputs] == [model.model_id]
    other = client.create_logged_model(tr.experiment_id, source_run_id=tr.run_id)
    list_as_output(tr, other.model_id, 4)
    assert {o.model_id for o in client.get_run(tr.run_id).outputs.model_outputs} == {model.model_id, other.model_id}


@pytest.mark.parametrize("served", ["/srv/podium/versions/v000001/model", "/srv/o'brien/versions/v000001/model"])
def test_a_version_created_twice_for_one_served_copy_is_registered_once(tr, served):
    client = tr.client()
    model = client.create_logged_model(tr.experiment_id, source_run_id=tr.run_id)
    record = CheckpointRecord(step=3, uri="/ckpt/3", status="validated", metrics={}, model_id=model.model_id)
    client.create_registered_model("podium")
    # the first delivery of the create, which the client never heard back from
    first = client.create_model_version("podium", source="/elsewhere", run_id=tr.run_id, tags={TAG_SERVED_URI: served})
    version = register_champion(tr, record, served, "podium", "champion", tags={})
    assert version == str(first.version)
    versions = client.search_model_versions("name = 'podium'")
    assert [v.version for v in versions] == [first.version], "the second delivery's version is deleted"
    assert client.get_model_version_by_alias("podium", "champion").version == first.version
    # another served copy is another version (numbers are not reused: the deleted 2 stays unused)
    second = register_champion(tr, record, served.replace("v000001", "v000002"), "podium", "champion", tags={})
    assert second == "3" and [v.version for v in client.search_model_versions("name = 'podium'")] == [3, 1]
