"""GCS and Azure Blob emulators on loopback for the tests, each in its own process on a free port.

- GCS: gcp-storage-emulator (PyPI, the test extra), through tests/helpers/gcs_emulator.py; as it is (it
  ignores generation preconditions) or with them honoured (`preconditions=True`).
- Azure Blob: Azurite (npm), installed from tests/helpers/azurite/package-lock.json (`npm ci` there, as
  .ci/run does). Its account and key are made up here; Azurite honours ETag conditions itself.

Clients reach them over HTTP as they would reach the cloud; nothing is mocked in the test process.
`env()` is what points gcsfs / adlfs (and podium's processes) at a server.
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import fsspec
import pytest

from helpers.s3_server import free_port, stop_process

HERE = Path(__file__).resolve().parent
AZURITE = HERE / "azurite" / "node_modules" / ".bin" / "azurite-blob"
AZURE_ACCOUNT = "podiumtest"
AZURE_KEY = base64.b64encode(b"podium-test-key-not-a-secret-0000").decode()  # Azurite takes any base64 key


@dataclass
class Emulator:
    """A running emulator process and the environment that points clients at it."""

    name: str
    endpoint: str
    process: subprocess.Popen
    variables: dict[str, str]

    def env(self) -> dict[str, str]:
        """Environment variables that point gcsfs / adlfs at this server."""
        return dict(self.variables)

    def point_here(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Point this process at the emulator (its environment, and fsspec's GCS settings, which fsspec read
        from FSSPEC_GCS_TOKEN when it was imported) until `monkeypatch` is undone."""
        for name, value in self.env().items():
            monkeypatch.setenv(name, value)
        if self.name == "gcs":
            monkeypatch.setitem(fsspec.config.conf, "gs", {"token": "anon"})

    def stop(self) -> None:
        """Stop the process."""
        stop_process(self.process)


def _wait_for_port(port: int, process: subprocess.Popen, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            time.sleep(0.2)
    return False


def _start(name: str, command: list[str], port: int, log_path: Path, env: dict[str, str],
           timeout_s: float) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env={**os.environ, **env})
    if not _wait_for_port(port, process, timeout_s):
        process.kill()
        process.wait()
        raise RuntimeError(f"{name} did not answer on 127.0.0.1:{port} (exit code {process.returncode}); "
                           f"see {log_path}")
    return process


def start_gcs_emulator(log_path: Path, bucket: str, *, preconditions: bool, timeout_s: float = 60.0) -> Emulator:
    """gcp-storage-emulator with `bucket` made, on a free loopback port."""
    port = free_port()
    command = [sys.executable, str(HERE / "gcs_emulator.py"), str(port), bucket]
    process = _start("gcp-storage-emulator", command + (["--preconditions"] if preconditions else []), port,
                     log_path, {}, timeout_s)
    endpoint = f"http://127.0.0.1:{port}"
    # FSSPEC_GCS_TOKEN: no Google credentials to look for (processes started from the test read it);
    # GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT: gcsfs would ask each bucket's layout over gRPC, which no emulator
    # speaks (a minute's timeout per bucket), before it falls back to JSON
    return Emulator("gcs", endpoint, process, {"STORAGE_EMULATOR_HOST": endpoint, "FSSPEC_GCS_TOKEN": "anon",
                                               "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"})


def install_azurite() -> None:
    """Azurite from its lock file (`npm ci`), the first time a test needs it on this checkout (.ci/run installs it
    beforehand); one test process installs while any other waits (a file lock)."""
    import fcntl
    import shutil

    folder = AZURITE.parents[2]
    with open(folder / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if AZURITE.exists():
            return
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("the Azure Blob tests need Azurite, installed with npm: install Node.js and npm "
                               f"(Debian: apt-get install npm), or run `npm ci` in {folder}")
        subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=folder, check=True,
                       timeout=600, capture_output=True)


def start_azurite(log_path: Path, timeout_s: float = 60.0, key: str = AZURE_KEY) -> Emulator:
    """Azurite's blob service, in memory, with a made-up account, on a free loopback port. The account's `key`
    (base64) reaches Azurite in its environment (AZURITE_ACCOUNTS), never on its command line: a test that
    treats it as a secret passes one of its own."""
    install_azurite()
    port = free_port()
    command = [str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
               "--disableTelemetry", "--skipApiVersionCheck", "--loose", "--silent"]
    process = _start("Azurite", command, port, log_path, {"AZURITE_ACCOUNTS": f"{AZURE_ACCOUNT}:{key}"}, timeout_s)
    endpoint = f"http://127.0.0.1:{port}/{AZURE_ACCOUNT}"
    connection = (f"DefaultEndpointsProtocol=http;AccountName={AZURE_ACCOUNT};AccountKey={key};"
                  f"BlobEndpoint={endpoint};")
    return Emulator("azure", endpoint, process, {"AZURE_STORAGE_CONNECTION_STRING": connection})
