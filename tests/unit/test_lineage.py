"""Lineage facts that need no server: what started a flow run, and the code version of a loop's package."""

from __future__ import annotations

import subprocess
import sys
import uuid

from prefect._internal.schemas.fields import CreatedBy
from prefect.client.schemas.objects import DeploymentSchedule
from prefect.client.schemas.schedules import CronSchedule, IntervalSchedule

from podium.tasks.lineage import code_lineage, describe_start


def test_a_scheduled_flow_run_names_the_schedule_that_started_it():
    nightly = DeploymentSchedule(id=uuid.uuid4(), schedule=CronSchedule(cron="0 2 * * *", timezone="Europe/Paris"))
    hourly = DeploymentSchedule(id=uuid.uuid4(), schedule=IntervalSchedule(interval=3600))
    by = CreatedBy(id=nightly.id, type="SCHEDULE", display_value="CronSchedule")
    assert describe_start(by, [hourly, nightly]) == ("schedule CronSchedule", "cron '0 2 * * *' (Europe/Paris)")
    assert describe_start(CreatedBy(id=hourly.id, type="SCHEDULE", display_value=None), [hourly, nightly])[1] \
        == "every 1:00:00"
    assert describe_start(CreatedBy(id=uuid.uuid4(), type="AUTOMATION", display_value="on-event"), [nightly]) \
        == ("automation on-event", "")
    assert describe_start(None, [nightly]) == ("a user or an API call", "")


def test_the_code_version_is_the_git_commit_of_the_loops_package(tmp_path, monkeypatch):
    name = f"loop_pkg_{uuid.uuid4().hex[:8]}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("")
    (tmp_path / name / "train.py").write_text("def train_func(config):\n    pass\n")

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True, text=True,
                              env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                                   "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}).stdout.strip()

    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "loop")
    git("remote", "add", "origin", "https://user:token@git.example.com/team/loops.git")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    tags = code_lineage(["not_a_module_anywhere:f", f"{name}.train:train_func"])
    assert tags["mlflow.source.git.commit"] == git("rev-parse", "HEAD")
    assert tags["podium.code.package"] == name and tags["podium.code.git_dirty"] == "false"
    assert "token" not in tags["mlflow.source.git.repoURL"]  # credentials never reach a tag
    (tmp_path / name / "train.py").write_text("def train_func(config):\n    return 1\n")
    assert code_lineage([f"{name}.train:train_func"])["podium.code.git_dirty"] == "true"
