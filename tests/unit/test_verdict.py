"""decide_verdict: the one function that decides a checkpoint's verdict, over its whole table."""

from __future__ import annotations

import math

import pytest

from podium.core.events import ValidationRequest
from podium.core.records import FAILED, PENDING, SKIPPED, VALIDATED
from podium.core.verdict import ValidationOutcome, Verdict, decide_verdict, run_failure

FINE = {"loss": 0.4, "epoch": 1.0}
DIVERGED = {"loss": math.nan, "epoch": 1.0}
NOT_ASKED = ValidationRequest(requested=False, stated=True)
ASKED = ValidationRequest(requested=True, stated=True, fn_kwargs={"val": 1})


def verdict(**known) -> Verdict:
    return decide_verdict(step=7, metric="val_loss", **{"training": FINE, **known})


# (what is known, status, reason, validate, unchanged): one row per line of the module's table, and
# the rows where two facts meet (the earlier line wins)
TABLE = [
    ("a resumed run's verdict stands", dict(status=VALIDATED), VALIDATED, None, False, True),
    ("a failed one stays failed", dict(status=FAILED, training=DIVERGED), FAILED, None, False, True),
    ("a skipped one stays skipped", dict(status=SKIPPED, request=ASKED), SKIPPED, None, False, True),
    ("diverged: failed before validation", dict(training=DIVERGED), FAILED,
     "training metric(s) not finite at step 7: loss = nan", False, False),
    ("diverged beats validation=False", dict(training=DIVERGED, request=NOT_ASKED), FAILED,
     "training metric(s) not finite at step 7: loss = nan", False, False),
    ("validation=False: skipped", dict(request=NOT_ASKED), SKIPPED,
     "not validated: the loop reported validation=False", False, False),
    ("validation=False beats a missing argument", dict(request=NOT_ASKED, missing_arguments=["ds"]), SKIPPED,
     "not validated: the loop reported validation=False", False, False),
    ("a required argument unfilled", dict(validation_fn="m:f", missing_arguments=["ds", "k"],
                                          given_arguments=["b", "a"]), FAILED,
     "not validated: m:f requires ds, k, which neither podium nor the arguments given for this checkpoint "
     "(['a', 'b']) fill", False, False),
    ("nothing known against it: validate", dict(), PENDING, None, True, False),
    ("asked for by its report: validate", dict(request=ASKED), PENDING, None, True, False),
    ("not stated: validate", dict(request=ValidationRequest()), PENDING, None, True, False),
    ("stopped with the run: stays pending", dict(outcome=ValidationOutcome(error="ValidationStopped: x", stopped=True)),
     PENDING, "its validation ended with the run's stop: it is validated when the run resumes", False, False),
    ("raised: failed with the error", dict(outcome=ValidationOutcome(error="TypeError: boom")), FAILED,
     "TypeError: boom", False, False),
    ("returned a string", dict(outcome=ValidationOutcome(non_numeric={"score": "'high' (str)"})), FAILED,
     "validation returned non-numeric metric(s): score = 'high' (str)", False, False),
    ("returned a NaN", dict(outcome=ValidationOutcome({"val_loss": math.nan, "val_accuracy": 0.2})), FAILED,
     "validation returned non-finite metric(s): val_loss = nan", False, False),
    ("returned no promotion metric", dict(outcome=ValidationOutcome({"val_accuracy": 0.9})), FAILED,
     "validation returned no 'val_loss' (the promotion metric); it returned ['val_accuracy'], training "
     "reported ['epoch', 'loss']", False, False),
    ("ranked by a training metric", dict(outcome=ValidationOutcome({"val_accuracy": 0.9}), training={"val_loss": 0.2}),
     VALIDATED, None, False, False),
    ("finite, with the metric: validated", dict(outcome=ValidationOutcome({"val_loss": 0.3})), VALIDATED, None,
     False, False),
]


@pytest.mark.parametrize("known, status, reason, validate, unchanged", [row[1:] for row in TABLE],
                         ids=[row[0] for row in TABLE])
def test_the_verdict_table(known, status, reason, validate, unchanged):
    v = verdict(**known)
    assert (v.status, v.reason, v.validate, v.unchanged) == (status, reason, validate, unchanged)
    assert v.to_record == (not unchanged and status != PENDING)


def test_a_verdict_carries_the_metrics_the_validation_returned():
    assert verdict(outcome=ValidationOutcome({"val_loss": 0.3, "acc": 0.9})).metrics == {"val_loss": 0.3, "acc": 0.9}
    # a failed one keeps them too: MLflow shows what the validation said, NaN included
    assert math.isnan(verdict(outcome=ValidationOutcome({"val_loss": math.nan})).metrics["val_loss"])
    assert verdict(request=NOT_ASKED).metrics == {}


def test_every_caller_decides_through_the_one_function():
    """No other module of podium names the ladder's pieces: they ask decide_verdict."""
    import pathlib

    import podium

    roots = {pathlib.Path(podium.__file__).parent, *(pathlib.Path(__import__(f"podium.{p}", fromlist=["x"]).__file__).parent
                                                     for p in ("flows", "tasks", "training", "deployments"))}
    pieces = ("judge_training(", "judge_validation(", "mark_skipped(", "mark_failed(")
    users = {str(path) for root in roots for path in root.rglob("*.py")
             if any(name in path.read_text() for name in pieces) and path.name not in ("verdict.py", "records.py")}
    assert not users, f"these modules decide or write a verdict themselves: {sorted(users)}"


def test_a_run_whose_every_validation_failed_has_failed():
    assert run_failure([FAILED, FAILED]) == "every validation failed (2 of 2 checkpoint(s) failed, none validated)"
    assert run_failure([FAILED, SKIPPED, FAILED]) == ("every validation failed (2 of 3 checkpoint(s) failed, "
                                                      "none validated)")
    assert run_failure([FAILED, VALIDATED]) is None  # one good checkpoint: the run did its work
    assert run_failure([SKIPPED, SKIPPED]) is None  # nothing asked for validation: not a failure of it
    assert run_failure([]) is None  # no checkpoint at all is said elsewhere (NoCheckpointReported)
