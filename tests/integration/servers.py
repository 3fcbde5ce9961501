"""Helpers for tests that start servers of their own (Prefect, MLflow) as processes."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path


def wait_http_ok(url: str, proc: subprocess.Popen, log: Path, timeout_s: float, poll_s: float = 1.0) -> None:
    """Wait until `url` answers 200; fail with the server's log if it exits or takes longer than `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:4]} exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(poll_s)
    raise RuntimeError(f"{url} not healthy after {timeout_s:g} s:\n{log.read_text()[-3000:]}")
