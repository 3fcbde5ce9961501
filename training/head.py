"""Watching the Ray cluster's head while a run depends on it: Ray core only.

When the head's GCS (Ray's control store) stops answering, Ray keeps a driver waiting for it to come back
(`RAY_gcs_rpc_server_reconnect_timeout_s`, 60 s by default) and then ends the process with exit code 1 and
one line of its own: no verdict or record finished, nothing said about resuming. podium probes the GCS
port instead, and when it has refused connections for most of Ray's window (all but `MARGIN_S`), says so
while the process can still end the run cleanly (`on_lost`). A head that returns within that window (GCS
fault tolerance) is ridden out, as Ray rides it out.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator

from podium.progress import say

logger = logging.getLogger(__name__)

RECONNECT_ENV = "RAY_gcs_rpc_server_reconnect_timeout_s"
RAY_RECONNECT_DEFAULT_S = 60.0
MARGIN_S = 15.0  # what podium keeps of Ray's window to end the run: records, states, the last line
HEAD_PROBE_S = 1.0


def lost_after_s() -> float:
    """How long the head may stay unreachable before podium ends the run: Ray's reconnect window less
    MARGIN_S (at least 2 s)."""
    try:
        window = float(os.environ.get(RECONNECT_ENV, RAY_RECONNECT_DEFAULT_S))
    except ValueError:
        window = RAY_RECONNECT_DEFAULT_S
    return max(2.0, window - MARGIN_S)


def _answers(host: str, port: int, timeout_s: float) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def watching_head(on_lost: Callable[[str], None]) -> Iterator[None]:
    """While the block runs, probe the connected cluster's GCS every HEAD_PROBE_S; once it has not answered for
    `lost_after_s()`, call `on_lost(reason)` (once, from the watching thread)."""
    import ray

    address = ray.get_runtime_context().gcs_address
    host, _, port = address.rpartition(":")
    done = threading.Event()
    allowed_s = lost_after_s()

    def watch() -> None:
        down_since: float | None = None
        while not done.wait(HEAD_PROBE_S):
            if _answers(host, int(port), timeout_s=HEAD_PROBE_S):
                if down_since is not None:
                    say("Ray's head at %s answers again", address)
                down_since = None
                continue
            now = time.monotonic()
            if down_since is None:
                down_since = now
                say("Ray's head at %s stopped answering; waiting up to %.0f s for it", address, allowed_s)
            elif now - down_since >= allowed_s:
                on_lost(f"Ray's head at {address} stopped answering (nothing for {now - down_since:.0f} s)")
                return

    thread = threading.Thread(target=watch, name="podium-ray-head-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
