"""A real S3 server on loopback for the tests: moto in server mode, in its own process.

Clients reach it over HTTP exactly as they would reach MinIO or AWS; nothing is
mocked inside the test process. The credentials are fake (moto accepts any key
until IAM checks are switched on with `enforce_iam`).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REGION = "us-east-1"
FAKE_KEY_ID = "podium-test-key-id"
FAKE_SECRET = "podium-test-secret-do-not-log-0000"  # any value works; tests check it never leaks


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class S3Server:
    """A running `moto_server` process."""

    endpoint: str
    process: subprocess.Popen
    log_path: Path
    _clients: dict[str, Any] = field(default_factory=dict)

    def env(self, key_id: str = FAKE_KEY_ID, secret: str = FAKE_SECRET) -> dict[str, str]:
        """Environment variables that point the AWS chain (and MLflow) at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "MLFLOW_S3_ENDPOINT_URL": self.endpoint,
                "AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret, "AWS_DEFAULT_REGION": REGION}

    def client(self, service: str = "s3", key_id: str = FAKE_KEY_ID, secret: str = FAKE_SECRET) -> Any:
        """A plain botocore client for arranging and inspecting the server's state."""
        import botocore.session

        return botocore.session.get_session().create_client(
            service, endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id=key_id,
            aws_secret_access_key=secret)

    def create_bucket(self, name: str) -> None:
        """Create a bucket (as the unrestricted fake user)."""
        self.client().create_bucket(Bucket=name)

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every key under a prefix."""
        out, token = [], None
        s3 = self.client()
        while True:
            page = s3.list_objects_v2(Bucket=bucket, Prefix=prefix, **({"ContinuationToken": token} if token else {}))
            out += [o["Key"] for o in page.get("Contents", [])]
            token = page.get("NextContinuationToken")
            if not token:
                return out

    def bucket_exists(self, name: str) -> bool:
        """Whether a bucket exists."""
        return name in {b["Name"] for b in self.client().list_buckets().get("Buckets", [])}

    def add_user(self, name: str, actions: list[str]) -> tuple[str, str]:
        """An IAM user allowed `actions` on every resource; returns (key id, secret)."""
        iam = self.client("iam")
        iam.create_user(UserName=name)
        iam.put_user_policy(UserName=name, PolicyName=f"{name}-policy", PolicyDocument=json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        return key["AccessKeyId"], key["SecretAccessKey"]

    def enforce_iam(self) -> None:
        """From now on every request must be signed by a known IAM user and be allowed by its policy."""
        request = urllib.request.Request(f"{self.endpoint}/moto-api/reset-auth", data=b"0", method="POST",
                                         headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(request, timeout=10).read()

    def requests(self, method: str, path_pattern: str) -> list[str]:
        """Request lines of the server's access log matching a method and a path regex."""
        pattern = re.compile(rf'"{method} /{path_pattern}[ ?]')
        return [line for line in self.log_path.read_text(errors="replace").splitlines() if pattern.search(line)]

    def stop(self) -> None:
        """Stop the server process."""
        stop_process(self.process)


def stop_process(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 10 s."""
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def start_s3_server(log_path: Path, timeout_s: float = 60.0, attempts: int = 3) -> S3Server:
    """Start `moto_server` on a free loopback port and wait until it answers.

    A port free when chosen can be taken before moto binds it (servers started side by side pick their ports
    the same way): moto then exits, or another server answers there. Either way it starts again on another
    port, at most `attempts` times."""
    for attempt in range(1, attempts + 1):
        port = free_port()
        endpoint = f"http://127.0.0.1:{port}"
        with open(log_path, "ab") as log:
            env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
            process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                       stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        if _answers_as_moto(endpoint, process, timeout_s):
            return S3Server(endpoint=endpoint, process=process, log_path=Path(log_path))
        process.kill()
        process.wait()
        if attempt == attempts:
            raise RuntimeError(f"moto_server did not answer on a port of its own after {attempts} tries "
                               f"(last {endpoint}, exit code {process.returncode}); see {log_path}")
    raise AssertionError("unreachable")


def _answers_as_moto(endpoint: str, process: subprocess.Popen, timeout_s: float) -> bool:
    """Whether `process` answers on `endpoint` within `timeout_s`: False when it exits first (its port was
    taken) or something else answers there (not moto's JSON: another server won the port)."""
    import http.client

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{endpoint}/moto-api/data.json", timeout=2) as r:
                json.loads(r.read())
            return True
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
        except (http.client.HTTPException, ValueError):
            return False
    return False


def pipe(src: socket.socket, dst: socket.socket) -> None:
    """Copy one direction of a relayed connection until either side ends, then shut both down."""
    try:
        while data := src.recv(1 << 16):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Relay:
    """A TCP relay on loopback in front of a server, that can be cut off and restored.

    `down()` closes the listening socket and every open connection: clients get
    refused connections (and broken requests in flight), as when a store or the
    network to it goes away; the server behind keeps its state (moto keeps
    everything in memory, so restarting it would lose the data). `up()` listens on
    the same port again.
    """

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.up()

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        if listener is not None:
            listener.close()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by down()
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=pipe, args=(a, b), daemon=True).start()
