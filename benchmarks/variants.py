"""Run one of the bare-Ray-Train variants (a), (b), (c), (f) of the comparison in this process.

    python -m benchmarks.variants --variant a|b|c|f --spec spec.json --out result.json

compare.py starts each variant in a fresh process (fresh Ray, cold workers, as a user
would run it) and reads the JSON it writes. The TorchTrainer is built exactly as
podium's `training.raytrain.fit` builds it (same scaling, run and checkpoint config,
same Ray Train poll interval podium sets), with podium's CheckpointAnnouncer writing
each persisted checkpoint to a file.

(f) is (a) plus the costly validation run back to back on the newest checkpoint by a plain Python
process (`validation_load`, no Ray, no podium) from the first checkpoint to the end of `fit()`: what
any asynchronous validation on the other core costs training on this machine (shared caches, memory
bandwidth, frequency), whoever schedules it. It is the floor under (c) and (d).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time

STARTED = time.time()  # before the heavy imports: the process wall time includes them

import ray  # noqa: E402
import ray.train  # noqa: E402
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ValidationConfig, ValidationTaskConfig  # noqa: E402
from ray.train.torch import TorchTrainer  # noqa: E402

from benchmarks.instrument import ENV as RECORD_ENV  # noqa: E402
from benchmarks.workload import FileSink, append_jsonl, read_jsonl, validate_repeated  # noqa: E402
from podium.storage.locations import arrow_filesystem  # noqa: E402
from podium.training import raytrain  # noqa: E402
from podium.training.ingest import builtin_datasets, dataset_config, podium_data_context  # noqa: E402

LOOPS = {"a": "benchmarks.loops:train_loop_plain", "b": "benchmarks.loops:train_loop_inline_validation",
         "c": "benchmarks.loops:train_loop_ray_validation", "f": "benchmarks.loops:train_loop_plain"}


def init_ray(variant: str, log: str) -> None:
    """A local Ray like podium's `ensure_ray` (3 logical CPUs here: training 1 + Ray Data 1 + validation 1).

    `log` receives Ray Train's validation results in (c) (see benchmarks.instrument)."""
    os.environ.setdefault(raytrain.POLL_INTERVAL_ENV, raytrain.DEFAULT_POLL_INTERVAL_S)
    runtime_env = {"env_vars": {raytrain.POLL_INTERVAL_ENV: os.environ[raytrain.POLL_INTERVAL_ENV],
                                RECORD_ENV: log}}
    if variant == "c":
        runtime_env["worker_process_setup_hook"] = "benchmarks.instrument.install"
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, 3), include_dashboard=False, logging_level=logging.WARNING,
             log_to_driver=False, runtime_env=runtime_env)


def run(variant: str, spec: dict, own_ray: bool = True) -> dict:
    """Train one way; return the timestamps compare.py turns into the table.

    With own_ray=False the caller has started Ray (with init_ray(..., "c")) and keeps it."""
    from podium.imports import resolve_callable

    log = spec["log"]
    load = start_validation_load(spec) if variant == "f" else None
    if own_ray:
        init_ray(variant, log)
    ray_ready = time.time()
    config = {**spec["loop_config"], "bench_log": log, "bench_validate_kwargs": spec["validate_kwargs"]}
    fs, path = arrow_filesystem(spec["storage"])
    validation_config = None
    if variant == "c":
        validation_config = ValidationConfig(fn=validate_repeated,
                                             task_config=ValidationTaskConfig(fn_kwargs=spec["validate_kwargs"]),
                                             ray_remote_kwargs={"num_cpus": 1})
    fit_start = time.time()
    trainer = TorchTrainer(
        train_loop_per_worker=resolve_callable(LOOPS[variant]),
        train_loop_config=config,
        scaling_config=ray.train.ScalingConfig(num_workers=1, use_gpu=False, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name=spec["run_name"], storage_path=path, storage_filesystem=fs,
                             callbacks=[raytrain.CheckpointAnnouncer(spec["run_name"], [FileSink(log)])],
                             failure_config=FailureConfig(max_failures=0),
                             checkpoint_config=CheckpointConfig(num_to_keep=None)),
        validation_config=validation_config,
        # the built-in loop reads its shard from Ray Data, as under podium
        datasets=builtin_datasets(config, data_cpus=1), dataset_config=dataset_config(data_cpus=1),
    )
    with podium_data_context(data_cpus=1):
        result = trainer.fit()
    fit_end = time.time()
    if load is not None:
        load.terminate()  # it records the validation it was in, then exits (validation_load)
        load.wait()
    best_step, best_value = None, None
    if variant == "b":
        recorded = [r for r in read_jsonl(log) if r["kind"] == "recorded"]
        if recorded:
            best = min(recorded, key=lambda r: (r["metrics"]["val_loss"], -r["step"]))
            best_step, best_value = best["step"], best["metrics"]["val_loss"]
    elif variant == "c":
        validated = [(c, m) for c, m in (result.best_checkpoints or []) if "val_loss" in m]
        if validated:
            c, m = min(validated, key=lambda cm: (cm[1]["val_loss"], -cm[1].get("step", 0)))
            best_step, best_value = m.get("step"), m["val_loss"]
    best_chosen = time.time()
    if own_ray:
        ray.shutdown()
    return {"variant": variant, "process_start": STARTED, "ray_ready": ray_ready, "fit_start": fit_start,
            "fit_end": fit_end, "best_chosen": best_chosen if variant in ("b", "c") else None, "best_step": best_step,
            "best_value": best_value, "process_end": time.time()}


def start_validation_load(spec: dict) -> subprocess.Popen:
    """(f)'s validation: `validation_load` in a process of its own (started before Ray, so its imports
    overlap Ray's start, not training). OMP_NUM_THREADS=1 as Ray sets it for a task with num_cpus=1:
    pyarrow and torch size their thread pools by it."""
    return subprocess.Popen([sys.executable, "-m", "benchmarks.variants", "--validation-load", "--spec",
                             spec["spec_path"]], env={**os.environ, "OMP_NUM_THREADS": "1"})


def validation_load(spec: dict) -> None:
    """Validate the newest persisted checkpoint, back to back, until killed: the costly validation with
    nothing around it. It waits for the first checkpoint, as every asynchronous validation does, and runs
    at the niceness of a Ray worker, as the validations of (c) and (d) do."""
    from podium.imports import yield_to_ray_workers

    yield_to_ray_workers()
    current = {"cpu0": time.thread_time()}

    def stopped(*_: object) -> None:  # the validation under way when training ended: its CPU time so far
        append_jsonl(spec["timing_log"], {"kind": "validation_stopped",
                                          "cpu_s": time.thread_time() - current["cpu0"]})
        os._exit(0)

    signal.signal(signal.SIGTERM, stopped)
    while True:
        current["cpu0"] = time.thread_time()
        persisted = [e for e in read_jsonl(spec["log"]) if e["kind"] == "persisted" and e.get("checkpoint_uri")]
        if not persisted:
            time.sleep(0.05)
            continue
        newest = max(persisted, key=lambda e: e["step"])
        path = newest["checkpoint_uri"].removeprefix("file://")
        validate_repeated(ray.train.Checkpoint.from_directory(path), step=newest["step"], **spec["validate_kwargs"])


def main() -> None:
    """CLI of one variant run."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", choices=sorted(LOOPS))
    p.add_argument("--spec", required=True)
    p.add_argument("--out")
    p.add_argument("--validation-load", action="store_true", help="run (f)'s validation (until killed)")
    a = p.parse_args()
    with open(a.spec) as f:
        spec = {**json.load(f), "spec_path": a.spec}
    if a.validation_load:
        validation_load(spec)
        return
    if not a.variant or not a.out:
        p.error("--variant and --out are required (unless --validation-load)")
    out = run(a.variant, spec)
    with open(a.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
