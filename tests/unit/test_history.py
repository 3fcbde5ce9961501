"""The serving history as a lineage of champions: where a rollback goes, what it withdraws (pure, no I/O)."""

from __future__ import annotations

import pytest

from podium.errors import HistoryError
from podium.serving.history import Lineage, current_switch, lineage_of, parse_switch, rollback_target


def promote(version: str) -> dict:
    return {"version": version, "action": "promote", "reason": "better", "withdrawn": None}


def rollback(frm: str, to: str) -> dict:
    return {"version": to, "action": "rollback", "reason": f"rollback from {frm}", "previous": frm, "withdrawn": frm}


def lineage(*docs: dict) -> Lineage:
    return lineage_of(parse_switch(d) for d in docs)


def walk(docs: list[dict], current: str) -> tuple[str, list[dict]]:
    """One plain rollback from `current`, recorded as the history would record it."""
    target, withdrawn = rollback_target(lineage(*docs), current)
    return target, [*docs, {**rollback(current, target), "withdrawn": withdrawn}]


def test_each_rollback_goes_one_champion_further_back_then_is_refused():
    docs = [promote("v000001"), promote("v000002"), promote("v000003"), promote("v000004")]
    current, seen = "v000004", []
    for _ in range(3):
        current, docs = walk(docs, current)
        seen.append(current)
    assert seen == ["v000003", "v000002", "v000001"]
    with pytest.raises(HistoryError, match="v000001 is the earliest champion still standing.*v000002, v000003, "
                                           "v000004 were withdrawn"):
        walk(docs, current)
    assert sorted(lineage(*docs).withdrawn) == ["v000002", "v000003", "v000004"]


def test_rolling_back_to_the_current_version_switches_nothing_and_is_never_its_own_predecessor():
    docs = [promote("v000001"), promote("v000002"), promote("v000003"), rollback("v000003", "v000002")]
    assert rollback_target(lineage(*docs), "v000002", to="v000002") == ("v000002", None)
    assert rollback_target(lineage(*docs), "v000002") == ("v000001", "v000002")


def test_a_withdrawn_version_named_explicitly_is_served_again_and_not_withdrawn_any_more():
    docs = [promote("v000001"), promote("v000002"), promote("v000003"), rollback("v000003", "v000002")]
    assert "v000003" in lineage(*docs).withdrawn
    # going forward to a later champion withdraws nothing
    assert rollback_target(lineage(*docs), "v000002", to="v000003") == ("v000003", None)
    docs.append({**rollback("v000002", "v000003"), "withdrawn": None})
    assert dict(lineage(*docs).withdrawn) == {}
    # and going back again walks the whole lineage
    assert rollback_target(lineage(*docs), "v000003") == ("v000002", "v000003")


def test_a_rollback_skips_withdrawn_champions_after_a_new_promotion():
    docs = [promote("v000001"), promote("v000002"), promote("v000003"), rollback("v000003", "v000002"),
            promote("v000004")]
    assert rollback_target(lineage(*docs), "v000004") == ("v000002", "v000004")


def test_to_a_version_that_was_never_a_champion_is_refused():
    with pytest.raises(HistoryError, match="v000007 was never a champion"):
        rollback_target(lineage(promote("v000001"), promote("v000002")), "v000002", to="v000007")


def test_the_first_champion_has_nothing_to_roll_back_to():
    with pytest.raises(HistoryError, match="v000001 is the earliest champion still standing, there is nothing to "
                                           "roll back to$"):
        rollback_target(lineage(promote("v000001")), "v000001")


def test_a_current_version_missing_from_the_history_counts_as_the_latest():
    assert rollback_target(lineage(promote("v000001")), "v000002") == ("v000001", "v000002")


def test_records_of_older_podium_are_read_by_their_reason():
    # podium <= 0.2 wrote neither `action` nor `withdrawn`; this is the flip-flop it produced
    old = [{"version": "v000001", "reason": "first", "previous": None},
           {"version": "v000002", "reason": "better", "previous": "v000001"},
           {"version": "v000003", "reason": "better", "previous": "v000002"},
           {"version": "v000002", "reason": "rollback from v000003", "previous": "v000003"}]
    switch = parse_switch(old[-1])
    assert (switch.action, switch.withdrawn) == ("rollback", "v000003")
    assert lineage(*old).champions == ("v000001", "v000002", "v000003")
    assert rollback_target(lineage(*old), "v000002") == ("v000001", "v000002")


def test_the_current_switch_is_the_last_one_to_the_current_version():
    docs = [promote("v000001"), promote("v000002"), rollback("v000002", "v000001"), promote("v000003"),
            rollback("v000003", "v000001")]
    switches = [parse_switch(d) for d in docs]
    assert current_switch(switches, "v000001") == 4, "v000001 is in three switches; the last one put it in place"
    assert current_switch(switches, "v000003") == 3
    assert current_switch(switches, None) is None and current_switch([], "v000001") is None
