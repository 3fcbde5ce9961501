"""The embedded Prefect server's start, against a real `prefect server start`."""

from __future__ import annotations

import socket
import urllib.request

import podium.services as services


def test_a_port_taken_before_the_server_binds_it_moves_the_server_to_another(tmp_path, monkeypatch):
    """Another process (another project's podium starting at the same moment) binds the port podium found
    free before the server binds it: the server starts on another port instead of the run failing."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    # the port was free when podium looked; the other process binds it in between
    monkeypatch.setattr(services, "_port_free", lambda p: p == port)
    try:
        url = services.ensure_prefect_server(tmp_path, port)
        assert f":{port}/" not in url
        with urllib.request.urlopen(f"{url}/health", timeout=10) as answer:
            assert answer.status == 200
    finally:
        services.stop_prefect_server(tmp_path)
        taken.close()
