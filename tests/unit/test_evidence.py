"""The gathering's own pieces (`podium.tasks.evidence`): the policy read from the configuration, the champion read
from a serving location, where a champion is validated again, and when promotion needs Ray."""

from __future__ import annotations

from pathlib import Path

import pytest

from podium.config import build_config
from podium.core.promotion import Policy
from podium.core.records import FAILED, VALIDATED, Champion, CheckpointRecord
from podium.serving.layout import PromotedVersion, seal_version, switch_current
from podium.serving.staging import stage_version
from podium.storage.fingerprint import DatasetDigest
from podium.tasks.evidence import (
    champion_digest,
    champion_of,
    promotion_needs_ray,
    read_champion,
    rows_of,
    served_checkpoint,
)
from podium.tasks.plan import RunPlan, promotion_policy

TONIGHT, LAST_WEEK = "a" * 64, "b" * 64


def plan(serving: Path, digest: str | None = TONIGHT, **promotion) -> RunPlan:
    data = {"val": DatasetDigest("/data/val.parquet", digest, 1, 10, 1, 100)} if digest else {}
    return RunPlan(config=build_config({"promotion": promotion}), storage=str(serving.parent / "storage"),
                   serving=str(serving), train_loop="", loop_config={}, validate_kwargs={}, data=data)


def serve(serving: Path, checkpoint: str, **manifest) -> PromotedVersion:
    version = stage_version(str(serving), checkpoint, manifest)
    seal_version(str(serving), version)
    switch_current(str(serving), version, "test")
    return version


def test_the_policy_is_what_the_configuration_says():
    p = build_config({"promotion": {"metric": "val_accuracy", "mode": "max", "min_delta": 0.01, "rescore": "stored",
                                    "thresholds": {"val_accuracy": {"min": 0.9}},
                                    "guards": {"val_loss": {"max_increase": 0.02}}, "confidence": 0.9,
                                    "confidence_without_rows": "point"}}).promotion
    policy = promotion_policy(p, approval=True)
    assert policy == Policy("val_accuracy", "max", 0.01, False, "stored", {"val_accuracy": {"min": 0.9, "max": None}},
                            {"val_loss": {"max_increase": 0.02, "max_decrease": None, "max_relative_increase": None,
                                          "max_relative_decrease": None}}, 0.9, "point", True)
    assert promotion_policy(build_config({}).promotion, approval=False) == Policy("val_loss", "min")


def test_the_champion_is_read_from_the_current_version(tmp_path, saved_checkpoint):
    serving = tmp_path / "serving"
    assert read_champion(str(serving)) is None and champion_of(None) is None
    serve(serving, saved_checkpoint.directory, step=7, metric="val_loss", value=0.3, source="/ckpt/7", mode="min",
          run_name="night-1")
    assert read_champion(str(serving)) == Champion("v000001", 7, "val_loss", 0.3, "/ckpt/7", "min", "night-1")


def test_a_champion_is_validated_again_from_its_served_files_or_the_checkpoint_its_model_came_from():
    files = PromotedVersion("v000001", "/srv/versions/v000001", {"content": "checkpoint", "source": "/ckpt/1"})
    model = PromotedVersion("v000002", "/srv/versions/v000002", {"content": "model", "checkpoint": "/ckpt/2",
                                                                 "source": "/ckpt/2-old"})
    assert served_checkpoint(files) == "/srv/versions/v000001"
    assert served_checkpoint(model) == "/ckpt/2"
    assert served_checkpoint(PromotedVersion("v3", "/v3", {"content": "model", "source": "/ckpt/3"})) == "/ckpt/3"


def test_the_champions_validation_data_is_its_manifests():
    assert champion_digest(PromotedVersion("v1", "/v1", {"datasets": {"val": {"digest": TONIGHT}}})) == TONIGHT
    assert champion_digest(PromotedVersion("v1", "/v1", {})) is None, "promoted before podium recorded digests"


def test_per_row_values_are_the_promotion_metrics_or_say_what_was_returned():
    assert rows_of({"val_loss": [0.1, 0.2]}, "val_loss") == ([0.1, 0.2], "")
    values, why = rows_of({"val_accuracy": [1.0]}, "val_loss")
    assert values is None and why == ("the validation function returned no per-row values for 'val_loss' (under "
                                      "'podium.per_row', it gave ['val_accuracy'])")
    assert rows_of({}, "val_loss")[1].endswith("(under 'podium.per_row')")


def validated(digest: str | None) -> CheckpointRecord:
    return CheckpointRecord(step=1, uri="/ckpt/1", status=VALIDATED, metrics={"val_loss": 0.3}, val_digest=digest)


@pytest.mark.parametrize(("promotion", "checkpoints", "champion_on", "needs"), [
    ({}, [validated(TONIGHT)], None, False),
    ({"verify": "revalidate"}, [validated(TONIGHT)], None, True),
    ({}, [validated(LAST_WEEK)], None, True),
    ({}, [CheckpointRecord(step=1, uri="/c", status=FAILED, val_digest=LAST_WEEK)], None, False),
    ({}, [validated(TONIGHT)], TONIGHT, False),
    ({}, [validated(TONIGHT)], LAST_WEEK, True),
    ({"confidence": 0.95}, [validated(TONIGHT)], TONIGHT, True),
    ({"confidence": 0.95}, [validated(TONIGHT)], None, False),
])
def test_promotion_needs_ray_when_it_will_validate_something(tmp_path, saved_checkpoint, promotion, checkpoints,
                                                             champion_on, needs):
    serving = tmp_path / "serving"
    if champion_on:
        serve(serving, saved_checkpoint.directory, step=1, datasets={"val": {"digest": champion_on}})
    assert promotion_needs_ray(plan(serving, **promotion), checkpoints) is needs


def test_promotion_needs_ray_errs_on_the_side_of_yes(tmp_path):
    broken = tmp_path / "serving"
    broken.mkdir()
    (broken / "CURRENT").write_text("{not json")
    assert promotion_needs_ray(plan(broken), [validated(TONIGHT)]) is True
    assert promotion_needs_ray(plan(tmp_path / "empty", digest=None), [validated(LAST_WEEK)]) is False
