"""The same-data gate's pure part: which numbers need measuring again, and the comparison in words."""

from __future__ import annotations

import dataclasses

from podium.core.comparison import (
    AT_VALIDATION,
    RESCORED,
    STORED,
    Comparison,
    Measure,
    comparison_from_dict,
    needs_rescore,
    rescored,
)

A, B = "a" * 32, "b" * 32


def test_a_number_is_measured_again_only_when_its_data_differs_or_is_unknown():
    assert not needs_rescore(A, A)
    assert needs_rescore(B, A)
    assert needs_rescore(None, A), "a champion promoted before digests were recorded"
    assert not needs_rescore(B, None), "no current digest: nothing to measure against"


def test_a_rescored_comparison_names_both_numbers_and_both_digests():
    champion = rescored(Measure("champion v000001", 0.80, A, STORED), 0.62, B)
    c = Comparison("accuracy", "/data/night-2/val.parquet", B, Measure("step 1", 0.66, B, AT_VALIDATION), champion)
    assert c.same_data and c.rescored == ["champion v000001"]
    text = c.describe()
    assert "same validation data, /data/night-2/val.parquet (digest bbbbbbbbbbbb)" in text
    assert "step 1 accuracy = 0.6600 (validated)" in text
    assert "champion v000001 accuracy = 0.6200 (re-scored; before: 0.8000 on digest aaaaaaaaaaaa)" in text


def test_a_comparison_on_different_data_says_so():
    c = Comparison("val_loss", "/v", B, Measure("step 3", 0.4, B, AT_VALIDATION), Measure("champion v000002", 0.3, A, STORED),
                   note="champion v000002 could not be re-scored (KeyError: 'w')")
    assert not c.same_data
    assert c.describe().startswith("NOT compared on the same data")
    assert "measured on digest aaaaaaaaaaaa" in c.describe() and "could not be re-scored" in c.describe()


def test_a_comparison_survives_json():
    c = Comparison("accuracy", "/v", B, Measure("step 1", 0.66, B, AT_VALIDATION),
                   rescored(Measure("champion v000001", 0.8, None, STORED), 0.62, B))
    assert comparison_from_dict(dataclasses.asdict(c)) == c
    assert comparison_from_dict(dataclasses.asdict(c)).champion.how == RESCORED
