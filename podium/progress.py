"""Progress lines: what a run says as it goes, on the terminal (the command shows the `podium.progress` logger)
and in the run's log. Plain logging: every layer may say something, a Ray worker's driver side included."""

from __future__ import annotations

import logging

progress_logger = logging.getLogger("podium.progress")


def say(message: str, *args: object) -> None:
    """A progress line for the terminal (the CLI shows podium.progress) and the run's log."""
    progress_logger.info(message, *args)
