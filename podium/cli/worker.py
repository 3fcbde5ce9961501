"""`podium worker`: a Prefect process worker for podium's deployments."""

from __future__ import annotations

import argparse
import os
import sys

from podium.cli.options import use_ray_address, whole_number
from podium.services import ensure_prefect_server
from podium.settings import PodiumSettings


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add this command's parser and handler."""
    worker = sub.add_parser("worker", help="Run a Prefect process worker for podium's deployments.",
                            description="Run `prefect worker start --type process` for podium's work pool, with "
                                        "RAY_ADDRESS and PODIUM_HOME set for its flow runs. MLFLOW_TRACKING_URI "
                                        "and the other variables of this environment pass through.")
    worker.add_argument("--pool", default="podium", help="Work pool (default: podium; created if missing).")
    worker.add_argument("--ray-address", help="Ray cluster the flow runs use (sets RAY_ADDRESS).")
    worker.add_argument("--limit", type=whole_number, help="Flow runs at once on this worker (default: no limit).")
    worker.set_defaults(func=cmd_worker)


def cmd_worker(args: argparse.Namespace) -> int:
    """Become a Prefect process worker for podium's deployments; flow runs inherit its environment."""

    settings = PodiumSettings()
    api_url = ensure_prefect_server(settings.home_dir, settings.prefect_port, settings.prefect_api_url)
    use_ray_address(args.ray_address)
    # flow runs start in a temporary folder: the embedded defaults must not resolve against it
    env = {**os.environ, "PREFECT_API_URL": api_url, "PODIUM_HOME": str(settings.home_dir)}
    # podium's own records (progress, verdicts, the decision and its reason) go to each flow run's log in
    # Prefect, as a `podium run`'s do
    extra = [n for n in env.get("PREFECT_LOGGING_EXTRA_LOGGERS", "").split(",") if n.strip()]
    env["PREFECT_LOGGING_EXTRA_LOGGERS"] = ",".join(dict.fromkeys([*extra, "podium"]))
    cmd = [sys.executable, "-m", "prefect", "worker", "start", "--pool", args.pool, "--type", "process"]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    print(f"podium worker: pool {args.pool}, Prefect API {api_url}, Ray "
          f"{env.get('RAY_ADDRESS') or 'local (per flow run)'}", flush=True)
    os.execve(sys.executable, cmd, env)
    return 0  # not reached
