"""The `podium` command as a user runs it: in its own process, with the environment the test gives."""

from __future__ import annotations

import subprocess
import sys


def podium(args: list[str], env: dict[str, str], check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """`python -m podium.cli ARGS`, its output captured; with `check`, a non-zero exit fails the test with the
    command's output."""
    proc = subprocess.run([sys.executable, "-m", "podium.cli", *args], env=env, capture_output=True, text=True,
                          timeout=600, **kwargs)
    if check and proc.returncode != 0:
        raise AssertionError(f"podium {args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-4000:]}")
    return proc
