"""Nightly training with fresh data every night: the champion and the challenger are compared on the same data.

Four nights, none trained: a linear model whose quality each night's config sets, and validation sets whose
difficulty is label noise (tests/integration/podium_nightly_code.py). What is checked is the decision, not the
training, so each night's checkpoint is made directly in storage and recorded in the test's MLflow store with podium's
own functions, its number computed by the real validation function on that night's data, inside a Prefect flow run
of its own (the run's lineage names it; tests/helpers/checkpoints.py); then the promote-run flow (what `podium
promote` and the promote-on-demand deployment run) decides, in this process, on the real Prefect server and a local
Ray (the champion's re-score), with the promotion defaults:

night 1  clean validation data, model error 0.2          -> first champion (accuracy 0.80)
night 2  30 % label noise, a BETTER model (error 0.1)    -> 0.66 on night 2's data; the old rule compares it with
         the champion's 0.80 from night 1 and refuses. The champion re-scored on night 2's data has 0.62: promoted.
night 3  clean data again, a WORSE model (error 0.3)     -> 0.70; the old rule compares it with the stored 0.66 and
         promotes. The champion re-scored on night 3's data has 0.90: refused.
night 4  night 2's validation files again, a better model -> same digest as the champion's number: no re-score.
"""

from __future__ import annotations

import json
import os

import pytest
from helpers.checkpoints import make_trained_run
from mlflow.tracking import MlflowClient
from podium_nightly_code import FEATURES, expected_accuracy, write_data

from podium.cli import main
from podium.cli.provenance import digest_report
from podium.config import PipelineConfig, build_config
from podium.core.events import CheckpointEvent
from podium.core.promotion import compare_with_champion
from podium.core.records import Champion
from podium.flows.promote import promote_run
from podium.serving.layout import read_current, read_version
from podium.storage.fingerprint import dataset_digest
from podium.tasks.plan import RunPlan
from podium.tasks.promote import promote_best_checkpoint
from podium.tracking.records import list_records, merge_validation, record_checkpoint
from podium.tracking.runs import open_tracking_run
from podium.training.checkpoint import CheckpointMeta, save_checkpoint
from podium.training.model import ModelSpec, build_model

pytestmark = pytest.mark.integration

ROWS = 20000  # the accuracy of a model on this many rows is within about 0.01 of its expectation


def _night(tmp_path, locations, calls_log, night: int, angle: float, val: str):
    """Night `night`'s run, made (not trained), then promoted by the promote-run flow: (its summary, the made run,
    its training data's digest)."""
    train = write_data(str(tmp_path / f"night-{night}" / "train.parquet"), 2000, 0.0, seed=100 + night)
    cfg = {"run_name": f"night-{night}", "storage": locations["storage"], "serving": locations["serving"],
           "data": {"train": train, "val": val, "feature_columns": list(FEATURES)},  # for the validation function
           "training": {"train_loop": "podium_nightly_code:train_func",
                        # one checkpoint a night: the last epoch's weights are turned by `angle` however many
                        "train_loop_config": {"epochs": 1, "angle_deg": angle}},
           "scaling": {"num_workers": 1},
           "validation": {"fn": "podium_nightly_code:validate_fn", "kwargs": {"calls_log": calls_log},
                          "concurrency": 1},
           "promotion": {"metric": "accuracy", "mode": "max"}}
    made = make_trained_run(cfg, locations["tracking_uri"], in_flow_run=True)
    promote = promote_run.with_options(flow_run_name=f"night-{night}-promote")
    return promote(config=build_config(cfg), tracking_uri=locations["tracking_uri"]).summary, made, \
        dataset_digest(train).digest


def _rescores(calls_log: str, before: int) -> list[str]:
    lines = open(calls_log).read().split()[before:]
    return [line for line in lines if "/versions/" in line]  # the served copy, not one of the run's checkpoints


def _old_rule(summary, stored: float) -> bool:
    """What the gate decided before podium compared on the same data: the stored number, as it is."""
    best = max(summary.checkpoints, key=lambda r: (r.metrics["accuracy"], r.step))  # ties: the later step
    return compare_with_champion(best, Champion("v", 0, "accuracy", stored), "accuracy", "max").promote


def test_champion_and_challenger_are_compared_on_the_same_data(prefect_api, ray_cluster, tmp_path, locations,
                                                                monkeypatch, capsys):
    serving, tracking_uri = locations["serving"], locations["tracking_uri"]
    calls_log = str(tmp_path / "validations.txt")
    vals = {n: write_data(str(tmp_path / f"night-{n}" / "val.parquet"), ROWS, noise, seed=n)
            for n, noise in ((1, 0.0), (2, 0.3), (3, 0.0))}
    digests = {n: dataset_digest(v).digest for n, v in vals.items()}
    assert len(set(digests.values())) == 3

    # night 1: the first champion, measured on night 1's data
    one, _, train_1 = _night(tmp_path, locations, calls_log, 1, 36.0, vals[1])
    assert one.promotion.promoted.version == "v000001"
    assert one.promotion.promoted.value == pytest.approx(expected_accuracy(36, 0.0), abs=0.015)
    assert one.promotion.comparison.candidate.digest == digests[1]
    assert all(r.val_digest == digests[1] for r in one.checkpoints)
    v1 = read_current(serving).manifest
    assert v1["datasets"]["val"]["digest"] == digests[1] and v1["datasets"]["train"]["digest"] == train_1

    # night 2: harder data, better model. The old rule would refuse it; re-scored, the champion is worse
    calls = len(open(calls_log).read().split())
    two, made_2, train_2 = _night(tmp_path, locations, calls_log, 2, 18.0, vals[2])
    assert not _old_rule(two, one.promotion.promoted.value)
    assert two.promotion.promoted is not None and two.promotion.promoted.version == "v000002"
    c = two.promotion.comparison
    assert (c.digest, c.candidate.digest, c.champion.digest) == (digests[2],) * 3
    assert c.champion.how == "re-scored" and c.champion.stored_digest == digests[1]
    assert c.champion.stored_value == pytest.approx(one.promotion.promoted.value)
    assert c.champion.value == pytest.approx(expected_accuracy(36, 0.3), abs=0.015)
    assert c.candidate.value == pytest.approx(expected_accuracy(18, 0.3), abs=0.015)
    assert len(_rescores(calls_log, calls)) == 1, "one validation more: the champion's, on its served copy"
    for digest in (digests[1], digests[2]):  # the decision names the data of every number it used
        assert digest[:12] in two.promotion.reason
    # the re-score is an evaluation on the champion's LoggedModel; its own record keeps its own number
    client = MlflowClient(tracking_uri)
    model = client.get_logged_model(v1["model_id"])
    assert {(m.key, m.dataset_digest) for m in model.metrics} >= {("accuracy", digests[1]), ("accuracy", digests[2])}
    night_1_best = next(r for r in list_records(one.tracking) if r.uri == v1["source"])
    assert night_1_best.metrics["accuracy"] == pytest.approx(one.promotion.promoted.value)
    # the report says it, in MLflow and in the manifest of the new version
    report = client.download_artifacts(two.tracking.run_id, "podium/promotion_report.md", str(tmp_path))
    text = open(report).read()
    assert digests[1] in text and digests[2] in text and "re-scored" in text
    v2 = read_current(serving).manifest
    assert v2["datasets"]["val"]["digest"] == digests[2] and v2["datasets"]["train"]["digest"] == train_2
    assert v2["comparison"]["champion"]["who"] == "champion v000001"
    lineage = v2["lineage"]
    assert lineage["mlflow"]["run_id"] == two.tracking.run_id and lineage["mlflow"]["model_id"] == v2["model_id"]
    # where the run comes from (the flow run that recorded it), and the flow run that promoted it
    assert made_2.flow_run_id and lineage["tags"]["podium.prefect.flow_run_id"] == made_2.flow_run_id
    assert lineage["tags"]["podium.prefect.flow_run_url"].endswith(made_2.flow_run_id)
    assert lineage["promoted_by"]["flow_run_id"] == two.flow_run_id
    registry = MlflowClient(tracking_uri, registry_uri=tracking_uri)
    version = registry.get_model_version_by_alias("podium", "champion")
    assert version.tags["podium.data.val.digest"] == digests[2]
    assert version.tags["podium.prefect.flow_run_id"] == made_2.flow_run_id

    # night 3: easier data, worse model. The old rule would promote it; re-scored, the champion is better
    calls = len(open(calls_log).read().split())
    three, _, _ = _night(tmp_path, locations, calls_log, 3, 54.0, vals[3])
    assert _old_rule(three, two.promotion.promoted.value)
    assert three.promotion.promoted is None
    c = three.promotion.comparison
    assert c.champion.how == "re-scored" and c.champion.digest == digests[3]
    assert c.champion.value == pytest.approx(expected_accuracy(18, 0.0), abs=0.015)
    assert c.candidate.value == pytest.approx(expected_accuracy(54, 0.0), abs=0.015)
    assert digests[3][:12] in three.promotion.reason and digests[2][:12] in three.promotion.reason
    assert len(_rescores(calls_log, calls)) == 1
    assert read_current(serving).version == "v000002"

    # night 4: night 2's validation files again: the champion's number was measured on them, no re-score
    calls = len(open(calls_log).read().split())
    four, _, _ = _night(tmp_path, locations, calls_log, 4, 9.0, vals[2])
    c = four.promotion.comparison
    assert c.champion.how == "stored" and c.champion.digest == c.digest == digests[2]
    assert _rescores(calls_log, calls) == []
    assert four.promotion.promoted.version == "v000003"

    # lineage from a digest: the runs that used night 2's validation data, and the champions measured on it
    report = digest_report(tracking_uri, serving, digests[2][:10])
    uses = {(r["run_name"], u["context"]) for r in report["runs"] for u in r["uses"]}
    assert {("night-2", "validation"), ("night-2-rescore-v000001", "evaluation"), ("night-4", "validation")} <= uses
    assert ("night-3", "validation") not in uses
    assert {(c["version"], tuple(c["roles"])) for c in report["champions"]} == {("v000002", ("val",)),
                                                                              ("v000003", ("val",))}
    # ... and through the command, both ways, and `status`
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
    capsys.readouterr()
    assert main(["lineage", digests[2][:10], "--serving", serving]) == 0
    assert "night-2-rescore-v000001" in capsys.readouterr().out
    assert main(["lineage", "v000002", "--serving", serving]) == 0
    out = capsys.readouterr().out
    assert made_2.flow_run_id in out and digests[2] in out and train_2 in out and "re-scored" in out
    assert main(["status", "--run-name", "night-3", "--serving", serving, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["last_decision"]["promote"] is False
    assert status["last_decision"]["comparison"]["champion"]["digest"] == digests[3]
    assert status["lineage"]["podium.data.val.digest"] == digests[3]
    assert status["champion_lineage"]["datasets"]["val"]["digest"] == digests[2]
    assert os.path.exists(read_version(serving, "v000003").uri)


def _record(tracking_uri: str, run_name: str, ckpt: str, accuracy: float, dataset=None):
    tracking = open_tracking_run(tracking_uri, "podium", run_name, {})
    record = record_checkpoint(tracking, CheckpointEvent(run_name=run_name, step=1, metrics={},
                                                         checkpoint_uri=ckpt, checkpoint_name="checkpoint_1"))
    merge_validation(tracking, record, {"accuracy": accuracy}, dataset)
    return tracking


@pytest.mark.parametrize("rescore", ["refuse", "stored"])
def test_a_champion_that_cannot_be_scored_any_more_is_the_configured_decision(ray_cluster, tmp_path, tracking_uri,
                                                                               rescore):
    serving, storage = str(tmp_path / "serving"), str(tmp_path / "storage")
    # the champion: podium's own checkpoint format, promoted before podium recorded what data it was scored on
    old = os.path.join(storage, "old", "checkpoint_1")
    spec = ModelSpec(in_features=4, num_classes=2, hidden_size=4)
    save_checkpoint(old, build_model(spec), None, CheckpointMeta(model=spec, epoch=1, step=1, metrics={}, config={},
                                                                 feature_columns=FEATURES, label_column="label"))
    base = {"storage": storage, "serving": serving, "promotion": {"metric": "accuracy", "mode": "max", "verify": "hashes",
                                                                  "rescore": rescore,
                                                                  # weights.json is served as files: this test is
                                                                  # about the re-score, not the loadable gate
                                                                  "allow_files": True},
            "validation": {"fn": "podium_nightly_code:validate_fn", "retries": 0}}
    first = RunPlan(config=PipelineConfig.model_validate(base), storage=storage, serving=serving, train_loop="x:y",
                    loop_config={}, validate_kwargs={})
    assert promote_best_checkpoint(first, _record(tracking_uri, "old", old, 0.90)).promoted.version == "v000001"

    # tonight: a checkpoint of the new format, scored on tonight's data; the new validation function cannot read
    # the champion's format
    val = write_data(str(tmp_path / "val.parquet"), 1000, 0.0, seed=1)
    data = dataset_digest(val)
    new = os.path.join(storage, "new", "checkpoint_1")
    os.makedirs(new)
    with open(os.path.join(new, "weights.json"), "w") as f:
        json.dump({"w": [1.0, 0.0, 0.0, 0.0]}, f)
    plan = first.model_copy(update={"validate_kwargs": {"val_data": val, "label_column": "label",
                                                        "feature_columns": FEATURES}, "data": {"val": data}})
    outcome = promote_best_checkpoint(plan, _record(tracking_uri, "new", new, 0.95, data))
    c = outcome.comparison
    assert c.champion.how == "stored" and c.champion.digest is None
    assert "champion v000001 could not be re-scored" in outcome.reason and "weights.json" in outcome.reason
    if rescore == "refuse":
        assert outcome.promoted is None and "promotion.rescore = 'refuse'" in outcome.reason
        assert read_current(serving).version == "v000001"
    else:  # promoted against the stored number, and the decision says so
        assert outcome.promoted.version == "v000002"
        assert "compared with its stored number (promotion.rescore = 'stored')" in outcome.reason
        assert "NOT compared on the same data" in outcome.reason
