"""Data that outgrows memory: the same podium job on 1x, 4x and 16x the data, before and after streaming.

    python benchmarks/data_scale.py --before-venv /path/to/venv-of-the-commit-before   # ~35 min here
    python benchmarks/data_scale.py --scales demo,1 --before-venv ... --no-s3          # a few minutes

The job: podium's built-in loop and validation, 2 workers, batch 128, `--epochs` epochs (default 2), on
synthetic data (16 float32 features, 4 classes). 1x is 400,000 training rows (one 35 MB Parquet file,
row groups of 65,536 rows) and 40,000 validation rows; kx is k such files of each (16x: 560 MB of
training Parquet). `demo` is `podium make-data`'s dataset (24,000 rows) with podium's default 5 epochs:
what Ray Data costs at small sizes.

"before" runs `podium` from another virtualenv, one where podium is installed from the commit before
(`--before-venv`; see benchmarks/README.md for the three commands that make it); "after" runs this tree
(the data read anew each epoch, streaming), "after-cache" this tree with `training.cache` always (read
once into Ray's object store).

Measured, per run:
- peak RSS (VmHWM) of each Ray Train worker process, sampled from /proc over the podium process tree,
  and of Ray Data's processes (read tasks, split coordinator); for the workers, also the highest private
  memory (RssAnon) and shared memory (RssShmem: the object store's pages it has read) sampled;
- the validation task's peak RSS: the probe validation function (benchmarks/probes/data_scale_probe.py)
  resets its process's peak before calling podium's built-in validation and reports it as a metric, with
  its private memory before the call and the highest during it (sampled every 5 ms);
- epoch time: between consecutive `podium.checkpoint.persisted` events (one checkpoint per epoch), and
  from the start of the train-model task to the first checkpoint (everything before epoch 2 included);
- bytes read from storage: a second run with the data on an S3 server on loopback that counts every
  byte it serves (benchmarks/counting_s3.py), split into training and validation data, and by phase
  (preflight, until the first checkpoint, each later epoch).
Results go to BENCHMARKS.md (section data_scale) and <workdir>/data_scale.json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks.podium_run import persisted_events, prefect_runs  # noqa: E402

PROBES = REPO / "benchmarks" / "probes"
VALIDATE_FN = "data_scale_probe:validate_measured"
ROWS_1X, VAL_ROWS_1X, ROW_GROUP, FEATURES, CLASSES = 400_000, 40_000, 65_536, 16, 4
BUCKET = "bench-data"
ROLES = {"RayTrainWorker": "train", "podium-validate": "validation", "ReadParquet": "data",
         "MapBatches": "data", "SplitCoordinator": "data", "DatasetManager": "data"}
MiB = 1 << 20


def log(msg: str) -> None:
    """Progress on stderr."""
    print(f"[data_scale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Data


def write_part(path: Path, rows: int, seed: int) -> None:
    """One Parquet file of the synthetic job (class centers shared by every part), written in row groups."""
    centers = np.random.default_rng(0).normal(0.0, 1.5, size=(CLASSES, FEATURES))
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([*(pa.field(f"f{i:02d}", pa.float32()) for i in range(FEATURES)), pa.field("label", pa.int64())])
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, rows, ROW_GROUP):
            n = min(ROW_GROUP, rows - start)
            y = rng.integers(0, CLASSES, size=n)
            x = (centers[y] + rng.normal(0.0, 2.0, size=(n, FEATURES))).astype(np.float32)
            writer.write_table(pa.table({**{f"f{i:02d}": x[:, i] for i in range(FEATURES)}, "label": y}, schema=schema))


def make_data(root: Path, scale: str) -> tuple[Path, Path]:
    """The (train, val) folders of a scale, written once."""
    folder = root / f"x{scale}"
    if scale == "demo":
        train, val = folder / "train.parquet", folder / "val.parquet"
        if not train.exists():
            sys.path.insert(0, str(REPO))
            from podium.training.data import make_classification_data

            make_classification_data(str(folder))
        return train, val
    k = int(scale)
    for name, rows, offset in (("train", ROWS_1X, 1000), ("val", VAL_ROWS_1X, 2000)):
        for i in range(k):
            part = folder / name / f"part-{i:02d}.parquet"
            if not part.exists():
                write_part(part, rows, offset + i)
    return folder / "train", folder / "val"


def size_of(path: Path) -> int:
    """Bytes of a Parquet file or folder."""
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*.parquet"))


# ---------------------------------------------------------------------------------------------
# Processes


MEMORY_KEYS = ("VmHWM", "RssAnon", "RssShmem")


def _status_kb(pid: int) -> dict[str, int]:
    """VmHWM (peak RSS), RssAnon (private memory now) and RssShmem (shared memory mapped now: for a Ray
    process, the pages of the object store it has touched) of a process, in KiB."""
    out = dict.fromkeys(MEMORY_KEYS, 0)
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in out:
                out[key] = int(line.split()[1])
    return out


class ProcessSampler(threading.Thread):
    """Every 0.2 s: the peak RSS (VmHWM), the highest private memory (RssAnon) and shared memory (RssShmem)
    seen, and the role (from the process title Ray sets) of every process of this run: Ray's workers
    inherit the podium process's environment, so they carry its PODIUM_HOME (Ray's raylet does not keep
    its workers in the podium process's tree). Nothing else is looked at.

    RSS counts the object-store pages a Ray process has read (shared memory: Ray Data hands blocks to a
    worker zero-copy), which the kernel keeps mapped after the block is freed; RssAnon is what the
    process itself allocated. The sampled maxima can miss a peak shorter than 0.2 s."""

    def __init__(self, home: Path):
        super().__init__(daemon=True)
        self.marker, self.stop = f"PODIUM_HOME={home}".encode(), threading.Event()
        self.peak_kb: dict[str, dict[int, int]] = {k: {} for k in MEMORY_KEYS}
        self.roles: dict[int, set[str]] = {}
        self.ours: dict[int, bool] = {}

    def _is_ours(self, pid: int) -> bool:
        if pid not in self.ours:
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    self.ours[pid] = self.marker in f.read().split(b"\0")
            except OSError:
                return False
        return self.ours[pid]

    def run(self) -> None:
        while not self.stop.is_set():
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit():
                    continue
                pid = int(entry.name)
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        title = f.read().replace(b"\0", b" ").decode(errors="replace")
                    roles = {role for needle, role in ROLES.items() if needle in title}
                    if not roles or not self._is_ours(pid):
                        continue
                    self.roles.setdefault(pid, set()).update(roles)
                    for key, kb in _status_kb(pid).items():
                        self.peak_kb[key][pid] = max(self.peak_kb[key].get(pid, 0), kb)
                except OSError:
                    continue
            self.stop.wait(0.2)

    def peaks_mb(self, role: str, key: str = "VmHWM") -> list[float]:
        """The peak of `key` (one of MEMORY_KEYS) of each process that only ever had `role`, in the order of
        their peak RSS."""
        pids = sorted((p for p, r in self.roles.items() if r == {role} and p in self.peak_kb["VmHWM"]),
                      key=lambda p: self.peak_kb["VmHWM"][p])
        return [self.peak_kb[key].get(p, 0) / 1024 for p in pids]


def variant_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """A podium subprocess's environment: embedded defaults under `home`, the probe importable, nothing
    pointing at real servers (and no PYTHONPATH to this tree: "before" must import its own podium)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL", "RAY_ADDRESS", "PYTHONPATH", "VIRTUAL_ENV")}
    env.update({"PODIUM_HOME": str(home), "PYTHONPATH": str(PROBES), "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1"})
    env.update(extra or {})
    return env


def start_server(bin_dir: Path, home: Path) -> str:
    """`podium server start` of that variant under `home`; returns the API URL."""
    out = subprocess.run([str(bin_dir / "podium"), "server", "start"], env=variant_env(home), capture_output=True,
                         text=True, timeout=300, check=True).stdout
    return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Prefect API"))


def stop_server(bin_dir: Path, home: Path) -> None:
    """`podium server stop` under `home`."""
    subprocess.run([str(bin_dir / "podium"), "server", "stop"], env=variant_env(home), capture_output=True, timeout=60)


def run_podium(bin_dir: Path, home: Path, config: dict[str, Any], workdir: Path,
               env: dict[str, str] | None = None) -> dict[str, Any]:
    """`podium run --json` with `config`; the summary, process peaks and wall time."""
    cfg_path = workdir / f"{config['run_name']}.json"
    cfg_path.write_text(json.dumps(config, indent=2))
    with open(workdir / f"{config['run_name']}.log", "w") as err:
        started = time.time()
        proc = subprocess.Popen([str(bin_dir / "podium"), "run", "--json", "--config", str(cfg_path)],
                                env=variant_env(home, env), stdout=subprocess.PIPE, stderr=err, text=True,
                                cwd=workdir)
        sampler = ProcessSampler(home)
        sampler.start()
        out, _ = proc.communicate(timeout=3600)
        sampler.stop.set()
        sampler.join(timeout=5)
    if proc.returncode != 0:
        tail = (workdir / f"{config['run_name']}.log").read_text()[-3000:]
        raise RuntimeError(f"podium run {config['run_name']} failed (exit {proc.returncode}):\n{tail}")
    return {"summary": json.loads(out.strip().splitlines()[-1]), "started": started, "wall_s": time.time() - started,
            "train_rss_mb": sampler.peaks_mb("train"), "train_private_mb": sampler.peaks_mb("train", "RssAnon"),
            "train_shared_mb": sampler.peaks_mb("train", "RssShmem"), "data_rss_mb": sampler.peaks_mb("data")}


def fit_started(home: Path, run_name: str, since: float) -> float | None:
    """When the train task handed over to Ray Train (its log line; podium before this change has none)."""
    from datetime import datetime

    log_file = home / "logs" / "podium.log"
    if not log_file.exists():
        return None
    for line in log_file.read_text(errors="replace").splitlines():
        if f"run {run_name}: starting Ray Train" in line:
            t = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if t >= since:
                return t
    return None


def timeline(api: str, run: dict[str, Any], home: Path) -> dict[str, Any]:
    """Train-task start, Ray Train's start and each checkpoint's persisted time."""
    name = run["summary"]["run_name"]
    time.sleep(1.5)  # events are flushed in batches
    events = persisted_events(api, name, run["started"])
    tasks = prefect_runs(api, f"{name}-run").get("tasks", [])
    train = next((t for t in tasks if t["name"].startswith("train-model")), {})
    plan = next((t for t in tasks if t["name"].startswith("plan-run")), {})
    fit = fit_started(home, name, run["started"])
    return {"plan_end": plan.get("end"), "train_start": train.get("start"), "train_end": train.get("end"),
            "fit_start": fit or train.get("start"), "persisted": [events[s] for s in sorted(events)]}


# ---------------------------------------------------------------------------------------------
# S3 with a byte count


class CountingS3:
    """benchmarks/counting_s3.py in a subprocess, the bucket made and the data uploaded."""

    def __init__(self, workdir: Path):
        with socket.socket() as sock:  # a free loopback port
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "s3-reads.jsonl"
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.counting_s3", "--port", str(self.port),
                                      "--log", str(self.log_path)], cwd=REPO, stdout=open(workdir / "s3.log", "w"),
                                     stderr=subprocess.STDOUT)
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                    "AWS_DEFAULT_REGION": "us-east-1"}
        for _ in range(150):
            try:
                self.client().list_buckets()
                break
            except Exception:
                time.sleep(0.2)
        self.client().create_bucket(Bucket=BUCKET)
        self.uploaded: set[str] = set()

    def client(self) -> Any:
        import botocore.session

        return botocore.session.get_session().create_client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id="bench",
            aws_secret_access_key="bench")

    def upload(self, local: Path, prefix: str) -> str:
        """Put a file or folder under s3://BUCKET/prefix; its URI."""
        if prefix not in self.uploaded:
            files = [local] if local.is_file() else sorted(local.rglob("*.parquet"))
            c = self.client()
            for f in files:
                key = prefix if local.is_file() else f"{prefix}/{f.relative_to(local)}"
                with open(f, "rb") as body:
                    c.put_object(Bucket=BUCKET, Key=key, Body=body)
            self.uploaded.add(prefix)
        return f"s3://{BUCKET}/{prefix}"

    def reads(self) -> list[dict[str, Any]]:
        """Every counted GET so far."""
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line.strip()]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def bytes_by_phase(reads: list[dict[str, Any]], since: float, prefix: str, tl: dict[str, Any]) -> dict[str, Any]:
    """Bytes served of the training and the validation data of one run: in the preflight (before the
    train task), while the train task prepared (statistics pass, dataset planning), and in each epoch
    (up to its checkpoint's persisted time: reads just before an epoch ends may be the next epoch's)."""
    train_p, val_p = f"/{BUCKET}/{prefix}/train", f"/{BUCKET}/{prefix}/val"
    bounds = [tl["fit_start"], *tl["persisted"]]
    out: dict[str, Any] = {"preflight": {"train": 0, "val": 0}, "setup": {"train": 0, "val": 0},
                           "epochs": [{"train": 0, "val": 0} for _ in tl["persisted"]], "total": {"train": 0, "val": 0}}
    for r in reads:
        if r["t"] < since:
            continue
        kind = "train" if r["path"].startswith(train_p) else "val" if r["path"].startswith(val_p) else None
        if kind is None:
            continue
        out["total"][kind] += r["bytes"]
        if r["t"] < tl["train_start"]:
            out["preflight"][kind] += r["bytes"]
        elif r["t"] < bounds[0]:
            out["setup"][kind] += r["bytes"]
        elif out["epochs"]:
            i = next((k for k, b in enumerate(bounds[1:]) if r["t"] <= b), len(out["epochs"]) - 1)
            out["epochs"][i][kind] += r["bytes"]
    return out


# ---------------------------------------------------------------------------------------------


# settings of a variant beyond the job's: "after-cache" is this tree reading the data once, into the object store
VARIANT_TRAINING: dict[str, dict[str, Any]] = {"after-cache": {"cache": "always"}}


def job_config(run_name: str, train: str, val: str, home: Path, epochs: int, variant: str) -> dict[str, Any]:
    """The same job for every variant (only settings podium had before this change, and the variant's own)."""
    return {"run_name": run_name, "experiment": "data-scale", "storage": str(home / "storage"),
            "serving": str(home / "serving" / run_name), "data": {"train": train, "val": val},
            "training": {"epochs": epochs, **VARIANT_TRAINING.get(variant, {})},
            "validation": {"fn": VALIDATE_FN, "retries": 0, "timeout_s": 3600},
            "promotion": {"verify": "hashes", "always": True}}


def local_run(variant: str, bin_dir: Path, home: Path, api: str, scale: str, data: tuple[Path, Path], epochs: int,
              workdir: Path, rep: int) -> dict[str, Any]:
    """One run of one scale and variant, the data on local files."""
    name = f"{variant}-x{scale}-{rep}"
    run = run_podium(bin_dir, home, job_config(name, str(data[0]), str(data[1]), home, epochs, variant), workdir)
    tl = timeline(api, run, home)
    checkpoints = run["summary"]["checkpoints"]
    p = tl["persisted"]
    def val_mb(key: str) -> float:
        return max(c["metrics"].get(key, float("nan")) for c in checkpoints)

    out = {"wall_s": run["wall_s"], "data_rss_mb": run["data_rss_mb"],
           **{k: run[k] for k in ("train_rss_mb", "train_private_mb", "train_shared_mb")},
           "val_rss_mb": val_mb("val_peak_rss_mb"), "val_private_mb": val_mb("val_peak_private_mb"),
           "val_private_before_mb": val_mb("val_private_before_mb"),
           "first_epoch_s": p[0] - tl["train_start"] if p and tl["train_start"] else None,
           "epoch_s": statistics.median([b - a for a, b in zip(p, p[1:])]) if len(p) > 1 else None,
           "val_accuracy": checkpoints[-1]["metrics"].get("val_accuracy")}
    log(f"{name}: {json.dumps(out)}")
    return out


def s3_run(variant: str, bin_dir: Path, home: Path, api: str, scale: str, data: tuple[Path, Path], epochs: int,
           workdir: Path, s3: CountingS3) -> dict[str, Any]:
    """One run of one scale and variant, the data on the counting S3 server: the bytes it served."""
    prefix = f"x{scale}"
    train_uri = s3.upload(data[0], f"{prefix}/train" + ("/part.parquet" if data[0].is_file() else ""))
    val_uri = s3.upload(data[1], f"{prefix}/val" + ("/part.parquet" if data[1].is_file() else ""))
    run = run_podium(bin_dir, home, job_config(f"{variant}-x{scale}-s3", train_uri, val_uri, home, epochs, variant),
                     workdir,
                     env=s3.env)
    out = {"bytes": bytes_by_phase(s3.reads(), run["started"], prefix, timeline(api, run, home)),
           "wall_s": run["wall_s"], "train_rss_mb": run["train_rss_mb"]}
    log(f"{variant}-x{scale}-s3: {json.dumps(out)}")
    return out


def summarize(variant: str, scale: str, data: tuple[Path, Path], epochs: int, runs: list[dict[str, Any]],
              s3: dict[str, Any] | None) -> dict[str, Any]:
    """The repetitions of one scale and variant: medians of times, peaks of memory."""
    def median(key: str) -> float | None:
        values = [r[key] for r in runs if r[key] is not None]
        return statistics.median(values) if values else None

    out = {"variant": variant, "scale": scale, "epochs": epochs, "runs": runs, "train_bytes": size_of(data[0]),
           "val_bytes": size_of(data[1]), "wall_s": median("wall_s"), "epoch_s": median("epoch_s"),
           "first_epoch_s": median("first_epoch_s"),
           # each run lists its workers in the order of their peak RSS (peaks_mb): the n-th of each key is
           # the same worker's, and the n-th largest of the runs
           **{k: [max(v) for v in zip(*(r.get(k, []) for r in runs))]
              for k in ("train_rss_mb", "train_private_mb", "train_shared_mb")},
           **{k: max(r.get(k, float("nan")) for r in runs) for k in ("val_private_mb", "val_private_before_mb")},
           "data_rss_mb": [max((m for r in runs for m in r["data_rss_mb"]), default=0.0)] if any(
               r["data_rss_mb"] for r in runs) else [],
           "val_rss_mb": max(r["val_rss_mb"] for r in runs), "val_accuracy": median("val_accuracy")}
    if s3 is not None:
        out["s3"] = s3
    return out


def _mb(v: float | None) -> str:
    return "–" if v is None else f"{v:.0f}"


def table(results: list[dict[str, Any]]) -> str:
    """The markdown table of all runs."""
    head = ("| data | variant | training workers, peak RSS (MB) | of which private / shared, peaks (MB) "
            "| validation task, peak RSS (MB) | validation, private: before the call → peak (MB) | Ray Data "
            "processes, peak RSS (MB) | training data read (× the data): before epoch 1 / each epoch | epoch "
            "time (s) | train task start → 1st checkpoint (s) | `podium run` (s) |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n")
    rows = []
    for r in results:
        size = (f"{r['scale']}× ({r['train_bytes'] / MiB:.0f} MB)" if r["scale"] != "demo"
                else f"demo ({r['train_bytes'] / MiB:.1f} MB, 5 epochs)")
        read = "–"
        if "s3" in r:
            b, whole = r["s3"]["bytes"], r["train_bytes"]
            epochs = ", ".join(f"{e['train'] / whole:.2f}" for e in b["epochs"])
            read = f"{b['setup']['train'] / whole:.2f} / {epochs} (preflight: {b['preflight']['train'] / MiB:.2f} MB)"
        data_rss = _mb(max(r["data_rss_mb"])) if r["data_rss_mb"] else "–"
        split = ", ".join(f"{_mb(a)} / {_mb(b)}" for a, b in zip(r.get("train_private_mb", []),
                                                                  r.get("train_shared_mb", []))) or "–"
        val_private = (f"{_mb(r['val_private_before_mb'])} → {_mb(r['val_private_mb'])}"
                       if r.get("val_private_mb", float("nan")) == r.get("val_private_mb") else "–")
        rows.append(f"| {size} | {r['variant']} | {', '.join(_mb(v) for v in r['train_rss_mb']) or '–'} "
                    f"| {split} | {_mb(r['val_rss_mb'])} | {val_private} | {data_rss} | {read} | {_s(r['epoch_s'], 2)} "
                    f"| {_s(r['first_epoch_s'], 1)} | {r['wall_s']:.1f} |")
    return head + "\n".join(rows) + "\n"


def _s(v: float | None, digits: int) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def write_section(path: Path, body: str) -> None:
    """Replace this benchmark's section of BENCHMARKS.md (between its markers), leaving the rest."""
    start, end = "<!-- data_scale:start -->", "<!-- data_scale:end -->"
    text = path.read_text() if path.exists() else ""
    block = f"{start}\n{body}{end}"
    if start in text and end in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def main() -> None:
    """Run the scales for each variant; write the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scales", default="demo,1,4,16", help="comma-separated: demo and multiples of 1x")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--before-venv", help="virtualenv with podium installed from the commit before (else after only)")
    p.add_argument("--variants", default="before,after",
                   help="before (--before-venv), after (this tree), after-cache (this tree, training.cache always)")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs on local files per variant at the demo and 1x scales (medians); larger scales run once")
    p.add_argument("--no-s3", action="store_true", help="skip the runs that count bytes read on S3")
    p.add_argument("--workdir", help="keep data, homes, logs and data_scale.json here (default: a temp folder)")
    p.add_argument("--output", default=str(REPO / "BENCHMARKS.md"))
    a = p.parse_args()
    workdir = Path(a.workdir or tempfile.mkdtemp(prefix="data-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    bins = {"after": Path(sys.executable).parent}
    if a.before_venv:
        bins["before"] = Path(a.before_venv) / "bin"
    bins["after-cache"] = bins["after"]
    variants = [v for v in a.variants.split(",") if v in bins]
    scales = a.scales.split(",")
    log(f"workdir {workdir}; variants {variants}; scales {scales}")
    data = {s: make_data(workdir / "data", s) for s in scales}
    s3 = None if a.no_s3 else CountingS3(workdir)
    homes = {v: workdir / f"home-{v.split('-')[0]}" for v in variants}  # after-cache shares after's server
    apis: dict[str, str] = {}
    saved = workdir / "data_scale.json"  # earlier scales measured into the same workdir stay in the table
    results = [r for r in (json.loads(saved.read_text()) if saved.exists() else [])
               if r["scale"] not in scales or r["variant"] not in variants]
    try:
        for v in variants:
            apis[v] = next((apis[w] for w in apis if homes[w] == homes[v]), None) or start_server(bins[v], homes[v])
        for scale in scales:
            epochs = 5 if scale == "demo" else a.epochs
            runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
            repeat = a.repeat if scale in ("demo", "1") else 1  # the small scales, where times are short and noisy
            for rep in range(repeat):  # the variants in turns: a machine that gets busier slows both
                for v in variants:
                    runs[v].append(local_run(v, bins[v], homes[v], apis[v], scale, data[scale], epochs, workdir, rep))
            for v in variants:
                remote = None if s3 is None else s3_run(v, bins[v], homes[v], apis[v], scale, data[scale], epochs,
                                                        workdir, s3)
                results.append(summarize(v, scale, data[scale], epochs, runs[v], remote))
            saved.write_text(json.dumps(results, indent=2))
    finally:
        for v in {homes[w]: w for w in apis}.values():
            stop_server(bins[v], homes[v])
        if s3 is not None:
            s3.close()
    results.sort(key=lambda r: (-1.0 if r["scale"] == "demo" else float(r["scale"]), r["variant"] != "before"))
    body = (f"Measured {time.strftime('%Y-%m-%d')} on this machine ({os.cpu_count()} cores), `python "
            f"benchmarks/data_scale.py --before-venv DIR --scales {a.scales} --epochs {a.epochs} --repeat {a.repeat}`"
            f"{' --no-s3' if a.no_s3 else ''}; 2 workers, batch 128. "
            "Times are medians of the runs on local files, memory the highest peak of any run.\n\n"
            + table(results))
    write_section(Path(a.output), body)
    print(table(results))


if __name__ == "__main__":
    main()
