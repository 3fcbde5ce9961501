"""The shadow stage (`promotion.rollout = "shadow"`) through the real commands: one `podium serve` for the module
serves the champion while `podium promote` of a better run puts its candidate in shadow; a thread of the test is
the live traffic. No training: the runs' checkpoints are made and validated without Ray Train
(tests/helpers/checkpoints.make_trained_run), and served as MLflow models through the nightly model's loader
(podium_nightly_code.load_linear).

  champion     the first promotion of the location: nothing to shadow, it is direct
  broken       a better run whose model answers NaN on a value training never saw (f1 = -50): live requests that
               carry it make the candidate fail, so it is refused with its error rate; the champion keeps serving
  better       a better run that answers like a champion: promoted after its shadow, the comparison recorded
  best         better still: SIGTERM during its shadow withdraws it; a rollback during its shadow refuses it
               (the champion changed); SIGKILL during its shadow leaves the shadow to the next command, which
               ends it, and whose own shadow, with no live traffic, ends at its deadline and refuses it
               (promotion.shadow.on_no_traffic's default); then, with approval required too, it passes its
               shadow, waits for a person, and `podium approve` promotes it
After each step that changes what serves, what serves is what the registry names and what the history says.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from helpers.checkpoints import make_trained_run, nightly_home, promote_in_process
from helpers.commands import podium, podium_in_process
from helpers.live import stop_podium
from helpers.servers import free_port, wait_http_ok
from podium_nightly_code import FEATURES

from podium.serving.layout import read_history

pytestmark = pytest.mark.integration

MODEL = "shadow-model"
# quality by run (see podium_nightly_code): the smaller the angle, the better; `broken` answers NaN below f1 = -8
RUNS = {"champion": {"angle_deg": 40.0}, "broken": {"angle_deg": 20.0, "nan_below": -8.0},
        "better": {"angle_deg": 10.0}, "best": {"angle_deg": 5.0}}


def _config(root: Path, run: str) -> Path:
    """A run's config: shadowed promotion, bounded (a few requests, a few seconds); limits a test can rely on: no
    latency limit to speak of (no test asserts a timing), agreement on labels of two different models."""
    config = {"run_name": run, "model": MODEL, "storage": str(root / "storage"), "serving": str(root / "serving"),
              "data": {"train": str(root / "train.parquet"), "val": str(root / "val.parquet"),
                       "feature_columns": list(FEATURES)},
              "training": {"train_loop": "podium_nightly_code:train_func",
                           "train_loop_config": {"epochs": 2, **RUNS[run]}},
              "scaling": {"num_workers": 1}, "validation": {"fn": "podium_nightly_code:validate_fn"},
              "promotion": {"metric": "accuracy", "mode": "max", "verify": "hashes",
                            "model_loader": "podium_nightly_code:load_linear", "rollout": "shadow",
                            "shadow": {"requests": 8, "duration_s": 60, "max_error_rate": 0.0,
                                       "max_latency_p95_ratio": 1000.0, "min_agreement": 0.5}}}
    path = root / f"{run}.json"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def world(prefect_api, shared_ray, tmp_path_factory, mlflow_template_db):
    """The module's podium home and MLflow store, its three runs made without training, and the first one promoted
    (direct: there is no champion to shadow yet)."""
    root = tmp_path_factory.mktemp("shadow")
    env = nightly_home(root, mlflow_template_db, prefect_api, shared_ray.driver_env())
    for run in RUNS:
        made = make_trained_run(json.loads(_config(root, run).read_text()), env["MLFLOW_TRACKING_URI"])
        assert [r.status for r in made.records] == ["validated", "validated"], made.records
    # in this process (the module's commands are the later promotions): nothing to compare with, promoted directly
    first = promote_in_process(json.loads(_config(root, "champion").read_text()), env)
    assert first.promotion.promoted and first.promotion.shadow is None, first.promotion
    return root, env


@pytest.fixture(scope="module")
def server(world):
    """One `podium serve` of the location for the module, on a Ray of its own, in its own process group."""
    root, env = world
    port, log = free_port(), root / "serve.log"
    serve_env = {k: v for k, v in env.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    proc = subprocess.Popen([sys.executable, "-m", "podium.cli", "serve", "--serving", str(root / "serving"),
                             "--port", str(port), "--poll-s", "0.5", "--num-cpus", "0"], env=serve_env,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(f"{url}/health", proc, log, timeout_s=300)
        yield url
    finally:
        stop_podium(proc)  # to podium serve alone: it shuts Serve and its Ray down
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _body(unseen: bool, probabilities: bool) -> bytes:
    """Three rows of the features as a client sends them; `unseen`: one with f1 = -50, a value training never saw."""
    rows = [[0.5, 0.2, -0.1, 1.0], [-1.2, 0.4, 0.3, -0.5], [0.1, -50.0 if unseen else -0.7, 0.0, 0.2]]
    body: dict = {"dataframe_split": {"columns": list(FEATURES), "data": rows}}
    if probabilities:
        body["params"] = {"probabilities": True}
    return json.dumps(body).encode()


class Traffic:
    """Live requests from a thread, until stopped: which version answered each (the X-Podium-Version header)."""

    def __init__(self, url: str, bodies: list[bytes]):
        self.url, self.bodies = url, bodies
        self.answered: Counter[tuple[int, str | None]] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._send, daemon=True)

    def _send(self) -> None:
        i = 0
        while not self._stop.is_set():
            request = urllib.request.Request(f"{self.url}/invocations", data=self.bodies[i % len(self.bodies)],
                                             headers={"Content-Type": "application/json"}, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=30) as r:
                    self.answered[(r.status, r.headers.get("X-Podium-Version"))] += 1
            except urllib.error.HTTPError as exc:
                self.answered[(exc.code, exc.headers.get("X-Podium-Version"))] += 1
            except OSError:
                self.answered[(0, None)] += 1
            i += 1
            self._stop.wait(0.05)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def _serving(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/health", timeout=10) as r:
        return json.loads(r.read())


def _replica_shows(url: str, key: str, value: object) -> dict:
    """What the replica says once its `key` is `value`, or after a minute (it follows CURRENT and SHADOW at its
    next poll)."""
    deadline = time.monotonic() + 60
    while (said := _serving(url))[key] != value and time.monotonic() < deadline:
        time.sleep(0.5)
    return said


def _current(root: Path) -> str:
    return json.loads((root / "serving" / "CURRENT").read_text())["version"]


def _registered(env: dict, version: str) -> tuple[str, dict[str, str]]:
    """The registered version of a serving version, and its tags."""
    from podium.tracking.client import tracking_client

    client = tracking_client(env["MLFLOW_TRACKING_URI"])
    [found] = [v for v in client.search_model_versions(f"name='{MODEL}'")
               if v.tags.get("podium.serving_version") == version]
    return found.version, dict(found.tags)


def _alias(env: dict, alias: str) -> str | None:
    from podium.tracking.client import tracking_client

    try:
        return tracking_client(env["MLFLOW_TRACKING_URI"]).get_model_version_by_alias(MODEL, alias).version
    except Exception:
        return None


def _artifact(key: str) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as c:
        found = c.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    assert found, f"no artifact {key}"
    return str(found[-1].data)


def test_a_candidate_failing_on_live_inputs_is_refused_with_its_error_rate_and_the_champion_keeps_serving(
        world, server):
    root, env = world
    champion = _current(root)
    champion_registered = _alias(env, "champion")
    with Traffic(server, [_body(unseen=True, probabilities=True), _body(unseen=False, probabilities=True)]) as live:
        out = json.loads(podium(["promote", "--json", "--config", str(_config(root, "broken"))], env).stdout)
    assert out["promoted"] is None and "refused by its shadow" in out["promotion_reason"], out["promotion_reason"]
    shadow = out["shadow"]
    assert not shadow["passed"] and shadow["requests"] >= 8 and 0 < shadow["errors"] < shadow["requests"]
    assert "error rate" in shadow["reason"] and "NaN" in shadow["reason"], shadow["reason"]
    # every live request was answered by the champion, during the shadow and after
    assert set(live.answered) == {(200, champion)}, live.answered
    assert _serving(server)["version"] == champion and _current(root) == champion
    assert not (root / "serving" / "SHADOW").exists()
    # the registry: the champion alias did not move, the candidate is tagged with its refusal, no challenger left
    assert _alias(env, "champion") == champion_registered and _alias(env, "challenger") is None
    candidate = shadow_candidate_version(root)
    assert (root / "serving" / "versions" / candidate / "DISCARDED.json").exists()
    _, tags = _registered(env, candidate)
    assert tags["podium.shadow"] == "refused" and float(tags["podium.shadow.error_rate"]) > 0
    # what `podium status` and `podium history` say (read in this process: their processes are test_cli_process's)
    status = json.loads(podium_in_process(["status", "--json", "--config", str(_config(root, "broken"))], env).stdout)
    assert "refused by its shadow" in status["promotion_reason"] and status["champion"]["version"] == champion
    history = json.loads(podium_in_process(["history", "--json", "--serving", str(root / "serving")], env).stdout)
    assert history["current"] == champion and all(s["version"] != candidate for s in history["switches"])
    assert "Refused" in _artifact("broken-shadow")


def shadow_candidate_version(root: Path) -> str:
    """The newest version number taken at the location (the candidate the last promotion staged)."""
    return sorted(p.name for p in (root / "serving" / "versions").iterdir())[-1]


def test_a_good_candidate_is_promoted_after_its_shadow_with_the_comparison_recorded(world, server):
    root, env = world
    before = _current(root)
    with Traffic(server, [_body(unseen=False, probabilities=False), _body(unseen=True, probabilities=False)]):
        out = json.loads(podium(["promote", "--json", "--config", str(_config(root, "better"))], env).stdout)
    promoted = out["promoted"]
    assert promoted and "passed its shadow" in out["promotion_reason"], out["promotion_reason"]
    shadow = out["shadow"]
    assert shadow["passed"] and shadow["requests"] >= 8 and shadow["errors"] == 0 and shadow["agreement"] >= 0.5
    assert _current(root) == promoted["version"] != before
    assert _replica_shows(server, "version", promoted["version"])["version"] == promoted["version"]
    registered, tags = _registered(env, promoted["version"])
    assert _alias(env, "champion") == registered and _alias(env, "challenger") is None
    assert tags["podium.shadow"] == "passed" and int(tags["podium.shadow.requests"]) == shadow["requests"]
    last = read_history(str(root / "serving"))[-1]
    assert last["version"] == promoted["version"] and last["origin"]["shadow"]["requests"] == shadow["requests"]
    manifest = json.loads((root / "serving" / "versions" / promoted["version"] / "MANIFEST.json").read_text())
    assert manifest["shadow"]["passed"] is True
    assert "Passed" in _artifact("better-shadow")


def test_a_promotion_stopped_during_its_shadow_withdraws_the_candidate(world, server):
    root, env = world
    champion = _current(root)
    proc = subprocess.Popen([sys.executable, "-m", "podium.cli", "promote", "--json", "--config",
                             str(_config(root, "best"))], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    pointer = root / "serving" / "SHADOW"
    deadline = time.monotonic() + 300
    while not pointer.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pointer.exists(), proc.communicate(timeout=60)
    candidate = json.loads(pointer.read_text())["version"]
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM and "nothing was promoted" in err, err[-3000:]
    assert not pointer.exists() and _current(root) == champion
    assert (root / "serving" / "versions" / candidate / "DISCARDED.json").exists()
    _, tags = _registered(env, candidate)
    assert tags["podium.approval"] == "withdrawn" and _alias(env, "challenger") is None
    assert tags["podium.shadow"] == "stopped", tags  # nothing refused it
    said = _replica_shows(server, "shadow", None)
    assert said["shadow"] is None and said["version"] == champion


def _check_one_champion(root: Path, env: dict, url: str) -> str:
    """What serves is what the registry names and what the history says: CURRENT, the replica's version (once
    it followed CURRENT), the champion alias's registered version, and the history's current switch."""
    current = _current(root)
    assert _replica_shows(url, "version", current)["version"] == current
    registered, _ = _registered(env, current)
    assert _alias(env, "champion") == registered and _alias(env, "challenger") is None
    # the history as `podium history` reads it (the command runs in the refusal's test: a process less each)
    last = read_history(str(root / "serving"))[-1]
    assert last["version"] == current, last
    return current


def _promote_until_shadowed(root: Path, env: dict, *args: str) -> tuple[subprocess.Popen, str]:
    """`podium promote` of run `best` in the background, once its candidate is in shadow: the process and the
    candidate's version."""
    proc = subprocess.Popen([sys.executable, "-m", "podium.cli", "promote", "--json", "--config",
                             str(_config(root, "best")), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    pointer = root / "serving" / "SHADOW"
    deadline = time.monotonic() + 300
    while not pointer.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if not pointer.exists():
        proc.kill()
        raise AssertionError(proc.communicate(timeout=60))
    return proc, json.loads(pointer.read_text())["version"]


def test_a_rollback_during_a_shadow_ends_it_and_what_serves_is_what_the_rollback_restored(world, server):
    """The team rolls back while a candidate is in shadow (no live traffic: it would wait its 60 s): the shadow
    ends at the promotion's next read, the candidate is refused (it was compared with another champion), and the
    rolled-back champion serves, named by the registry and the history."""
    root, env = world
    before = _check_one_champion(root, env, server)
    proc, candidate = _promote_until_shadowed(root, env)
    # the rollback in this process (its own process: test_cli_process's, test_promotion_state's)
    rolled = json.loads(podium_in_process(["rollback", "--json", "--serving", str(root / "serving"), "--model", MODEL,
                                           "--reason", "a complaint about the new champion"], env).stdout)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    outcome = json.loads(out.strip().splitlines()[-1])
    assert outcome["promoted"] is None and "the champion changed during its shadow" in outcome["promotion_reason"], \
        outcome["promotion_reason"]
    assert f"{before} -> {rolled['to_version']}" in outcome["promotion_reason"], (rolled, outcome)
    assert not (root / "serving" / "SHADOW").exists()
    assert (root / "serving" / "versions" / candidate / "DISCARDED.json").exists()
    assert _check_one_champion(root, env, server) == rolled["to_version"] != before
    assert _serving(server)["shadow"] is None


def test_a_promotion_killed_during_its_shadow_is_ended_by_the_next_command_whose_shadow_no_request_reaches(
        world, server):
    """SIGKILL during a shadow (no handler runs): the SHADOW pointer and the staged copy stay behind, and the champion
    keeps serving. The next `podium promote` of the location ends that shadow and withdraws its candidate before it
    stages its own, and one champion is named everywhere. That promotion's shadow is one no live request reaches:
    it refuses its candidate at its (short) deadline, as promotion.shadow.on_no_traffic's default says."""
    root, env = world
    champion = _check_one_champion(root, env, server)
    proc, orphan = _promote_until_shadowed(root, env)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert json.loads((root / "serving" / "SHADOW").read_text())["version"] == orphan  # left behind
    assert _current(root) == champion and _serving(server)["version"] == champion
    after = podium(["promote", "--json", "--config", str(_config(root, "best")), "--shadow-duration", "3"], env)
    assert f"ended the shadow of {orphan}" in after.stderr, after.stderr[-3000:]
    outcome = json.loads(after.stdout.strip().splitlines()[-1])
    assert outcome["promoted"] is None and outcome["shadow"]["requests"] == 0, outcome
    assert "no live request reached the shadow" in outcome["promotion_reason"]
    assert "on_no_traffic = refuse" in outcome["promotion_reason"]
    assert (root / "serving" / "versions" / orphan / "DISCARDED.json").exists()
    assert not (root / "serving" / "SHADOW").exists()
    assert _check_one_champion(root, env, server) == champion


def test_a_candidate_that_passed_its_shadow_waits_for_approval_and_an_approval_promotes_it(world, server):
    """Shadow and approval together: the shadow comes first; a candidate it passes waits for a person, with the
    shadow's numbers on the form; `podium approve` then promotes it, and everything names it."""
    from podium.prefect_api import paused_flow_run

    root, env = world
    champion = _current(root)
    with Traffic(server, [_body(unseen=False, probabilities=False)]) as live:
        proc, candidate = _promote_until_shadowed(root, env, "--approval", "required")
        deadline = time.monotonic() + 300
        while True:
            try:
                paused_flow_run("best")
                break
            except LookupError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=60)
                time.sleep(1)
    assert set(live.answered) == {(200, champion)}, live.answered  # the champion answered throughout
    assert _current(root) == champion
    said = _replica_shows(server, "shadow", None)  # the shadow ended when it had its requests
    assert said["shadow"] is None and said["version"] == champion
    # the approval in this process (its own process: test_promotion_state's, test_champion_files')
    podium_in_process(["approve", "--run-name", "best", "--reason", "the shadow agreed", "--by", "ana"], env)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    outcome = json.loads(out.strip().splitlines()[-1])
    assert outcome["promoted"]["version"] == candidate and outcome["shadow"]["passed"], outcome
    assert "passed its shadow" in outcome["promotion_reason"] and "approved by ana" in outcome["promotion_reason"]
    assert _check_one_champion(root, env, server) == candidate
    last = read_history(str(root / "serving"))[-1]
    origin = last["origin"]
    assert origin["approval"]["by"] == "ana (podium approve)" and origin["shadow"]["passed"] is True, origin
