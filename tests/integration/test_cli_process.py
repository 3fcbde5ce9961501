"""The `podium` command as a user runs it, in its own process, against the test's Prefect server.

Three Ray Train starts, in one project folder; what each carries (each behaviour checked by a test named for it,
failing on its own):

- `alpha` (module-scoped): `podium run --model alpha`, the built-in loop, 3 epochs on the session's Ray head, and
  the same command started while it runs, and a SIGINT right after its promotion's switch (the run completes:
  exit 0, `late_stop`, Completed, FINISHED). Carries the JSON outcome, `status` (JSON and text), `promote` of the
  latest run, `history`, the flow runs' final states, the champion served the MLflow way
  (test_run_status_promote_json_and_the_champion_served_the_mlflow_way); the second run refused while the first
  holds the lock (test_a_second_run_of_the_same_name_is_refused_while_the_first_runs); with `beta`, two models in
  one project folder, each with its champion (test_two_models_in_one_project_folder_each_keep_their_champion).
- `beta` (module-scoped), in the same project folder: `podium run --model beta` of a user's loop (plain Ray
  Train APIs, 40 short epochs) whose score improves until epoch 3 and no more, with --early-stop-patience 3 and
  --keep-checkpoints 2, ranked by another metric in the other direction than alpha. Carries the early stop
  (test_a_run_whose_validations_stop_improving_stops_early_validates_what_it_saved_and_promotes) and
  checkpoints.keep (test_keep_checkpoints_leaves_the_best_and_the_newest_in_storage_and_every_record_in_mlflow,
  storage naming only what Ray Train's snapshot names).
- `beta_resumed`: the same run name with more epochs and the next night's validation data, on a local Ray of
  podium's own (the second Ray Train start of `beta`'s run). Carries the resume after an early stop
  (test_a_resume_after_an_early_stop_trains_on_from_the_newest_checkpoint_in_the_same_mlflow_run), checkpoints.keep
  across it (test_a_resume_keeps_the_new_best_and_the_served_champion_s_checkpoint), the champion re-scored on the
  other data (test_the_next_night_s_run_re_scores_the_champion_on_its_validation_data_on_a_local_ray), and then
  `podium rollback` (test_a_rollback_serves_the_first_champion_again_from_its_kept_checkpoint).

The runs that share nothing with these (a user's repository, a loop that never checkpoints, a signal while the
server starts): test_cli_alone, so that xdist runs them beside this module. Bad input and refused runs, of every
command: test_cli_small; a run whose every validation failed, through the command: test_pipeline's diverging run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from helpers.commands import podium, podium_in_process

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def project(prefect_api, shared_ray, tmp_path_factory, mlflow_template_db):
    """The module's project folder, where `alpha` and `beta` train: its home (serving locations under
    home/serving/<model>), storage and MLflow store, on the session's Prefect server and Ray head."""
    root = tmp_path_factory.mktemp("project")
    shutil.copy(mlflow_template_db, root / "mlflow.db")
    env = dict(os.environ)
    env.update({"PODIUM_HOME": str(root / "home"), "PREFECT_API_URL": prefect_api,
                "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}", **shared_ray.driver_env(),
                "PYTHONPATH": os.path.dirname(__file__)})  # the user loops' module, as a user's own code
    return types.SimpleNamespace(root=root, env=env, home=root / "home", storage=root / "storage")


@pytest.fixture(scope="module")
def alpha(project, dataset):
    """`podium run --json --model alpha` (the built-in loop, 3 epochs, 1 worker: what is under test is the command,
    not DDP, which test_pipeline's e2e run trains), and the same command started while it holds the run's lock.
    A SIGINT reaches it right after its promotion switched CURRENT (held there by the test-only hook
    PODIUM_TEST_PAUSE_AT): past the point of no return, the run completes and says the stop came after the switch."""
    data = ["--train-data", dataset[0], "--val-data", dataset[1], "--storage", str(project.storage)]
    common = ["--run-name", "cli", "--model", "alpha", *data]
    args = ["run", "--json", "--epochs", "3", "--num-workers", "1", *common]
    lock = project.storage / ".podium-runs" / "cli.lock"
    paused = project.root / "alpha-paused-after-switch"
    first = subprocess.Popen([sys.executable, "-m", "podium.cli", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**project.env, "PODIUM_TEST_PAUSE_AT": "after-switch",
                                                                    "PODIUM_TEST_PAUSE_FILE": str(paused)})
    try:
        deadline = time.monotonic() + 120
        while not (lock.exists() and lock.read_text()) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        holder = json.loads(lock.read_text())["pid"] if lock.exists() and lock.read_text() else None
        second = podium(args, project.env, check=False)
        first_still_running = first.poll() is None
        while not paused.exists() and first.poll() is None and time.monotonic() < deadline + 480:
            time.sleep(0.2)
        if paused.exists():
            first.send_signal(signal.SIGINT)
        stdout, stderr = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
    out = json.loads(stdout.strip().splitlines()[-1]) if first.returncode == 0 else None
    return types.SimpleNamespace(returncode=first.returncode, stderr=stderr, out=out, pid=first.pid, holder=holder,
                                 second=second, first_still_running=first_still_running, data=data, common=common,
                                 serving=project.home / "serving" / "alpha")


def _alpha_out(alpha) -> dict:
    assert alpha.returncode == 0, alpha.stderr[-3000:]
    return alpha.out


def test_run_status_promote_json_and_the_champion_served_the_mlflow_way(alpha, project, dataset, tmp_path,
                                                                        monkeypatch):
    """`podium run --json --model alpha`: the outcome as JSON, the model's own serving location, its champion
    loaded and served the MLflow way; `status` (JSON and text) and `promote` of the model's latest run; each flow
    run's final state says what it did."""
    from helpers.served_checks import check_served_champion

    out, env, data = _alpha_out(alpha), project.env, alpha.data
    assert {"run_name", "mlflow_run_id", "tracking_uri", "checkpoints", "promoted", "model", "champion"} <= set(out)
    assert out["run_name"] == "cli" and out["tracking_uri"] == env["MLFLOW_TRACKING_URI"]
    assert [c["status"] for c in out["checkpoints"]] == ["validated"] * 3
    assert all({"step", "uri", "status", "metrics"} <= set(c) for c in out["checkpoints"])
    best = min(out["checkpoints"], key=lambda c: (c["metrics"]["val_loss"], -c["step"]))  # ties: the later step
    assert out["promoted"]["step"] == best["step"] and out["promoted"]["metric"] == "val_loss"
    assert out["promoted"]["value"] == pytest.approx(best["metrics"]["val_loss"])
    alpha_serving = alpha.serving  # the model's own default serving location
    assert out["promoted"]["uri"] == str(alpha_serving / "versions" / "v000001" / "model")
    assert out["champion"]["version"] == "v000001" and out["champion"]["checkpoint"] == best["uri"]
    # the SIGINT came after the switch: the run is complete, and every output says so
    late = "SIGINT after the switch: v000001 promoted; the run is complete"
    assert out["late_stop"] == late and f"podium: {late}" in alpha.stderr, alpha.stderr[-3000:]
    from podium.tracking.client import tracking_client

    assert tracking_client(env["MLFLOW_TRACKING_URI"]).get_run(out["mlflow_run_id"]).info.status == "FINISHED"
    # `mlflow models serve` answers for the champion in test_production (an MLflow server, S3 artifacts)
    check_served_champion(env["MLFLOW_TRACKING_URI"], "alpha", str(alpha_serving), dataset[1], tmp_path,
                          env, monkeypatch, serve=False)

    status = json.loads(podium(["status", "--json", "--run-name", "cli", "--model", "alpha", "--storage",
                                str(project.storage)], env).stdout)
    assert status["mlflow_run_id"] == out["mlflow_run_id"] and status["model"] == "alpha"
    assert [c["step"] for c in status["checkpoints"]] == [c["step"] for c in out["checkpoints"]]
    assert status["promoted"]["version"] == out["promoted"]["version"] and status["promoted"]["current"]
    assert (status["champion"]["model"], status["champion"]["run_name"]) == ("alpha", "cli")

    # no --run-name: the model's latest run, the one `podium status` shows
    again = json.loads(podium(["promote", "--json", "--model", "alpha", *data], env).stdout.strip().splitlines()[-1])
    assert again["run_name"] == "cli"
    assert again["promoted"] is None and "already the champion" in again["promotion_reason"]
    # each flow run's final state says what it did, for a person reading the Prefect UI
    from helpers.prefect_queries import flow_run_state

    flow_run = out["prefect_ui"].rsplit("/", 1)[-1]  # the refused second run has a flow run of that name too
    ended = flow_run_state(run_id=flow_run)
    assert ended.name == "Completed" and ended.message.endswith(late), ended
    assert ended.message.startswith(f"promoted step {out['promoted']['step']} (val_loss=0.")
    assert flow_run_state("cli-promote").message == f"nothing promoted: {again['promotion_reason']}"[:1000]
    assert again["champion"]["version"] == "v000001"  # the model's champion; `promoted` is this invocation's

    # no --run-name: the model's latest run; what it promoted and why, then the model's champion, apart
    text = podium(["status", "--model", "alpha", "--storage", str(project.storage)], env).stdout
    step, version = out["promoted"]["step"], out["promoted"]["version"]
    assert text.startswith(f"run cli (MLflow run {out['mlflow_run_id']}): 3 checkpoints")
    assert f"this run promoted: {version} (step {step}, val_loss=" in text
    assert "  why: step" in text and "already the champion" in text  # the latest attempt's reason
    assert f"champion of model alpha at {alpha_serving}: {version} (step {step}, val_loss=" in text
    champion_line = next(line for line in text.splitlines() if line.startswith("champion of"))
    assert not re.search(r"\d\.\d{5,}", text.split("  why:")[0] + champion_line)  # 4 digits (the reason is exact)


def test_a_second_run_of_the_same_name_is_refused_while_the_first_runs(alpha, project):
    """A second `podium run` of the same name, started while the first holds the run's lock, is refused at once:
    exit 2, the holder named, nothing created, the first run untouched."""
    from mlflow.tracking import MlflowClient

    assert alpha.holder == alpha.pid, "the lock names the first run's process"
    second = alpha.second
    assert alpha.first_still_running, "the first run was still going when the second was refused"
    assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr[-3000:]
    assert f"held by pid {alpha.pid}" in second.stderr and "same name is in progress" in second.stderr
    _alpha_out(alpha)  # and the first run ended well
    client = MlflowClient(project.env["MLFLOW_TRACKING_URI"])
    alpha_runs = client.search_runs([client.get_experiment_by_name("alpha").experiment_id],
                                    filter_string="tags.`podium.run_name` = 'cli'")
    assert len(alpha_runs) == 1  # the refused run created nothing


def test_two_models_in_one_project_folder_each_keep_their_champion(alpha, beta, project):
    """`--model alpha` (val_loss, min) and `--model beta` (score, max) in the same project folder: each keeps its
    champion, its serving location, its registered model; one way to name a model on every command (--model) (a
    command without it, in a store of several models, names them: test_cli_small)."""
    from mlflow.tracking import MlflowClient

    out, out_b, env, home = _alpha_out(alpha), _beta_out(beta), project.env, project.home
    assert out_b["promoted"]["version"] == "v000001" and "first promotion" in out_b["promotion_reason"]
    assert out_b["promoted"]["uri"].startswith(str(home / "serving" / "beta"))
    client = MlflowClient(env["MLFLOW_TRACKING_URI"], registry_uri=env["MLFLOW_TRACKING_URI"])
    assert {e.name for e in client.search_experiments()} >= {"alpha", "beta"}
    assert client.get_model_version_by_alias("alpha", "champion").run_id == out["mlflow_run_id"]
    assert client.get_model_version_by_alias("beta", "champion").run_id == out_b["mlflow_run_id"]
    assert beta.status.returncode == 0, beta.status.stderr[-3000:]
    status_b = json.loads(beta.status.stdout)  # `podium status --json --model beta` right after beta's run
    assert (status_b["champion"]["model"], status_b["champion"]["metric"]) == ("beta", "score")
    assert status_b["mlflow_run_id"] == out_b["mlflow_run_id"]
    history_b = json.loads(podium(["history", "--json", "--model", "beta"], env).stdout)
    assert history_b["serving"] == str(home / "serving" / "beta"), history_b


# beta's scores by epoch: they improve until epoch 3 (9) and no more; the resume's two new epochs improve again
SCORES = [1, 5, 2, 9, 8, 0, 3] + [0] * 33
FIRST_BEST, SECOND = 3, 4  # the two best of the first start: epochs 3 (9) and 4 (8)


def _beta_run(project, dataset, env: dict[str, str], epochs: int, scores: list[int],
              val_data: str, *extra: str) -> subprocess.CompletedProcess:
    return podium(["run", "--json", "--run-name", "kept", "--model", "beta", "--train-loop", "podium_user_code:train_func",
                   "--validate-fn", "podium_user_code:validate_fn", "--validate-kwargs", json.dumps({"scores": scores}),
                   "--loop-config", f"epochs={epochs}", "--loop-config", "epoch_s=0.5", "--num-workers", "1",
                   "--early-stop-patience", "3", "--keep-checkpoints", "2", "--metric", "score", "--mode", "max",
                   "--train-data", dataset[0], "--val-data", val_data, "--storage", str(project.storage), *extra],
                  env, check=False)


def _checkpoint_folders(storage, run_name: str) -> list[str]:
    return sorted(p.name for p in (storage / run_name).glob("checkpoint_*") if p.is_dir())


def _storage_now(project) -> types.SimpleNamespace:
    """What storage holds for run `kept` now, and what Ray Train's run snapshot names."""
    from podium.training.raytrain import persisted_checkpoints

    return types.SimpleNamespace(folders=_checkpoint_folders(project.storage, "kept"),
                                 named={e.checkpoint_name for e in persisted_checkpoints(str(project.storage), "kept")})


def _mlflow_now(project, run_id: str | None) -> types.SimpleNamespace:
    """beta's checkpoint records (LoggedModels' tags) and its MLflow run's tags and status now."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(project.env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("beta")
    models = client.search_logged_models([experiment.experiment_id], max_results=100) if experiment else []
    run = client.get_run(run_id) if run_id else None
    return types.SimpleNamespace(model_tags=[dict(m.tags) for m in models], run_tags=dict(run.data.tags) if run else {},
                                 run_params=dict(run.data.params) if run else {},
                                 run_status=run.info.status if run else None)


def _task_run_names(flow_run_id: str, until) -> list[str]:
    """The names of a flow run's task runs, read again until `until(names)` holds or a minute has passed (task runs
    reach the server as events, in batches)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter

    deadline = time.monotonic() + 60
    with get_client(sync_client=True) as client:
        while True:
            names = [r.name for r in client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [flow_run_id]}))]
            if until(names) or time.monotonic() > deadline:
                return names
            time.sleep(0.5)


@pytest.fixture(scope="module")
def beta(alpha, project, dataset):
    """`podium run --model beta` in alpha's project folder (after it: the two models' test needs both): a user's loop
    of 40 half-second epochs scored SCORES, early stop patience 3, checkpoints.keep 2; what storage, MLflow and
    `podium status` held right after it."""
    proc = _beta_run(project, dataset, project.env, 40, SCORES, dataset[1])
    out = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    status = podium_in_process(["status", "--json", "--model", "beta", "--storage", str(project.storage)],
                               project.env, check=False)  # a read: the status command's process is alpha's
    return types.SimpleNamespace(proc=proc, out=out, storage=_storage_now(project),
                                 mlflow=_mlflow_now(project, out and out["mlflow_run_id"]), status=status)


def _beta_out(beta) -> dict:
    assert beta.proc.returncode == 0, beta.proc.stderr[-3000:]
    return beta.out


@pytest.fixture(scope="module")
def beta_resumed(beta, project, dataset, tmp_path_factory):
    """The next night's `podium run` of beta's run name: 2 more epochs (scored 10 and 11), other validation data,
    on a local Ray of podium's own (no RAY_ADDRESS), which it releases early when nothing needs it any more, with a
    watch after its switch (`[promotion.watch]`, 2 s, no `podium serve` answering); what storage and MLflow held
    right after it."""
    from podium.training.data import make_classification_data

    first = _beta_out(beta)
    n = len(first["checkpoints"])
    scores = SCORES[:n] + [10, 11] + [0] * 10
    _, harder_val = make_classification_data(str(tmp_path_factory.mktemp("other")), train_rows=600, val_rows=600,
                                             seed=7)
    local = {k: v for k, v in project.env.items() if k != "RAY_ADDRESS"}
    watched = project.root / "watched.toml"
    watched.write_text("[promotion.watch]\nduration_s = 2\nmin_requests = 5\n")
    proc = _beta_run(project, dataset, local, n + 2, scores, harder_val, "--config", str(watched))
    out = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    return types.SimpleNamespace(proc=proc, out=out, first=first, harder_val=harder_val, epochs=n + 2,
                                 storage=_storage_now(project), mlflow=_mlflow_now(project, first["mlflow_run_id"]))


def _resumed_out(beta_resumed) -> dict:
    assert beta_resumed.proc.returncode == 0, beta_resumed.proc.stderr[-3000:]
    return beta_resumed.out


@pytest.fixture(scope="module")
def beta_rolled_back(beta_resumed, project):
    """`podium rollback --json --model beta` after the resume promoted v000002; `podium status` after it."""
    rolled = podium(["rollback", "--json", "--model", "beta"], project.env, check=False)
    status = podium_in_process(["status", "--json", "--model", "beta", "--storage", str(project.storage)],
                               project.env, check=False)  # a read: the status command's process is alpha's
    return types.SimpleNamespace(proc=rolled, status=status)


def test_a_run_whose_validations_stop_improving_stops_early_validates_what_it_saved_and_promotes(beta, project):
    """--early-stop-patience 3 on a user's loop of 40 short epochs whose score improves until epoch 3 and no more:
    after the verdicts of epochs 4, 5 and 6 podium stops Ray Train, validates every checkpoint it saved, promotes
    the best and says so in the summary, the JSON, the MLflow run and the flow run's final state."""
    from helpers.prefect_queries import flow_run_state

    out, proc = _beta_out(beta), beta.proc
    steps = [c["step"] for c in out["checkpoints"]]
    assert 7 <= len(steps) < 40, steps  # stopped after the seventh verdict, well before the last epoch
    assert all(c["status"] == "validated" for c in out["checkpoints"]), out["checkpoints"]
    assert [c["metrics"]["score"] for c in out["checkpoints"]] == SCORES[:len(steps)]
    stopped = out["stopped_early"]
    assert stopped["step"] == steps[6], stopped
    assert stopped["reason"] == (f"3 validation(s) in a row (steps {steps[4]}-{steps[6]}) did not improve score "
                                 f"on step {steps[3]}'s 9.000"), stopped
    assert out["promoted"]["step"] == steps[FIRST_BEST]
    assert f"stopping training early at step {steps[6]}" in proc.stderr
    assert beta.mlflow.run_tags["podium.stopped_early"] == f"step {steps[6]}: {stopped['reason']}"
    assert beta.mlflow.run_status == "FINISHED"
    state = flow_run_state(run_id=out["prefect_ui"].rsplit("/", 1)[-1])  # its final state says what happened
    assert state.is_completed() and state.message == (f"stopped early at step {steps[6]} ({stopped['reason']}); "
                                                      f"promoted step {steps[FIRST_BEST]} (score=9.000) as v000001"), \
        state.message


def test_keep_checkpoints_leaves_the_best_and_the_newest_in_storage_and_every_record_in_mlflow(beta):
    """--keep-checkpoints 2: storage ends with the 2 best by the promotion metric and the newest, deleted while the
    run went on, and no folder that Ray Train's run snapshot does not name; MLflow keeps every record with its
    verdict, the deleted ones tagged; the champion's copy is served."""
    out, err = _beta_out(beta), beta.proc.stderr
    checkpoints = out["checkpoints"]
    kept = [checkpoints[i]["uri"] for i in (FIRST_BEST, SECOND, len(checkpoints) - 1)]
    assert beta.storage.folders == sorted(os.path.basename(u) for u in kept)
    assert set(beta.storage.folders) <= beta.storage.named, (beta.storage.folders, beta.storage.named)
    assert [c["uri"] for c in checkpoints if "deleted" not in c] == kept
    assert "storage: deleted checkpoint(s) of step" in err  # as verdicts arrived, not only at the end
    assert out["promoted"]["step"] == checkpoints[FIRST_BEST]["step"] and os.path.isdir(out["promoted"]["uri"])
    tags = beta.mlflow.model_tags
    assert len(tags) == len(checkpoints) and all(t["podium.status"] == "validated" for t in tags)
    assert sum("podium.deleted" in t for t in tags) == len(checkpoints) - 3
    assert beta.status.returncode == 0, beta.status.stderr[-3000:]
    assert sum("deleted" in c for c in json.loads(beta.status.stdout)["checkpoints"]) == len(checkpoints) - 3


def test_a_resume_after_an_early_stop_trains_on_from_the_newest_checkpoint_in_the_same_mlflow_run(beta_resumed):
    """The same run name with more epochs, after a run that stopped early: it says the best so far stands and that
    patience counts this start's checkpoints, trains on from the newest checkpoint (the only one it needs), in the
    same MLflow run, validating only its new checkpoints and recording none twice; the changed settings take
    effect, are said, and the MLflow run records the values in effect beside the first ones."""
    first, out, proc = beta_resumed.first, _resumed_out(beta_resumed), beta_resumed.proc
    n = len(first["checkpoints"])
    said = proc.stdout + proc.stderr  # with --json, what it says goes to stderr
    assert "early stopping: the best so far stands; patience (3) counts this start's checkpoints" in said, said
    assert f"run kept resumes from step {first['checkpoints'][-1]['step']}" in said, said
    assert f"training.train_loop_config.epochs = {beta_resumed.epochs} (was 40): takes effect" in said, said
    steps = [c["step"] for c in out["checkpoints"]]
    assert steps[:n] == [c["step"] for c in first["checkpoints"]] and len(steps) == n + 2, steps
    assert [c["metrics"]["score"] for c in out["checkpoints"][n:]] == [10, 11]
    assert out["mlflow_run_id"] == first["mlflow_run_id"], "the same MLflow run"
    assert out["stopped_early"] is None
    assert len(beta_resumed.mlflow.model_tags) == n + 2, "none recorded twice"
    run = beta_resumed.mlflow
    assert (run.run_params["training.train_loop_config.epochs"],
            run.run_tags["podium.config.training.train_loop_config.epochs"]) == ("40", str(beta_resumed.epochs))
    # only the two new checkpoints were validated by the resume's flow run
    names = _task_run_names(out["prefect_ui"].rsplit("/", 1)[-1],
                            lambda names: sum(n.startswith("validate-step-") for n in names) >= 2)
    validated = sorted(n for n in names if n.startswith("validate-step-"))
    assert validated == sorted(f"validate-step-{s}" for s in steps[n:]), validated


def test_a_resume_keeps_the_new_best_and_the_served_champion_s_checkpoint(beta_resumed):
    """checkpoints.keep across the resume: storage keeps the new best two (the newest among them) and the first
    champion's checkpoint though it fell out of the best, which the serving history can serve again; the new best
    is promoted as v000002."""
    out = _resumed_out(beta_resumed)
    checkpoints, n = out["checkpoints"], len(beta_resumed.first["checkpoints"])
    kept = [checkpoints[i]["uri"] for i in (FIRST_BEST, n, n + 1)]  # FIRST_BEST: the source of v000001
    assert beta_resumed.storage.folders == sorted(os.path.basename(u) for u in kept)
    assert set(beta_resumed.storage.folders) <= beta_resumed.storage.named
    assert out["promoted"]["step"] == checkpoints[n + 1]["step"] and out["promoted"]["version"] == "v000002"


def test_a_run_s_watch_with_no_live_traffic_ends_final_and_every_output_says_so(beta_resumed, project):
    """`podium run` with `[promotion.watch]`: its new champion is watched for 2 s after the switch; with no
    `podium serve` answering, the watch ends with fewer than min_requests and the promotion is final. The JSON, the
    registered version's tags and the flow run's final message say so, and v000002 serves (the watch's rollback on
    live errors, through `podium serve` and `podium promote`: test_watch)."""
    import mlflow

    out = _resumed_out(beta_resumed)
    watch = out["watch"]
    assert watch["state"] == "passed" and watch["version"] == "v000002" and watch["previous"] == "v000001", watch
    assert "fewer than min_requests" in watch["reason"] and watch["reason"] in out["promotion_reason"], watch
    client = mlflow.MlflowClient(project.env["MLFLOW_TRACKING_URI"])
    version = client.get_model_version_by_alias("beta", "champion")
    assert version.tags.get("podium.watch") == "passed", version.tags
    from podium.serving.layout import read_current

    assert read_current(str(project.home / "serving" / "beta")).version == "v000002"
    flow_run_id = out["prefect_ui"].rsplit("/", 1)[-1]
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as prefect:
        state = prefect.read_flow_run(flow_run_id).state
    assert state.is_completed() and "final after its watch" in (state.message or ""), state


def test_the_next_night_s_run_re_scores_the_champion_on_its_validation_data_on_a_local_ray(beta_resumed):
    """The next night brings other validation data: the same `podium run` re-scores beta's champion on it (Ray kept
    up for that) and compares the two on the same rows. On a local Ray of podium's own, which it releases early
    when nothing needs it any more: through the real process, where a Ray shut down early once ended the run in
    a crash with exit code 0."""
    out = _resumed_out(beta_resumed)
    assert "re-scored" in out["promotion_reason"], out["promotion_reason"]
    assert beta_resumed.harder_val in out["promotion_reason"], out["promotion_reason"]  # the data both were measured on


def test_a_rollback_serves_the_first_champion_again_from_its_kept_checkpoint(beta_rolled_back, beta_resumed):
    """`podium rollback --model beta` after the resume's v000002: v000001 serves again, from the checkpoint
    checkpoints.keep kept; the rollback is a flow run of its own, which the Prefect UI shows, its end saying what
    serves now; `podium status` finds the stores agreeing."""
    from helpers.prefect_queries import flow_run_state
    from prefect.client.orchestration import get_client

    checkpoints = _resumed_out(beta_resumed)["checkpoints"]
    assert beta_rolled_back.proc.returncode == 0, beta_rolled_back.proc.stderr[-3000:]
    rolled = json.loads(beta_rolled_back.proc.stdout)
    assert rolled["to_version"] == "v000001" and os.path.isdir(checkpoints[FIRST_BEST]["uri"])
    serving = str(beta_resumed.first["promoted"]["uri"]).rsplit("/versions/", 1)[0]
    state = flow_run_state(run_id=rolled["flow_run_id"])
    assert state.is_completed() and state.message.startswith(f"{serving}: v000002 -> v000001; @champion -> version"), \
        state.message
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(rolled["flow_run_id"])
        assert client.read_flow(flow_run.flow_id).name == "rollback" and flow_run.name == "beta-rollback"
    tasks = _task_run_names(rolled["flow_run_id"], lambda names: any(n.startswith("roll-back") for n in names))
    assert any(name.startswith("roll-back") for name in tasks), f"no roll-back task run: {tasks}"
    assert beta_rolled_back.status.returncode == 0, beta_rolled_back.status.stderr[-3000:]
    status = json.loads(beta_rolled_back.status.stdout)
    assert status["champion"]["checkpoint"] == checkpoints[FIRST_BEST]["uri"] and status["disagreements"] == []
