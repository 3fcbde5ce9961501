"""`podium serve` against `mlflow models serve` of the same champion, under the same load, on loopback.

    python benchmarks/serve.py                       # 3 rounds of 20 s per server and request size, 8 clients
    python benchmarks/serve.py --repeats 3 --seconds 10 --write

One `podium run` (the demo job, 3 epochs, in a temporary project folder) and one `podium promote --always-promote
--mode max` of the same run give a serving location with two versions, v000001 and v000002. Then, in each round,
interleaved so load drift hits all of them alike:

  mlflow     `mlflow models serve -m <v000002's model folder> --env-manager local` (uvicorn, one worker)
  podium     `podium serve` of the serving location (Ray Serve: its HTTP proxy and one replica; the fast path)
  floor      a plain uvicorn app answering every POST with a constant (no model): what this client, this loopback
             and this machine allow at all
  ray floor  a Ray Serve deployment answering every request with a constant (no model), behind Ray Serve's HTTP
             proxy as `podium serve` is: what Ray Serve's hop allows on this machine

Each server gets `--clients` closed-loop clients (threads with a keep-alive connection each, one JSON
dataframe_split request in a loop) for `--seconds`, after a warm-up, once with requests of 1 row and once with
requests of `--rows` rows (64); throughput is answers per second, latency p50 and p99 in ms. podium's switch
cost: with the 1-row load on `podium serve`, CURRENT is switched to the other version
(podium.serving.layout.switch_current, what a promotion and a rollback call), and the latencies of the requests
sent in the 5 s after the switch are compared with the steady state's. A shadow's extra CPU per mirrored request
is what the replica's shadow thread spends on one: the candidate's answer (fast path, else MLflow's code) and the
comparison, measured in this process (CPU time) on the same model. Figures are medians over rounds with the range;
the ratios (podium / mlflow) are taken within each round first. Goal (issue 62): podium's throughput at least 2x
mlflow's, its p99 at most mlflow's, for both request sizes.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.workload import load_average, machine_description, markdown_table, update_markdown_section

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
FLOOR_APP = '''
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

async def answer(request):
    await request.body()
    return Response('{"predictions": [0]}', media_type="application/json")

app = Starlette(routes=[Route("/invocations", answer, methods=["POST"]), Route("/ping", answer, methods=["GET"])])
'''
RAY_FLOOR_APP = '''
import signal, sys, threading
import ray
from ray import serve
from starlette.responses import Response

@serve.deployment(max_ongoing_requests=32)
class Constant:
    async def __call__(self, request):
        await request.body()
        return Response('{"predictions": [0]}', media_type="application/json")

stop = threading.Event()
ray.init(num_cpus=1)
for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, lambda *_: stop.set())
serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[1])})
serve.run(Constant.bind(), name="floor", route_prefix="/")
stop.wait()
serve.shutdown()
ray.shutdown()
'''
SERVERS = ("floor", "ray floor", "mlflow", "podium")


def log(msg: str) -> None:
    print(f"[serve {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def podium_env(project: Path) -> dict[str, str]:
    """podium's embedded defaults in `project` (servers a user may point at are dropped)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL", "RAY_ADDRESS")}
    return {**env, "PODIUM_HOME": str(project / ".podium"), "MLFLOW_TRACKING_URI": f"sqlite:///{project}/.podium/mlflow.db"}


def make_champion(project: Path) -> str:
    """A serving location with two versions of the demo model; its path."""
    env = podium_env(project)
    log("podium run (the demo job, 3 epochs)")
    subprocess.run([PYTHON, "-m", "podium.cli", "run", "--quiet", "--epochs", "3", "--run-name", "bench"], cwd=project,
                   env=env, check=True, stdout=subprocess.DEVNULL)
    log("podium promote --always-promote --mode max: a second version")
    subprocess.run([PYTHON, "-m", "podium.cli", "promote", "--quiet", "--run-name", "bench", "--epochs", "3",
                    "--always-promote", "--mode", "max"], cwd=project, env=env, check=True, stdout=subprocess.DEVNULL)
    subprocess.run([PYTHON, "-m", "podium.cli", "server", "stop"], cwd=project, env=env, check=False,
                   capture_output=True)
    return str(project / ".podium" / "serving" / "podium")


def request_body(serving: str, rows: int) -> bytes:
    """`rows` rows of the champion's own input example, as MLflow's dataframe_split."""
    from podium.serving.layout import read_current

    current = read_current(serving)
    assert current is not None
    folder = Path(current.uri)
    example = json.loads(next(folder / name for name in ("serving_input_example.json", "input_example.json")
                              if (folder / name).exists()).read_text())
    split = example.get("dataframe_split", example)
    data = (split["data"] * rows)[:rows]
    return json.dumps({"dataframe_split": {"columns": split["columns"], "data": data}}).encode()


@contextmanager
def server(name: str, command: list[str], port: int, env: dict[str, str], ready_path: str, cwd: Path,
           ready_s: float = 300) -> Iterator[None]:
    """A server process (its own group) until `ready_path` answers 200; SIGTERM at the end."""
    out = open(cwd / f"{name}.log", "w")
    proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + ready_s
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", ready_path)
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start: see {cwd / f'{name}.log'}")
            time.sleep(0.5)
        yield
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        out.close()


def load(port: int, body: bytes, clients: int, seconds: float, warmup_s: float = 3.0,
         during: tuple[float, object] | None = None) -> list[tuple[float, float, int, str | None]]:
    """Closed-loop clients for `seconds` after `warmup_s`: (sent, latency s, status, version header) per request.
    `during` = (after_s, fn): fn() is called that long into the measured window (the switch)."""
    results: list[tuple[float, float, int, str | None]] = []
    lock = threading.Lock()
    start = time.monotonic() + warmup_s
    end = start + seconds

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        mine = []
        while (now := time.monotonic()) < end:
            try:
                conn.request("POST", "/invocations", body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                response.read()
                status, version = response.status, response.headers.get("X-Podium-Version")
            except OSError:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                status, version = 0, None
            if now >= start:
                mine.append((now, time.monotonic() - now, status, version))
        conn.close()
        with lock:
            results.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    if during is not None:
        after_s, fn = during
        time.sleep(max(0.0, start + after_s - time.monotonic()))
        fn()  # type: ignore[operator]
    for t in threads:
        t.join()
    return results


def summary(results: list[tuple[float, float, int, str | None]], seconds: float) -> dict[str, float]:
    ok = sorted(r[1] for r in results if r[2] == 200)
    q = statistics.quantiles(ok, n=100) if len(ok) > 1 else [float("nan")] * 99
    return {"rps": len(ok) / seconds, "p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000,
            "failed": float(sum(1 for r in results if r[2] != 200))}


def med(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f})"


def shadow_cpu(serving: str, bodies: dict[int, bytes], n: int = 300) -> dict[int, float]:
    """CPU ms the replica's shadow thread spends on one mirrored request, by rows per request: the candidate's
    answer (as podium.live.server asks it) and its comparison with the champion's, on the champion's model."""
    from podium.live.server import _compared, invoke, load_serving
    from podium.serving.layout import read_current

    loaded = load_serving(read_current(serving))  # type: ignore[arg-type]
    out = {}
    for rows, body in bodies.items():
        champion = invoke(loaded, body, "application/json")
        for _ in range(20):
            invoke(loaded, body, "application/json")
        started = time.process_time()
        for _ in range(n):
            _compared(champion, invoke(loaded, body, "application/json"), 1e-6)
        out[rows] = (time.process_time() - started) / n * 1000
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rows", type=int, default=64, help="Rows per request of the larger requests (default: "
                                                             "%(default)s); the smaller have 1.")
    parser.add_argument("--podium-flag", action="append", default=[],
                        help="A flag for `podium serve` (repeatable), e.g. --podium-flag=--batch-wait-ms=0.")
    parser.add_argument("--write", action="store_true", help="Rewrite BENCHMARKS.md's serve section.")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="podium-serve-bench-"))
    try:
        serving = make_champion(work)
        from podium.serving.layout import read_current, read_version, switch_current

        sizes = sorted({1, args.rows})
        bodies = {rows: request_body(serving, rows) for rows in sizes}
        model_dir = str(Path(read_current(serving).uri))  # type: ignore[union-attr]
        (work / "floor_app.py").write_text(FLOOR_APP)
        (work / "ray_floor_app.py").write_text(RAY_FLOOR_APP)
        env = podium_env(work)
        rounds: dict[str, list[dict[str, float]]] = {f"{name} {rows}": [] for name in SERVERS for rows in sizes}
        rounds["switch"] = []
        for r in range(1, args.repeats + 1):
            for name in SERVERS:
                port = free_port()
                command = {
                    "floor": [PYTHON, "-m", "uvicorn", "floor_app:app", "--port", str(port), "--log-level", "warning"],
                    "ray floor": [PYTHON, "ray_floor_app.py", str(port)],
                    "mlflow": [PYTHON, "-m", "mlflow", "models", "serve", "-m", model_dir, "--env-manager", "local",
                               "-h", "127.0.0.1", "-p", str(port), "-w", "1"],
                    "podium": [PYTHON, "-m", "podium.cli", "serve", "--serving", serving, "--port", str(port),
                               *args.podium_flag],
                }[name]
                ready = "/health" if name == "podium" else "/ping"
                log(f"round {r}: {name}")
                with server(name.replace(" ", "_"), command, port, env, ready, work):
                    for rows in sizes:
                        rounds[f"{name} {rows}"].append(summary(load(port, bodies[rows], args.clients, args.seconds),
                                                                args.seconds))
                    if name == "podium":  # the switch, under the 1-row load
                        rounds["switch"].append(switch_under_load(serving, port, bodies[1], args, read_current,
                                                                  read_version, switch_current))
        cpu = shadow_cpu(serving, bodies)
        table = render(rounds, sizes, cpu, args)
        print(table)
        if args.write:
            update_markdown_section(ROOT / "BENCHMARKS.md", "serve", table)
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def switch_under_load(serving: str, port: int, body: bytes, args: argparse.Namespace, read_current, read_version,
                      switch_current) -> dict[str, float]:
    """CURRENT switched to the other version a quarter into a measured window: latencies before and after."""
    current = read_current(serving)
    other = "v000001" if current and current.version == "v000002" else "v000002"
    switched_at: list[float] = []

    def switch() -> None:
        switched_at.append(time.monotonic())
        switch_current(serving, read_version(serving, other), "benchmark switch", action="rollback")

    results = load(port, body, args.clients, args.seconds, during=(args.seconds / 4, switch))
    t_switch = switched_at[0]
    steady = [x for x in results if x[0] < t_switch]
    after = [x for x in results if t_switch <= x[0] < t_switch + 5]
    first_new = min((x[0] + x[1] for x in results if x[3] == other), default=float("nan"))
    return {"steady_p99_ms": summary(steady, args.seconds / 4)["p99_ms"], "after_p99_ms": summary(after, 5)["p99_ms"],
            "after_max_ms": max((x[1] for x in after), default=float("nan")) * 1000,
            "first_answer_s": first_new - t_switch, "failed": float(sum(1 for x in results if x[2] != 200)),
            "requests": float(len(results))}


def render(rounds: dict[str, list[dict[str, float]]], sizes: list[int], cpu: dict[int, float],
           args: argparse.Namespace) -> str:
    def rows_(n: int) -> str:
        return f"{n} row{'s' if n > 1 else ''}"

    table = [[name, *[cell for n in sizes for cell in (
        med([x["rps"] for x in rounds[f"{name} {n}"]]),
        f"{med([x['p50_ms'] for x in rounds[f'{name} {n}']])} / {med([x['p99_ms'] for x in rounds[f'{name} {n}']])}")],
        f"{sum(x['failed'] for n in sizes for x in rounds[f'{name} {n}']):.0f}"] for name in SERVERS]
    ratios, floors, met = [], [], True
    for n in sizes:
        ratio_rps = [p["rps"] / m["rps"] for p, m in zip(rounds[f"podium {n}"], rounds[f"mlflow {n}"])]
        ratio_p99 = [p["p99_ms"] / m["p99_ms"] for p, m in zip(rounds[f"podium {n}"], rounds[f"mlflow {n}"])]
        of_floor = [p["rps"] / f["rps"] for p, f in zip(rounds[f"podium {n}"], rounds[f"ray floor {n}"])]
        met = met and statistics.median(ratio_rps) >= 2.0 and statistics.median(ratio_p99) <= 1.0
        ratios.append(f"{rows_(n)}: throughput ×{med(ratio_rps)}, p99 ×{med(ratio_p99)}, ×{med(of_floor)} of the ray "
                      "floor's throughput")
        ray_floor = statistics.median(x["rps"] for x in rounds[f"ray floor {n}"])
        goal = 2 * statistics.median(x["rps"] for x in rounds[f"mlflow {n}"])
        if ray_floor < goal:  # the floor below the goal: no replica code can reach it behind this proxy
            floors.append(f"{ray_floor:.1f} against {goal:.1f} at {rows_(n)}")
    floor = (f" The floor is below the goal: Ray Serve's HTTP proxy alone answers a constant at fewer requests/s than "
             f"twice mlflow's ({'; '.join(floors)}), so behind it the throughput goal cannot be met on this machine."
             if floors else "")
    sw = rounds["switch"]
    machine = machine_description()
    return "\n".join([
        "## Serving live (`benchmarks/serve.py`)",
        f"`python benchmarks/serve.py --repeats {args.repeats} --seconds {args.seconds:g} --clients {args.clients} "
        f"--rows {args.rows}{''.join(' --podium-flag=' + f for f in args.podium_flag)}`: the demo champion, "
        f"{args.clients} closed-loop keep-alive clients on the same machine, JSON dataframe_split requests; median "
        f"(range) of {args.repeats} interleaved rounds. {machine.get('cpu', '')}; {load_average()} (other work "
        "shared the machine: the ratios within a round are what counts).", "",
        markdown_table(["server", *[h for n in sizes for h in (f"answers/s, {rows_(n)}", f"p50 / p99 ms, {rows_(n)}")],
                        "failed"], table), "",
        f"- podium / mlflow, {'; '.join(ratios)}. Goal: throughput ≥ ×2.0 and p99 ≤ ×1.0 at each size: "
        f"**{'met' if met else 'not met'}**.{floor}",
        f"- A switch of CURRENT under the 1-row load: p99 in the 5 s after it {med([x['after_p99_ms'] for x in sw])} "
        f"ms against {med([x['steady_p99_ms'] for x in sw])} ms before it (slowest "
        f"{med([x['after_max_ms'] for x in sw])} ms); the new version's first answer "
        f"{med([x['first_answer_s'] for x in sw])} s after it; {sum(x['failed'] for x in sw):.0f} failed of "
        f"{sum(x['requests'] for x in sw):.0f} requests. A shadow's extra CPU per mirrored request (the candidate's "
        "answer and the comparison, in the replica's shadow thread): "
        + ", ".join(f"{cpu[n]:.2f} ms at {rows_(n)}" for n in sizes) + ".",
    ])


if __name__ == "__main__":
    sys.exit(main())
