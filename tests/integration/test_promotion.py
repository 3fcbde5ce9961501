"""Promotion under real faults: two promoter processes at once, rollback, a promoter killed mid-way; verdicts
that must never be promoted (NaN), rollbacks that walk back the history, withdrawn checkpoints.

These need no Ray or Prefect server (verification is off): real MLflow stores, real folders, real processes.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import signal
import time

import pytest
import torch
from mlflow.tracking import MlflowClient

from podium import load_promoted_model
from podium.config import PipelineConfig
from podium.core.events import CheckpointEvent
from podium.core.verdict import decide_verdict
from podium.errors import ServingError
from podium.serving.layout import read_current, read_history
from podium.tasks.plan import RunPlan
from podium.tasks.promote import promote_best_checkpoint
from podium.tasks.rollback import roll_back
from podium.tracking.client import TAG_METRICS, TAG_WITHDRAWN
from podium.tracking.records import list_records, merge_validation, record_checkpoint, record_verdict
from podium.tracking.runs import open_tracking_run
from podium.training.checkpoint import CheckpointMeta, save_checkpoint
from podium.training.model import ModelSpec, build_model

pytestmark = pytest.mark.integration


def _plan(serving: str, storage: str) -> RunPlan:
    config = PipelineConfig(storage=storage, serving=serving, promotion={"verify": False})
    return RunPlan(config=config, storage=storage, serving=serving, train_loop="x:y", loop_config={},
                   validate_kwargs={})


def _recorded(tracking, root: str, step: int = 1, loss: float = 1.0, padding_mb: int = 0):
    """A real podium checkpoint on disk, recorded (pending) with its training loss."""
    spec = ModelSpec(in_features=4, num_classes=2, hidden_size=8)
    name = f"checkpoint_{step:08d}"
    ckpt = os.path.join(root, tracking.run_name, name)
    save_checkpoint(ckpt, build_model(spec), None, CheckpointMeta(
        model=spec, epoch=1, step=step, metrics={"loss": loss}, config={}, feature_columns=list("abcd"),
        label_column="y"))
    if padding_mb:  # a bigger checkpoint, so a copy takes long enough to be killed half-way
        with open(os.path.join(ckpt, "extra.bin"), "wb") as f:
            f.write(os.urandom(padding_mb << 20))
    return record_checkpoint(tracking, CheckpointEvent(run_name=tracking.run_name, step=step, metrics={"loss": loss},
                                                       checkpoint_uri=ckpt, checkpoint_name=name))


def _validated_run(tracking_uri: str, root: str, run_name: str, val_loss: float, padding_mb: int = 0):
    """A run with one validated checkpoint on disk (a real podium checkpoint)."""
    tracking = open_tracking_run(tracking_uri, "podium", run_name, {})
    merge_validation(tracking, _recorded(tracking, root, padding_mb=padding_mb), {"val_loss": val_loss})
    return tracking


def _promote(serving, storage, tracking, barrier=None):
    if barrier is not None:
        barrier.wait()
    return promote_best_checkpoint(_plan(serving, storage), tracking)


def _alias_source(tracking_uri: str) -> str:
    """The serving copy the champion alias names (its version's source is the LoggedModel it was made from)."""
    client = MlflowClient(tracking_uri, registry_uri=tracking_uri)
    return client.get_model_version_by_alias("podium", "champion").tags["podium.served_uri"]


def test_two_promotions_at_once_leave_one_consistent_champion(tmp_path, tracking_uri):
    serving, storage = str(tmp_path / "serving"), str(tmp_path / "storage")
    a = _validated_run(tracking_uri, storage, "run-a", val_loss=0.5)
    b = _validated_run(tracking_uri, storage, "run-b", val_loss=0.4)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_promote, args=(serving, storage, t, barrier)) for t in (a, b)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    current = read_current(serving)
    # whichever went first, the better run ends as champion, and the registry agrees with serving
    assert current.manifest["run_name"] == "run-b"
    assert _alias_source(tracking_uri) == current.uri
    attempts = sorted(os.listdir(tmp_path / "serving" / "attempts"))
    assert len(attempts) == 2, "both attempts are in the history"

    # rollback restores the previous champion (if there was one) atomically; the alias follows
    if len(read_history(serving)) == 2:
        out = roll_back(serving, tracking_uri, "podium", "champion")
        assert read_current(serving).manifest["run_name"] == "run-a"
        assert _alias_source(tracking_uri) == read_current(serving).uri and out.to_version != out.from_version


def test_rollback_restores_previous_champion_and_alias(tmp_path, tracking_uri):
    serving, storage = str(tmp_path / "serving"), str(tmp_path / "storage")
    first = _promote(serving, storage, _validated_run(tracking_uri, storage, "old", 0.5)).promoted
    second = _promote(serving, storage, _validated_run(tracking_uri, storage, "new", 0.3)).promoted
    assert read_current(serving).version == second.version
    out = roll_back(serving, tracking_uri, "podium", "champion")
    assert (out.from_version, out.to_version) == (second.version, first.version)
    assert read_current(serving).version == first.version
    assert _alias_source(tracking_uri) == first.uri
    assert str(out.mlflow_version) == first.mlflow_version
    load_promoted_model(serving)  # complete and loadable


def test_promoter_killed_at_any_moment_leaves_champion_intact_and_rerun_finishes(tmp_path, tracking_uri):
    serving, storage = str(tmp_path / "serving"), str(tmp_path / "storage")
    champion = _promote(serving, storage, _validated_run(tracking_uri, storage, "champ", 0.5)).promoted
    reference = load_promoted_model(serving)
    challenger = _validated_run(tracking_uri, storage, "challenger", 0.2, padding_mb=64)
    ctx = mp.get_context("spawn")
    for delay in (0.5, 1.5, 2.5, 3.5):  # spawn start-up, then planning, copying, hashing, switching
        proc = ctx.Process(target=_promote, args=(serving, storage, challenger))
        proc.start()
        time.sleep(delay)
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        current = read_current(serving)
        if current.version != champion.version:  # this kill came after the switch: it is the challenger
            assert current.manifest["run_name"] == "challenger"
            break
        # serving still holds the previous champion, complete and loadable, identical to before
        model = load_promoted_model(serving)
        for p, q in zip(model.module.state_dict().values(), reference.module.state_dict().values()):
            assert torch.equal(p, q)
    # running promotion again finishes the job: serving and registry both name the challenger
    _promote(serving, storage, challenger)
    current = read_current(serving)
    assert current.manifest["run_name"] == "challenger"
    assert _alias_source(tracking_uri) == current.uri
    assert len(read_history(serving)) == 2


def test_a_diverged_checkpoint_next_to_a_working_champion_is_never_promoted(tmp_path, tracking_uri):
    serving, storage = str(tmp_path / "serving"), str(tmp_path / "storage")
    champion = _promote(serving, storage, _validated_run(tracking_uri, storage, "champ", 9.67517)).promoted
    diverged = open_tracking_run(tracking_uri, "podium", "diverged", {})
    # the training loss went NaN: the checkpoint is failed without being validated
    record = _recorded(diverged, storage, step=94, loss=math.nan)
    failed = record_verdict(diverged, record, decide_verdict(step=94, metric="val_loss", training=record.metrics))
    assert failed.status == "failed" and failed.failure == "training metric(s) not finite at step 94: loss = nan"
    # a verdict that holds a NaN (as podium <= 0.2 wrote them): MLflow's LoggedModel metrics read it back as
    # 0.0, "better" than the champion's 9.7; podium's own copy reads back NaN, and NaN is never promoted
    merge_validation(diverged, _recorded(diverged, storage, step=188), {"val_loss": math.nan, "val_accuracy": 0.25})
    client = MlflowClient(tracking_uri)
    by_step = {r.step: r for r in list_records(diverged)}
    model = client.get_logged_model(by_step[188].model_id)
    assert {m.key: m.value for m in model.metrics}["val_loss"] == 0.0, "MLflow's SQL store changed the NaN"
    assert math.isnan(by_step[188].metrics["val_loss"]) and "NaN" in model.tags[TAG_METRICS]
    assert by_step[94].status == "failed" and "loss = nan" in by_step[94].failure

    outcome = _promote(serving, storage, diverged)
    assert outcome.promoted is None
    assert read_current(serving).version == champion.version and len(read_history(serving)) == 1
    assert _alias_source(tracking_uri) == champion.uri

    # records of older podium (no copy of their own) read their NaN back from the tag that named it
    client.delete_logged_model_tag(by_step[188].model_id, TAG_METRICS)
    client.set_logged_model_tags(by_step[188].model_id, {"podium.nonfinite_metrics": "val_loss"})
    assert math.isnan({r.step: r for r in list_records(diverged)}[188].metrics["val_loss"])


def test_rollbacks_walk_back_the_champions_and_a_withdrawn_checkpoint_stays_out(tmp_path, tracking_uri):
    serving, storage = str(tmp_path / "serving"), str(tmp_path / "storage")
    runs = [_validated_run(tracking_uri, storage, f"r{i}", val_loss) for i, val_loss in
            enumerate((0.5, 0.4, 0.3, 0.2), start=1)]
    promoted = [_promote(serving, storage, run).promoted for run in runs]
    assert [p.version for p in promoted] == ["v000001", "v000002", "v000003", "v000004"]

    walked = [roll_back(serving, tracking_uri, "podium", "champion", reason="bad answers") for _ in range(3)]
    assert [(o.from_version, o.to_version, o.withdrawn) for o in walked] == [
        ("v000004", "v000003", "v000004"), ("v000003", "v000002", "v000003"), ("v000002", "v000001", "v000002")]
    assert _alias_source(tracking_uri) == promoted[0].uri
    with pytest.raises(ServingError, match="v000001 is the earliest champion still standing"):
        roll_back(serving, tracking_uri, "podium", "champion")
    assert read_current(serving).version == "v000001"

    # the withdrawn champions are marked on their MLflow records
    client = MlflowClient(tracking_uri, registry_uri=tracking_uri)
    r4 = list_records(runs[3])[0]
    assert r4.withdrawn and "withdrawn from" in r4.withdrawn and "bad answers" in r4.withdrawn
    assert TAG_WITHDRAWN in client.get_model_version("podium", promoted[3].mlflow_version).tags
    # and promoting r4 again does not bring its checkpoint back
    again = _promote(serving, storage, runs[3])
    assert again.promoted is None and "step 1 is withdrawn" in again.reason
    assert read_current(serving).version == "v000001"

    # naming it serves it again: no longer withdrawn, and a rollback from it walks the lineage again
    restored = roll_back(serving, tracking_uri, "podium", "champion", to_version="v000004")
    assert (restored.to_version, restored.withdrawn) == ("v000004", None)
    assert list_records(runs[3])[0].withdrawn is None and _alias_source(tracking_uri) == promoted[3].uri
    assert TAG_WITHDRAWN not in client.get_model_version("podium", promoted[3].mlflow_version).tags
    same = roll_back(serving, tracking_uri, "podium", "champion", to_version="v000004")
    assert not same.switched and len(read_history(serving)) == 4 + 3 + 1
    assert roll_back(serving, tracking_uri, "podium", "champion").to_version == "v000001"


def test_an_approval_does_not_promote_a_candidate_whose_champion_changed_while_it_waited(tmp_path, tracking_uri):
    from podium.core.approval import answered
    from podium.serving.layout import read_pointer
    from podium.tasks.promote import settle_candidate

    serving, storage = str(tmp_path / "serving"), str(tmp_path / "storage")
    waiting = _validated_run(tracking_uri, storage, "run-a", val_loss=0.5)
    outcome = promote_best_checkpoint(_plan(serving, storage), waiting, approval=True)
    assert outcome.promoted is None and outcome.awaiting is not None and "awaiting approval" in outcome.reason
    client = MlflowClient(tracking_uri, registry_uri=tracking_uri)
    assert str(client.get_model_version_by_alias("podium", "challenger").version) == outcome.awaiting.mlflow_version
    assert read_pointer(serving) is None  # nothing served while it waits

    promote_best_checkpoint(_plan(serving, storage), _validated_run(tracking_uri, storage, "run-b", val_loss=0.4))
    settled = settle_candidate(_plan(serving, storage), waiting, outcome, answered("approve", "ok", "ana"))
    assert settled.promoted is None and "but the champion changed while it waited (none -> v000002)" in settled.reason
    assert read_current(serving).manifest["run_name"] == "run-b"
    assert os.listdir(os.path.join(serving, "versions", outcome.awaiting.version)) == ["DISCARDED.json"]
    version = client.get_model_version("podium", outcome.awaiting.mlflow_version)
    # approved, never served: its tags say it was discarded, what was decided and why (never `approved` alone)
    assert version.tags["podium.approval"] == "discarded" and "challenger" not in version.aliases
    assert version.tags["podium.approval.decided"] == "approved" and version.tags["podium.approval.by"] == "ana"
    assert "the champion changed while it waited" in version.tags["podium.discarded"]
    assert client.get_model_version_by_alias("podium", "champion").version != version.version
