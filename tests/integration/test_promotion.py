"""Promotion under real faults: two promoter processes at once, rollback, a promoter killed mid-way.

These need no Ray or Prefect server (verification is off): real MLflow stores, real folders, real processes.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import pytest
import torch
from mlflow.tracking import MlflowClient

from podium import load_promoted_model
from podium.config import PipelineConfig
from podium.serving.layout import read_current, read_history
from podium.tasks.plan import RunPlan
from podium.tasks.promote import promote_best_checkpoint, roll_back
from podium.tracking.records import merge_validation, record_checkpoint
from podium.tracking.runs import open_tracking_run
from podium.training.checkpoint import CheckpointMeta, save_checkpoint
from podium.training.events import CheckpointEvent
from podium.training.model import ModelSpec, build_model

pytestmark = pytest.mark.integration


def _plan(serving: str, storage: str) -> RunPlan:
    config = PipelineConfig(storage=storage, serving=serving, promotion={"verify": False})
    return RunPlan(config=config, storage=storage, serving=serving, train_loop="x:y", loop_config={},
                   validate_kwargs={})


def _validated_run(tracking_uri: str, root: str, run_name: str, val_loss: float, padding_mb: int = 0):
    """A run with one validated checkpoint on disk (a real podium checkpoint)."""
    spec = ModelSpec(in_features=4, num_classes=2, hidden_size=8)
    ckpt = os.path.join(root, run_name, "checkpoint_00000001")
    save_checkpoint(ckpt, build_model(spec), None, CheckpointMeta(
        model=spec, epoch=1, step=1, metrics={"loss": 1.0}, config={}, feature_columns=list("abcd"),
        label_column="y"))
    if padding_mb:  # a bigger checkpoint, so a copy takes long enough to be killed half-way
        with open(os.path.join(ckpt, "extra.bin"), "wb") as f:
            f.write(os.urandom(padding_mb << 20))
    tracking = open_tracking_run(tracking_uri, "podium", run_name, {})
    record = record_checkpoint(tracking, CheckpointEvent(run_name=run_name, step=1, metrics={"loss": 1.0},
                                                         checkpoint_uri=ckpt, checkpoint_name="checkpoint_00000001"))
    merge_validation(tracking, record, {"val_loss": val_loss})
    return tracking


def _promote(serving, storage, tracking, barrier=None):
    if barrier is not None:
        barrier.wait()
    return promote_best_checkpoint(_plan(serving, storage), tracking)


def _alias_source(tracking_uri: str) -> str:
    """The serving copy the champion alias names (its version's source is the LoggedModel it was made from)."""
    client = MlflowClient(tracking_uri, registry_uri=tracking_uri)
    return client.get_model_version_by_alias("podium", "champion").tags["podium.served_uri"]


def test_two_promotions_at_once_leave_one_consistent_champion(tmp_path):
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
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


def test_rollback_restores_previous_champion_and_alias(tmp_path):
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
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


def test_promoter_killed_at_any_moment_leaves_champion_intact_and_rerun_finishes(tmp_path):
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
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
