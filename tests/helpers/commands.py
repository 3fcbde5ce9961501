"""The `podium` command as a user runs it: in its own process, with the environment the test gives."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import time
from pathlib import Path


def podium(args: list[str], env: dict[str, str], check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """`python -m podium.cli ARGS`, its output captured; with `check`, a non-zero exit fails the test with the
    command's output."""
    proc = subprocess.run([sys.executable, "-m", "podium.cli", *args], env=env, capture_output=True, text=True,
                          timeout=600, **kwargs)
    if check and proc.returncode != 0:
        raise AssertionError(f"podium {args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-4000:]}")
    return proc


@contextlib.contextmanager
def environment(env: dict[str, str], cwd: str | Path | None = None):
    """This process's environment replaced by `env` (and its current folder by `cwd`) for the block, as a `podium`
    process started with them would have it; sys.path as it was afterwards (the command puts its folder first)."""
    environ, path, here = dict(os.environ), list(sys.path), os.getcwd()
    os.environ.clear()
    os.environ.update(env)
    try:
        if cwd is not None:
            os.chdir(cwd)
        yield
    finally:
        os.chdir(here)
        sys.path[:] = path
        os.environ.clear()
        os.environ.update(environ)


def podium_in_process(args: list[str], env: dict[str, str], check: bool = True, cwd: str | Path | None = None
                      ) -> subprocess.CompletedProcess:
    """`podium ARGS` called in this process (podium.cli.main.main, as from Python) with `env` and `cwd`, its output
    captured (as `podium`'s, `check` included): for a read of the state a command left, or a case of a behaviour
    whose process is tested in another case. No process is started, and none is counted."""
    from podium.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with environment(env, cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's refusals
            code = exc.code if isinstance(exc.code, int) else 1
    if check and code != 0:
        raise AssertionError(f"podium {args} (in this process) returned {code}:\n{out.getvalue()}\n{err.getvalue()[-4000:]}")
    return subprocess.CompletedProcess(["podium", *args], code, out.getvalue(), err.getvalue())


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


def prefect_servers_of(home) -> list[int]:
    """The pids of `prefect server` processes whose PREFECT_HOME is under `home`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ")
        except OSError:
            continue
        if b"prefect" in cmd and b"server" in cmd and f"PREFECT_HOME={home}".encode() in b"\n".join(environ):
            found.append(int(pid))
    return found
