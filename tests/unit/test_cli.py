"""The podium command's parsing and config building; nothing here starts a server or trains."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import podium.cli.run as run_command
import podium.services
from podium.cli.errors import CliError, exit_code_of
from podium.cli.main import build_parser, main
from podium.cli.options import OPTIONS, config_from_args
from podium.errors import EXIT_REFUSED, ConfigError
from podium.settings import PodiumSettings


def config_for(argv: list[str], home: Path):
    return config_from_args(build_parser().parse_args(argv), PodiumSettings(home=home))


def test_flags_become_the_nested_config(tmp_path):
    config = config_for(["run", "--run-name", "exp-1", "--epochs", "3", "--learning-rate", "0.5",
                         "--num-workers", "4", "--use-gpu", "--feature-columns", "a, b,,c",
                         "--validate-kwargs", '{"k": 1}', "--concurrency", "3", "--metric", "val_accuracy",
                         "--mode", "max", "--min-delta", "0.01", "--always-promote", "--no-verify"], tmp_path)
    assert config.run_name == "exp-1"
    assert (config.training.epochs, config.training.learning_rate) == (3, 0.5)
    assert (config.scaling.num_workers, config.scaling.use_gpu) == (4, True)
    assert config.data.feature_columns == ["a", "b", "c"]
    assert (config.validation.kwargs, config.validation.concurrency) == ({"k": 1}, 3)
    p = config.promotion
    assert (p.metric, p.mode, p.min_delta, p.always, p.verify) == ("val_accuracy", "max", 0.01, True, "hashes")


def test_verify_modes_and_the_old_bool(tmp_path):
    assert config_for(["run", "--verify", "revalidate"], tmp_path).promotion.verify == "revalidate"
    from podium.config import build_config
    from podium.errors import ConfigError
    assert build_config({"promotion": {"verify": True}}).promotion.verify == "revalidate"
    assert build_config({"promotion": {"verify": False}}).promotion.verify == "hashes"
    with pytest.raises(ConfigError, match="verify"):
        build_config({"promotion": {"verify": "sometimes"}})


def test_unset_flags_keep_defaults_and_locations_come_from_home(tmp_path):
    config = config_for(["run"], tmp_path)
    assert (config.training.epochs, config.scaling.use_gpu, config.promotion.verify) == (5, False, "load")
    assert config.storage == str(tmp_path / "storage") and config.serving == str(tmp_path / "serving" / "podium")
    assert config.data.train == str(tmp_path / "data" / "train.parquet")
    assert (config.model, config.experiment, config.promotion.registered_model) == ("podium",) * 3
    assert config.training.standardize is True


def test_a_run_names_placeholders_are_filled_for_the_commands_start_and_only_when_given(tmp_path):
    from datetime import datetime, timezone

    before = datetime.now(timezone.utc)
    config = config_for(["run", "--run-name", "nightly-{date}-at-{datetime}"], tmp_path)
    after = datetime.now(timezone.utc)
    filled = re.fullmatch(r"nightly-(\d{8})-at-((\d{8})-\d{6})", config.run_name)
    assert filled, config.run_name
    assert f"{before:%Y%m%d-%H%M%S}" <= filled[2] <= f"{after:%Y%m%d-%H%M%S}" and filled[1] == filled[3]
    # no placeholder, no run name given: the default stays "not given" (`podium promote` then takes the latest run)
    assert "run_name" not in config_for(["run"], tmp_path).model_fields_set


def test_a_model_name_scopes_experiment_registered_model_and_serving(tmp_path):
    config = config_for(["run", "--model", "churn", "--no-standardize"], tmp_path)
    assert (config.model, config.experiment, config.promotion.registered_model) == ("churn",) * 3
    assert config.serving == str(tmp_path / "serving" / "churn") and config.training.standardize is False
    named = config_for(["run", "--model", "churn", "--experiment", "e", "--registered-model", "r"], tmp_path)
    assert (named.experiment, named.promotion.registered_model) == ("e", "r")
    with pytest.raises(ConfigError, match="model = '../up'"):
        config_for(["run", "--model", "../up"], tmp_path)


def test_flags_override_the_config_file(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"training": {"epochs": 7, "batch_size": 16}, "serving": "/srv/models"}))
    config = config_for(["run", "--config", str(path), "--epochs", "2"], tmp_path)
    assert (config.training.epochs, config.training.batch_size, config.serving) == (2, 16, "/srv/models")


def test_invalid_flag_value_is_a_cli_error_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match="promotion.mode = 'up'") as refused:
        config_for(["run", "--mode", "up"], tmp_path)
    assert exit_code_of(refused.value) == EXIT_REFUSED  # the command's one table: printed, exit 2


@pytest.mark.parametrize("value, expected", [
    ("{bad", "expected a JSON object such as '{\"threshold\": 0.5}', got '{bad' (Expecting property name"),
    ("[1, 2]", "expected a JSON object such as '{\"threshold\": 0.5}', got a list: '[1, 2]'"),
])
def test_validate_kwargs_that_are_no_json_object_are_a_usage_error_saying_what_was_expected(capsys, value, expected):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["run", "--validate-kwargs", value])
    assert exit_.value.code == 2 and f"podium: --validate-kwargs: {expected}" in capsys.readouterr().err


@pytest.mark.parametrize("argv, expected", [
    (["run", "--epochs", "x"], "podium: --epochs = 'x': expected a whole number"),
    (["run", "--keep-checkpoints", "2.5"], "podium: --keep-checkpoints = '2.5': expected a whole number"),
    (["promote", "--min-delta", "a bit"], "podium: --min-delta = 'a bit': expected a number"),
    (["run", "--no-such-flag"], "podium: unrecognized arguments: --no-such-flag"),
    # the commands that read a run take no training flag they would ignore
    (["status", "--epochs", "3"], "podium: unrecognized arguments: --epochs 3"),
    (["ui", "--learning-rate", "0.1"], "podium: unrecognized arguments: --learning-rate 0.1"),
])
def test_a_bad_flag_is_one_sentence_not_the_usage_block(capsys, argv, expected):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith(expected), err
    assert err.count("\n") == 1 and "usage:" not in err, err


def test_status_and_ui_take_which_run_and_where_it_serves(tmp_path):
    for command in ("status", "ui"):
        args = build_parser().parse_args([command, "--config", "c.toml", "--run-name", "r", "--model", "m",
                                          "--experiment", "e", "--storage", "s", "--serving", "v",
                                          "--registered-model", "rm", "--alias", "a", "--json"])
        assert (args.run_name, args.model, args.serving, args.alias, args.json) == ("r", "m", "v", "a", True)


def test_run_help_mentions_every_option(capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["run", "--help"])
    assert exit_.value.code == 0
    shown = capsys.readouterr().out
    assert [flag for flag, *_ in OPTIONS if flag not in shown] == []


def test_invalid_run_fails_before_any_server_starts(tmp_path, monkeypatch, capsys):
    def no_server(*args, **kwargs):
        raise AssertionError("a server was started for an invalid configuration")

    monkeypatch.setenv("PODIUM_HOME", str(tmp_path))
    # routes library logs to a file under home and edits the root logger: not what this test is about
    monkeypatch.setattr(run_command, "_quiet_libraries", lambda log_file: None)
    monkeypatch.setattr(podium.services, "ensure_prefect_server", no_server)
    monkeypatch.setattr(podium.services, "prepare_mlflow", no_server)
    monkeypatch.setattr(podium.services, "check_mlflow", no_server)

    assert main(["run", "--epochs", "0", "--quiet"]) == 2
    assert "training.epochs = 0" in capsys.readouterr().err


# --- bad input: one sentence, exit code 2, nothing created ---------------------------------------

@pytest.mark.parametrize("content, kind", [("[1, 2]", "list"), ('"podium"', "str")])
def test_a_json_config_that_is_not_an_object_is_refused(tmp_path, capsys, content, kind):
    path = tmp_path / "podium.json"
    path.write_text(content)
    assert main(["status", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"expected a table of settings (a JSON object), got a {kind}" in err and "Traceback" not in err


@pytest.mark.parametrize("argv, expected", [
    (["--classes", "0"], "podium: --classes = '0': expected a whole number of at least 2"),
    (["--train-rows", "-5"], "podium: --train-rows = '-5': expected a whole number of at least 1"),
    (["--features", "0"], "podium: --features = '0': expected a whole number of at least 1"),
    (["--val-rows", "many"], "podium: --val-rows = 'many': expected a whole number"),
])
def test_make_data_refuses_counts_that_make_no_dataset(tmp_path, capsys, argv, expected):
    with pytest.raises(SystemExit) as exit_:
        main(["make-data", "--out", str(tmp_path / "data"), *argv])
    assert exit_.value.code == 2 and expected in capsys.readouterr().err
    assert not (tmp_path / "data").exists()


def test_verify_and_no_verify_together_are_refused(tmp_path):
    with pytest.raises(CliError, match="--verify revalidate and --no-verify contradict each other"):
        config_for(["run", "--verify", "revalidate", "--no-verify"], tmp_path)


def test_status_in_an_empty_folder_creates_no_mlflow_store(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PODIUM_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["status"]) == 2
    assert "no MLflow store at sqlite:///" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_rollback_and_history_of_a_missing_serving_location_create_nothing(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    assert main(["rollback", "--serving", str(missing)]) == 2
    assert f"nothing has been promoted to {str(missing)!r}" in capsys.readouterr().err
    # a location that does not exist is a wrong folder or a typo, not an empty history: refused, exit 2
    assert main(["history", "--serving", str(missing)]) == 2
    assert f"nothing has been promoted to {str(missing)!r} (no such location)" in capsys.readouterr().err
    assert not missing.exists()
    missing.mkdir()  # one that exists, with nothing promoted yet: says so, exit 0
    assert main(["history", "--serving", str(missing)]) == 0
    assert "nothing has been promoted" in capsys.readouterr().out
    assert list(missing.iterdir()) == []


def test_a_truncated_pointer_is_a_sentence_not_a_traceback(tmp_path, monkeypatch, capsys):
    serving = tmp_path / "serving"
    serving.mkdir()
    (serving / "CURRENT").write_text('{"version": "v0000')
    for argv in (["rollback", "--serving", str(serving)], ["history", "--serving", str(serving)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"{serving}/CURRENT is not valid JSON (truncated or corrupt?)" in err and "Traceback" not in err
    assert sorted(p.name for p in serving.iterdir()) == ["CURRENT"]  # no lock file was created


def test_history_says_when_why_and_what_started_each_switch(tmp_path, saved_checkpoint, capsys):
    from podium.serving.layout import seal_version, switch_current
    from podium.serving.staging import stage_version

    serving = str(tmp_path / "serving")
    versions = []
    for step in (7, 9):
        version = stage_version(serving, saved_checkpoint.directory, {"step": step, "run_name": "r1",
                                                                      "metric": "val_loss", "value": 0.25})
        seal_version(serving, version)
        switch_current(serving, version, f"step {step} is better", origin={
            "flow": "train-validate-promote", "flow_run": "r1-run", "user": "ana", "host": "gpu1", "pid": 7})
        versions.append(version)
    switch_current(serving, versions[0], "rollback from v000002: bad answers", action="rollback",
                   withdrawn="v000002", origin={"command": "podium rollback", "user": "ops", "host": "h", "pid": 9})
    assert main(["history", "--serving", serving]) == 0
    out = capsys.readouterr().out
    assert "3 switch(es), current v000001" in out
    assert re.search(r"UTC  promote  v000002  run r1 step 9, val_loss=0.2500  \[withdrawn\]", out)
    # v000001 appears twice: promoted, then rolled back to; only the rollback made it current
    assert re.search(r"UTC  promote  v000001  run r1 step 7, val_loss=0.2500\n", out), out
    assert re.search(r"UTC  rollback v000001  run r1 step 7, val_loss=0.2500; withdrew v000002  \[current\]", out)
    assert "why: rollback from v000002: bad answers" in out
    assert "by:  flow run r1-run (train-validate-promote), ana@gpu1 pid 7" in out
    assert "by:  podium rollback, ops@h pid 9" in out
    assert main(["history", "--serving", serving, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["current"], doc["withdrawn"], len(doc["switches"])) == ("v000001", ["v000002"], 3)
    assert doc["current_switch"] == 2
def test_a_loops_config_from_a_file_and_key_value_flags(tmp_path):
    (tmp_path / "loop.toml").write_text('num_epochs = 3\nname = "a"\n[nested]\nx = 1\n')
    (tmp_path / "run.json").write_text(json.dumps({"training": {"train_loop_config": {"num_epochs": 9, "lr": 0.5}}}))
    config = config_for(["run", "--config", str(tmp_path / "run.json"), "--loop-config-file", str(tmp_path / "loop.toml"),
                         "--loop-config", "name=b", "--loop-config", "sizes=[1, 2]", "--loop-config", 'label="4"',
                         "--loop-dataset", "validation_dataset=/data/val.parquet"], tmp_path)
    assert config.training.train_loop_config == {"num_epochs": 3, "lr": 0.5, "name": "b", "nested": {"x": 1},
                                                 "sizes": [1, 2], "label": "4"}
    assert config.training.loop_datasets == {"validation_dataset": "/data/val.parquet"}


def test_a_loop_config_flag_without_a_key_names_the_flag(tmp_path):
    with pytest.raises(ConfigError, match="--loop-config = '=3': expected KEY=VALUE"):
        config_for(["run", "--loop-config", "=3"], tmp_path)
    with pytest.raises(ConfigError, match="--loop-config-file = .*no such file"):
        config_for(["run", "--loop-config-file", str(tmp_path / "missing.json")], tmp_path)


def test_demo_data_fills_only_what_a_builtin_needs(tmp_path):
    own = config_for(["run", "--train-loop", "mypkg.train:loop", "--validate-fn", "mypkg.train:validate"], tmp_path)
    assert (own.data.train, own.data.val) == ("", "")
    assert config_for(["run", "--train-loop", "mypkg.train:loop"], tmp_path).data.val.endswith("val.parquet")


@pytest.mark.parametrize("signum, raised", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, SystemExit)])
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")  # the swallowed exception, printed
def test_a_start_up_signal_a_library_swallowed_still_stops_the_command_or_its_run(signum, raised):
    """Ctrl-C or SIGTERM while a command starts raises where it lands; Python ignores an exception raised in a
    `__del__` or an extension module's import ('Exception ignored in ...', seen under load), as some libraries' code
    ignores every exception. The signal is kept, without that traceback: the command stops before its run starts, or
    the run stops as soon as its own handler is installed."""
    from podium.cli import signals
    from podium.errors import RunStopped
    from podium.flows import stop
    from podium.flows.stop import SIGNALS

    class Finalizer:  # the signal is handled in the main thread at the next instruction: here, inside __del__
        def __del__(self):
            os.kill(os.getpid(), signum)
            time.sleep(0.01)

    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    hook, mask = sys.unraisablehook, None
    try:
        # as a command started from a terminal or a scheduler has them (an earlier test of this process may have
        # left a signal ignored or blocked, which the handler respects)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
        signals.stop_before_the_run()
        finalizer = Finalizer()
        del finalizer  # swallowed: the command went on
        assert signals.start_up_signal() == signum  # main() reads it where the exception came back wrapped
        with pytest.raises(raised) as exc_info:
            signals.stop_if_signalled()
        if raised is SystemExit:
            assert exc_info.value.code == 143
        with stop.stop_on_signals() as request:  # a run whose start swallowed it: asked to stop at once
            assert request.signum == signum
            with pytest.raises(RunStopped):
                request.check()
        signals.stop_before_the_run()  # the next command in this process starts with nothing pending
        signals.stop_if_signalled()
    finally:
        signals.end_command()  # no command state left for the next flow run of this process (test_outages')
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        sys.unraisablehook = hook
        for sig, handler in previous.items():
            signal.signal(sig, handler)


STUCK_COMMAND = """
import os, signal, sys, threading
from podium.cli import signals
marker = sys.argv[1]
signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal starts a command (pytest's may differ)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
signals.stop_before_the_run(on_stuck=lambda: open(marker, "w").write("stopped"), stuck_after_s=1.0)
try:  # swallowed where it landed, as library code that catches everything does
    os.kill(os.getpid(), int(sys.argv[2]))
    threading.Event().wait(0.5)
except BaseException:
    pass
threading.Event().wait()  # then blocked, as on a lock the interrupted code held
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_command_stuck_after_a_start_up_signal_ends_at_once_with_the_signal_s_exit(tmp_path, signum):
    """A start-up signal whose exception a library swallowed, after which the command blocks (it never reaches its
    run, where the kept signal would stop it: seen once in CI, a `podium run` that went on for minutes after Ctrl-C
    while its servers started): the watchdog stops what was still starting, says one line and exits 128 + the
    signal, in a process of its own (it ends that process)."""
    marker = tmp_path / "on-stuck"
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", STUCK_COMMAND, str(marker), str(int(signum))], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 128 + signum, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"podium: stopped by {signal.Signals(signum).name}"), proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert marker.read_text() == "stopped"
    assert time.monotonic() - began < 30


def test_a_run_that_ended_hands_its_result_back_inside_the_error_that_followed_it():
    """The flow's end raised EndNotRecorded (the Prefect server did not answer), and Prefect's engine, recording that
    in turn, failed with a client error raised `from` its transport's: the command still finds the run's result."""
    from podium.errors import EXIT_FAILED, EndNotRecorded, UnfinishedRun
    from podium.flows.summary import RunResult, result_of

    result = RunResult.model_construct(summary=None, shortfall="every validation failed")
    assert result.exit_code == EXIT_FAILED

    def engine_records_the_failure() -> None:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except ConnectionRefusedError as transport:
            raise RuntimeError("the client gave up") from transport

    try:
        try:
            raise EndNotRecorded("run r: promoted v000001; the Prefect server did not answer", result)
        except EndNotRecorded:
            engine_records_the_failure()
    except RuntimeError as engine_error:
        assert result_of(engine_error) is result
    assert result_of(UnfinishedRun("run r failed", result)) is result
    assert result_of(RuntimeError("before the run's end")) is None
