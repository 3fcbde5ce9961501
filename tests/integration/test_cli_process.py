"""The `podium` command as a user runs it, in its own process, against the test's Prefect server."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.commands import podium

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def _refused_while_it_runs(first: subprocess.Popen, args: list[str], env: dict[str, str], lock) -> None:
    """A second `podium run` of the same name, started while `first` holds the run's lock, is refused at once:
    exit 2, the holder named, nothing created (checked by the caller), the first run untouched."""
    deadline = time.monotonic() + 120
    while not (lock.exists() and lock.read_text()) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert json.loads(lock.read_text())["pid"] == first.pid
    second = podium(args, env, check=False)
    assert first.poll() is None, "the first run was still going when the second was refused"
    assert second.returncode == 2 and "Traceback" not in second.stderr
    assert f"held by pid {first.pid}" in second.stderr and "same name is in progress" in second.stderr


def test_run_status_promote_json_and_two_models_each_with_their_champion(cli_env, dataset, tmp_path, monkeypatch):
    """`podium run --model alpha` (a second run of its name refused while it runs), then `--model beta` (another
    metric and direction) in the same project folder: each keeps its champion, its serving location, its
    registered model; alpha's champion loads and serves the MLflow way. Then beta's next night, on other
    validation data: its champion re-scored on them."""
    from helpers.served_checks import check_served_champion
    from mlflow.tracking import MlflowClient

    home = tmp_path / "home"
    data = ["--train-data", dataset[0], "--val-data", dataset[1], "--storage", str(tmp_path / "storage")]
    common = ["--run-name", "cli", "--model", "alpha", *data]
    one = ["--num-workers", "1"]  # what is under test is the command, not DDP (test_pipeline's e2e test)
    first = subprocess.Popen([sys.executable, "-m", "podium.cli", "run", "--json", "--epochs", "3", *one, *common],
                             env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _refused_while_it_runs(first, ["run", "--json", "--epochs", "3", *one, *common], cli_env,
                           tmp_path / "storage" / ".podium-runs" / "cli.lock")
    stdout, stderr = first.communicate(timeout=600)
    assert first.returncode == 0, stderr[-3000:]
    out = json.loads(stdout.strip().splitlines()[-1])
    assert {"run_name", "mlflow_run_id", "tracking_uri", "checkpoints", "promoted", "model", "champion"} <= set(out)
    assert out["run_name"] == "cli" and out["tracking_uri"] == cli_env["MLFLOW_TRACKING_URI"]
    assert [c["status"] for c in out["checkpoints"]] == ["validated"] * 3
    assert all({"step", "uri", "status", "metrics"} <= set(c) for c in out["checkpoints"])
    best = min(out["checkpoints"], key=lambda c: (c["metrics"]["val_loss"], -c["step"]))  # ties: the later step
    assert out["promoted"]["step"] == best["step"] and out["promoted"]["metric"] == "val_loss"
    assert out["promoted"]["value"] == pytest.approx(best["metrics"]["val_loss"])
    alpha_serving = home / "serving" / "alpha"  # the model's own default serving location
    assert out["promoted"]["uri"] == str(alpha_serving / "versions" / "v000001" / "model")
    assert out["champion"]["version"] == "v000001" and out["champion"]["checkpoint"] == best["uri"]
    # `mlflow models serve` answers for the champion in test_production (an MLflow server, S3 artifacts)
    check_served_champion(cli_env["MLFLOW_TRACKING_URI"], "alpha", str(alpha_serving), dataset[1], tmp_path,
                          cli_env, monkeypatch, serve=False)

    # another model in the same folder, ranked by another metric in the other direction: its own champion
    beta = ["--run-name", "cli-beta", "--model", "beta", "--metric", "val_accuracy", "--mode", "max", *data]
    out_b = json.loads(podium(["run", "--json", "--epochs", "1", *one, *beta], cli_env).stdout.strip().splitlines()[-1])
    assert out_b["promoted"]["version"] == "v000001" and "first promotion" in out_b["promotion_reason"]
    assert out_b["promoted"]["uri"].startswith(str(home / "serving" / "beta"))
    client = MlflowClient(cli_env["MLFLOW_TRACKING_URI"], registry_uri=cli_env["MLFLOW_TRACKING_URI"])
    assert {e.name for e in client.search_experiments()} >= {"alpha", "beta"}
    assert client.get_model_version_by_alias("alpha", "champion").run_id == out["mlflow_run_id"]
    assert client.get_model_version_by_alias("beta", "champion").run_id == out_b["mlflow_run_id"]
    alpha_runs = client.search_runs([client.get_experiment_by_name("alpha").experiment_id],
                                    filter_string="tags.`podium.run_name` = 'cli'")
    assert len(alpha_runs) == 1  # the refused run created nothing

    status = json.loads(podium(["status", "--json", *common], cli_env).stdout)
    assert status["mlflow_run_id"] == out["mlflow_run_id"] and status["model"] == "alpha"
    assert [c["step"] for c in status["checkpoints"]] == [c["step"] for c in out["checkpoints"]]
    assert status["promoted"]["version"] == out["promoted"]["version"] and status["promoted"]["current"]
    assert (status["champion"]["model"], status["champion"]["run_name"]) == ("alpha", "cli")
    status_b = json.loads(podium(["status", "--json", *beta], cli_env).stdout)
    assert (status_b["champion"]["model"], status_b["champion"]["metric"]) == ("beta", "val_accuracy")
    assert status_b["promoted"]["version"] == "v000001"
    # one way to name a model on every command: --model; a command without it names the models there are
    history_b = json.loads(podium(["history", "--json", "--model", "beta"], cli_env).stdout)
    assert history_b["serving"] == str(home / "serving" / "beta") and history_b["current"] == "v000001"
    unnamed = podium(["status"], cli_env, check=False)
    assert unnamed.returncode != 0 and "no podium run in MLflow experiment 'podium'" in unnamed.stderr
    assert "runs of other models are here: alpha, beta (--model NAME)" in unnamed.stderr, unnamed.stderr

    # no --run-name: the model's latest run, the one `podium status` shows
    again = json.loads(podium(["promote", "--json", "--model", "alpha", *data], cli_env).stdout.strip().splitlines()[-1])
    assert again["run_name"] == "cli"
    assert again["promoted"] is None and "already the champion" in again["promotion_reason"]
    # each flow run's final state says what it did, for a person reading the Prefect UI
    from helpers.prefect_queries import flow_run_state

    flow_run = out["prefect_ui"].rsplit("/", 1)[-1]  # the refused second run has a flow run of that name too
    assert flow_run_state(run_id=flow_run).message.startswith(f"promoted step {out['promoted']['step']} (val_loss=0.")
    assert flow_run_state("cli-promote").message == f"nothing promoted: {again['promotion_reason']}"[:1000]
    assert again["champion"]["version"] == "v000001"  # the model's champion; `promoted` is this invocation's

    # no --run-name: the model's latest run; what it promoted and why, then the model's champion, apart
    text = podium(["status", "--model", "alpha", *data], cli_env).stdout
    step, version = out["promoted"]["step"], out["promoted"]["version"]
    assert text.startswith(f"run cli (MLflow run {out['mlflow_run_id']}): 3 checkpoints")
    assert f"this run promoted: {version} (step {step}, val_loss=" in text
    assert "  why: step" in text and "already the champion" in text  # the latest attempt's reason
    assert f"champion of model alpha at {alpha_serving}: {version} (step {step}, val_loss=" in text
    champion_line = next(line for line in text.splitlines() if line.startswith("champion of"))
    assert not re.search(r"\d\.\d{5,}", text.split("  why:")[0] + champion_line)  # 4 digits (the reason is exact)

    # the next night brings other validation data: the same `podium run` re-scores beta's champion on it (Ray kept
    # up for that) and compares the two on the same rows. On a local Ray of podium's own, which it releases early
    # when nothing needs it any more: through the real process, where a Ray shut down early once ended the run in
    # a crash with exit code 0
    from podium.training.data import make_classification_data

    _, harder_val = make_classification_data(str(tmp_path / "other"), train_rows=600, val_rows=600, seed=7)
    night = ["--run-name", "cli-beta-2", "--model", "beta", "--metric", "val_accuracy", "--mode", "max",
             "--train-data", dataset[0], "--val-data", harder_val, "--storage", str(tmp_path / "storage")]
    local = {k: v for k, v in cli_env.items() if k != "RAY_ADDRESS"}
    out_n = json.loads(podium(["run", "--json", "--epochs", "1", *one, *night], local).stdout.strip().splitlines()[-1])
    assert "re-scored" in out_n["promotion_reason"], out_n["promotion_reason"]
    assert harder_val in out_n["promotion_reason"], out_n["promotion_reason"]  # the data both were measured on


def test_bad_input_rejected_before_anything_is_created(cli_env, dataset, tmp_path):
    proc = podium(["run", "--train-data", str(tmp_path / "missing.parquet"), "--val-data", dataset[1],
                   "--storage", str(tmp_path / "storage"), "--serving", str(tmp_path / "serving")],
                  cli_env, check=False)
    assert proc.returncode == 2
    assert "data.train" in proc.stderr and "missing.parquet" in proc.stderr
    assert not (tmp_path / "storage").exists() and not (tmp_path / "serving").exists()
    proc = podium(["run", "--validate-kwargs", "{threshold: 0.5}", "--storage", str(tmp_path / "storage")], cli_env,
                  check=False)  # a flag's value that is no JSON object: a usage error, before anything starts
    assert proc.returncode == 2 and "podium: --validate-kwargs: expected a JSON object" in proc.stderr, proc.stderr
    assert not (tmp_path / "storage").exists()


def test_a_repository_with_its_own_training_and_tasks_packages(cli_env, dataset, tmp_path):
    """The user's repository has packages named `training` and `tasks`, as ML repositories often do.
    `podium` (the console script, not `python -m`) runs from the repository's root with no PYTHONPATH
    and resolves the user's packages, not its own (which are podium.training, podium.tasks). The run's name has a
    dot, as a versioned name often does, which MLflow refuses in a checkpoint record's name, and a {date} that the
    command fills. The user's code is the complete example of docs/bring-your-own-loop.md, as written there: its
    loop, validation function and model loader; the champion is a served MLflow model that predicts labels."""
    from datetime import datetime, timezone

    from mlflow.tracking import MlflowClient

    guide = (REPO / "docs" / "bring-your-own-loop.md").read_text()
    example = re.search(r"```python\n(# mypkg/train\.py\n.*?)```", guide, re.S).group(1)  # type: ignore[union-attr]
    repo = tmp_path / "user-repo"
    for package in ("training", "tasks"):
        (repo / package).mkdir(parents=True)
        (repo / package / "__init__.py").write_text("")
    (repo / "training" / "train.py").write_text(example)
    (repo / "tasks" / "checks.py").write_text("from training.train import validate_fn  # noqa: F401\n")
    # a local Ray of podium's own, as a user's first run gets: the user's packages reach its workers through the
    # raylet's path, not an upload
    env = {k: v for k, v in cli_env.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")}
    console_script = os.path.join(os.path.dirname(sys.executable), "podium")
    day = datetime.now(timezone.utc).strftime("%Y%m%d")
    proc = subprocess.run(
        [console_script, "run", "--json", "--run-name", "own-packages-v1.2-{date}", "--loop-config", "epochs=2",
         "--num-workers", "1", "--train-loop", "training.train:train_func", "--validate-fn", "tasks.checks:validate_fn",
         "--model-class", "training.train:Net", "--train-data", dataset[0], "--val-data", dataset[1],
         "--metric", "accuracy", "--mode", "max", "--storage", str(tmp_path / "storage"),
         "--serving", str(tmp_path / "serving")],
        cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [c["status"] for c in out["checkpoints"]] == ["validated", "validated"]
    assert all(c["metrics"]["accuracy"] > 0.5 for c in out["checkpoints"]), out["checkpoints"]
    if out["run_name"] != f"own-packages-v1.2-{day}":  # the command started after midnight (UTC)
        day = datetime.now(timezone.utc).strftime("%Y%m%d")
    assert out["promoted"] is not None and out["run_name"] == f"own-packages-v1.2-{day}"
    client = MlflowClient(cli_env["MLFLOW_TRACKING_URI"])
    models = client.search_logged_models([client.get_experiment_by_name("podium").experiment_id])
    assert {m.name for m in models} == {f"own-packages-v1_2-{day}-step-{c['step']}" for c in out["checkpoints"]}
    # the guide's model loader made the champion a served MLflow model: class labels from the feature columns
    load = ("import json, sys, mlflow, pandas as pd; df = pd.read_parquet(sys.argv[1]).drop(columns=['label']).head(5); "
            "print(json.dumps([int(v) for v in mlflow.pyfunc.load_model('models:/podium@champion').predict(df)]))")
    loaded = subprocess.run([sys.executable, "-c", load, dataset[1]], env=env, capture_output=True, text=True,
                            timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-4000:]
    predicted = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert len(predicted) == 5 and set(predicted) <= {0, 1, 2, 3}, predicted


def test_a_loop_that_never_checkpoints_fails_the_run(cli_env, tmp_path):
    """Ray's FashionMNIST example reports metrics only: the run fails, saying how to report a checkpoint."""
    from helpers.prefect_queries import flow_run_state
    from mlflow.tracking import MlflowClient

    cli_env["PYTHONPATH"] = os.path.dirname(__file__)  # the loop's module, as a user's own code
    proc = podium(["run", "--run-name", "no-ckpt", "--train-loop", "ray_example_checks:never_checkpoints",
                   "--validate-fn", "ray_example_checks:validate_tagged", "--num-workers", "1",
                   "--storage", str(tmp_path / "storage"), "--serving", str(tmp_path / "serving")],
                  cli_env, check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "reported metrics 2 time(s) but never with a checkpoint" in proc.stderr
    assert "ray.train.Checkpoint.from_directory" in proc.stderr and "Traceback" not in proc.stderr
    assert flow_run_state("no-ckpt-run").is_failed()
    client = MlflowClient(cli_env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("podium").experiment_id])
    assert run.info.status == "FAILED"


def test_a_run_whose_every_validation_failed_exits_1_after_its_summary(cli_env, tmp_path):
    """A validation function that returns None fails every checkpoint: the run prints its summary (the JSON a
    scheduler keeps), says why on stderr and exits 1, so nobody reads it as a success; its flow run ends Failed and
    its MLflow run FAILED, each saying why."""
    from helpers.prefect_queries import flow_run_state
    from mlflow.tracking import MlflowClient

    cli_env["PYTHONPATH"] = os.path.dirname(__file__)  # the loop's module, as a user's own code
    proc = podium(["run", "--json", "--run-name", "none-back", "--train-loop", "podium_user_code:train_func",
                   "--validate-fn", "podium_user_code:validate_returns_none", "--loop-config", "epochs=2",
                   "--num-workers", "1", "--validation-retries", "0", "--metric", "score", "--mode", "max",
                   "--storage", str(tmp_path / "storage"), "--serving", str(tmp_path / "serving")],
                  cli_env, check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [c["status"] for c in out["checkpoints"]] == ["failed", "failed"] and out["promoted"] is None
    assert "returned NoneType, expected a dict" in out["checkpoints"][0]["failure"]
    assert "podium: run 'none-back' failed: every validation failed (2 of 2 checkpoint(s) failed" in proc.stderr
    state = flow_run_state("none-back-run")
    assert state.is_failed() and state.message.startswith("run none-back failed: every validation failed"), state
    assert MlflowClient(cli_env["MLFLOW_TRACKING_URI"]).get_run(out["mlflow_run_id"]).info.status == "FAILED"
    from podium.serving.layout import read_current

    assert read_current(str(tmp_path / "serving")) is None


def test_a_run_whose_validations_stop_improving_stops_early_validates_what_it_saved_and_promotes(cli_env, tmp_path):
    """--early-stop-patience 3 on a user's loop of 40 short epochs whose score improves until epoch 2 and no
    more: after the verdicts of epochs 3, 4 and 5 podium stops Ray Train, validates every checkpoint it saved,
    promotes the best (ties: the later step) and says so in the summary, the JSON and the MLflow run."""
    from helpers.prefect_queries import flow_run_state
    from mlflow.tracking import MlflowClient

    cli_env["PYTHONPATH"] = os.path.dirname(__file__)  # the loop's module, as a user's own code
    proc = podium(["run", "--json", "--run-name", "plateau", "--train-loop", "podium_user_code:train_func",
                   "--validate-fn", "podium_user_code:validate_fn", "--validate-kwargs", '{"plateau_from": 2}',
                   "--loop-config", "epochs=40", "--loop-config", "epoch_s=0.5", "--num-workers", "1",
                   "--early-stop-patience", "3", "--metric", "score", "--mode", "max",
                   "--storage", str(tmp_path / "storage"), "--serving", str(tmp_path / "serving")], cli_env)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    steps = [c["step"] for c in out["checkpoints"]]
    assert 6 <= len(steps) < 40, steps  # stopped after the sixth verdict, well before the last epoch
    assert all(c["status"] == "validated" for c in out["checkpoints"]), out["checkpoints"]
    stopped = out["stopped_early"]
    assert stopped["step"] == steps[5], stopped
    assert stopped["reason"] == (f"3 validation(s) in a row (steps {steps[3]}-{steps[5]}) did not improve score "
                                 f"on step {steps[2]}'s 2.000"), stopped
    assert out["promoted"]["step"] == steps[-1]  # every step from the third scores 2: the later one wins
    assert f"stopping training early at step {steps[5]}" in proc.stderr
    client = MlflowClient(cli_env["MLFLOW_TRACKING_URI"])
    run = client.get_run(out["mlflow_run_id"])
    assert run.data.tags["podium.stopped_early"] == f"step {steps[5]}: {stopped['reason']}"
    assert run.info.status == "FINISHED"
    state = flow_run_state("plateau-run")  # the flow run's final state says what happened
    assert state.is_completed() and state.message == (f"stopped early at step {steps[5]} ({stopped['reason']}); "
                                                      f"promoted step {steps[-1]} (score=2.000) as v000001"), state.message


def _checkpoint_folders(storage, run_name: str) -> list[str]:
    return sorted(p.name for p in (storage / run_name).glob("checkpoint_*") if p.is_dir())


def test_keep_checkpoints_leaves_the_best_and_the_newest_in_storage_and_every_record_in_mlflow(cli_env, tmp_path):
    """--keep-checkpoints 2 on 6 epochs: storage ends with the 2 best by the promotion metric and the newest,
    deleted while the run went on; MLflow keeps all 6 records with their verdicts, the deleted ones tagged; the
    champion is served; a resume to 8 epochs continues from the newest and keeps the new best, and the first
    champion's checkpoint though it fell out of the best: a rollback serves it again."""
    from mlflow.tracking import MlflowClient

    from podium.serving.layout import read_current

    scores = [1, 5, 2, 9, 8, 0, 10, 11]  # the best: epochs 3 and 4, then 7 and 6
    storage, serving = tmp_path / "storage", tmp_path / "serving"
    cli_env["PYTHONPATH"] = os.path.dirname(__file__)  # the loop's module, as a user's own code

    def run(epochs: int) -> tuple[dict, str]:
        proc = podium(["run", "--json", "--run-name", "kept", "--train-loop", "podium_user_code:train_func",
                       "--validate-fn", "podium_user_code:validate_fn", "--validate-kwargs", json.dumps({"scores": scores}),
                       "--loop-config", f"epochs={epochs}", "--num-workers", "1", "--keep-checkpoints", "2",
                       "--metric", "score", "--mode", "max", "--storage", str(storage), "--serving", str(serving)],
                      cli_env)
        return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr

    out, err = run(6)
    checkpoints = out["checkpoints"]
    assert [c["status"] for c in checkpoints] == ["validated"] * 6
    assert [c["metrics"]["score"] for c in checkpoints] == scores[:6]
    kept = [checkpoints[i]["uri"] for i in (3, 4, 5)]
    assert _checkpoint_folders(storage, "kept") == sorted(os.path.basename(u) for u in kept)
    assert [c["uri"] for c in checkpoints if "deleted" not in c] == kept
    assert "storage: deleted checkpoint(s) of step" in err  # as verdicts arrived, not only at the end
    assert out["promoted"]["step"] == checkpoints[3]["step"] and os.path.isdir(out["promoted"]["uri"])
    client = MlflowClient(cli_env["MLFLOW_TRACKING_URI"])
    models = client.search_logged_models([client.get_experiment_by_name("podium").experiment_id], max_results=100)
    assert len(models) == 6 and all(m.tags["podium.status"] == "validated" for m in models)
    assert sum("podium.deleted" in m.tags for m in models) == 3
    status = json.loads(podium(["status", "--json", "--run-name", "kept", "--storage", str(storage),
                                "--serving", str(serving)], cli_env).stdout)
    assert sum("deleted" in c for c in status["checkpoints"]) == 3

    out, _ = run(8)  # the resume continues from the newest checkpoint, the only one it needs
    checkpoints = out["checkpoints"]
    assert [c["metrics"]["score"] for c in checkpoints] == scores and len(checkpoints) == 8
    kept = [checkpoints[i]["uri"] for i in (3, 6, 7)]  # 3: the source of v000001, which the history can serve again
    assert _checkpoint_folders(storage, "kept") == sorted(os.path.basename(u) for u in kept)
    assert out["promoted"]["step"] == checkpoints[7]["step"] and out["promoted"]["version"] == "v000002"
    assert read_current(str(serving)).version == "v000002"
    rolled = json.loads(podium(["rollback", "--json", "--serving", str(serving)], cli_env).stdout)
    assert rolled["to_version"] == "v000001" and os.path.isdir(checkpoints[3]["uri"])
    # the rollback is a flow run of its own, which the Prefect UI shows: its end says what serves now
    from helpers.prefect_queries import flow_run_state
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter

    state = flow_run_state(run_id=rolled["flow_run_id"])
    assert state.is_completed() and state.message.startswith(f"{serving}: v000002 -> v000001; @champion -> version"), \
        state.message
    deadline = time.monotonic() + 60  # task runs reach the server as events, in batches
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(rolled["flow_run_id"])
        assert client.read_flow(flow_run.flow_id).name == "rollback" and flow_run.name == "podium-rollback"
        while True:
            tasks = [r.name for r in client.read_task_runs(
                flow_run_filter=FlowRunFilter(id={"any_": [rolled["flow_run_id"]]}))]
            if any(name.startswith("roll-back") for name in tasks):
                break
            assert time.monotonic() < deadline, f"no roll-back task run: {tasks}"
            time.sleep(0.5)
    status = json.loads(podium(["status", "--json", "--run-name", "kept", "--storage", str(storage),
                                "--serving", str(serving)], cli_env).stdout)
    assert status["champion"]["checkpoint"] == checkpoints[3]["uri"] and status["disagreements"] == []


def _prefect_servers_of(home) -> list[int]:
    """The pids of `prefect server` processes whose PREFECT_HOME is under `home`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ")
        except OSError:
            continue
        if b"prefect" in cmd and b"server" in cmd and f"PREFECT_HOME={home}".encode() in b"\n".join(environ):
            found.append(int(pid))
    return found


def _signals_as_in_a_terminal() -> None:
    """In the child, before podium starts: SIGINT and SIGTERM with their default action and not blocked, as a command
    a terminal or a scheduler starts has them. A child inherits an ignored or blocked signal (which podium respects,
    as Python does), and this pytest worker's state is whatever its earlier tests left (a full run under xdist
    ignored the group's SIGINT, where the test alone passed)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def test_refused_runs_leave_no_server_behind(dataset, tmp_path):
    """Runs refused by the plan, on the embedded defaults (no Prefect server configured): a bad path, an unwritable
    storage, an import path that does not import, a metric the built-in validation does not report, a column the data
    lacks. Each is refused before any server or Ray starts: one sentence naming what was wrong, exit 2, and nothing
    started or left behind (no Prefect server, no home folder, where its logs and Ray's would be). (Every kind of
    refusal and its message: test_plan, test_datasets, in-process; the time to the refusal: benchmarks/startup.py.)
    Then a run stopped by a signal while the server starts."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "RAY_ADDRESS")}
    env.update({"PODIUM_HOME": str(home), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"})
    a_file = tmp_path / "a-file"  # a folder under a file cannot be made, by root either
    a_file.write_text("")
    missing = str(tmp_path / "missing.parquet")
    refusals = {"missing": (["--train-data", missing], f"data.train = {missing!r}: no such file or directory"),
                "unwritable": (["--storage", str(a_file / "storage")], f"storage = {str(a_file / 'storage')!r}: "),
                "import": (["--validate-fn", "no_such_module:validate"],
                           "validation.fn = 'no_such_module:validate': cannot import module 'no_such_module'"),
                "metric": (["--metric", "val_acc"], "promotion.metric = 'val_acc': no such metric; the built-in loop "
                                                    "and validation report ['accuracy', 'loss', 'val_accuracy', "
                                                    "'val_loss']"),
                "column": (["--label-column", "no_label"], "has no label column 'no_label'")}
    for what, (flags, sentence) in refusals.items():
        args = ["run", "--run-name", f"refused-{what}", "--epochs", "1", "--train-data", dataset[0],
                "--val-data", dataset[1], *flags]
        proc = podium(args, env, check=False)
        assert proc.returncode == 2, f"{what}: exit {proc.returncode}:\n{proc.stderr[-3000:]}"
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert proc.stderr.startswith("podium: ") and sentence in proc.stderr, proc.stderr
        assert "checking its data" in proc.stdout and "starting" not in proc.stdout, proc.stdout  # said, not started
        assert not home.exists(), f"{what}: {sorted(str(p) for p in home.rglob('*'))}"
        assert _prefect_servers_of(home) == [], f"{what}: a Prefect server was left running"
        assert not (tmp_path / "storage").exists()

    # stopped while the server starts: Ctrl-C (SIGINT to the command's process group, as a terminal sends it), and a
    # scheduler's SIGTERM to the command: exit 128 + the signal, one line, and no server left that server.json
    # does not name (`podium server stop` finds every one). Where a library swallowed the signal's exception, the
    # command stops at its run's start instead (tests/unit/test_cli.py): the same exit, its own line
    proc = None
    try:
        for sig, to_group in ((signal.SIGINT, True), (signal.SIGTERM, False)):
            proc = subprocess.Popen([sys.executable, "-m", "podium.cli", "run", "--run-name", "stopped", "--epochs", "1",
                                     "--train-data", dataset[0], "--val-data", dataset[1]], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                    preexec_fn=_signals_as_in_a_terminal)
            deadline = time.monotonic() + 120
            while not _prefect_servers_of(home):
                assert proc.poll() is None and time.monotonic() < deadline, f"no Prefect server started: {proc.poll()}"
                time.sleep(0.05)
            (os.killpg if to_group else os.kill)(proc.pid, sig)
            _, err = proc.communicate(timeout=180)
            last = err.strip().splitlines()[-1] if err.strip() else ""
            here = [line.strip() for line in open("/proc/self/status") if line.startswith(("SigBlk", "SigIgn"))]
            assert proc.returncode == 128 + sig and last.startswith("podium: "), (
                f"exit {proc.returncode} (this process: SIGINT {signal.getsignal(signal.SIGINT)}, {here}):\n{err[-3000:]}")
            assert "Traceback" not in err, err[-3000:]
            state = home / "prefect" / "server.json"
            deadline = time.monotonic() + 30
            while set(_prefect_servers_of(home)) - ({json.loads(state.read_text())["pid"]} if state.exists() else set()):
                assert time.monotonic() < deadline, f"{sig.name}: a Prefect server that no server.json names was left"
                time.sleep(0.2)
            podium(["server", "stop"], env)
            assert _prefect_servers_of(home) == []
    finally:  # a failed assertion above leaves neither the command nor a server it started running
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in _prefect_servers_of(home):  # each server is a session of its own
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
