"""`podium serve` against `mlflow models serve` of the same champion, closed and open loop, on loopback.

    python benchmarks/serve.py                              # 3 interleaved rounds, the issue's whole grid
    python benchmarks/serve.py --repeats 3 --write          # and BENCHMARKS.md's serve section rewritten
    python benchmarks/serve.py --servers podium --podium-flag=--batch-wait-ms=0   # one server, other flags

One `podium run` (the demo job, 3 epochs, in a temporary project folder) and one `podium promote --always-promote
--mode max` of the same run give a serving location with two versions, v000001 and v000002. The servers:

  mlflow -w 1, -w 2   `mlflow models serve -m <v000002's model folder> --env-manager local -w N`; the better of the
                      two at each request size (by capacity) is the comparator
  podium              `podium serve` of the location, its default ingress (Ray's HAProxy in front of one replica)
  podium, proxy       `podium serve --ingress proxy` (Ray Serve's Python HTTP proxy in front of the replica)
  haproxy floor       a Ray Serve deployment answering every request with a constant (no model) behind the same
                      HAProxy ingress, as `podium serve` sets it up: what that ingress allows on this machine
  proxy floor         the same constant behind Ray Serve's Python HTTP proxy
  bare                a plain uvicorn app answering every POST with a constant: what this client, this loopback
                      and this machine allow at all

Each round starts each server in turn (mlflow's two first, side by side: the open loop's rates come from their
capacity; the others' order turns from round to round), and for each request size (1, 32 and 256 rows of the
champion's input example, JSON dataframe_split):

  capacity    closed loop: `wrk` (one thread, a Lua script posting the body) with each of --connections
              keep-alive connections for --closed-s; the capacity is the best of them, with its p50 and p99; wrk's
              own CPU (its rusage) is reported beside it, as it shares the cores with the server
  latency     open loop (mlflow's comparator and podium only): requests sent at fixed offered rates (50 % and 80 % of
              the round's mlflow capacity at that size, and 2x it) from this process (asyncio, up to 64
              connections), each request's latency taken from its scheduled send, not from when a connection was
              free (coordinated omission: a stalled server's backlog counts); a rate is held when answers/s reach
              95 % of it
  cost        CPU-ms per answer of the server's own processes (utime + stime from /proc of every process below the
              server's, and in its session: Ray's GCS, raylet, workers and HAProxy included) at capacity; and the
              idle CPU (% of one core) of the stack answering nothing, over --idle-s after its load

podium's switch: after its rates, one more 1-row open-loop window at 50 % of mlflow's rate (apart, so the rates' p99
are without it), in which CURRENT is switched to the other version a third in and back two thirds in
(podium.serving.layout.switch_current, what a promotion and a rollback call); failed requests are counted. A shadow's
extra CPU per mirrored request is what the replica's shadow thread spends on one (the candidate's answer and the
comparison), measured in this process on the same model. Figures are medians over rounds with the range; ratios
(podium / mlflow) are taken within each round first. Goals (issue 69): capacity ≥ 2.0x the better mlflow at 32 and
256 rows, ≥ 1.5x at 1 row; p99 at most mlflow's at every rate mlflow holds; CPU-ms per answer ≤ 0.5x mlflow's. Where
the haproxy floor itself is below a capacity goal, podium is judged against the floor: ≥ 0.8x its capacity.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.workload import load_average, machine_description, markdown_table, update_markdown_section

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
WRK = shutil.which("wrk") or "/usr/bin/wrk"
BARE_APP = '''
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

logging_config = {"enable_access_log": False}  # as podium serve's default

@serve.deployment(max_ongoing_requests=32, logging_config=logging_config)
class Constant:
    async def __call__(self, request):
        await request.body()
        return Response('{"predictions": [0]}', media_type="application/json")

stop = threading.Event()
ray.init(num_cpus=1)
for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, lambda *_: stop.set())
serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[1])}, logging_config=logging_config)
serve.run(Constant.bind(), name="floor", route_prefix="/")
stop.wait()
serve.shutdown()
ray.shutdown()
'''
WRK_SCRIPT = '''
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = assert(io.open(os.getenv("PODIUM_BENCH_BODY"), "rb"))
wrk.body = f:read("*a")
f:close()
'''
MLFLOW = ("mlflow -w 1", "mlflow -w 2")
TURNING = ("podium", "podium, proxy", "haproxy floor", "proxy floor", "bare")  # their order turns each round
SERVERS = (*MLFLOW, *TURNING)
OPEN = ("mlflow", "podium")  # the open loop's servers (mlflow: the round's better one at that size)
RATES = (("50 %", 0.5), ("80 %", 0.8), ("2x", 2.0))
TICK = os.sysconf("SC_CLK_TCK")
VARIANT = "podium "  # + flags: a server of --variant


def log(msg: str) -> None:
    print(f"[serve {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def podium_env(project: Path) -> dict[str, str]:
    """podium's embedded defaults in `project` (servers a user may point at are dropped)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL", "RAY_ADDRESS")}
    path = os.pathsep.join([os.path.dirname(PYTHON), env.get("PATH", "")])  # mlflow runs the venv's `uvicorn`
    return {**env, "PATH": path, "PODIUM_HOME": str(project / ".podium"),
            "MLFLOW_TRACKING_URI": f"sqlite:///{project}/.podium/mlflow.db"}


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
           ready_s: float = 300) -> Iterator[int]:
    """A server process (its own session) until `ready_path` answers 200, its pid; SIGTERM at the end."""
    out = open(cwd / f"{name.replace(' ', '_').replace(',', '')}.log", "w")
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
                raise RuntimeError(f"{name} did not start: see {out.name}")
            time.sleep(0.5)
        yield proc.pid
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        out.close()


def tree_cpu(root: int) -> dict[int, float]:
    """CPU seconds (utime + stime) of every live process below `root` or in its session, by pid."""
    stats: dict[int, tuple[int, int, float]] = {}  # pid -> parent, session, CPU s
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[pid] = (int(fields[1]), int(fields[3]), (int(fields[11]) + int(fields[12])) / TICK)
    ours = {pid for pid, (_, session, _) in stats.items() if session == root} | {root}
    while more := {pid for pid, (parent, _, _) in stats.items() if parent in ours and pid not in ours}:
        ours |= more
    return {pid: stats[pid][2] for pid in ours if pid in stats}


def cpu_since(root: int, before: dict[int, float]) -> float:
    """CPU seconds the server's processes spent since `before` (a tree_cpu of it)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in tree_cpu(root).items())


def _seconds(text: str) -> float:
    if text == "nans":  # not reported
        return float("nan")
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}[unit]


def closed_loop(port: int, body_file: Path, connections: int, seconds: float, pid: int) -> dict[str, float]:
    """wrk with `connections` keep-alive connections for `seconds`: answers/s (2xx), p50 and p99 ms, failures,
    the server's CPU-ms per answer and wrk's own CPU (% of one core)."""
    script = body_file.with_suffix(".lua")
    script.write_text(WRK_SCRIPT)
    before_client, before_server = resource.getrusage(resource.RUSAGE_CHILDREN), tree_cpu(pid)
    out = subprocess.run([WRK, "-t1", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "10s", "--latency",
                          "-s", str(script), f"http://127.0.0.1:{port}/invocations"], capture_output=True, text=True,
                         env={**os.environ, "PODIUM_BENCH_BODY": str(body_file)}, check=True).stdout
    server_cpu = cpu_since(pid, before_server)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    client_cpu = (after.ru_utime + after.ru_stime) - (before_client.ru_utime + before_client.ru_stime)
    total, took = re.search(r"(\d+) requests in ([\d.]+\w+),", out).groups()  # type: ignore[union-attr]
    failed = sum(int(n) for n in re.findall(r"Non-2xx or 3xx responses: (\d+)", out))
    failed += sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    window = _seconds(took)
    ok = int(total) - failed
    percentiles = dict(re.findall(r"^\s*(50|99)(?:\.0+)?%\s+([\d.]+(?:us|ms|s|m))\s*$", out, re.M))
    if "50" not in percentiles or "99" not in percentiles:
        log(f"wrk's percentiles not found in:\n{out}")
    return {"rps": ok / window, "p50_ms": _seconds(percentiles.get("50", "nans")) * 1000,
            "p99_ms": _seconds(percentiles.get("99", "nans")) * 1000,
            "failed": float(failed), "cpu_ms": server_cpu * 1000 / max(ok, 1), "client_pct": client_cpu / window * 100}


async def _open_loop(port: int, body: bytes, rate: float, seconds: float, connections: int,
                     at: list[tuple[float, Callable[[], None]]]) -> list[tuple[float, float, int, str | None]]:
    """Requests scheduled every 1/rate s for `seconds`, sent on the first free connection of `connections`:
    (scheduled send, latency from it, status, version header) each; 0 for no answer in time."""
    loop = asyncio.get_running_loop()
    request = (f"POST /invocations HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    queue: asyncio.Queue[float | None] = asyncio.Queue()
    results: list[tuple[float, float, int, str | None]] = []
    start = loop.time() + 0.2
    count = int(rate * seconds)

    async def schedule() -> None:
        for i in range(count):
            due = start + i / rate
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            queue.put_nowait(due)
        for _ in range(connections):
            queue.put_nowait(None)

    async def send() -> None:
        reader = writer = None
        while (due := await queue.get()) is not None:
            status, version = 0, None
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(request)
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")  # type: ignore[union-attr]
                headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in head[1:] if ":" in h)}
                await reader.readexactly(int(headers.get("content-length", 0)))  # type: ignore[union-attr]
                status, version = int(head[0].split()[1]), headers.get("x-podium-version")
                if headers.get("connection", "").lower() == "close":
                    writer.close()
                    reader = writer = None
            except (OSError, asyncio.IncompleteReadError, ValueError):
                if writer is not None:
                    writer.close()
                reader = writer = None
            results.append((due, loop.time() - due, status, version))
        if writer is not None:
            writer.close()

    async def call_at(after_s: float, fn: Callable[[], None]) -> None:
        await asyncio.sleep(max(0.0, start + after_s - loop.time()))
        await asyncio.to_thread(fn)

    tasks = [asyncio.create_task(send()) for _ in range(connections)] + [
        asyncio.create_task(call_at(after_s, fn)) for after_s, fn in at]
    await schedule()
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=seconds + 30)
    except asyncio.TimeoutError:  # a server that stalled: what is left unanswered counts as failed
        pass
    return results


def open_loop(port: int, body: bytes, rate: float, seconds: float, pid: int,
              at: list[tuple[float, Callable[[], None]]] | None = None, connections: int = 64) -> dict[str, float]:
    """The open loop at `rate` requests/s: answers/s, p50/p99 ms from each request's scheduled send, failures,
    the server's CPU-ms per answer and this client's own CPU (% of one core)."""
    before_client, before_server = time.process_time(), tree_cpu(pid)
    started = time.monotonic()
    results = asyncio.run(_open_loop(port, body, rate, seconds, connections, at or []))
    window = time.monotonic() - started
    server_cpu, client_cpu = cpu_since(pid, before_server), time.process_time() - before_client
    ok = sorted(r[1] for r in results if r[2] == 200)
    q = statistics.quantiles(ok, n=100) if len(ok) > 1 else [float("nan")] * 99
    failed = int(rate * seconds) - len(ok)
    return {"rps": len(ok) / seconds, "offered": rate, "held": float(len(ok) / seconds >= 0.95 * rate and failed == 0),
            "p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000, "failed": float(failed),
            "cpu_ms": server_cpu * 1000 / max(len(ok), 1), "client_pct": client_cpu / window * 100}


def idle_cpu(pid: int, seconds: float) -> float:
    """% of one core the server's processes spend answering nothing, over `seconds`."""
    before = tree_cpu(pid)
    time.sleep(seconds)
    return cpu_since(pid, before) / seconds * 100


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


class Bench:
    """One run: the champion, the request bodies, the servers' commands, and every round's figures."""

    def __init__(self, args: argparse.Namespace, work: Path):
        from podium.live.ingress import haproxy_environment
        from podium.serving.layout import read_current

        self.args, self.work = args, work
        made = work / ".podium" / "serving" / "podium"
        self.serving = str(made) if (made / "CURRENT").exists() else make_champion(work)
        self.bodies = {rows: request_body(self.serving, rows) for rows in args.rows}
        self.files = {}
        for rows, body in self.bodies.items():
            self.files[rows] = work / f"body-{rows}.json"
            self.files[rows].write_bytes(body)
        self.model_dir = str(Path(read_current(self.serving).uri))  # type: ignore[union-attr]
        (work / "bare_app.py").write_text(BARE_APP)
        (work / "ray_floor_app.py").write_text(RAY_FLOOR_APP)
        self.env = podium_env(work)
        haproxy, self.haproxy_folder = haproxy_environment("127.0.0.1")  # the floor's, as podium serve makes its own
        self.haproxy_env = {**self.env, **haproxy}
        # (server, rows) -> rounds of: capacity (closed loop, best of the connections), by connections, idle
        self.closed: dict[tuple[str, int], list[dict[str, float]]] = {}
        self.open: dict[tuple[str, int, str], list[dict[str, float]]] = {}
        self.idle: dict[str, list[float]] = {}
        self.better: dict[int, list[str]] = {}  # rows -> the better mlflow, by round
        self.switch: list[dict[str, float]] = []

    def command(self, name: str, port: int) -> tuple[list[str], dict[str, str], str]:
        """A server's command line, environment and readiness path."""
        serve = [PYTHON, "-m", "podium.cli", "serve", "--serving", self.serving, "--port", str(port),
                 *self.args.podium_flag]
        if name.startswith(VARIANT):  # podium with other flags beside the default one (--variant)
            return serve + name[len(VARIANT):].split(), self.env, "/health"
        mlflow = [PYTHON, "-m", "mlflow", "models", "serve", "-m", self.model_dir, "--env-manager", "local",
                  "-h", "127.0.0.1", "-p", str(port), "-w"]
        return {"mlflow -w 1": (mlflow + ["1"], self.env, "/ping"),
                "mlflow -w 2": (mlflow + ["2"], self.env, "/ping"),
                "podium": (serve, self.env, "/health"),
                "podium, proxy": (serve + ["--ingress", "proxy"], self.env, "/health"),
                "haproxy floor": ([PYTHON, "ray_floor_app.py", str(port)], self.haproxy_env, "/ping"),
                "proxy floor": ([PYTHON, "ray_floor_app.py", str(port)], self.env, "/ping"),
                "bare": ([PYTHON, "-m", "uvicorn", "bare_app:app", "--port", str(port), "--log-level", "warning"],
                         self.env, "/ping")}[name]

    @contextmanager
    def started(self, name: str) -> Iterator[tuple[int, int]]:
        port = free_port()
        command, env, ready = self.command(name, port)
        with server(name, command, port, env, ready, self.work) as pid:
            yield port, pid

    def capacity(self, name: str, port: int, pid: int) -> None:
        """The closed loop at each size and number of connections; the best is the capacity."""
        for rows in self.args.rows:
            closed_loop(port, self.files[rows], self.args.connections[0], 1, pid)  # warm-up
            runs = [closed_loop(port, self.files[rows], c, self.args.closed_s, pid) for c in self.args.connections]
            best = max(range(len(runs)), key=lambda i: runs[i]["rps"])
            self.closed.setdefault((name, rows), []).append({**runs[best],
                                                            "connections": float(self.args.connections[best])})
            log(f"  {name}, {rows} rows: {runs[best]['rps']:.0f} answers/s at {self.args.connections[best]} "
                f"connections, p99 {runs[best]['p99_ms']:.1f} ms, {runs[best]['cpu_ms']:.2f} CPU-ms/answer")

    def latency(self, name: str, port: int, pid: int, sizes: list[int] | None = None) -> None:
        """The open loop at each rate, from this round's mlflow capacity at each size (of `sizes`, default all)."""
        for rows in sizes or self.args.rows:
            comparator = self.better[rows][-1]
            mlflow_rps = self.closed[(comparator, rows)][-1]["rps"]
            for label, share in RATES:
                result = open_loop(port, self.bodies[rows], share * mlflow_rps, self.args.open_s, pid)
                key = "mlflow" if name in MLFLOW else name
                self.open.setdefault((key, rows, label), []).append(result)
                log(f"  {name}, {rows} rows, {label} ({share * mlflow_rps:.0f}/s): p99 {result['p99_ms']:.1f} ms, "
                    f"{result['rps']:.0f} answers/s, {result['failed']:.0f} failed")
            if name == "podium" and rows == min(self.args.rows):  # the switches in a window of their own
                share = RATES[0][1]
                result = open_loop(port, self.bodies[rows], share * mlflow_rps, self.args.open_s, pid,
                                   self.switches())
                self.switch.append(result)
                log(f"  {name}, {rows} rows, switched and back at {share * mlflow_rps:.0f}/s: p99 "
                    f"{result['p99_ms']:.1f} ms, {result['failed']:.0f} failed of {result['rps'] * self.args.open_s:.0f}")

    def switches(self) -> list[tuple[float, Callable[[], None]]]:
        """CURRENT switched to the other version a third into the window, and back two thirds in."""
        from podium.serving.layout import read_current, read_version, switch_current

        current = read_current(self.serving)
        assert current is not None
        first, other = current.version, "v000001" if current.version == "v000002" else "v000002"

        def to(version: str, action: str) -> Callable[[], None]:
            return lambda: switch_current(self.serving, read_version(self.serving, version), "benchmark switch",
                                          action=action)

        return [(self.args.open_s / 3, to(other, "promote")), (2 * self.args.open_s / 3, to(first, "rollback"))]

    def round(self, r: int) -> None:
        turning = [*TURNING, *(VARIANT + flags for flags in self.args.variant)]
        turn = (r - 1) % len(turning)
        names = [n for n in (*MLFLOW, *turning[turn:], *turning[:turn]) if n in self.args.servers or n not in SERVERS]
        if any(n in MLFLOW for n in names):
            log(f"round {r}: {', '.join(n for n in MLFLOW if n in names)} (side by side, measured in turn)")
            with self.started(MLFLOW[0]) as (port1, pid1), self.started(MLFLOW[1]) as (port2, pid2):
                both = {MLFLOW[0]: (port1, pid1), MLFLOW[1]: (port2, pid2)}
                for name in MLFLOW:
                    self.capacity(name, *both[name])
                for rows in self.args.rows:
                    self.better.setdefault(rows, []).append(max(MLFLOW, key=lambda n: self.closed[(n, rows)][-1]["rps"]))
                for name in MLFLOW:
                    self.idle.setdefault(name, []).append(idle_cpu(both[name][1], self.args.idle_s))
                for rows in self.args.rows:  # the open loop on the better one, size by size
                    comparator = self.better[rows][-1]
                    self.latency(comparator, *both[comparator], sizes=[rows])
        for name in (n for n in names if n not in MLFLOW):
            log(f"round {r}: {name}")
            with self.started(name) as (port, pid):
                self.capacity(name, port, pid)
                if name in OPEN and self.better:
                    self.latency(name, port, pid)
                self.idle.setdefault(name, []).append(idle_cpu(pid, self.args.idle_s))

def med(values: list[float], digits: int = 1) -> str:
    values = [v for v in values if v == v]
    if not values:
        return "–"
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def _rows(n: int) -> str:
    return f"{n} row{'s' if n > 1 else ''}"


def render(b: Bench, cpu: dict[int, float]) -> str:
    """BENCHMARKS.md's serve section: the table by server, then the goals, the open loop, the switch."""
    args, sizes = b.args, b.args.rows
    names = [n for n in (*SERVERS, *(VARIANT + f for f in args.variant)) if any((n, rows) in b.closed for rows in sizes)]
    table = []
    for name in names:
        runs = [b.closed.get((name, rows), []) for rows in sizes]
        table.append([name, *[f"{med([x['rps'] for x in rs], 0)}; {med([x['p99_ms'] for x in rs])}" for rs in runs],
                      " · ".join(med([x["cpu_ms"] for x in rs], 2).split(" ")[0] for rs in runs),
                      med(b.idle.get(name, []), 1), " · ".join(
                          f"{statistics.median([x['client_pct'] for x in rs]):.0f}" if rs else "–" for rs in runs)])
    lines = [
        "## Serving live (`benchmarks/serve.py`)",
        f"`python benchmarks/serve.py --repeats {args.repeats}{''.join(' --podium-flag=' + f for f in args.podium_flag)}"
        f"{_narrowed(args)}`"
        f": the demo champion on loopback, JSON dataframe_split requests of 1, 32 and 256 rows; capacity by `wrk` "
        f"(closed loop, the best of {', '.join(map(str, args.connections))} keep-alive connections, {args.closed_s:g} s "
        f"each), latency in an open loop ({args.open_s:g} s per rate, timed from each request's scheduled send); CPU of "
        f"the server's own processes (Ray's and HAProxy's included); median (range) of {args.repeats} interleaved "
        f"rounds. {machine_description().get('cpu', '')}, {os.cpu_count()} cores, shared; {load_average()}.", "",
        markdown_table(["server", *[f"answers/s; p99 ms, {_rows(n)}" for n in sizes],
                        "CPU-ms per answer, " + " · ".join(map(str, sizes)) + " rows", "idle CPU %",
                        "wrk's CPU %"], table)]
    summary, open_said = goals(b, sizes)  # two lines: BENCHMARKS.md keeps to 250
    sw = b.switch
    lines += [summary, open_said + (
        f" Switching under load (podium, 1-row open loop at 50 % of mlflow's rate, CURRENT switched and switched back "
        f"inside a window of its own, after the rates'): {sum(x['failed'] for x in sw):.0f} failed of "
        f"{sum(x['offered'] * args.open_s for x in sw):.0f} requests, p99 {med([x['p99_ms'] for x in sw])} ms. A "
        "shadow's extra CPU per mirrored request (the candidate's answer and the comparison, in the replica's shadow "
        "thread): " + ", ".join(f"{cpu[n]:.2f} ms at {_rows(n)}" for n in sizes) + ".")]
    return "\n".join(lines)


def goals(b: Bench, sizes: list[int]) -> tuple[str, str]:
    """The summary line (capacity and p99 ratios per size, against the better mlflow), the open loop's p99s, and
    each goal met or not (judged against the haproxy floor where that floor is below the goal)."""
    def ratio(name: str, rows: int, key: str) -> list[float]:
        mine = b.closed.get((name, rows), [])
        theirs = [b.closed[(better, rows)][i] for i, better in enumerate(b.better.get(rows, []))]
        return [m[key] / t[key] for m, t in zip(mine, theirs)]

    said, open_said, verdicts = [], [], []
    comparator = ", ".join(f"{_rows(n)}: {statistics.mode(b.better[n])}" for n in sizes if b.better.get(n))
    for rows in sizes:
        if not b.better.get(rows) or ("podium", rows) not in b.closed:
            continue
        throughput = ratio("podium", rows, "rps")
        p99 = [p["p99_ms"] / m["p99_ms"] for p, m in zip(b.open[("podium", rows, RATES[1][0])],
                                                        b.open[("mlflow", rows, RATES[1][0])])]
        cost = ratio("podium", rows, "cpu_ms")
        said.append(f"{_rows(rows)}: throughput ×{med(throughput)}, p99 ×{med(p99, 2)}, CPU per answer ×{med(cost, 2)}")
        goal = 1.5 if rows == 1 else 2.0
        floor = statistics.median(ratio("haproxy floor", rows, "rps")) if ("haproxy floor", rows) in b.closed else None
        if floor is not None and floor < goal:
            of_floor = [p["rps"] / f["rps"] for p, f in zip(b.closed[("podium", rows)], b.closed[("haproxy floor", rows)])]
            verdicts.append(f"capacity at {_rows(rows)}: the haproxy floor is ×{floor:.1f} of mlflow (goal ×{goal:.1f}), "
                            f"podium ×{med(of_floor, 2)} of the floor (goal ≥ 0.8): "
                            f"**{'met' if statistics.median(of_floor) >= 0.8 else 'not met'}**")
        else:
            verdicts.append(f"capacity ×{goal:.1f} at {_rows(rows)}: "
                            f"**{'met' if statistics.median(throughput) >= goal else 'not met'}**")
        held_p99 = []
        for label, _ in RATES:
            mine, theirs = b.open[("podium", rows, label)], b.open[("mlflow", rows, label)]
            held = statistics.median(x["held"] for x in theirs) >= 0.5
            podium_held = statistics.median(x["held"] for x in mine) >= 0.5
            open_said.append(f"{label} at {_rows(rows)} ({statistics.median(x['offered'] for x in theirs):.0f}/s): "
                             f"{med([x['p99_ms'] for x in mine])}{'' if podium_held else ' (not held)'} vs "
                             f"{med([x['p99_ms'] for x in theirs])}{'' if held else ' (not held)'}")
            if held:
                held_p99.append(statistics.median(m["p99_ms"] / t["p99_ms"] for m, t in zip(mine, theirs)))
        verdicts.append(f"p99 ≤ mlflow's at the rates it holds, {_rows(rows)}: "
                        f"**{'met' if held_p99 and max(held_p99) <= 1.0 else 'not met'}**")
        verdicts.append(f"CPU per answer ≤ ×0.5 at {_rows(rows)}: "
                        f"**{'met' if statistics.median(cost) <= 0.5 else 'not met'}**")
    return (f"- podium / mlflow (the better of -w 1 and -w 2 by capacity; {comparator}), {'; '.join(said)} "
            f"(throughput and CPU per answer at capacity, p99 in the open loop at 80 % of mlflow's capacity). Goals: "
            + "; ".join(verdicts) + ".",
            "- Open loop, p99 ms podium vs mlflow (\"not held\": answers/s below 95 % of the offered rate, or failures): "
            + "; ".join(open_said) + ".")


def _narrowed(args: argparse.Namespace) -> str:
    """The options that narrowed a run to some sizes or servers, as the command line gave them (the header names the
    run it describes)."""
    said = ""
    if args.rows != [1, 32, 256]:
        said += f" --rows {','.join(map(str, args.rows))}"
    if args.servers != list(SERVERS):
        said += f' --servers "{";".join(args.servers)}"'
    return said


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--closed-s", type=float, default=2.0, help="Seconds per closed-loop run (default: %(default)s).")
    parser.add_argument("--open-s", type=float, default=3.0, help="Seconds per offered rate (default: %(default)s).")
    parser.add_argument("--budget-s", type=float, default=600.0,
                        help="Fewer rounds than --repeats where another would end past this many seconds "
                             "(default: %(default)s; the section says how many ran).")
    parser.add_argument("--idle-s", type=float, default=3.0, help="Seconds of idle CPU (default: %(default)s).")
    parser.add_argument("--connections", type=lambda s: [int(x) for x in s.split(",")], default=[8, 64],
                        help="The closed loop's connections, comma-separated (default: 8,64).")
    parser.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")], default=[1, 32, 256],
                        help="Rows per request, comma-separated (default: 1,32,256).")
    parser.add_argument("--servers", type=lambda s: s.split(";"), default=list(SERVERS),
                        help="The servers, ';'-separated (default: all: " + "; ".join(SERVERS) + ").")
    parser.add_argument("--variant", action="append", default=[],
                        help="podium serve with these flags (space-separated) as one more server, e.g. "
                             "--variant='--max-batch-size 32' (repeatable).")
    parser.add_argument("--podium-flag", action="append", default=[],
                        help="A flag for `podium serve` (repeatable), e.g. --podium-flag=--batch-wait-ms=0.")
    parser.add_argument("--project", help="A project folder kept after the run, its champion made once and reused "
                                          "(default: a temporary one).")
    parser.add_argument("--write", action="store_true", help="Rewrite BENCHMARKS.md's serve section.")
    args = parser.parse_args()
    work = Path(args.project or tempfile.mkdtemp(prefix="podium-serve-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    bench = None
    try:
        bench = Bench(args, work)
        started = time.monotonic()
        for r in range(1, args.repeats + 1):
            bench.round(r)
            spent = time.monotonic() - started
            if r < args.repeats and spent / r * (r + 1) > args.budget_s:  # another round would overrun the budget
                log(f"{r} rounds in {spent:.0f} s: a round more would pass --budget-s {args.budget_s:g}")
                args.repeats = r
                break
        log(f"rounds done in {time.monotonic() - started:.0f} s")
        cpu = shadow_cpu(bench.serving, bench.bodies)
        print(json.dumps({"closed": {f"{k[0]} {k[1]}": v for k, v in bench.closed.items()},
                          "open": {" ".join(map(str, k)): v for k, v in bench.open.items()}, "idle": bench.idle,
                          "better": bench.better, "switch": bench.switch}), file=sys.stderr)
        section = render(bench, cpu)
        print(section)
        if args.write:
            update_markdown_section(ROOT / "BENCHMARKS.md", "serve", section)
        return 0
    finally:
        if bench is not None:
            shutil.rmtree(bench.haproxy_folder, ignore_errors=True)
        if not args.project:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
