"""`podium server start|stop`: the local Prefect server of the embedded defaults."""

from __future__ import annotations

import argparse

from podium.services import ensure_prefect_server, stop_prefect_server, ui_url
from podium.settings import PodiumSettings


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add this command's parser and handler."""
    server = sub.add_parser("server", help="Start or stop the local Prefect server of the embedded defaults.")
    server.add_argument("action", choices=["start", "stop"])
    server.set_defaults(func=cmd_server)


def cmd_server(args: argparse.Namespace) -> int:
    """Start or stop the local Prefect server of the embedded defaults."""

    settings = PodiumSettings()
    if args.action == "stop":
        print("stopped" if stop_prefect_server(settings.home_dir) else "no local server was running")
        return 0
    url = ensure_prefect_server(settings.home_dir, settings.prefect_port, settings.prefect_api_url)
    print(f"Prefect API: {url}\nPrefect UI:  {ui_url(url)}")
    return 0
