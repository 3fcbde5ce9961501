"""The loadable gate (`podium.core.policy.check_served_as_model`, applied by `podium.core.promotion.gate_files`): a
candidate that would be served as files never replaces a champion that loads as an MLflow model, forced or not,
unless promotion.allow_files; and what the gathering tells it (`podium.tasks.evidence.served_as_files`)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from podium.config import build_config
from podium.core.policy import LOADABLE, check_served_as_model
from podium.core.promotion import AWAIT, PROMOTE, REFUSE, Evidence, Policy, decide_promotion
from podium.core.records import VALIDATED, Champion, CheckpointRecord
from podium.tasks.evidence import served_as_files
from podium.tasks.plan import promotion_policy

TONIGHT = "a" * 64
POLICY = Policy("accuracy", "max")
BEST = CheckpointRecord(step=5, uri="/ckpt/5", status=VALIDATED, metrics={"accuracy": 0.9}, val_digest=TONIGHT)
HELD = Champion(version="v000001", step=1, metric="accuracy", value=0.8, source="/old", mode="max")


def evidence(candidate_files: bool | None, champion_files: bool | None, held: Champion | None = HELD) -> Evidence:
    return Evidence(BEST, "best of 1", held, {"accuracy": 0.8} if held else {}, TONIGHT if held else None,
                    "/data/val.parquet", TONIGHT, candidate_files=candidate_files, champion_files=champion_files)


def test_files_over_a_champion_that_loads_are_refused_in_one_sentence_with_the_way_out():
    decision = decide_promotion(evidence(True, False), POLICY)
    assert decision.action == REFUSE and not decision.promote
    first = decision.reason.split("; ")[0]
    assert first == ("not promoted: step 5 would be served as files (its checkpoint is not in podium's format, and "
                     "neither promotion.model_class nor promotion.model_loader is set), and champion v000001 loads "
                     "as an MLflow model, which @champion would stop doing")
    assert "--model-class package.module:Class" in decision.reason and "--allow-files" in decision.reason
    assert "better than champion v000001" in decision.reason  # the comparison it would have promoted on, kept
    assert [c.kind for c in decision.checks] == [LOADABLE] and decision.checks[0].passed is False


def test_always_does_not_pass_the_gate_but_allow_files_does_and_says_so():
    forced = decide_promotion(evidence(True, False), dataclasses.replace(POLICY, always=True))
    assert forced.action == REFUSE
    allowed = decide_promotion(evidence(True, False), dataclasses.replace(POLICY, always=True, allow_files=True))
    assert allowed.action == PROMOTE and allowed.checks[-1].passed is True
    assert "as promotion.allow_files (--allow-files) asks: @champion no longer loads" in allowed.reason


def test_the_gate_refuses_before_a_candidate_is_staged_for_approval():
    decision = decide_promotion(evidence(True, False), dataclasses.replace(POLICY, approval=True, alias="canary"))
    assert decision.action == REFUSE and "which @canary would stop doing" in decision.reason
    assert decide_promotion(evidence(False, False), dataclasses.replace(POLICY, approval=True)).action == AWAIT


@pytest.mark.parametrize("candidate_files, champion_files, held", [
    (False, False, HELD),  # a model over a model
    (True, True, HELD),  # files over files: nothing loadable to lose
    (True, None, None),  # the first promotion: no alias holder
    (None, False, HELD),  # not known (the checkpoint folder could not be read): the promotion itself says
    (False, True, HELD),  # a model over files
])
def test_the_gate_says_nothing_where_no_loadable_champion_is_replaced_by_files(candidate_files, champion_files, held):
    assert check_served_as_model(5, candidate_files, held.version if held else None, champion_files, False) is None
    decision = decide_promotion(evidence(candidate_files, champion_files, held), POLICY)
    assert decision.action == PROMOTE and not decision.checks, decision.reason


def test_a_refusal_by_the_numbers_is_not_turned_into_the_gate_s():
    worse = dataclasses.replace(BEST, metrics={"accuracy": 0.7})
    decision = decide_promotion(dataclasses.replace(evidence(True, False), best=worse), POLICY)
    assert decision.action == REFUSE and not decision.checks and "not more than min_delta" in decision.reason


def _promotion(**promotion) -> object:
    return build_config({"promotion": promotion}).promotion


def test_what_the_gathering_tells_the_gate_from_the_settings_and_the_checkpoint_folder(tmp_path):
    mine = tmp_path / "checkpoint_0"
    mine.mkdir()
    (mine / "weights.json").write_text(json.dumps({"w": [1.0]}))
    record = dataclasses.replace(BEST, uri=str(mine))
    assert served_as_files(_promotion(), record) is True  # no loader, not podium's format
    assert served_as_files(_promotion(model_loader="pkg.mod:load"), record) is False
    assert served_as_files(_promotion(model_class="pkg.mod:Net"), record) is False
    (mine / "podium.json").write_text("{}")  # podium's own format: built into an MLflow model
    assert served_as_files(_promotion(), record) is False
    assert served_as_files(_promotion(), dataclasses.replace(BEST, uri=str(tmp_path / "gone"))) is None
    policy = promotion_policy(_promotion(allow_files=True, alias="canary"), approval=False)
    assert policy.allow_files is True and policy.alias == "canary"


def test_the_run_s_outcome_line_says_the_gate_refused_it():
    from podium.tasks.promote import PromotionOutcome
    from podium.tasks.report import outcome_texts

    decision = decide_promotion(evidence(True, False), POLICY)
    outcome = PromotionOutcome(promoted=None, reason=decision.reason, best_step=5, champion_before="v000001",
                               checks=decision.checks)
    line, description = outcome_texts("r", [BEST], "accuracy", outcome)
    assert line == "not promoted: it would be served as files over a champion that loads as an MLflow model"
    assert "Why: not promoted: step 5 would be served as files" in description
