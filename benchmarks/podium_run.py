"""Run the real `podium run --json` in a subprocess and read back, from the servers it used,
when each thing happened.

Where each timestamp comes from:
  announced   the `podium.checkpoint.persisted` Prefect event's payload (CheckpointEvent.persisted_at,
              set by podium's Ray Train callback on the controller); fallback: the MLflow record's creation
  (uploaded   the checkpoint files' mtime in storage: benchmarks.workload.uploaded_at)
  recorded    the checkpoint's MLflow LoggedModel creation_timestamp (record-checkpoint task)
  validated   the LoggedModel tag podium.validated_at (metrics merged, status validated)
  val start/end  the validation function's own timing log (benchmarks.workload.validate_repeated)
  phases      Prefect flow-run and task-run start/end times (plan, connect-ray, train-model, promote)
The driver's peak RSS is read from /proc/<pid>/status (VmHWM) while it runs, and the Prefect
server's CPU seconds from /proc/<pid>/stat before and after.
"""

from __future__ import annotations

import atexit
import bisect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
PODIUM = str(Path(sys.executable).parent / "podium")


_BENCH_PATH: str | None = None


def benchmarks_only_path() -> str:
    """A folder holding only `benchmarks` (a link to this one), for PYTHONPATH: podium's processes and Ray
    workers import the validation function from it, and the repository's own `podium/` folder does not
    shadow the podium of the installation being measured (another one, with startup.py --before)."""
    global _BENCH_PATH
    if _BENCH_PATH is None:
        _BENCH_PATH = tempfile.mkdtemp(prefix="podium-bench-path-")
        os.symlink(REPO / "benchmarks", Path(_BENCH_PATH) / "benchmarks")
        atexit.register(shutil.rmtree, _BENCH_PATH, True)
    return _BENCH_PATH


def podium_env(home: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a podium subprocess: embedded defaults under `home`, benchmarks importable,
    plus `extra` (the pinning hook of benchmarks.pinning)."""
    env = {**os.environ, **(extra or {})}
    for k in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL", "RAY_ADDRESS", "PODIUM_TRACKING_URI",
              "PODIUM_PREFECT_API_URL"):
        env.pop(k, None)
    env["PODIUM_HOME"] = home
    env["PYTHONPATH"] = os.pathsep.join([benchmarks_only_path(), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("DO_NOT_TRACK", "1")
    return env


def start_server(home: str) -> tuple[str, float]:
    """`podium server start` under `home`; returns (API URL, seconds it took)."""
    t = time.time()
    out = subprocess.run([PODIUM, "server", "start"], env=podium_env(home), capture_output=True, text=True,
                         timeout=300, check=True).stdout
    url = next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Prefect API"))
    return url, time.time() - t


def settle(pid: int | None, max_cores: float = 0.05, every_s: float = 2.0, timeout_s: float = 60.0) -> float:
    """Wait until process `pid` uses at most `max_cores` over `every_s` (a server just started finishes its
    own start-up work in the background); returns the seconds waited."""
    t0 = time.time()
    last = cpu_seconds(pid)
    while last is not None and time.time() - t0 < timeout_s:
        time.sleep(every_s)
        now = cpu_seconds(pid)
        if now is None or now - last <= max_cores * every_s:
            break
        last = now
    return time.time() - t0


def stop_server(home: str) -> None:
    """`podium server stop` under `home` (only the server this home started)."""
    subprocess.run([PODIUM, "server", "stop"], env=podium_env(home), capture_output=True, timeout=60)


def server_url(home: str) -> str | None:
    """API URL of the local Prefect server podium started under `home` (by `podium run` itself when cold)."""
    p = Path(home) / "prefect" / "server.json"
    return json.loads(p.read_text())["api_url"] if p.exists() else None


def server_pid(home: str) -> int | None:
    """PID of the local Prefect server podium started under `home`."""
    p = Path(home) / "prefect" / "server.json"
    return json.loads(p.read_text())["pid"] if p.exists() else None


def cpu_seconds(pid: int | None) -> float | None:
    """User+system CPU seconds of a process so far."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class PeakRss(threading.Thread):
    """Polls VmHWM (peak resident set) and the CPU seconds of a process until it exits or `stop()`; keeps the
    CPU seconds over time (`samples`: (time.time(), CPU-s so far))."""

    def __init__(self, pid: int, every_s: float = 0.25):
        super().__init__(daemon=True)
        self.pid, self.every_s, self.peak_kb, self.cpu_s = pid, every_s, 0, 0.0
        self.samples: list[tuple[float, float]] = []
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()
        self.join(timeout=2)

    def run(self) -> None:
        path = f"/proc/{self.pid}/status"
        while not self._stopped.is_set():
            try:
                with open(path) as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            self.peak_kb = max(self.peak_kb, int(line.split()[1]))
            except (OSError, ValueError):
                return
            self.cpu_s = cpu_seconds(self.pid) or self.cpu_s
            self.samples.append((time.time(), self.cpu_s))
            self._stopped.wait(self.every_s)


def cpu_between(samples: list[tuple[float, float]], t0: float, t1: float) -> float | None:
    """CPU seconds a sampled process used between t0 and t1 (the last sample at or before each), or None
    when the samples do not cover t0."""
    times = [t for t, _ in samples]  # in the order they were taken
    i0, i1 = bisect.bisect_right(times, t0), bisect.bisect_right(times, t1)
    return samples[i1 - 1][1] - samples[i0 - 1][1] if i0 else None


def run_podium(home: str, config: dict[str, Any], workdir: str, timeout_s: float = 3600,
               extra_env: dict[str, str] | None = None, podium: str = PODIUM) -> dict[str, Any]:
    """`podium run --json --config <file>` under `home`; the JSON summary plus process facts.

    `podium`: the command to run (another installation, to compare before and after a change)."""
    cfg_path = Path(workdir) / f"{config['run_name']}.json"
    cfg_path.write_text(json.dumps(config, indent=2))
    env = podium_env(home, extra_env)
    srv = server_pid(home)
    srv_cpu0 = cpu_seconds(srv)
    cmd = [podium, "run", "--json", "--config", str(cfg_path)]
    log = open(Path(workdir) / f"{config['run_name']}.log", "w")
    started = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=log, text=True, cwd=workdir)
    rss = PeakRss(proc.pid)
    rss.start()
    server = PeakRss(srv) if srv is not None else None
    if server is not None:
        server.start()
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append((time.time(), line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    ended = time.time()
    reader.join(timeout=10)
    log.close()
    rss.join(timeout=2)
    if server is not None:
        server.stop()
    if proc.returncode != 0 or not lines:
        tail = (Path(workdir) / f"{config['run_name']}.log").read_text()[-3000:]
        raise RuntimeError(f"podium run failed (exit {proc.returncode}); stderr tail:\n{tail}")
    printed, last = lines[-1]
    return {"command": " ".join(cmd), "process_start": started, "process_end": ended, "summary": json.loads(last),
            "json_printed": printed, "peak_rss_mb": rss.peak_kb / 1024, "driver_cpu_s": rss.cpu_s,
            "server_cpu_s": (cpu_seconds(srv) - srv_cpu0) if srv_cpu0 is not None else None, "config": config,
            "driver_cpu_samples": rss.samples, "server_cpu_samples": server.samples if server is not None else []}


def _ts(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def prefect_runs(api: str, flow_run_name: str) -> dict[str, Any]:
    """The flow run's start/end and every task run's (name, start, end)."""
    with httpx.Client(base_url=api.rstrip("/") + "/", timeout=60) as c:
        fr = c.post("flow_runs/filter", json={"flow_runs": {"name": {"any_": [flow_run_name]}}}).json()
        if not fr:
            return {}
        flow = fr[0]
        tasks, offset = [], 0
        while True:
            page = c.post("task_runs/filter", json={"flow_runs": {"id": {"any_": [flow["id"]]}},
                                                   "limit": 200, "offset": offset}).json()
            tasks += page
            offset += len(page)
            if len(page) < 200:
                break
    return {"flow": {"start": _ts(flow.get("start_time")), "end": _ts(flow.get("end_time")),
                     "state": flow.get("state_type")},
            "tasks": [{"name": t["name"], "start": _ts(t.get("start_time")), "end": _ts(t.get("end_time")),
                       "state": t.get("state_type")} for t in tasks]}


def persisted_events(api: str, run_name: str, since: float) -> dict[int, float]:
    """step -> persisted_at from the podium.checkpoint.persisted events of `run_name`."""
    body = {"filter": {"event": {"name": ["podium.checkpoint.persisted"]},
                       "occurred": {"since": datetime.fromtimestamp(since - 60, timezone.utc).isoformat(),
                                    "until": (datetime.now(timezone.utc) + timedelta(minutes=5)).isoformat()}},
            "limit": 50}
    out: dict[int, float] = {}
    with httpx.Client(timeout=60) as c:
        page = c.post(api.rstrip("/") + "/events/filter", json=body).json()
        while True:
            for e in page.get("events", []):
                p = e.get("payload", {})
                if p.get("run_name") == run_name:
                    out[int(p["step"])] = float(p["persisted_at"])
            nxt = page.get("next_page")
            if not nxt:
                return out
            page = c.get(nxt).json()


def mlflow_records(tracking_uri: str, run_id: str) -> dict[str, Any]:
    """Per-step record creation and validation times, and the registered version's creation time."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    run = client.get_run(run_id)
    models, token = [], None
    while True:
        page = client.search_logged_models([run.info.experiment_id], filter_string=f"source_run_id = '{run_id}'",
                                           max_results=1000, page_token=token)
        models += page
        token = page.token
        if not token:
            break
    steps = {}
    for m in models:
        tags = m.tags or {}
        steps[int(tags.get("podium.step", -1))] = {
            "recorded": m.creation_timestamp / 1000.0,
            "validated": float(tags["podium.validated_at"]) if "podium.validated_at" in tags else None,
            "status": tags.get("podium.status"), "uri": tags.get("podium.checkpoint_uri")}
    versions = client.search_model_versions(f"run_id = '{run_id}'")
    registered = max((v.creation_timestamp / 1000.0 for v in versions), default=None)
    return {"steps": steps, "registered": registered}


SETTLE_S = 60.0


# task runs every finished podium run has: the server may store the last of them after the flow run's end
# (a cold server, busy with its first start, was seen storing promote-best-checkpoint a second later)
SETTLED_TASKS = ("train-model", "promote-best-checkpoint")


def _prefect_settled(prefect: dict[str, Any]) -> bool:
    """The flow run has ended, every task run has too, and the train-model and promotion task runs are among
    them."""
    tasks = prefect.get("tasks") or []
    return (bool((prefect.get("flow") or {}).get("end")) and all(t.get("end") for t in tasks)
            and all(any(t["name"].startswith(name) for t in tasks) for name in SETTLED_TASKS))


def collect(run: dict[str, Any], api: str, timing_log: str | None) -> dict[str, Any]:
    """Everything compare.py and scale.py need about one finished podium run."""
    from benchmarks.workload import is_verification, read_jsonl

    s = run["summary"]
    name = s["run_name"]
    # The server persists task-run states and events from its event stream, after the process that sent
    # them may have exited (podium waits until they are delivered, not stored): read until the flow run and
    # every task run have ended and every checkpoint's event is there, for up to SETTLE_S
    ml = mlflow_records(s["tracking_uri"], s["mlflow_run_id"])  # written before the process exited
    deadline = time.monotonic() + SETTLE_S
    while True:
        time.sleep(1.0)
        events = persisted_events(api, name, run["process_start"])
        prefect = prefect_runs(api, f"{name}-run")
        if (_prefect_settled(prefect) and len(events) >= len(ml["steps"])) or time.monotonic() > deadline:
            break
    serving = run["config"]["serving"]
    timings = {}
    verify = []
    for r in read_jsonl(timing_log) if timing_log else []:
        if is_verification(r, serving):
            verify.append(r)
        else:
            timings[int(r["step"])] = r
    rows = []
    for step, rec in sorted(ml["steps"].items()):
        t = timings.get(step, {})
        rows.append({"step": step, "uri": rec["uri"], "persisted": events.get(step), "recorded": rec["recorded"],
                     "val_start": t.get("start"), "val_end": t.get("end"), "validated": rec["validated"],
                     "status": rec["status"]})
    tasks = prefect.get("tasks", [])

    def task(name_: str) -> dict[str, Any]:
        return next((t for t in tasks if t["name"].startswith(name_)), {})

    return {"rows": rows, "flow": prefect.get("flow", {}), "tasks": tasks, "train": task("train-model"),
            "promote": task("promote-best-checkpoint"), "plan": task("plan-run"), "connect": task("connect-ray"),
            "registered": ml["registered"], "verify": verify, "events_found": len(events)}
