"""The `podium` command as a user runs it: in its own process, with the environment the test gives."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def podium(args: list[str], env: dict[str, str], check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """`python -m podium.cli ARGS`, its output captured; with `check`, a non-zero exit fails the test with the
    command's output."""
    proc = subprocess.run([sys.executable, "-m", "podium.cli", *args], env=env, capture_output=True, text=True,
                          timeout=600, **kwargs)
    if check and proc.returncode != 0:
        raise AssertionError(f"podium {args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-4000:]}")
    return proc


def awaiting_approval(proc: subprocess.Popen, run_name: str, timeout_s: float = 300) -> str:
    """The id of the paused flow run of `run_name`, once the command `proc` (a `podium run` or `promote` with
    approval required) has a candidate awaiting a person's decision; fails the test with the command's output if
    it ends first or `timeout_s` passes."""
    from podium.prefect_api import paused_flow_run

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return paused_flow_run(run_name)
        except LookupError:
            if proc.poll() is not None or time.monotonic() > deadline:
                out, err = proc.communicate(timeout=60)
                raise AssertionError(f"no approval awaited (exit {proc.returncode}):\n{out[-2000:]}\n{err[-4000:]}") from None
            time.sleep(1)


def made_run_home(root: Path, prefect_api: str, shared_ray: Any, mlflow_template_db: Path, code: Path) -> dict[str, str]:
    """The environment of a `podium` process with a home and an MLflow store of its own under `root` (a copy of
    the session's template database), the session's Prefect server and Ray head, and `code` (a folder of the
    run's modules) importable; the train and val datasets of podium_nightly_code written under `root`."""
    from podium_nightly_code import write_data

    shutil.copy(mlflow_template_db, root / "mlflow.db")
    write_data(str(root / "train.parquet"), 100, 0.0, seed=1)
    write_data(str(root / "val.parquet"), 400, 0.1, seed=2)
    return {**os.environ, "PODIUM_HOME": str(root / "home"), "PREFECT_API_URL": prefect_api,
            "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}", **shared_ray.driver_env(),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")]))}
