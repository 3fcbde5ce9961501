"""`podium serve` as a user runs it (its own process and process group), and clients of its HTTP endpoint."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

from helpers.servers import free_port

VERSION_HEADER = "X-Podium-Version"


@dataclass
class Served:
    """A running `podium serve`: its base URL and process (its output goes to `log`)."""

    url: str
    proc: subprocess.Popen
    log: str

    def output(self) -> str:
        with open(self.log) as f:
            return f.read()


@dataclass
class Answer:
    """One request's outcome: when it was sent and answered (monotonic), its status, the version header."""

    sent: float
    answered: float
    status: int
    version: str | None
    body: str


def call(url: str, body: bytes | None = None, timeout_s: float = 30) -> Answer:
    """GET (no body) or POST JSON to `url`; an HTTP error is an answer too (its status), a refused connection
    is status 0."""
    sent = time.monotonic()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"} if body else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return Answer(sent, time.monotonic(), response.status, response.headers.get(VERSION_HEADER),
                          response.read().decode())
    except urllib.error.HTTPError as exc:
        return Answer(sent, time.monotonic(), exc.code, exc.headers.get(VERSION_HEADER), exc.read().decode())
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        return Answer(sent, time.monotonic(), 0, None, repr(exc))


def stop_podium(proc: subprocess.Popen) -> None:
    """SIGTERM to a `podium` process that owns a Ray (`podium serve`, `podium run`), to it alone, as a supervisor
    stops its main process: podium shuts its Serve and Ray down itself. Sent to its process group, the signal also
    reached Ray's GCS and raylet in the middle of that shutdown, which then waited its 30 s and could leave
    Serve's HAProxy behind. The caller waits, and SIGKILLs the group only if that wait runs out."""
    with suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)


@contextmanager
def serving(location: str, env: dict[str, str], *more: str, ready_s: float = 240) -> Iterator[Served]:
    """`podium serve --serving LOCATION` on a free loopback port, until /health answers 200; stopped with SIGTERM
    to the podium process alone at the end (`stop_podium`), which must end it with exit 0."""
    port = free_port()
    log = tempfile.NamedTemporaryFile("w", prefix="podium-serve-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "podium.cli", "serve", "--serving", location, "--port", str(port),
                             "--poll-s", "0.5", *more], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    served = Served(f"http://127.0.0.1:{port}", proc, log.name)
    try:
        deadline = time.monotonic() + ready_s
        while call(f"{served.url}/health", timeout_s=5).status != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"podium serve never became healthy (exit {proc.poll()}):\n{served.output()}")
            time.sleep(0.5)
        yield served
    finally:
        if proc.poll() is None:
            stop_podium(proc)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise AssertionError(f"podium serve did not stop on SIGTERM:\n{served.output()}") from None
        assert proc.returncode == 0, f"podium serve exited {proc.returncode}:\n{served.output()}"


@dataclass
class Load:
    """Clients posting `body` to /invocations in threads of their own until stopped; every answer is kept."""

    url: str
    body: bytes
    clients: int = 4
    pause_s: float = 0.0  # between a client's requests
    other_body: bytes | None = None  # posted every other request, client k starting with `body` if k is even
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Load:
        lock = threading.Lock()
        bodies = [self.body, self.other_body if self.other_body is not None else self.body]

        def client(k: int) -> None:
            while not self._stop.is_set():
                answer = call(f"{self.url}/invocations", bodies[k % 2])
                with lock:
                    self.answers.append(answer)
                k += 1
                self._stop.wait(self.pause_s)

        self._threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(self.clients)]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def since(self, t: float) -> list[Answer]:
        return [a for a in list(self.answers) if a.sent >= t]

    def wait_for(self, version: str, after: float, timeout_s: float = 120) -> Answer:
        """The first answer from `version` to a request sent after `after`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = [a for a in self.since(after) if a.version == version]
            if found:
                return min(found, key=lambda a: a.sent)
            time.sleep(0.2)
        seen = sorted({a.version for a in self.since(after)}, key=str)
        raise AssertionError(f"no answer from {version} within {timeout_s} s; versions answering: {seen}")


def predictions(answer: Answer) -> list:
    return json.loads(answer.body)["predictions"]


PROMETHEUS_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
PROMETHEUS_LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')


def prometheus_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The samples of metric `name` in a Prometheus text export: each one's labels and value."""
    found = []
    for line in text.splitlines():
        sample = PROMETHEUS_SAMPLE.match(line)
        if sample and sample["name"] == name:
            labels = {m["key"]: m["value"] for m in PROMETHEUS_LABEL.finditer(sample["labels"] or "")}
            found.append((labels, float(sample["value"])))
    return found
