"""`podium serve` through the real commands, on loopback: one `podium serve` process for the module (on the test
process's Ray head, as a team's cluster runs it), live requests in threads while `podium promote` and
`podium rollback` switch the serving location's CURRENT, then what the replica counted per version, on its
/version and in Ray's Prometheus export. No training: the run's checkpoints are made (helpers.checkpoints), and
the nightly model's loader makes every version an MLflow model."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.checkpoints import make_trained_run, nightly_home
from helpers.commands import podium
from helpers.live import Answer, Load, Served, call, predictions, prometheus_samples, serving, stop_podium
from helpers.servers import free_port
from podium_nightly_code import FEATURES

pytestmark = pytest.mark.integration

RUN = "live"
# rows the two checkpoints disagree on (epoch 1 is turned 20 degrees from the true boundary, epoch 0 40 degrees)
ROWS = [[-0.5, 1.0, 0.0, 0.0], [1.0, 0.2, 0.0, 0.0], [-1.0, -0.3, 0.5, 0.0]]
BODY = json.dumps({"dataframe_split": {"columns": FEATURES, "data": ROWS}}).encode()


@pytest.fixture(scope="module")
def live(prefect_api, shared_ray, tmp_path_factory, mlflow_template_db):
    """A module's own podium home and MLflow store, the session's Prefect server and Ray head, and one made run
    (2 checkpoints, epoch 1 the better)."""
    root = tmp_path_factory.mktemp("serve")
    env = nightly_home(root, mlflow_template_db, prefect_api, shared_ray.driver_env())
    made = make_trained_run(json.loads(_config(root).read_text()), env["MLFLOW_TRACKING_URI"])
    assert [r.status for r in made.records] == ["validated", "validated"], made.records
    return root, env


def _config(root: Path, **promotion) -> Path:
    config = {"run_name": RUN, "model": "live", "storage": str(root / "storage"), "serving": str(root / "serving"),
              "data": {"train": str(root / "train.parquet"), "val": str(root / "val.parquet"),
                       "feature_columns": list(FEATURES)},
              "training": {"train_loop": "podium_nightly_code:train_func",
                           "train_loop_config": {"epochs": 2, "angle_deg": 20.0}},
              "scaling": {"num_workers": 1}, "validation": {"fn": "podium_nightly_code:validate_fn"},
              "promotion": {"metric": "accuracy", "mode": "max", "verify": "load",
                            "model_loader": "podium_nightly_code:load_linear", **promotion}}
    path = root / f"config-{abs(hash(json.dumps(promotion, sort_keys=True)))}.json"
    path.write_text(json.dumps(config))
    return path


def _promote(live, *more: str, **promotion) -> dict:
    root, env = live
    proc = subprocess.run([sys.executable, "-m", "podium.cli", "promote", "--json", "--config",
                           str(_config(root, **promotion)), *more], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@dataclass
class Switched:
    """`podium serve` (still running) after live requests across a promotion and a rollback: every answer, the
    first from the promoted version, the first from the rollback's, and when the rollback's command ran."""

    served: Served
    location: str
    answers: list[Answer]
    first_new: Answer
    back: Answer
    rolling_back: float
    rolled_back: float


@pytest.fixture(scope="module")
def switched(live):
    """One `podium serve` of the location for the module, with clients sending requests while v000001 serves,
    while `podium promote` switches to v000002, and while `podium rollback` switches back; it serves on (no
    request any more) until the module's tests are done."""
    root, env = live
    location = str(root / "serving")
    assert _promote(live)["promoted"]["version"] == "v000001"
    with serving(location, env) as served:
        health = json.loads(call(f"{served.url}/health").body)
        assert health["version"] == "v000001" and health["refused"] == {}, health
        assert health["ingress"] == "ray-serve-http-proxy", health  # which ingress answers clients
        with Load(served.url, BODY) as load:
            load.wait_for("v000001", after=0)
            # the other checkpoint, promoted over it: the replica loads it beside v000001, then switches
            promoted = _promote(live, "--always-promote", mode="min")
            assert promoted["promoted"]["version"] == "v000002", promoted
            switched = time.monotonic()
            first_new = load.wait_for("v000002", after=0)
            load.wait_for("v000002", after=switched)
            # a rollback switches back the same way
            rolling_back = time.monotonic()
            rolled = json.loads(podium(["rollback", "--json", "--serving", location, "--model", "live"], env).stdout)
            assert rolled["to_version"] == "v000001", rolled
            rolled_back = time.monotonic()
            back = load.wait_for("v000001", after=rolled_back)
            time.sleep(2)  # answers after the switch back, to see that none comes from v000002 any more
        yield Switched(served, location, load.answers, first_new, back, rolling_back, rolled_back)


def test_requests_across_a_promotion_and_a_rollback_never_fail_and_each_is_answered_by_one_whole_version(
        switched):
    answers, first_new, back = switched.answers, switched.first_new, switched.back
    failed = [a for a in answers if a.status != 200]
    assert not failed, f"{len(failed)} of {len(answers)} requests failed, e.g. {failed[:3]}"
    assert {a.version for a in answers} == {"v000001", "v000002"}, {a.version for a in answers}
    # each answer is its version's own: one version's predictions, never a mix or a half-loaded model's
    by_version = {v: {json.dumps(predictions(a)) for a in answers if a.version == v} for v in ("v000001", "v000002")}
    assert all(len(p) == 1 for p in by_version.values()) and by_version["v000001"] != by_version["v000002"], by_version
    # one replica switches in place: once a version answers, no request sent after that gets the one before
    assert not [a for a in answers if a.sent > first_new.answered and a.answered < switched.rolling_back
                and a.version == "v000001"], "v000001 answered after v000002 had"
    assert not [a for a in answers if a.sent > back.answered and a.version == "v000002"], \
        "v000002 answered after the rollback's v000001 had"
    # the new version answers soon after the command that switched it ends (a poll, a load and a check)
    waited = back.answered - switched.rolled_back
    assert waited < 60, f"the rollback's version answered {waited:.1f} s later"
    said = switched.served.output()
    assert "serving " in said and ": v000002 at http://127.0.0.1:" in said and "NOT switched" not in said, said
    print(f"{len(answers)} requests, 0 failed; the rollback's version answered {waited:.1f} s after the command ended")


def _answered(switched: Switched) -> dict[str, int]:
    """What the clients were answered, by the version that answered."""
    return {v: sum(1 for a in switched.answers if a.version == v) for v in ("v000001", "v000002")}


def test_version_shows_each_version_s_requests_counted_by_the_replica_with_no_errors(switched):
    said = json.loads(call(f"{switched.served.url}/version").body)
    counted = said["this_replica"]["versions"]
    # one replica answered every request: its counts are the clients' own, version by version
    assert {v: c["requests"] for v, c in counted.items()} == _answered(switched), (counted, _answered(switched))
    assert {v: c["errors"] for v, c in counted.items()} == {"v000001": 0, "v000002": 0}, counted
    for version, c in counted.items():
        assert 0 < c["latency_ms"]["p50"] <= c["latency_ms"]["p95"] <= c["latency_ms"]["max"], (version, c)
    assert said["this_replica"]["replica"] and said["this_replica"]["since"] > 0, said["this_replica"]
    print(json.dumps(said["this_replica"]))


def test_ray_s_prometheus_export_counts_each_version_s_requests_and_latency(switched, shared_ray):
    """Ray's metrics agent exports what the replica recorded after its report interval (about 10 s): read each
    node's export until the counts are the clients' own, or a deadline passes."""
    answered, urls = _answered(switched), shared_ray.metrics_urls()
    started = time.monotonic()
    deadline, seen = started + 90, {}
    while True:
        text = ""
        for url in urls:
            try:
                with urllib.request.urlopen(url, timeout=10) as response:
                    text += response.read().decode() + "\n"
            except OSError:
                continue
        ours = {"serving": switched.location}
        seen = {name: _by_version(text, f"ray_podium_serve_{name}", ours)
                for name in ("requests_total", "errors_total", "latency_ms_count")}
        if seen["requests_total"] == answered or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert seen["requests_total"] == answered, (f"Ray's export at {urls} never counted the clients' requests "
                                                f"{answered}: {seen}")
    assert seen["latency_ms_count"] == answered, seen
    assert not seen["errors_total"], seen
    print(f"Ray's export counted {answered} after {time.monotonic() - started:.0f} s")


def _by_version(text: str, metric: str, labels: dict[str, str]) -> dict[str, int]:
    """A metric's samples with `labels`, summed by their `serving_version` label."""
    out: dict[str, int] = {}
    for found, value in prometheus_samples(text, metric):
        if all(found.get(k) == v for k, v in labels.items()) and value:
            out[found["serving_version"]] = out.get(found["serving_version"], 0) + int(value)
    return out


def _shaped(rows: list[list[float]], shape: str) -> bytes:
    """`rows` in one of MLflow's JSON shapes."""
    records = [dict(zip(FEATURES, row)) for row in rows]
    body = {"split": {"dataframe_split": {"columns": FEATURES, "data": rows}}, "records": {"dataframe_records": records},
            "inputs": {"inputs": records}, "instances": {"instances": records}}[shape]
    return json.dumps(body).encode()


def test_concurrent_requests_are_batched_and_each_is_answered_with_its_own_rows(switched):
    """After the module's switches (v000001 serves again): clients at once, each request of its own size and shape;
    the replica's fast path answers them in batches (one model call for several requests), each with the
    predictions of its own rows, as the row asked alone is answered; a request with params goes to MLflow's code."""
    url = switched.served.url
    health = json.loads(call(f"{url}/health").body)
    assert health["fast_path"] is True and health["version"] == "v000001", health
    alone = [predictions(call(f"{url}/invocations", _shaped([row], "split")))[0] for row in ROWS]
    before = json.loads(call(f"{url}/version").body)["this_replica"]["fast_path"]
    asks = [([(k + j) % len(ROWS) for j in range(1 + k % 9)], ("split", "records", "inputs", "instances")[k % 4])
            for k in range(160)]
    answers: list[tuple[list[int], Answer]] = []

    def client(mine: list[tuple[list[int], str]]) -> None:
        for picked, shape in mine:
            answers.append((picked, call(f"{url}/invocations", _shaped([ROWS[i] for i in picked], shape))))

    threads = [threading.Thread(target=client, args=(asks[n::8],)) for n in range(8)]
    for thread in threads:
        thread.start()
    probabilities = call(f"{url}/invocations", json.dumps(
        {"dataframe_split": {"columns": FEATURES, "data": ROWS}, "params": {"probabilities": True}}).encode())
    for thread in threads:
        thread.join()
    assert len(answers) == len(asks)
    wrong = [(picked, a.status, a.version, a.body[:200]) for picked, a in answers
             if a.status != 200 or a.version != "v000001" or predictions(a) != [alone[i] for i in picked]]
    assert not wrong, f"{len(wrong)} of {len(answers)} answers wrong, e.g. {wrong[:3]}"
    after = json.loads(call(f"{url}/version").body)["this_replica"]["fast_path"]
    requests, batches = after["requests"] - before["requests"], after["batches"] - before["batches"]
    assert requests == len(asks) and batches < requests, (before, after)  # some model calls answered several
    assert probabilities.status == 200, probabilities  # MLflow's path: one probability per class label
    assert all(isinstance(p, dict) and abs(sum(p.values()) - 1) < 1e-5 for p in predictions(probabilities)), probabilities
    print(f"{requests} requests from 8 clients answered in {batches} model calls")


def test_bad_batch_settings_are_refused_naming_each_before_ray_starts(tmp_path):
    proc = podium(["serve", "--serving", str(tmp_path), "--max-batch-size", "0", "--batch-wait-ms", "-1"],
                  dict(os.environ), check=False)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "--max-batch-size 0: expected 1 or more; --batch-wait-ms -1.0: expected 0 or more" in proc.stderr, proc.stderr


def test_a_second_podium_serve_on_a_held_port_is_refused_naming_the_server_that_holds_it(switched, tmp_path):
    """The module's server holds its port: a second `podium serve` of another location on that port is refused
    before Ray starts (Serve's proxy would share the port with the first, and answer its clients with another
    model), and the first one's clients still get the first one's answers."""
    port = switched.served.url.rsplit(":", 1)[1]
    other = tmp_path / "other-serving"
    other.mkdir()
    proc = podium(["serve", "--serving", str(other), "--port", port], dict(os.environ), check=False)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    said = proc.stderr.strip()
    assert f"port {port} is held by another `podium serve` (process {switched.served.proc.pid}, serving " \
           f"{switched.location})" in said and "Traceback" not in said and len(said.splitlines()) == 1, said
    answer = call(f"{switched.served.url}/invocations", BODY)
    assert answer.status == 200 and answer.version == "v000001", answer


def test_a_port_another_program_holds_is_refused_naming_the_program(tmp_path):
    other = tmp_path / "serving"
    other.mkdir()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = str(held.getsockname()[1])
        proc = podium(["serve", "--serving", str(other), "--port", port], dict(os.environ), check=False)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    said = proc.stderr.strip()
    assert f"port {port} on 127.0.0.1 is held by another program (process {os.getpid()}: " in said, said
    assert "Traceback" not in said and len(said.splitlines()) == 1, said


def _haproxy_processes(folder_prefix: str) -> list[str]:
    """The HAProxy processes of this machine whose configuration lies in a folder named `folder_prefix...`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "haproxy" in args and folder_prefix in args:
            found.append(f"{pid}: {args}")
    return found


def _descendants(root: int) -> dict[int, str]:
    """The processes below `root` (its children, theirs, ...), by pid, with their command lines."""
    parent, args = {}, {}
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            args[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        parent[pid] = int(stat.rsplit(")", 1)[1].split()[1])
    below, frontier = {}, [root]
    while frontier:
        frontier = [pid for pid, ppid in parent.items() if ppid in frontier and pid not in below]
        below.update({pid: args[pid] for pid in frontier})
    return below


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_through_haproxy_ingress_requests_across_two_switches_never_fail_and_nothing_is_left_at_the_stop(
        switched, live):
    """`podium serve` on a Ray of its own serves through Ray's HAProxy ingress by default (HAProxy in front of the
    replica, direct ingress): /health says so, clients' requests across a switch and a switch back each get one
    whole version, none fails, and once the command has stopped nothing it started is left (no HAProxy, no
    replica, nothing of its Ray), nor HAProxy's folder."""
    from podium.serving.layout import read_version, switch_current

    root, env = live
    own_ray = {k: v for k, v in env.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    location = switched.location
    with serving(location, own_ray, "--num-cpus", "0") as served:
        health = json.loads(call(f"{served.url}/health").body)
        assert health["ingress"] == "haproxy" and health["version"] == "v000001", health
        started = _descendants(served.proc.pid)
        assert any("ServeReplica" in args for args in started.values()), started
        # the HAProxy below the command, on its own folder (another test's `podium serve` may run one beside it)
        ours = [arg for args in started.values() if "haproxy" in args.split()[0] for arg in args.split()
                if arg.endswith("/haproxy.cfg") and "podium-haproxy-" in arg]
        assert ours, f"no HAProxy process of podium serve's own among what it started: {started}"
        folder = os.path.dirname(ours[0])
        with Load(served.url, BODY, clients=2) as load:
            load.wait_for("v000001", after=0)
            switch_current(location, read_version(location, "v000002"), "test: through HAProxy")
            load.wait_for("v000002", after=time.monotonic())
            back = time.monotonic()
            switch_current(location, read_version(location, "v000001"), "test: back", action="rollback")
            load.wait_for("v000001", after=back)
        answers = load.answers
    failed = [a for a in answers if a.status != 200]
    assert not failed, f"{len(failed)} of {len(answers)} requests failed through HAProxy, e.g. {failed[:3]}"
    assert {a.version for a in answers} == {"v000001", "v000002"}
    by_version = {v: {json.dumps(predictions(a)) for a in answers if a.version == v} for v in ("v000001", "v000002")}
    assert all(len(p) == 1 for p in by_version.values()), by_version
    left = _haproxy_processes(folder)
    assert not left and not os.path.exists(folder), f"HAProxy left after podium serve stopped: {left}"
    deadline = time.monotonic() + 30  # a process the stop signalled may take a moment to exit
    while (left := {pid: args for pid, args in started.items() if _alive(pid)}) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"processes podium serve started are left after it stopped: {left}"
    print(f"{len(answers)} requests through HAProxy across two switches, 0 failed")


def test_a_sigterm_while_ray_starts_stops_podium_serve_in_one_line_leaving_nothing_running(tmp_path):
    """A pod's or a supervisor's stop (SIGTERM to the podium process alone) while `podium serve` starts its Ray:
    exit 143, one line and no traceback, and nothing of it left: no process of its process group (Ray's, started
    with it), the port free for the next server."""
    location = tmp_path / "serving"
    location.mkdir()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    env["PYTHONUNBUFFERED"] = "1"  # its lines as they are said, through the pipe
    proc = subprocess.Popen([sys.executable, "-m", "podium.cli", "serve", "--serving", str(location), "--port",
                             str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not any("starting Ray Serve" in line for line in lines) and proc.poll() is None:
            assert time.monotonic() < deadline, lines
            time.sleep(0.05)
        time.sleep(1.0)  # inside Ray's start (its imports, then ray.init)
        stop_podium(proc)
        proc.wait(timeout=90)
    finally:
        if proc.poll() is None:  # a failure above: nothing of this test left running
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    reader.join(timeout=10)
    said = "".join(lines).strip()
    assert proc.returncode == 143, (proc.returncode, said[-3000:])
    assert "podium: stopped by SIGTERM" in said.splitlines() and "Traceback" not in said, said[-3000:]
    deadline = time.monotonic() + 30  # Ray's processes end with their driver (fate sharing), within moments
    while _in_group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _in_group(proc.pid)  # what it started, in its process group (start_new_session)
    with socket.socket() as again:  # the port is free: the next `podium serve` can take it
        again.bind(("127.0.0.1", port))


def _in_group(pgid: int) -> list[str]:
    """The live processes of process group `pgid`, with their command lines."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(f"{pid}: {args}")
    return found
