"""A chaos soak: pipeline runs, each with a random fault at a random moment, then the same run again until
it completes; after each, the invariants that must hold whatever happened.

    python benchmarks/chaos.py --runs 30 --seed 1                 # the soak
    python benchmarks/chaos.py --runs 30 --seed 1 --output BENCHMARKS.md

Everything runs for real on this machine, under one podium home (a temporary folder): `podium run` (its
own process group, with a local Ray of its own), podium's local Prefect server, and an `mlflow server` on
SQLite that the soak starts, so that it can be killed and restarted. One fault per run, drawn with the
seed, injected at a moment drawn too (after the first checkpoint is announced, or after training ends for
a promoter):

  podium-kill        SIGKILL to podium's process group (podium and its Ray)
  podium-ctrl-c      SIGINT to the process group, as a terminal's Ctrl-C
  train-worker       SIGKILL to one Ray Train worker process
  validation         SIGKILL to the process of a running validation task
  promoter           SIGKILL to podium's process group once training is done (promotion under way)
  prefect-server     SIGKILL to the Prefect server (it stays down for that attempt; the next one starts it)
  mlflow-server      the MLflow server killed, restarted 3 to 20 s later on the same port and database
  store-endpoint     the object store unreachable for 3 to 40 s: the relay in front of it refuses connections
                     and cuts those open (checkpoints are persisted there; `--storage local` leaves this out)
  disk-full          the serving location's filesystem (a tmpfs of its own) filled up while training runs,
                     so the promotion meets a full disk; the space is freed after that attempt, as an operator
                     would (needs root to mount the tmpfs; left out of the draw otherwise)

Every run promotes its best checkpoint by default (`--always-promote`): the runs are alike, so podium's gate
would let only the first one promote, and the promoter and full-disk faults would meet no copy
(`--promotion gate` lets the gate decide). Storage is S3 by default: a moto server on loopback (the tests'
S3 server) behind a relay, in bucket `soak`; `--storage gs` and `--storage az` put it on Google Cloud Storage
(gcp-storage-emulator, generation preconditions honoured) or Azure Blob (Azurite), each behind the same relay;
serving and the dataset are local. Not drawn (covered by the
test suite, not here): the Ray head of a remote cluster.

Invariants, after each run completes (exit code 0, or 4: done but not recorded in Prefect):
  1. every checkpoint persisted in storage has exactly one MLflow record, with its training metrics
     (`loss` in `podium.metrics`) and a verdict (validated, failed or skipped; none pending)
  2. serving's CURRENT, its manifest and the registry alias agree, and the champion loads and predicts
  3. the history has no gaps: each switch's `previous` is the version the one before switched to, and
     the last switch is CURRENT
  4. nothing was promoted twice: at most one promotion per run name
It prints the faults injected, invariants checked, violations, and the wall-time cost of each fault (the
run's time to completion, all attempts, less the median of the fault-free runs).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.workload import load_average, machine_description, markdown_table, update_markdown_section

FAULTS = ["podium-kill", "podium-ctrl-c", "train-worker", "validation", "promoter", "prefect-server",
          "mlflow-server", "store-endpoint", "disk-full"]
BUCKET = "soak"
TESTS = Path(__file__).resolve().parent.parent / "tests" / "integration"
sys.path.insert(0, str(TESTS))  # the user code the soak's runs import (by path, in Ray's workers too)
sys.path.insert(0, str(TESTS.parent))  # the tests' helpers: servers (MLflow, S3, the relay), the full-disk filler
DONE = (0, 4)  # completed (4: done, but the flow run's end not recorded in Prefect)
MAX_ATTEMPTS = 4


def log(msg: str) -> None:
    """Progress on stderr."""
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def mlflow_server(root: Path) -> Any:
    """An `mlflow server` on SQLite under `root`, on one port across restarts (the outage tests' server:
    `start()`, `kill()`, `url`)."""
    from helpers.servers import MlflowServer

    return MlflowServer(root)


def _cmdlines() -> dict[int, str]:
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                out[int(pid)] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return out


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def _kill(pid: int, sig: int = signal.SIGKILL) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


class Attempt:
    """One `podium run` in its own process group; its output read line by line as it comes."""

    def __init__(self, args: list[str], env: dict[str, str]):
        self.started = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-m", "podium.cli", *args], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def saw(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def wait_for(self, text: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self.saw(text):
                return True
            time.sleep(0.1)
        return self.saw(text)

    def finish(self, timeout_s: float = 900) -> int:
        try:
            rc = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            rc = self.proc.wait()
        self.reader.join(timeout=10)
        return rc


class Stores:
    """Where the soak's runs keep checkpoints (an object store through a relay, or local) and serve (a tmpfs of
    its own when this process may mount one, so that it can be filled)."""

    def __init__(self, home: Path, storage: str):
        self.home, self.server, self.relay, self.mounted = home, None, None, False
        self.store_env: dict[str, str] = {}
        self.serving_fs = home / "serving"
        self.serving_fs.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(self.serving_fs)],
                                  capture_output=True, text=True)
            self.mounted = done.returncode == 0
            if not self.mounted:
                log(f"no tmpfs for serving ({done.stderr.strip()}): disk-full is left out of the draw")
        else:
            log("not root, so no tmpfs for serving: disk-full is left out of the draw")
        self.storage = str(home / "storage")
        if storage == "local":
            return
        from helpers.s3_server import Relay

        if storage == "s3":
            from helpers.s3_server import start_s3_server

            self.server = start_s3_server(home / "moto.log")
            self.server.create_bucket(BUCKET)
            self.relay = Relay(int(self.server.endpoint.rsplit(":", 1)[1]))
            self.store_env = {**self.server.env(), "AWS_ENDPOINT_URL": self.relay.endpoint}
        elif storage == "gs":
            from helpers.object_stores import start_gcs_emulator

            self.server = start_gcs_emulator(home / "gcs.log", BUCKET, preconditions=True)
            self.relay = Relay(int(self.server.endpoint.rsplit(":", 1)[1]))
            self.store_env = {**self.server.env(), "STORAGE_EMULATOR_HOST": self.relay.endpoint}
            import fsspec

            fsspec.config.conf.setdefault("gs", {})["token"] = "anon"  # fsspec read FSSPEC_GCS_TOKEN on import
        else:
            from azure.storage.blob import BlobServiceClient
            from helpers.object_stores import start_azurite

            self.server = start_azurite(home / "azurite.log")
            direct = self.server.env()["AZURE_STORAGE_CONNECTION_STRING"]
            BlobServiceClient.from_connection_string(direct).create_container(BUCKET)
            port = self.server.endpoint.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1]
            self.relay = Relay(int(port))
            self.store_env = {"AZURE_STORAGE_CONNECTION_STRING": direct.replace(
                f"127.0.0.1:{port}", self.relay.endpoint.split("://", 1)[1])}
        self.storage = f"{storage}://{BUCKET}/storage"

    def env(self) -> dict[str, str]:
        """What podium (and this process, for the invariants) needs to reach the store: through the relay."""
        return dict(self.store_env)

    def faults(self) -> list[str]:
        return [f for f in FAULTS if (f != "store-endpoint" or self.relay is not None)
                and (f != "disk-full" or self.mounted)]

    def persisted(self, run_name: str) -> list[str]:
        """The checkpoint folders of a run in storage (local or S3, through podium's own filesystem)."""
        from podium.storage.locations import fsspec_filesystem

        fs, root = fsspec_filesystem(f"{self.storage}/{run_name}")
        fs.invalidate_cache()
        names = [e["name"].rstrip("/").rsplit("/", 1)[-1] for e in (fs.ls(root, detail=True) if fs.exists(root) else [])
                 if e["type"] == "directory"]
        return sorted(n for n in names if n.startswith("checkpoint_"))

    def close(self) -> None:
        if self.relay is not None:
            self.relay.down()
        if self.server is not None:
            self.server.stop()
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.serving_fs)], check=False)


def _inject(fault: str, attempt: Attempt, rng: random.Random, home: Path, mlflow: Any, stores: Stores,
            after: list) -> str:
    """Inject `fault` into a running attempt at a moment drawn from `rng`; returns what was done. What must
    be undone once the attempt has ended (freeing a filled disk) goes on `after`."""
    if fault == "promoter":
        if not attempt.wait_for("training done", 600):
            return "not injected: training never ended"
        time.sleep(rng.uniform(0.0, 2.0))
        os.killpg(attempt.proc.pid, signal.SIGKILL)
        return "podium SIGKILLed after training ended"
    if not attempt.wait_for("checkpoint step", 600):
        return "not injected: no checkpoint announced"
    time.sleep(rng.uniform(0.0, 6.0))
    if attempt.proc.poll() is not None:
        return "not injected: the run had ended"
    if fault == "podium-kill":
        os.killpg(attempt.proc.pid, signal.SIGKILL)
        return "podium's process group SIGKILLed"
    if fault == "podium-ctrl-c":
        os.killpg(attempt.proc.pid, signal.SIGINT)
        return "SIGINT to podium's process group"
    if fault in ("train-worker", "validation"):
        marker = "TrainWorker" if fault == "train-worker" else "podium-validate"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and attempt.proc.poll() is None:
            victims = [pid for pid, cmd in _cmdlines().items()
                       if cmd.startswith("ray::") and marker in cmd and _session(pid) == attempt.proc.pid]
            if victims:
                pid = rng.choice(victims)
                _kill(pid)
                return f"SIGKILL to {marker} process {pid}"
            time.sleep(0.2)
        return f"not injected: no {marker} process ran"
    if fault == "prefect-server":
        state = json.loads((home / "prefect" / "server.json").read_text())
        _kill(int(state["pid"]))
        return f"Prefect server {state['pid']} SIGKILLed (down for this attempt)"
    if fault == "mlflow-server":
        down = rng.uniform(3.0, 20.0)
        mlflow.kill()
        time.sleep(down)
        mlflow.start()
        return f"MLflow server killed, back after {down:.0f} s"
    if fault == "store-endpoint":
        down = rng.uniform(3.0, 40.0)
        stores.relay.down()
        time.sleep(down)
        stores.relay.up()
        return f"the store's endpoint unreachable for {down:.0f} s"
    if fault == "disk-full":
        leave = rng.choice([0, 8 * 1024])  # a promoted version of the demo model takes more than 8 KiB
        from helpers.servers import fill_filesystem

        filler = fill_filesystem(stores.serving_fs, leave)
        after.append(filler.unlink)
        return f"serving's filesystem filled ({leave // 1024} KiB left) until the attempt ended"
    raise ValueError(f"unknown fault {fault!r}")


def check_invariants(run_name: str, home: Path, tracking_uri: str, stores: Stores, model: str = "podium") -> list[str]:
    """The soak's invariants for one completed run; returns the violations (empty: all hold)."""
    from mlflow.tracking import MlflowClient

    from podium.serving.layout import read_current, read_history
    from podium.tracking.client import TAG_CHECKPOINT, TAG_METRICS, TAG_RUN, TAG_SERVED_URI, TAG_STATUS
    from podium.training.promoted import load_promoted_model

    violations = []
    serving = str(home / "serving" / model)
    persisted = stores.persisted(run_name)
    client = MlflowClient(tracking_uri, registry_uri=tracking_uri)
    exp = client.get_experiment_by_name("podium")
    models = client.search_logged_models([exp.experiment_id], filter_string=f"tags.`{TAG_RUN}` = '{run_name}'",
                                         max_results=1000) if exp else []
    by: dict[str, list[Any]] = {}
    for m in models:
        by.setdefault(m.tags.get(TAG_CHECKPOINT, "?"), []).append(m)
    for name in persisted:
        records = by.get(name, [])
        if len(records) != 1:
            violations.append(f"{run_name}/{name}: {len(records)} MLflow records, expected 1")
            continue
        tags = records[0].tags
        if "loss" not in json.loads(tags.get(TAG_METRICS, "{}")):
            violations.append(f"{run_name}/{name}: training metrics missing from the record")
        if tags.get(TAG_STATUS) not in ("validated", "failed", "skipped"):
            violations.append(f"{run_name}/{name}: no verdict (status {tags.get(TAG_STATUS)!r})")
    current = read_current(serving)
    history = read_history(serving)
    if current is not None:
        try:
            alias = client.get_model_version_by_alias(model, "champion")
            if (alias.tags or {}).get(TAG_SERVED_URI) != current.uri:
                violations.append(f"the alias names {alias.tags.get(TAG_SERVED_URI)}, CURRENT is {current.uri}")
        except Exception as exc:
            violations.append(f"no registry alias for CURRENT {current.version}: {exc}")
        try:
            load_promoted_model(serving)
        except Exception as exc:
            violations.append(f"the champion {current.version} does not load: {type(exc).__name__}: {exc}")
    for before, after in zip(history, history[1:]):
        if after.get("previous") != before.get("version"):
            violations.append(f"history gap: {after.get('version')} switched from {after.get('previous')}, "
                              f"the switch before went to {before.get('version')}")
    if history and current is not None and history[-1].get("version") != current.version:
        violations.append(f"the last switch went to {history[-1].get('version')}, CURRENT is {current.version}")
    promotions = [h for h in history if h.get("action") == "promote" and h.get("run_name") == run_name]
    if len(promotions) > 1:
        violations.append(f"{run_name} promoted {len(promotions)} times")
    return violations


def soak(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    home = Path(args.workdir or tempfile.mkdtemp(prefix="podium-chaos-"))
    home.mkdir(parents=True, exist_ok=True)
    mlflow = mlflow_server(home / "mlflow-server")
    mlflow.start()
    stores = Stores(home, args.storage)
    os.environ.update(stores.env())  # the invariants read the store as podium does
    env = {**os.environ, "PODIUM_HOME": str(home), "MLFLOW_TRACKING_URI": mlflow.url}
    for name in ("RAY_ADDRESS", "PREFECT_API_URL"):
        env.pop(name, None)
    faults = [f for f in stores.faults() if not args.faults or f in args.faults.split(",")]
    plan = ["none"] * args.baseline + [rng.choice(faults) for _ in range(args.runs)]
    results = []
    try:
        for i, fault in enumerate(plan):
            run_name = f"soak-{args.seed}-{i:03d}"
            cmd = ["run", "--json", "--run-name", run_name, "--epochs", str(args.epochs), "--storage", stores.storage]
            if args.promotion == "always":  # every run promotes (the runs are alike: the gate would pass only the first)
                cmd.append("--always-promote")
            began, attempts, injected, codes = time.monotonic(), 0, "none", []
            while attempts < MAX_ATTEMPTS:
                attempts += 1
                attempt, after = Attempt(cmd, env), []
                if attempts == 1 and fault != "none":
                    injected = _inject(fault, attempt, rng, home, mlflow, stores, after)
                codes.append(attempt.finish())
                for undo in after:
                    undo()
                (home / "attempts").mkdir(exist_ok=True)  # each attempt's output, for what a violation needs
                (home / "attempts" / f"{run_name}-{attempts}.log").write_text("\n".join(attempt.lines) + "\n")
                if codes[-1] in DONE:
                    break
                if mlflow.proc is None or mlflow.proc.poll() is not None:
                    mlflow.start()
            wall = time.monotonic() - began
            violations = check_invariants(run_name, home, mlflow.url, stores) if codes[-1] in DONE else \
                [f"{run_name}: not complete after {attempts} attempts (exit codes {codes})"]
            results.append({"run": run_name, "fault": fault, "injected": injected, "exit_codes": codes,
                            "wall_s": round(wall, 1), "violations": violations})
            log(f"{run_name}: {fault} ({injected}); exit codes {codes}; {wall:.0f} s; "
                f"{len(violations)} violation(s){': ' + '; '.join(violations) if violations else ''}")
            # every result so far, after each run: a soak stopped early keeps what it found
            (home / "results.json").write_text(json.dumps({"home": str(home), "results": results}, indent=1))
    finally:
        mlflow.kill()
        subprocess.run([sys.executable, "-m", "podium.cli", "server", "stop"], env=env, capture_output=True)
        stores.close()
    return {"home": str(home), "results": results}


def summarize(args: argparse.Namespace, out: dict[str, Any], loads: list[str]) -> str:
    results = out["results"]
    clean = [r["wall_s"] for r in results if r["fault"] == "none"]
    base = statistics.median(clean) if clean else None
    rows = []
    for fault in FAULTS:
        runs = [r for r in results if r["fault"] == fault]
        if not runs:
            continue
        injected = [r for r in runs if not r["injected"].startswith("not injected")]
        costs = [r["wall_s"] - base for r in injected] if base is not None else []
        rows.append([fault, str(len(runs)), str(len(injected)),
                     str(sum(len(r["exit_codes"]) for r in runs)),
                     f"{statistics.median(costs):+.0f} s" if costs else "n/a",
                     f"{min(costs):+.0f} to {max(costs):+.0f} s" if costs else "",
                     str(sum(len(r["violations"]) for r in runs))])
    violations = [v for r in results for v in r["violations"]]
    checked = sum(1 for r in results if r["exit_codes"][-1] in DONE) * 4
    m = machine_description()
    return "\n\n".join([
        "## Chaos soak (`benchmarks/chaos.py`)",
        f"Command: `python benchmarks/chaos.py --runs {args.runs} --seed {args.seed} --epochs {args.epochs}"
        f"{' --storage ' + args.storage if args.storage != 's3' else ''}{' --promotion gate' if args.promotion == 'gate' else ''}"
        f"{' --faults ' + args.faults if args.faults else ''}`. "
        f"Measured {time.strftime('%Y-%m-%d %H:%M %Z')} on {m['cpu']}, {m['cores']} cores, {m['memory']}; "
        f"{m['versions']}.",
        "Load: " + "; ".join(loads),
        f"{len(results) - len(clean)} faulted runs and {len(clean)} fault-free ones (median "
        f"{base:.0f} s each). " if base is not None else "",
        markdown_table(["fault", "runs", "injected", "attempts", "cost (median)", "cost (range)", "violations"], rows),
        f"Invariants checked: {checked} (4 per completed run). Violations: {len(violations)}."
        + ("".join(f"\n- {v}" for v in violations) if violations else "")]) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="A chaos soak of podium runs; see the module's docstring.")
    p.add_argument("--runs", type=int, default=30, help="faulted runs (default: 30)")
    p.add_argument("--seed", type=int, default=1, help="seed of the faults and moments drawn (default: 1)")
    p.add_argument("--epochs", type=int, default=4, help="epochs per run (default: 4)")
    p.add_argument("--baseline", type=int, default=2, help="fault-free runs first, for the cost (default: 2)")
    p.add_argument("--storage", choices=["s3", "gs", "az", "local"], default="s3",
                   help="where checkpoints are persisted: S3 (moto; default), GCS (gcp-storage-emulator), Azure Blob "
                        "(Azurite), each on loopback behind a relay, or local")
    p.add_argument("--promotion", choices=["always", "gate"], default="always",
                   help="always: every run promotes its best checkpoint (--always-promote), so that promotion, the "
                        "switch, the alias and the history are exercised by every run (the default); gate: podium's "
                        "gate decides (identical runs then promote only the first time)")
    p.add_argument("--faults", default="", help="comma-separated faults to draw from (default: all that can run)")
    p.add_argument("--workdir", default="", help="the soak's podium home (default: a new temporary folder)")
    p.add_argument("--output", default="", help="markdown file to update (e.g. BENCHMARKS.md; default: none)")
    p.add_argument("--json", default="", help="write every run's result to this file")
    args = p.parse_args(argv)
    loads = [f"before: {load_average()}"]
    out = soak(args)
    loads.append(f"after: {load_average()}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    text = summarize(args, out, loads)
    if args.output:
        update_markdown_section(args.output, "chaos", text)
    print(text)
    return 1 if any(r["violations"] for r in out["results"]) else 0


if __name__ == "__main__":
    sys.exit(main())
