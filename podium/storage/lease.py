"""Locks on a location: an flock on local paths, a lease object built from an object store's conditional writes.

`location_lock(location, name)` is what podium uses (one promoter per serving location, one
`podium run` per run name); `ObjectLease` is the object store half, on any backend with
conditional writes (podium.storage.backends: S3's If-None-Match / If-Match on ETags, GCS's
generation preconditions, Azure's ETag conditions):

    <serving>/.promotion.lock   {"owner", "host", "pid", "acquired_at", "renewed_at", "ttl_s"}

- Taken with a create-only write: of two promoters, exactly one creates it.
- Renewed by its holder every `ttl_s / 3` with a write conditional on the version it last wrote,
  so nobody else's lease is ever overwritten.
- A holder that dies stops renewing. Once `renewed_at + ttl_s` has passed (the clocks of
  promoters are assumed to agree to well within `ttl_s`), another promoter takes the stale
  lease over with a write conditional on the stale object's version: of several takers, one wins.
- Released with a conditional delete, which removes only our own lease.

A holder that could not renew in time has lost the lease; `check()` then raises, and the
promotion stops before it switches CURRENT. A store that ignored the conditions would not be a lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import posixpath
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from podium.errors import PodiumError
from podium.storage.backends import backend_for
from podium.storage.backends.base import Conflict
from podium.storage.locations import fsspec_filesystem, is_remote, normalize_location
from podium.storage.preflight import check_conditional_writes

logger = logging.getLogger(__name__)


class LeaseError(PodiumError, RuntimeError):
    """The lease could not be taken in time, or was lost while held."""


class ObjectLease:
    """An exclusive, expiring lease on one object of a store with conditional writes (see the module docstring)."""

    def __init__(self, uri: str, ttl_s: float = 60.0, poll_s: float = 0.5):
        if ttl_s <= 0:
            raise ValueError(f"ttl_s = {ttl_s!r}: expected a positive number of seconds")
        self.uri = uri
        self.ttl_s = ttl_s
        self.poll_s = poll_s
        self.backend = backend_for(uri)
        if not self.backend.conditional_writes:
            raise ValueError(f"{uri}: a {self.backend.name} store has no conditional writes to build a lease from")
        self.fs, self.path = fsspec_filesystem(uri)
        self.owner = uuid.uuid4().hex
        self._etag: str | None = None
        self._lost: str | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _body(self, acquired_at: float) -> bytes:
        now = time.time()
        return json.dumps({"owner": self.owner, "host": socket.gethostname(), "pid": os.getpid(),
                           "acquired_at": acquired_at, "renewed_at": now, "ttl_s": self.ttl_s}).encode()

    def _read(self) -> tuple[dict[str, Any], str] | None:
        """The current lease document and its version, or None if there is none."""
        current = self.backend.read_versioned(self.fs, self.path)
        if current is None:
            return None
        body, version = current
        try:
            doc = json.loads(body)
        except ValueError:
            doc = {}  # unreadable: treated as expired
        return doc, version

    # ---------------------------------------------------------------- lifecycle

    def acquire(self, timeout_s: float = 600.0) -> ObjectLease:
        """Take the lease, waiting up to `timeout_s` for its holder to release it or let it expire."""
        check_conditional_writes(posixpath.dirname(self.uri.rstrip("/")))  # no lease on a store that ignores them
        deadline = time.monotonic() + timeout_s
        acquired_at = time.time()
        holder: dict[str, Any] = {}
        waited = False
        while True:
            try:
                self._etag = self.backend.create_versioned(self.fs, self.path, self._body(acquired_at))
                break
            except Conflict:
                pass
            current = self._read()
            if current is not None:
                holder, etag = current
                expires = float(holder.get("renewed_at", 0)) + float(holder.get("ttl_s", 0))
                if time.time() > expires:  # its holder stopped renewing: take it over, one taker wins
                    try:
                        self._etag = self.backend.replace_versioned(self.fs, self.path, self._body(acquired_at), etag)
                        logger.warning("took over the expired lease %s of %s (pid %s on %s)", self.uri,
                                       holder.get("owner"), holder.get("pid"), holder.get("host"))
                        break
                    except (Conflict, FileNotFoundError):
                        pass
                    continue
            if not waited and holder:
                waited = True
                logger.warning("promotion lock %s is held by pid %s on %s; waiting up to %g s for it to be released "
                               "or to expire (%g s after its last renewal)", self.uri, holder.get("pid"),
                               holder.get("host"), timeout_s, float(holder.get("ttl_s", 0)))
            if time.monotonic() > deadline:
                raise LeaseError(f"{self.uri} is held by {_holder_words(holder)} (waited {timeout_s:g} s)")
            time.sleep(self.poll_s)
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew_loop, args=(acquired_at,), name="lease-renewer",
                                         daemon=True)
        self._renewer.start()
        return self

    def _renew_loop(self, acquired_at: float) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            assert self._etag is not None
            try:
                self._etag = self.backend.replace_versioned(self.fs, self.path, self._body(acquired_at), self._etag)
            except (Conflict, FileNotFoundError):  # taken over: we were too slow
                self._lost = f"{self.uri}: the lease was taken over by another promoter"
                logger.error(self._lost)
                return
            except Exception as exc:  # the store is unreachable
                logger.warning("could not renew the lease %s (%s); retrying", self.uri, exc)

    def check(self) -> None:
        """Raise LeaseError if the lease was lost (taken over after it expired)."""
        if self._lost:
            raise LeaseError(self._lost)

    def release(self) -> None:
        """Stop renewing and delete the lease, if it is still ours."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=10)
            self._renewer = None
        if self._etag is None or self._lost:
            return
        try:
            self.backend.delete_versioned(self.fs, self.path, self._etag)
        except Exception as exc:  # someone else's now, or gone; it expires on its own
            logger.warning("could not release the lease %s: %s", self.uri, exc)
        self._etag = None

    def __enter__(self) -> ObjectLease:
        return self if self._etag is not None else self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _holder_words(holder: dict[str, Any]) -> str:
    return f"pid {holder.get('pid')} on {holder.get('host')}" if holder else "another process"


@contextlib.contextmanager
def location_lock(location: str, name: str, timeout_s: float, what: str) -> Iterator[Callable[[], None]]:
    """Hold `<location>/<name>` exclusively for the block; yields a `check()` that raises if the lock was lost.

    Local paths: an flock on the file, released by the kernel if the process dies; the
    holder's pid and host are written into it for the message others get. A store with
    conditional writes: an `ObjectLease` with its backend's TTL (`lease_wait_s`), whose `check()`
    raises once the lease was taken over. Other stores have no lock podium can take: a warning, no lock.
    Waits up to `timeout_s`, then raises LeaseError naming `what` and the holder.
    """
    location = normalize_location(location)
    backend = backend_for(location)
    if is_remote(location) and backend.conditional_writes:
        lease = ObjectLease(posixpath.join(location.rstrip("/"), name), ttl_s=backend.lease_ttl_s())
        try:
            lease.acquire(timeout_s)
        except LeaseError as exc:
            raise LeaseError(f"{what}: {exc}") from None
        try:
            yield lease.check
        finally:
            lease.release()
        return
    if is_remote(location):
        logger.warning("%s: no lock on this store (%s); run one at a time", location, what)
        yield lambda: None
        return
    os.makedirs(location, exist_ok=True)
    with open(os.path.join(location, name), "a+") as f:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    try:
                        f.seek(0)
                        holder = json.loads(f.read() or "{}")
                    except ValueError:
                        holder = {}
                    raise LeaseError(f"{what}: {os.path.join(location, name)} is held by {_holder_words(holder)} "
                                     f"(waited {timeout_s:g} s)") from None
                time.sleep(0.2)
        try:
            f.seek(0)
            f.truncate()
            f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}))
            f.flush()
            yield lambda: None
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def lease_wait_s(location: str) -> float:
    """How long a lock on `location` may stay held by a process that died: 0 for an flock (the kernel frees
    it), the lease's TTL (and a margin) where the lock is a lease that must expire."""
    backend = backend_for(location)
    return backend.lease_ttl_s() + 5 if is_remote(location) and backend.conditional_writes else 0.0
