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
from podium.tracking.ledger import await_decision, promote_version
from podium.tracking.records import list_as_output
from podium.tracking.registry import TAG_VERSION_UID
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


def test_a_version_created_twice_for_one_serving_version_is_registered_once(tr):
    client = tr.client()
    model = client.create_logged_model(tr.experiment_id, source_run_id=tr.run_id)
    record = CheckpointRecord(step=3, uri="/ckpt/3", status="validated", metrics={}, model_id=model.model_id)
    served = "/srv/podium/versions/v000001/model"
    client.create_registered_model("podium")
    # the first delivery of the create, which the client never heard back from
    first = client.create_model_version("podium", source="/elsewhere", run_id=tr.run_id,
                                        tags={TAG_SERVED_URI: served, TAG_VERSION_UID: "a1"})
    version = promote_version(tr, record, served, "podium", "champion", tags={}, version_uid="a1")
    assert version == str(first.version)
    versions = client.search_model_versions("name = 'podium'")
    assert [v.version for v in versions] == [first.version], "the second delivery's version is deleted"
    assert client.get_model_version_by_alias("podium", "champion").version == first.version
    # another serving version is another registered version (numbers are not reused: the deleted 2 stays unused)
    second = promote_version(tr, record, served.replace("v000001", "v000002"), "podium", "champion", tags={},
                             version_uid="b2")
    assert second == "3" and [v.version for v in client.search_model_versions("name = 'podium'")] == [3, 1]


def test_a_served_copy_at_the_path_of_another_is_never_taken_for_it(tr):
    """The registry matches a serving version by its identity, not its path: a candidate staged where a rejected one
    was (podium <= 0.3 reused the number) is registered as itself, and the alias names it, not the rejected one."""
    from podium.tracking.registry import registered_version_for

    client = tr.client()
    model = client.create_logged_model(tr.experiment_id, source_run_id=tr.run_id)
    record = CheckpointRecord(step=3, uri="/ckpt/3", status="validated", metrics={}, model_id=model.model_id)
    served = "/srv/podium/versions/v000003/model"
    rejected = await_decision(tr, record, served, "podium", "challenger", tags={}, version_uid="old")
    approved = promote_version(tr, record, served, "podium", "champion", tags={}, version_uid="new")
    assert approved != rejected
    assert str(client.get_model_version_by_alias("podium", "champion").version) == approved
    assert registered_version_for(tr.tracking_uri, "podium", "new", served) == approved
    assert registered_version_for(tr.tracking_uri, "podium", "old", served) == rejected


def test_a_record_whose_writer_was_killed_after_its_create_is_completed_when_found(tr):
    """A SIGKILL between the create and the writes after it leaves a record with podium's tags only: a resumed
    run that finds it (one by one, or in its catch-up listing) lists it as the run's output and logs its
    training metrics, once."""
    from podium.core.events import CheckpointEvent
    from podium.tracking.client import TAG_CHECKPOINT, TAG_METRICS, TAG_RUN, TAG_STATUS, TAG_STEP, TAG_URI
    from podium.tracking.records import record_checkpoint, record_checkpoints

    client = tr.client()
    events = [CheckpointEvent(run_name=tr.run_name, step=s, epoch=s, metrics={"loss": 1.0 / (s + 1)},
                              checkpoint_uri=f"/ckpt/{s}", checkpoint_name=f"checkpoint_{s}") for s in (0, 1)]
    for e in events:  # what the killed writer got to do: the create alone
        client.create_logged_model(tr.experiment_id, name=f"x-{e.step}", source_run_id=tr.run_id, tags={
            TAG_RUN: tr.run_name, TAG_CHECKPOINT: e.checkpoint_name, TAG_URI: e.checkpoint_uri, TAG_STEP: str(e.step),
            TAG_STATUS: "pending", TAG_METRICS: f'{{"loss": {e.metrics["loss"]}}}'})
    record_checkpoint(tr, events[0])
    records = record_checkpoints(tr, events)
    record_checkpoints(tr, events)  # a whole record costs nothing and gains nothing
    assert [(r.step, r.metrics) for r in records] == [(0, {"loss": 1.0}), (1, {"loss": 0.5})]
    for r in records:
        logged = client.get_logged_model(r.model_id).metrics
        assert [(m.key, m.value, m.step) for m in logged] == [("loss", r.metrics["loss"], r.step)]
    assert sorted(o.model_id for o in client.get_run(tr.run_id).outputs.model_outputs) == sorted(r.model_id for r in records)
