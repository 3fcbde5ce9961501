"""What a person meets at the edges of the `podium` command, through its own process (issue 61, point 6), each
command's once; the further cases of each in the test's process (podium.cli.main, helpers.commands.podium_in_process):

- refusals in an empty project folder, of `run` (a typo'd metric, a storage filesystem that does not import, a label
  column the data lacks, shadow limits nothing asks for, a missing file, a storage or serving location under a file)
  and of the other commands (history, lineage, rollback and make-data on a file where a folder is expected or a path
  no folder can be made at) say one sentence, exit 2, and write nothing: no demo dataset, no home folder;
- `history` marks one switch current, the one that made the current version current;
- `history`, `lineage` and `rollback` from the wrong folder say where podium looked and how to point it elsewhere;
- `status` without --model, in a store whose only model is `cancer`, shows it and says so; with two models it lists
  them.

No training: the checkpoints are made (helpers.checkpoints.make_trained_run), the serving history written with
podium's own functions.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from helpers.checkpoints import INTEGRATION, make_trained_run
from helpers.commands import podium, podium_in_process, prefect_servers_of
from podium_nightly_code import FEATURES, write_data

pytestmark = pytest.mark.integration


def _bare_env(home: Path, tracking_uri: str) -> dict[str, str]:
    """The embedded defaults under `home`: no Prefect server or Ray configured."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "RAY_ADDRESS", "PODIUM_HOME")}
    env.update({"PODIUM_HOME": str(home), "MLFLOW_TRACKING_URI": tracking_uri})
    return env


def _contents(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


def _refusals(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """Each refusal a person meets in an empty project folder: the command's arguments, and the sentence it says."""
    (tmp_path / "fs.toml").write_text('[storage]\npath = "checkpoints"\nfilesystem = "no_such_module:make_fs"\n')
    (tmp_path / "shadow.toml").write_text("[promotion.shadow]\nrequests = 50\n")
    a_file = tmp_path / "a-file"  # a folder under a file cannot be made, by root either
    a_file.write_text("")
    missing = str(tmp_path / "missing.parquet")
    in_the_way = "stands where --serving expects a folder"
    run = ["run", "--run-name", "refused"]
    return {
        # the run's plan, before the demo data is written
        "metric": ([*run, "--metric", "val_acc"], "promotion.metric = 'val_acc': no such metric; the built-in loop and "
                                                  "validation report ['accuracy', 'loss', 'val_accuracy', 'val_loss']"),
        "filesystem": ([*run, "--config", str(tmp_path / "fs.toml")],
                       "storage.filesystem = 'no_such_module:make_fs': cannot import module 'no_such_module'"),
        "shadow": ([*run, "--config", str(tmp_path / "shadow.toml")],
                   "promotion.shadow = {...}: the shadow stage's limits have no effect with promotion.rollout = "
                   "'direct': expected promotion.rollout = \"shadow\""),
        "import": ([*run, "--validate-fn", "no_such_module:validate"],
                   "validation.fn = 'no_such_module:validate': cannot import module 'no_such_module'"),
        "missing data": ([*run, "--train-data", missing], f"data.train = {missing!r}: no such file or directory"),
        "not JSON": ([*run, "--validate-kwargs", "{threshold: 0.5}"], "--validate-kwargs: expected a JSON object"),
        # after the demo data was written, by the data itself: the demo data is removed again
        "label": ([*run, "--label-column", "no_label"], "has no label column 'no_label'"),
        # a location that cannot be created: refused before either is made
        "unwritable storage": ([*run, "--storage", str(a_file / "storage")], f"storage = {str(a_file / 'storage')!r}: "),
        "serving under a file": ([*run, "--serving", str(a_file / "serving")],
                                 f"serving = {str(a_file / 'serving')!r}: a file ({a_file}) stands where serving "
                                 "expects a folder"),
        # the other commands, on a file where a folder is expected or a path no folder can be made at
        "history": (["history", "--serving", str(a_file)], f"{a_file}: a file {in_the_way}"),
        "lineage": (["lineage", "v000001", "--serving", str(a_file)], f"{a_file}: a file {in_the_way}"),
        "rollback": (["rollback", "--serving", str(a_file)], f"{a_file}: a file {in_the_way}"),
        "make-data under a file": (["make-data", "--out", str(a_file / "x")],
                                   f"{a_file / 'x'}: a file ({a_file}) stands where --out expects a folder"),
        "make-data where nothing can be made": (["make-data", "--out", "/proc/podium-x"],
                                                "/proc/podium-x: not writable"),
    }


# the refusals met through the `podium` process; the rest are met by podium.cli.main in the test's process
THROUGH_THE_PROCESS = {"metric", "history", "lineage", "rollback", "make-data where nothing can be made"}


def test_refusals_in_an_empty_project_say_one_sentence_and_leave_nothing(tmp_path):
    """Every refusal a person meets at the command line, in an empty project folder on the embedded defaults (one of
    each command's through the real process, and the label column's in a home that held something; the others in
    this process): exit 2, one sentence naming what was wrong (no traceback), nothing started (no Prefect server, no
    "starting") and nothing written: no home folder (the demo data, the logs, an empty .podium/), no
    storage. A refusal met after the demo data was written (a label column it lacks) leaves a home that held
    something as it was. (Every kind of refusal and its message in-process: test_plan, test_datasets; the time to
    the refusal: benchmarks/startup.py.)"""
    project = tmp_path / "project"
    project.mkdir()
    kept = tmp_path / "kept"
    (kept / "logs").mkdir(parents=True)
    (kept / "logs" / "podium.log").write_text("an earlier run\n")
    refusals = _refusals(tmp_path)
    runs = [(project / ".podium", what) for what in refusals] + [(kept, "label")]
    for home, what in runs:
        before = _contents(home)
        args, sentence = refusals[what]
        # through the real process: a refusal of each command, and the one that wrote the demo data first; the others
        # in this process (their sentence is what differs, not the process)
        command = podium if what in THROUGH_THE_PROCESS or home == kept else podium_in_process
        proc = command(args, _bare_env(home, f"sqlite:///{tmp_path / 'mlflow.db'}"), check=False, cwd=project)
        assert proc.returncode == 2, f"{what}: exit {proc.returncode}:\n{proc.stderr[-3000:]}"
        assert proc.stderr.startswith("podium: ") and sentence in proc.stderr, f"{what}: {proc.stderr[-3000:]}"
        assert "Traceback" not in proc.stderr and "starting" not in proc.stdout, f"{what}: {proc.stderr[-3000:]}"
        assert _contents(home) == before, f"{what}: left {_contents(home)}"
        assert prefect_servers_of(home) == [], f"{what}: a Prefect server was left running"
        assert list(project.iterdir()) == [], f"{what}: left {list(project.iterdir())}"
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "a-file" / "storage").exists()


def _fabricated_serving(serving: Path, source: Path) -> None:
    """A serving location where v000001 was promoted, then v000002, then a rollback served v000001 again: v000001
    is in two switches. Written by podium's own functions, as a promotion and a rollback write it."""
    from podium.serving.layout import seal_version, switch_current
    from podium.serving.staging import stage_version

    source.mkdir()
    (source / "weights.json").write_text("[1.0, 2.0]")
    versions = []
    for step in (3, 5):
        version = stage_version(str(serving), str(source), {"step": step, "run_name": "r1", "metric": "accuracy",
                                                             "value": 0.5 + step / 100})
        seal_version(str(serving), version)
        switch_current(str(serving), version, f"step {step} is better", origin={"command": "test", "user": "t",
                                                                                "host": "h", "pid": 1})
        versions.append(version)
    switch_current(str(serving), versions[0], "rollback from v000002: bad answers", action="rollback",
                   withdrawn="v000002", origin={"command": "podium rollback", "user": "t", "host": "h", "pid": 1})


def test_history_marks_the_switch_that_made_the_champion_current_and_a_wrong_folder_says_where_it_looked(tmp_path):
    project = tmp_path / "project"
    _fabricated_serving(project / ".podium" / "serving" / "cancer", tmp_path / "checkpoint")
    env = {k: v for k, v in os.environ.items() if k not in ("PODIUM_HOME", "MLFLOW_TRACKING_URI")}
    out = podium(["history", "--model", "cancer"], env, cwd=project).stdout
    lines = [line for line in out.splitlines() if re.match(r"\s+\d{4}-\d\d-\d\d ", line)]
    assert len(lines) == 3 and [line.endswith("[current]") for line in lines] == [False, False, True], out
    assert "promote  v000001" in lines[0] and "rollback v000001" in lines[2], out
    doc = json.loads(podium_in_process(["history", "--model", "cancer", "--json"], env, cwd=project).stdout)
    assert (doc["current"], doc["current_switch"]) == ("v000001", 2)

    # the same commands one folder off: where podium looked, and how to point it at the project (history's through
    # its process, the others' in this one)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for args, then in ((["history", "--model", "cancer"], ")"),
                       (["lineage", "v000001", "--model", "cancer"], "), so no version v000001 there"),
                       (["rollback", "--model", "cancer"], "), nothing to roll back")):
        command = podium if args[0] == "history" else podium_in_process
        proc = command(args, env, check=False, cwd=elsewhere)
        home = elsewhere / ".podium"
        assert proc.returncode == 2, f"{args}: exit {proc.returncode}: {proc.stdout}{proc.stderr}"
        assert proc.stderr.startswith(
            f"podium: nothing has been promoted to '{home}/serving/cancer' (no such location; the serving location "
            f"of model 'cancer' in podium's home {home}, PODIUM_HOME is not set: ./.podium of this folder{then}"
        ), proc.stderr
        assert proc.stderr.rstrip().endswith("Run podium from the project folder, set PODIUM_HOME to its .podium "
                                             "folder, or give --serving LOCATION"), proc.stderr
        assert "Traceback" not in proc.stderr and list(elsewhere.iterdir()) == [], proc.stderr
    # PODIUM_HOME pointing at the project reads it from anywhere
    out = podium(["history", "--model", "cancer"], {**env, "PODIUM_HOME": str(project / ".podium")},
                 cwd=elsewhere).stdout
    assert "3 switch(es), current v000001" in out


def _made_config(root: Path, model: str) -> dict:
    return {"run_name": f"{model}-night", "model": model, "storage": str(root / "storage"),
            "serving": str(root / "home" / "serving" / model),
            "data": {"train": str(root / "train.parquet"), "val": str(root / "val.parquet"),
                     "feature_columns": list(FEATURES)},
            "training": {"train_loop": "podium_nightly_code:train_func",
                         "train_loop_config": {"epochs": 2, "angle_deg": 20.0}},
            "scaling": {"num_workers": 1}, "validation": {"fn": "podium_nightly_code:validate_fn"},
            "promotion": {"metric": "accuracy", "mode": "max", "verify": "hashes"}}


def test_status_without_a_model_shows_the_only_model_with_runs_and_lists_them_when_there_are_several(
        tmp_path, mlflow_template_db):
    shutil.copy(mlflow_template_db, tmp_path / "mlflow.db")
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    write_data(str(tmp_path / "train.parquet"), 100, 0.0, seed=1)
    write_data(str(tmp_path / "val.parquet"), 200, 0.1, seed=2)
    make_trained_run(_made_config(tmp_path, "cancer"), tracking_uri)
    env = {**_bare_env(tmp_path / "home", tracking_uri),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(INTEGRATION), os.environ.get("PYTHONPATH")]))}
    proc = podium(["status", "--json"], env, cwd=tmp_path)
    doc = json.loads(proc.stdout)
    assert (doc["model"], doc["run_name"]) == ("cancer", "cancer-night"), doc
    assert [c["status"] for c in doc["checkpoints"]] == ["validated", "validated"], doc["checkpoints"]
    assert (f"podium: no --model given; the only model with runs in {tracking_uri} is 'cancer': showing it "
            "(--model cancer)") in proc.stderr, proc.stderr
    named = podium_in_process(["status", "--model", "cancer"], env, cwd=tmp_path)
    assert "no --model given" not in named.stderr and "cancer-night" in named.stdout

    make_trained_run(_made_config(tmp_path, "melanoma"), tracking_uri)
    proc = podium(["status"], env, check=False, cwd=tmp_path)
    assert proc.returncode == 2 and "no podium run in MLflow experiment 'podium'" in proc.stderr, proc.stderr
    assert "runs of other models are here: cancer, melanoma (--model NAME)" in proc.stderr, proc.stderr
