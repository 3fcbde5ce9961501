"""The deployments podium declares: a scheduled training run and an on-demand promotion.

    python -m deployments serve [--config podium.toml] [--cron "0 2 * * *"] [--timezone UTC]

serves them from this process (Prefect's `serve`), against PREFECT_API_URL;
runs started from the UI or by the schedule execute here.
"""

from __future__ import annotations

import argparse
from typing import Any

from prefect.deployments.runner import RunnerDeployment
from prefect.schedules import Cron

from flows.pipeline import train_validate_promote
from flows.promote import promote_run
from training.config import PipelineConfig

NIGHTLY = "nightly-training"
PROMOTE = "promote-on-demand"


def build_deployments(config: PipelineConfig, cron: str = "0 2 * * *", timezone: str = "UTC") -> list[RunnerDeployment]:
    """The scheduled train-validate-promote deployment and the on-demand promotion deployment."""
    params: dict[str, Any] = {"config": config.model_dump(mode="json")}
    nightly = train_validate_promote.to_deployment(
        name=NIGHTLY, schedule=Cron(cron, timezone=timezone), parameters=params, tags=["podium", "training"],
        description="Train, validate every checkpoint as it lands, promote the best if it beats the champion.",
    )
    promote = promote_run.to_deployment(
        name=PROMOTE, parameters=params, tags=["podium", "promotion"],
        description="Promote the best validated checkpoint of the run named in the config.",
    )
    return [nightly, promote]


def main(argv: list[str] | None = None) -> None:
    """Serve podium's deployments from this process."""
    from prefect import serve

    from podium.cli import CliError, config_from_args
    from podium.settings import PodiumSettings

    parser = argparse.ArgumentParser(prog="python -m deployments", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["serve"])
    parser.add_argument("--config", help="TOML or JSON run configuration (as for `podium run`).")
    parser.add_argument("--cron", default="0 2 * * *", help="Schedule of the training deployment.")
    parser.add_argument("--timezone", default="UTC", help="Time zone of the schedule.")
    args = parser.parse_args(argv)
    from podium.cli import OPTIONS

    for flag, *_ in OPTIONS:
        setattr(args, flag[2:].replace("-", "_"), None)
    try:
        config = config_from_args(args, PodiumSettings())
    except CliError as exc:
        raise SystemExit(f"podium: {exc}") from None
    serve(*build_deployments(config, args.cron, args.timezone))
