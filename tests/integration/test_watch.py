"""The watch after the switch (`[promotion.watch]`) through the real commands: one `podium serve` for the module
serves the champion while `podium promote` of a better run switches it in and watches it on live traffic; threads
of the test are the clients. No training: the runs' checkpoints are made and validated without Ray Train
(tests/helpers/checkpoints.make_trained_run).

  champion   the first promotion of the location: nothing to watch against, it is final at its switch
  failing    better, but its model raises on a value training never saw (f1 = -50; podium_nightly_code's
             FailingLinear): the live requests that carry it fail, so its watch rolls it back on its own, and no
             request the champion answered fails
  good       better still, answers like a champion: final after its watch
  failing2   better still, failing as `failing`: its promoter is killed (SIGKILL) during its watch; the replicas go on
             counting its errors, and the next command rolls it back
  best       better still, with a shadow rollout too: it passes its shadow, then its watch, and is final
  stop-int   better still: SIGINT to its promoter during its watch (past the point of no return): the promotion
  stop-term  stands, exit 0, the watch `stopped`; and SIGTERM, a pod's or a scheduler's stop, the same
After each of them, CURRENT, `podium serve`, the `@champion` alias and the history name one champion.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.checkpoints import make_trained_run, nightly_home
from helpers.commands import podium, podium_in_process
from helpers.live import Answer, call, serving
from helpers.prefect_queries import flow_run_state
from podium_nightly_code import FEATURES

from podium.serving.layout import read_history

pytestmark = pytest.mark.integration

MODEL = "watch-model"
# the smaller the angle, the better the run (see podium_nightly_code); FailingLinear raises below f1 = -8
RUNS = {"champion": ({"angle_deg": 40.0}, "load_linear"),
        "failing": ({"angle_deg": 20.0, "fail_below": -8.0}, "load_failing"),
        "good": ({"angle_deg": 10.0}, "load_linear"),
        "failing2": ({"angle_deg": 5.0, "fail_below": -8.0}, "load_failing"),
        "best": ({"angle_deg": 2.5}, "load_linear"),
        "stop-int": ({"angle_deg": 1.5}, "load_linear"),
        "stop-term": ({"angle_deg": 1.0}, "load_linear")}
WATCH = {"duration_s": 90, "min_requests": 10, "max_error_rate_increase": 0.0,
         "max_latency_p95_ratio": 1000.0}  # no latency limit to speak of: no test asserts a timing


def _config(root: Path, run: str, shadowed: bool = False, **watch: float) -> Path:
    loop, loader = RUNS[run]
    config = {"run_name": run, "model": MODEL, "storage": str(root / "storage"), "serving": str(root / "serving"),
              "data": {"train": str(root / "train.parquet"), "val": str(root / "val.parquet"),
                       "feature_columns": list(FEATURES)},
              "training": {"train_loop": "podium_nightly_code:train_func",
                           "train_loop_config": {"epochs": 2, **loop}},
              "scaling": {"num_workers": 1}, "validation": {"fn": "podium_nightly_code:validate_fn"},
              "promotion": {"metric": "accuracy", "mode": "max", "verify": "hashes",
                            "model_loader": f"podium_nightly_code:{loader}", "watch": {**WATCH, **watch}}}
    if shadowed:
        config["promotion"].update(rollout="shadow", shadow={"requests": 8, "duration_s": 60, "min_agreement": 0.5,
                                                             "max_latency_p95_ratio": 1000.0})
    path = root / f"{run}-{len(watch)}-{shadowed}.json"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def world(prefect_api, shared_ray, tmp_path_factory, mlflow_template_db):
    """The module's podium home and MLflow store, its runs made without training, the first one promoted."""
    root = tmp_path_factory.mktemp("watch")
    env = nightly_home(root, mlflow_template_db, prefect_api, shared_ray.driver_env())
    for run in RUNS:
        made = make_trained_run(json.loads(_config(root, run).read_text()), env["MLFLOW_TRACKING_URI"])
        assert [r.status for r in made.records] == ["validated", "validated"], made.records
    first = json.loads(podium(["promote", "--json", "--config", str(_config(root, "champion"))], env).stdout)
    assert first["promoted"] and first["watch"] is None, first  # nothing to compare with: final at its switch
    return root, env


@pytest.fixture(scope="module")
def server(world):
    """One `podium serve` of the location for the module, on a Ray of its own."""
    root, env = world
    serve_env = {k: v for k, v in env.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    with serving(str(root / "serving"), serve_env, "--num-cpus", "0") as served:
        yield served.url


def _body(unseen: bool) -> bytes:
    """Two rows as a client sends them; `unseen`: one with f1 = -50, which the failing runs' models raise on."""
    rows = [[0.5, 0.2, -0.1, 1.0], [0.1, -50.0 if unseen else -0.7, 0.0, 0.2]]
    return json.dumps({"dataframe_split": {"columns": list(FEATURES), "data": rows}}).encode()


BAD_REQUEST = json.dumps({"dataframe_split": {"columns": ["nope"], "data": [["x"]]}}).encode()


class Clients:
    """Live requests from a thread, half of them carrying the unseen value, until stopped; every answer kept.
    `bad`: every third request is a client's bad request instead (columns the model does not have: a 4xx)."""

    def __init__(self, url: str, bad: bool = False):
        self.url, self.answers, self.bad = url, [], bad  # type: ignore[var-annotated]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._send, daemon=True)

    def _send(self) -> None:
        i = 0
        while not self._stop.is_set():
            body = BAD_REQUEST if self.bad and i % 3 == 0 else _body(unseen=i % 2 == 0)
            self.answers.append(call(f"{self.url}/invocations", body))
            i += 1
            self._stop.wait(0.02)

    def __enter__(self) -> Clients:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def failed(self, version: str | None) -> list[Answer]:
        return [a for a in list(self.answers) if a.version == version and a.status != 200]

    def by(self, version: str | None) -> list[Answer]:
        return [a for a in list(self.answers) if a.version == version]


def _current(root: Path) -> str:
    return json.loads((root / "serving" / "CURRENT").read_text())["version"]


def _health(url: str) -> dict:
    return json.loads(call(f"{url}/health").body)


def _registered(env: dict, version: str) -> tuple[str, dict[str, str]]:
    from podium.tracking.client import tracking_client

    client = tracking_client(env["MLFLOW_TRACKING_URI"])
    [found] = [v for v in client.search_model_versions(f"name='{MODEL}'")
               if v.tags.get("podium.serving_version") == version]
    return found.version, dict(found.tags)


def _alias(env: dict) -> str | None:
    from podium.tracking.client import tracking_client

    return tracking_client(env["MLFLOW_TRACKING_URI"]).get_model_version_by_alias(MODEL, "champion").version


def _one_champion(root: Path, env: dict, url: str) -> str:
    """CURRENT, the replica (once it followed CURRENT), `@champion` and the history name one version."""
    current = _current(root)
    deadline = time.monotonic() + 60
    while _health(url)["version"] != current and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _health(url)["version"] == current
    assert _alias(env) == _registered(env, current)[0]
    # the history as `podium history` reads it (the command itself runs once, in the first test: a process less each)
    last = read_history(str(root / "serving"))[-1]
    assert last["version"] == current, last
    return current


def _watch_event(reason_part: str):
    """The `podium.serving.rolled-back` event whose reason says `reason_part`."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter

    deadline = time.monotonic() + 30
    while True:
        with get_client(sync_client=True) as c:
            page = c.read_events(filter=EventFilter(event=EventNameFilter(name=["podium.serving.rolled-back"])),
                                 limit=50)
        found = [e for e in page.events if reason_part in str(e.payload.get("reason"))]
        if found or time.monotonic() > deadline:
            assert found, [e.payload for e in page.events]
            return found[0]
        time.sleep(1)


def test_a_champion_failing_on_live_traffic_is_rolled_back_within_its_watch_and_none_of_the_old_ones_fails(
        world, server):
    root, env = world
    champion = _one_champion(root, env, server)
    with Clients(server) as live:
        out = json.loads(podium(["promote", "--json", "--config", str(_config(root, "failing"))], env).stdout)
        time.sleep(2)  # answers after the rollback, from the champion again
    new = out["promoted"]["version"]
    watch = out["watch"]
    assert watch["state"] == "rolled-back", watch
    assert "rolled back by its watch" in out["promotion_reason"] and "error rate" in watch["reason"], watch["reason"]
    assert watch["requests"] >= 10 and 0 < watch["errors"] < watch["requests"], watch
    # no request the champion answered failed, before, between or after; the new one's failures were its own
    assert live.by(champion) and not live.failed(champion), live.failed(champion)[:3]
    failed = live.failed(new)
    # the model's failure is the server's (500), not the client's (MLflow's own server answers it 400)
    assert failed and {a.status for a in failed} == {500}, {a.status for a in failed}
    back = [a for a in live.by(champion) if a.sent > failed[0].sent]
    print(f"\nwatch: {new} answered {len(live.by(new))} request(s), {len(failed)} failed; rolled back after "
          f"{watch['seconds']:.1f} s of watch; the champion answered again "
          f"{min(a.answered for a in back) - failed[0].answered:.1f} s after the first failure")
    # every store says the champion serves again, and why the new one left
    assert _one_champion(root, env, server) == champion
    registered, tags = _registered(env, new)
    assert tags["podium.watch"] == "rolled-back" and "error rate" in tags["podium.watch.reason"], tags
    assert "rolled back by its watch" in tags["podium.withdrawn"], tags
    switches = json.loads(podium(["history", "--json", "--serving", str(root / "serving")], env).stdout)["switches"]
    last = switches[-1]
    assert last["action"] == "rollback" and "rolled back by its watch" in last["reason"], last
    # the promotion's flow run ends saying so
    promoted = next(s for s in reversed(switches) if s["version"] == new)
    state = flow_run_state(run_id=promoted["origin"]["flow_run_id"])
    assert state.is_completed() and "rolled back by its watch" in str(state.message), state
    assert not (root / "serving" / "WATCH").exists()
    event = _watch_event("rolled back by its watch")
    assert event.payload["from_version"] == new and event.payload["to_version"] == champion, event.payload


def test_a_champion_that_passes_its_watch_is_final_and_says_so(world, server):
    root, env = world
    """Clients send bad requests too (a 4xx each): the client's error, not counted against the new champion."""
    before = _one_champion(root, env, server)
    with Clients(server, bad=True) as live:
        out = json.loads(podium(["promote", "--json", "--config", str(_config(root, "good", duration_s=8))],
                                env).stdout)
    new = out["promoted"]["version"]
    watch = out["watch"]
    assert watch["state"] == "passed" and "final after its watch" in out["promotion_reason"], out
    assert watch["errors"] == 0 and watch["client_errors"] > 0 and watch["warmup"] > 0, watch
    assert "bad request(s) from clients (4xx, not counted)" in watch["reason"], watch["reason"]
    assert {a.status for a in live.answers if a.status != 200} == {400}, {a.status for a in live.answers}
    assert not [a for a in live.failed(before) + live.failed(new) if a.status != 400]
    assert _one_champion(root, env, server) == new != before
    _, tags = _registered(env, new)
    assert tags["podium.watch"] == "passed" and "podium.withdrawn" not in tags, tags
    assert not (root / "serving" / "WATCH").exists()


def test_a_promoter_killed_during_its_watch_is_settled_by_the_next_command(world, server):
    """SIGKILL during the watch (no handler runs): the WATCH pointer stays, the replicas go on counting the new
    champion's answers, and the next `podium promote` settles the watch on them: rolled back."""
    root, env = world
    before = _one_champion(root, env, server)
    config = _config(root, "failing2")
    proc = subprocess.Popen([sys.executable, "-m", "podium.cli", "promote", "--json", "--config", str(config)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    pointer = root / "serving" / "WATCH"
    deadline = time.monotonic() + 300
    while not pointer.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pointer.exists(), proc.communicate(timeout=60)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    watched = json.loads(pointer.read_text())
    new = watched["version"]
    assert _current(root) == new and watched["previous"] == before
    status = json.loads(podium_in_process(["status", "--json", "--config", str(config)], env).stdout)
    assert any("watched by a command that is gone" in d for d in status["disagreements"]), status["disagreements"]
    with Clients(server) as live:  # the replicas count its answers for the watch nobody reads now
        tallies = root / "serving" / "watch" / watched["watch_id"]
        deadline = time.monotonic() + 120
        while (sum(json.loads(p.read_text())["champion_counts"].get("requests", 0) for p in tallies.glob("*.json"))
               < 20 and time.monotonic() < deadline):
            time.sleep(0.5)
        after = podium(["promote", "--json", "--config", str(config)], env)
        time.sleep(2)
    assert "its promoter ended during its watch" in after.stderr, after.stderr[-3000:]
    assert not pointer.exists()
    assert not live.failed(before), live.failed(before)[:3]
    assert _one_champion(root, env, server) == before
    _, tags = _registered(env, new)
    assert tags["podium.watch"] == "rolled-back" and "settled by the next command" in tags["podium.watch.reason"]
    outcome = json.loads(after.stdout.strip().splitlines()[-1])
    assert outcome["promoted"] is None, outcome  # its checkpoint was withdrawn by the rollback
    # `podium status` of the killed promoter's run says what settled its watch, not only its promotion
    settled = json.loads(podium_in_process(["status", "--json", "--config", str(config)], env).stdout)
    assert settled["promoted"]["version"] == new, settled["promoted"]
    assert settled["promoted"]["watch"]["state"] == "rolled-back", settled["promoted"]
    assert "settled by the next command" in settled["promoted"]["watch"]["reason"], settled["promoted"]


def test_a_candidate_that_passed_its_shadow_is_watched_after_its_switch(world, server):
    root, env = world
    before = _one_champion(root, env, server)
    with Clients(server) as live:
        out = json.loads(podium(["promote", "--json", "--config", str(_config(root, "best", True, duration_s=5))],
                                env).stdout)
    new = out["promoted"]["version"]
    assert out["shadow"]["passed"] and out["watch"]["state"] == "passed", out
    reason = out["promotion_reason"]
    assert reason.index("passed its shadow") < reason.index("final after its watch"), reason
    assert not live.failed(before) and not live.failed(new)
    assert _one_champion(root, env, server) == new
    assert _registered(env, new)[1]["podium.watch"] == "passed"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_during_the_watch_ends_it_and_the_promotion_stands(world, server, signum):
    """SIGINT, and SIGTERM (a pod's or a scheduler's stop), to the promoter's process group during the watch: past the
    switch, the point of no return, so the promotion stands (exit 0), the watch ends `stopped` with its pointer gone,
    and `--json`, the flow run, the registry's alias, CURRENT and the replica agree on the new champion."""
    root, env = world
    before = _one_champion(root, env, server)
    run = "stop-int" if signum == signal.SIGINT else "stop-term"
    pointer = root / "serving" / "WATCH"
    with Clients(server) as live:
        # --always-promote: its accuracy may only tie the champion's (both near 1 this close to the truth)
        proc = subprocess.Popen([sys.executable, "-m", "podium.cli", "promote", "--json", "--always-promote",
                                 "--config", str(_config(root, run))], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        deadline = time.monotonic() + 300
        while not pointer.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pointer.exists(), proc.communicate(timeout=60)
        time.sleep(1)  # the new champion answers live requests meanwhile
        os.killpg(proc.pid, signum)
        out, err = proc.communicate(timeout=120)
    name = signal.Signals(signum).name
    assert proc.returncode == 0, (proc.returncode, err[-3000:])
    result = json.loads(out.strip().splitlines()[-1])
    new = result["promoted"]["version"]
    assert result["watch"]["state"] == "stopped" and "the promotion stands" in result["watch"]["reason"], result
    assert result["late_stop"] == f"{name} after the switch: {new} promoted; the run is complete", result["late_stop"]
    assert f"{name} after the switch" in err, err[-3000:]
    assert not pointer.exists()
    assert _one_champion(root, env, server) == new != before
    assert not live.failed(before) and not live.failed(new), (live.failed(before) + live.failed(new))[:3]
    switch = read_history(str(root / "serving"))[-1]
    state = flow_run_state(run_id=switch["origin"]["flow_run_id"])
    assert state.is_completed() and f"{name} after the switch" in str(state.message), state
    _, tags = _registered(env, new)
    assert "podium.withdrawn" not in tags and tags.get("podium.approval") != "pending", tags
    assert tags["podium.watch"] == "stopped" and "the promotion stands" in tags["podium.watch.reason"], tags
