"""The job every benchmark runs: data, sizes, the costly validation function, and the timing records.

Everything here is importable inside Ray workers (no prefect, no mlflow): the
validation function below is what (b), (c) and podium all call, so the four ways
of running the job validate with the very same code.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ray.train
import torch

from podium.core.events import CheckpointEvent
from podium.training.checkpoint import CheckpointMeta, load_model, save_checkpoint
from podium.training.data import load_arrays, make_classification_data
from podium.training.model import ModelSpec, build_model, evaluate

VALIDATE_FN = "benchmarks.workload:validate_repeated"


@dataclass
class Workload:
    """Sizes of the benchmark job. `repeat` is filled by `calibrate` unless given."""

    name: str
    train_rows: int
    val_rows: int
    epochs: int
    hidden_size: int = 256
    batch_size: int = 128
    learning_rate: float = 1e-3
    features: int = 16
    classes: int = 4
    checkpoint_every_steps: int | None = None
    # validation cost as a multiple of one training epoch (1.2: a little slower than training, so a
    # one-at-a-time validator falls behind by ~20% of an epoch per checkpoint and the backlog shows)
    val_cost_epochs: float = 1.2
    repeat: int | None = None
    calibration: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON)."""
        return asdict(self)


PRESETS: dict[str, Workload] = {
    # ~3 s epochs on one core of this machine, 10 checkpoints: enough for p50/p95 and a visible backlog
    "full": Workload("full", train_rows=240_000, val_rows=20_000, epochs=10),
    "quick": Workload("quick", train_rows=60_000, val_rows=10_000, epochs=5),
    "smoke": Workload("smoke", train_rows=4_000, val_rows=1_000, epochs=2, hidden_size=32, repeat=20),
}


def make_data(workload: Workload, out_dir: str) -> tuple[str, str]:
    """Write the synthetic train/val Parquet files (podium's own generator) once per folder."""
    train, val = os.path.join(out_dir, "train.parquet"), os.path.join(out_dir, "val.parquet")
    if os.path.exists(train) and os.path.exists(val):
        return train, val
    return make_classification_data(out_dir, train_rows=workload.train_rows, val_rows=workload.val_rows,
                                    num_features=workload.features, num_classes=workload.classes, seed=0)


def feature_columns(workload: Workload) -> list[str]:
    """Column names make_classification_data writes."""
    return [f"f{i:02d}" for i in range(workload.features)]


# The training data is read once into Ray's object store in every way (podium's `training.cache`, which
# `auto` would choose for data this size): otherwise Ray Data's read tasks run each epoch outside the pinned
# train worker, on the validation's core, and the costly validation no longer costs what calibration says.
TRAINING_CACHE = "always"
# and no feature standardisation, in every way: podium's default computes the statistics in one Ray Data
# pass at the start of training, which a bare TorchTrainer of this job does not do (the data is generated
# on one scale), so the ways train the same job


def loop_config(workload: Workload, train: str, val: str) -> dict[str, Any]:
    """The config dict podium's plan_run hands the built-in loop, built for the same job."""
    return {
        "epochs": workload.epochs, "batch_size": workload.batch_size, "learning_rate": workload.learning_rate,
        "hidden_size": workload.hidden_size, "checkpoint_every_steps": workload.checkpoint_every_steps,
        "seed": 0, "torch_threads": 1, "train_data": train, "train_rows": workload.train_rows, "val_data": val,
        "label_column": "label",
        "feature_columns": feature_columns(workload), "num_classes": workload.classes, "cache": TRAINING_CACHE,
        "standardize": False,
    }


def validate_kwargs(workload: Workload, val: str, timing_log: str | None) -> dict[str, Any]:
    """Keyword arguments of `validate_repeated` (podium adds step and run_name itself)."""
    return {"val_data": val, "label_column": "label", "feature_columns": feature_columns(workload),
            "torch_threads": 1, "repeat": int(workload.repeat or 1), "timing_log": timing_log}


def podium_config(workload: Workload, *, run_name: str, train: str, val: str, storage: str, serving: str,
                  timing_log: str | None, concurrency: int = 1, verify: str | None = None,
                  repeat: int | None = None) -> dict[str, Any]:
    """The same job as a podium config file (one worker on one CPU, validation on one CPU)."""
    kwargs = validate_kwargs(workload, val, timing_log)
    kwargs = {k: v for k, v in kwargs.items() if k in ("repeat", "timing_log")}
    if repeat is not None:
        kwargs["repeat"] = repeat
    return {
        "run_name": run_name, "experiment": "bench", "storage": storage, "serving": serving,
        "data": {"train": train, "val": val},
        "training": {"epochs": workload.epochs, "batch_size": workload.batch_size,
                     "learning_rate": workload.learning_rate, "hidden_size": workload.hidden_size,
                     "checkpoint_every_steps": workload.checkpoint_every_steps, "torch_threads": 1,
                     "cache": TRAINING_CACHE, "standardize": False},
        "scaling": {"num_workers": 1, "cpus_per_worker": 1},
        "validation": {"fn": VALIDATE_FN, "kwargs": kwargs, "concurrency": concurrency, "num_cpus": 1,
                       "retries": 0, "timeout_s": 3600},
        # each run serves from a serving location of its own, and podium gives one registry alias to one location
        # (`champion` names the first location's): each location's alias is its run's name
        "promotion": {"alias": re.sub(r"[^\w-]", "-", run_name), **({"verify": verify} if verify else {})},
    }


def append_jsonl(path: str, record: dict[str, Any]) -> None:
    """Append one JSON line; a single O_APPEND write, so concurrent writers do not interleave."""
    data = (json.dumps(record) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def is_verification(record: dict[str, Any], serving: str) -> bool:
    """A timing record of a validation call on a promoted copy (podium's verification), not on a checkpoint."""
    path = record.get("path", "")
    return path.startswith(serving) or "/versions/" in path


def validation_cpu_s(timing_log: str, serving: str | None = None) -> float:
    """The validation function's own CPU seconds over every checkpoint's validation `timing_log` recorded, the
    one stopped half-way at the end of (f) included (none: 0). Calls on a promoted copy (under `serving`)
    are left out: that verification is podium's own work."""
    return sum(r.get("cpu_s", 0.0) for r in read_jsonl(timing_log)
               if r.get("kind") in ("validation", "validation_stopped")
               and not (serving and is_verification(r, serving)))


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """Every record of a JSONL file (none if it does not exist)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def validate_repeated(
    checkpoint: ray.train.Checkpoint,
    val_data: str,
    label_column: str = "label",
    feature_columns: list[str] | None = None,
    torch_threads: int = 1,
    repeat: int = 1,
    timing_log: str | None = None,
    step: int | None = None,
) -> dict[str, float]:
    """podium's built-in validation, made costly: the validation set is evaluated `repeat` times.

    It stands in for a validation set `repeat` times larger (or test-time augmentation with
    `repeat` passes): the same load, the same model, `repeat` times the arithmetic. The result
    is the same as one pass, so podium's verification of the promoted copy still agrees.
    Each call appends its start and end time, and its own CPU time (this thread's: torch computes on it
    alone), to `timing_log`.
    """
    started, cpu0 = time.time(), time.thread_time()
    torch.set_num_threads(torch_threads)
    with checkpoint.as_directory() as d:
        model, meta = load_model(d)
    x, y = load_arrays(val_data, label_column, feature_columns or meta.feature_columns)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(max(1, int(repeat))):
        m = evaluate(model, xt, yt)
    ended = time.time()
    if timing_log:
        append_jsonl(timing_log, {"kind": "validation", "checkpoint": os.path.basename(checkpoint.path.rstrip("/")),
                                  "path": checkpoint.path, "step": step if step is not None else meta.step,
                                  "start": started, "end": ended, "cpu_s": time.thread_time() - cpu0,
                                  "pid": os.getpid()})
    return {"val_loss": m["loss"], "val_accuracy": m["accuracy"]}


class FileSink:
    """An EventSink for podium's CheckpointAnnouncer that appends each announcement to a JSONL file.

    (a), (b) and (c) use podium's own Ray Train callback with this sink, so "persisted"
    means the same moment (CheckpointEvent.persisted_at) in all four ways.
    """

    def __init__(self, path: str):
        self.path = path

    def put(self, event: CheckpointEvent) -> None:
        """Record the announcement."""
        append_jsonl(self.path, {"kind": "persisted", **event.to_dict()})


def calibrate(workload: Workload, train: str, val: str, cpus: set[int] | None = None,
              other: set[int] | None = None) -> Workload:
    """Measure here, on `cpus` (the training core) with one torch thread: an epoch, twice (the two must
    agree for the calibration to be trusted), and one validation pass. Set `repeat` (unless given) so
    that a validation costs about `val_cost_epochs` epochs, then time one whole validation
    (`validate_repeated` on a real checkpoint: loading included), which is what every way is checked against.

    With `other` (the validation's cores) that validation is timed where the ways run it: on `other`, while
    a training loop of the same shape runs on `cpus`. Two busy cores slow each other (shared caches and
    memory), so a validation next to training costs more than one alone; `validation_alone_s` keeps the
    latter."""
    before = os.sched_getaffinity(0) if cpus else None
    if cpus:
        os.sched_setaffinity(0, cpus)
    try:
        torch.set_num_threads(1)
        torch.manual_seed(0)
        cols = feature_columns(workload)
        x, y = (torch.from_numpy(a) for a in load_arrays(train, "label", cols))
        xv, yv = (torch.from_numpy(a) for a in load_arrays(val, "label", cols))
        spec = ModelSpec(workload.features, workload.classes, workload.hidden_size)
        model = build_model(spec)
        opt = torch.optim.Adam(model.parameters(), lr=workload.learning_rate)
        steps = math.ceil(len(x) / workload.batch_size)
        sample = min(steps, max(20, steps // 4))
        epochs = []
        for _ in range(2):
            t = time.perf_counter()
            for b in range(sample):
                i = slice(b * workload.batch_size, (b + 1) * workload.batch_size)
                loss = torch.nn.functional.cross_entropy(model(x[i]), y[i])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            epochs.append((time.perf_counter() - t) * steps / sample)
        evaluate(model, xv, yv)
        t = time.perf_counter()
        for _ in range(3):
            evaluate(model, xv, yv)
        pass_s = (time.perf_counter() - t) / 3
        epoch_s = min(epochs)
        if not workload.repeat:
            workload.repeat = max(1, round(workload.val_cost_epochs * epoch_s / pass_s))
        with tempfile.TemporaryDirectory(prefix="bench-calibrate-") as d:
            meta = CheckpointMeta(model=spec, epoch=1, step=1, metrics={}, config={}, feature_columns=cols,
                                  label_column="label")
            save_checkpoint(d, model, None, meta)
            checkpoint = ray.train.Checkpoint.from_directory(d)
            kwargs = validate_kwargs(workload, val, None)
            validate_repeated(checkpoint, **{**kwargs, "repeat": 1})  # warm: files, torch
            alone_s = validation_s = _timed(lambda: validate_repeated(checkpoint, **kwargs))
            if cpus and other:
                os.sched_setaffinity(0, other)
                with training_load(workload, cpus):
                    validation_s = _timed(lambda: validate_repeated(checkpoint, **kwargs))
    finally:
        if before:
            os.sched_setaffinity(0, before)
    workload.calibration = {"epoch_s": round(epoch_s, 3), "epoch_spread": round(max(epochs) / min(epochs) - 1, 3),
                            "val_pass_s": round(pass_s, 4), "validation_s": round(validation_s, 3),
                            "validation_alone_s": round(alone_s, 3)}
    return workload


def _timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


# the job's model (podium's MLP) training on random data until stopped: the load of calibrate's second timing
_LOAD = """
import os, sys, torch
from podium.training.model import ModelSpec, build_model
os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(",")})
torch.set_num_threads(1)
f, h, k, b = (int(v) for v in sys.argv[2:6])
m = build_model(ModelSpec(f, k, h))
opt = torch.optim.Adam(m.parameters())
x, y = torch.randn(b * 64, f), torch.randint(0, k, (b * 64,))
print("busy", flush=True)
while True:
    for i in range(64):
        loss = torch.nn.functional.cross_entropy(m(x[i * b:(i + 1) * b]), y[i * b:(i + 1) * b])
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
"""


@contextlib.contextmanager
def training_load(workload: Workload, cpus: set[int]) -> Iterator[None]:
    """A process training on `cpus` for the duration of the block."""
    proc = subprocess.Popen([sys.executable, "-c", _LOAD, ",".join(map(str, sorted(cpus))), str(workload.features),
                             str(workload.hidden_size), str(workload.classes), str(workload.batch_size)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # "busy": torch imported, training
        time.sleep(0.5)
        yield
    finally:
        proc.kill()
        proc.wait()


def uploaded_at(checkpoint_dir: str | None) -> float | None:
    """When Ray Train finished writing a checkpoint to (local) storage: the newest file mtime in it."""
    if not checkpoint_dir or not os.path.isdir(checkpoint_dir):
        return None
    times = [os.stat(os.path.join(root, f)).st_mtime for root, _, files in os.walk(checkpoint_dir) for f in files]
    return max(times) if times else None


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear interpolation; None for no values."""
    xs = sorted(v for v in values if v is not None and math.isfinite(v))
    if not xs:
        return None
    k = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def machine_description() -> dict[str, str]:
    """CPU, cores, memory, OS and the versions that matter."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            mem = f"{kb / 2**20:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    import mlflow
    import prefect
    import pyarrow
    import ray

    try:
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        rev = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        revision = f"{rev}{' + uncommitted changes' if dirty else ''}"
    except (OSError, subprocess.SubprocessError):
        revision = "unknown"
    return {"cpu": cpu, "cores": str(os.cpu_count()), "memory": mem, "revision": revision,
            "os": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
            "versions": f"torch {torch.__version__}, ray {ray.__version__}, prefect {prefect.__version__}, "
                        f"mlflow {mlflow.__version__}, pyarrow {pyarrow.__version__}"}


def load_average() -> str:
    """`uptime` as text (the machine is shared: the numbers depend on it)."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load: " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def update_markdown_section(path: str | Path, key: str, body: str, title: str = "# podium benchmarks") -> None:
    """Replace the block between <!-- key:start --> and <!-- key:end --> in `path` (append it if absent)."""
    p = Path(path)
    text = p.read_text() if p.exists() else f"{title}\n\n"
    start, end = f"<!-- {key}:start -->", f"<!-- {key}:end -->"
    block = f"{start}\n{body.rstrip()}\n{end}"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    p.write_text(text)


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table."""
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def fmt(v: float | None, digits: int = 1, suffix: str = "") -> str:
    """A number for a table cell ('–' for none)."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return f"{v:.{digits}f}{suffix}"


def start_moto(workdir: Path) -> Any:
    """moto in server mode on loopback (the same server the tests use), with fake credentials for this
    process; the caller stops it (`.stop()`)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the tests' helpers package
    from helpers.s3_server import start_s3_server

    server = start_s3_server(workdir / "moto.log")
    os.environ.update(server.env())
    return server
