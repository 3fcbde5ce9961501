"""What people read: the chart artifact, the run's outcome line, where the MLflow links and artifacts point."""

from __future__ import annotations

import pytest

from podium.charts import Mark, metric_figure
from podium.core.records import FAILED, VALIDATED, CheckpointRecord
from podium.settings import PodiumSettings
from podium.tasks.promote import Promoted, PromotionOutcome
from podium.tasks.report import chart_markdown, outcome_texts

RECORDS = [CheckpointRecord(step=10, uri="/c/10", status=VALIDATED, metrics={"val_loss": 0.2041}),
           CheckpointRecord(step=20, uri="/c/20", status=VALIDATED, metrics={"val_loss": 0.1914}),
           CheckpointRecord(step=30, uri="/c/30", status=FAILED, metrics={}, failure="worker died")]


def test_a_gated_run_is_drawn_against_the_champion_it_lost_to():
    outcome = PromotionOutcome(promoted=None, best_step=20, champion_before="v000003",
                               champion_before_value=0.19, champion_before_run="nightly-1",
                               reason="step 20 has val_loss = 0.1914; champion v000003 has 0.19: improvement -0.0014 "
                                      "is not more than min_delta 0")
    fig = metric_figure(RECORDS, "val_loss", "min", "t", Mark("best, not promoted", 0.1914, 20),
                        Mark("champion before this run (v000003, run nightly-1)", 0.19))
    (ax,) = fig.axes
    assert any(list(line.get_ydata()) == [0.19, 0.19] for line in ax.lines)  # the reference line, at its value
    assert ax.get_ylim()[0] < 0.19 < 0.2041 < ax.get_ylim()[1]  # both the champion and every point in view
    md = chart_markdown(RECORDS, "val_loss", "min", outcome, b"\x89PNG")
    assert "![val_loss per checkpoint](data:image/png;base64," in md
    assert "| vs champion before this run (0.1900) |" in md
    assert "| 10 | validated | 0.2041 | +0.01410 (+7.4%) worse |" in md
    assert "| 20 | validated | 0.1914 | +0.001400 (+0.74%) worse | ★ best, not promoted |" in md
    assert "| 30 | failed |  |  | worker died |" in md
    line, description = outcome_texts("r", RECORDS, "val_loss", outcome)
    assert line == "not promoted: champion v000003 has 0.19: improvement -0.0014 is not more than min_delta 0"
    assert description.startswith("**Not promoted: champion v000003")


def test_a_promotion_is_one_line_with_step_version_and_value():
    promoted = Promoted(version="v000004", uri="/s/v4", step=20, metric="val_loss", value=0.1914,
                        mlflow_version="4", checkpoint_uri="/c/20")
    outcome = PromotionOutcome(promoted=promoted, reason="step 20 has val_loss = 0.1914; first promotion", best_step=20)
    line, _ = outcome_texts("r", RECORDS, "val_loss", outcome)
    assert line == "promoted step 20 as v000004 (val_loss 0.1914, model version 4)"
    md = chart_markdown(RECORDS, "val_loss", "min", outcome, None)
    assert "| vs the winner (0.1914) |" in md and "| 20 | validated | 0.1914 | ±0 | ★ promoted as v000004 |" in md
    assert "| 10 | validated | 0.2041 | +0.01270 (+6.6%) worse |" in md


@pytest.mark.parametrize("env, tracking_uri, expected", [
    ({}, "sqlite:///x/mlflow.db", None),  # nothing says where a UI is: no link, never a guessed port
    ({"PODIUM_MLFLOW_UI_URL": "http://mlflow.internal:8080/"}, "sqlite:///x.db", "http://mlflow.internal:8080"),
    ({}, "https://ci:secret@mlflow.internal", "https://mlflow.internal"),  # an mlflow server serves its UI
])
def test_mlflow_ui_links_come_from_configuration(monkeypatch, env, tracking_uri, expected):
    monkeypatch.delenv("PODIUM_MLFLOW_UI_URL", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert PodiumSettings().mlflow_ui(tracking_uri) == expected


def test_a_version_served_as_files_says_so_in_the_report_and_the_runs_summary(tmp_path, monkeypatch, capsys):
    """A checkpoint podium could build no model from: the promotion report and `podium run`'s end say it is served
    as files and how to make it loadable, and never suggest `mlflow models serve`; the `load:` line names the
    embedded store's MLFLOW_TRACKING_URI."""
    from types import SimpleNamespace

    from podium.cli.output import print_summary
    from podium.config import build_config
    from podium.tasks.report import promotion_markdown

    files = Promoted(version="v000002", uri="/s/v2/checkpoint", step=20, metric="val_loss", value=0.1914,
                     mlflow_version="2", checkpoint_uri="/c/20", served_as="files",
                     load="served as files (...): mlflow.artifacts.download_artifacts('models:/podium@champion')")
    outcome = PromotionOutcome(promoted=files, reason="first promotion", best_step=20)
    report = promotion_markdown("r", outcome, None)
    assert "- serving copy: `/s/v2/checkpoint` (served as files (name a --model-class or --model-loader to get a " \
           "loadable model))" in report
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("PODIUM_TRACKING_URI", raising=False)
    summary = SimpleNamespace(run_name="r", checkpoints=RECORDS[:2], stopped_early=None, late_stop=None, promotion=outcome,
                              flow_run_id="f", tracking=None)
    print_summary(summary, build_config({"serving": "/s"}), PodiumSettings(), "sqlite:///x", "http://127.0.0.1:1/api",
                  1.0)
    said = capsys.readouterr().out
    assert "with MLFLOW_TRACKING_URI=sqlite:///.podium/mlflow.db   (the embedded store)" in said
    assert "Serving:     /s  (model podium; served as files (name a --model-class or --model-loader to get a " \
           "loadable model))" in said
    assert "mlflow models serve" not in said
