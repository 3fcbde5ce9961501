"""One `podium serve` per port: the port is claimed before Ray starts, and held until Serve is down.

Ray Serve's HTTP proxy listens with SO_REUSEPORT, so a second proxy on a port another one holds starts too, and the
kernel shares the clients between them: the first server's clients get answers from another model. `claim_port`
refuses that before Ray starts, in one sentence naming what holds the port:

- another `podium serve`: each one holds an exclusive lock on `<tmp>/podium-serve-ports/<port>.lock` for its life,
  with its process id and serving location written in it (the lock, not the file, says it runs: a killed server's
  lock goes with its process);
- another program: a plain bind of the port fails (its process named from /proc where this user can see it).

Stdlib only: `podium serve`'s driver asks before it loads Ray.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from podium.errors import ServingError

LOCKS = "podium-serve-ports"


class PortHeld(ServingError):
    """The port `podium serve` was asked to listen on is held: by another `podium serve`, or by another program."""


@dataclass
class PortClaim:
    """A port claimed by this process: its lock file stays open (and locked) until `release`."""

    port: int
    lock: IO[str]

    def release(self) -> None:
        """Let the port go (after Serve's proxy stopped listening on it)."""
        self.lock.close()


def lock_path(port: int) -> Path:
    """The lock file of a port, shared by every `podium serve` of this machine's user(s)."""
    return Path(tempfile.gettempdir()) / LOCKS / f"{port}.lock"


def claim_port(host: str, port: int, serving: str) -> PortClaim:
    """Claim `port` for a `podium serve` of `serving` listening on `host`, or raise `PortHeld` saying what holds it."""
    path = lock_path(port)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = open(path, "a+")  # held open for the claim's life: the lock is the claim
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = _holder(lock.read())
        lock.close()
        raise PortHeld(f"port {port} is held by another `podium serve` ({holder}): one `podium serve` per port; "
                       "stop it, or pass another --port") from None
    try:
        _check_free(host, port)
    except PortHeld:
        lock.close()
        raise
    lock.seek(0)
    lock.truncate()
    lock.write(json.dumps({"pid": os.getpid(), "serving": serving, "host": host}))
    lock.flush()
    return PortClaim(port, lock)



def _holder(said: str) -> str:
    try:
        doc = json.loads(said)
        return f"process {doc['pid']}, serving {doc['serving']}"
    except (ValueError, KeyError, TypeError):
        return "its process did not say which"


def _check_free(host: str, port: int) -> None:
    """Raise `PortHeld` if another program listens on `port` (a plain bind, without SO_REUSEPORT, fails)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortHeld(f"port {port} on {host} is held by another program ({_listener(port)}): "
                               "stop it, or pass another --port to `podium serve`") from None
            raise PortHeld(f"cannot listen on {host}:{port} ({exc.strerror}): expected an address of this machine "
                           "(--host) and a port this user may open (--port)") from None


def _listener(port: int) -> str:
    """The process listening on `port`, from /proc, where this user can see it."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    for pid in filter(str.isdigit, os.listdir("/proc") if inodes else []):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in fds):
                said = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                return f"process {pid}: {' '.join(said.split())[:120]}"
        except OSError:
            continue
    return "its process is not visible to this user"
