"""Where podium keeps its embedded state, and which servers it talks to. Built when asked for, never at import."""

from __future__ import annotations

import getpass
import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def current_user() -> str:
    """Who runs this process, for the records that say who did something: the login name, or the uid for a
    container user without one."""

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


class PodiumSettings(BaseSettings):
    """Environment-driven settings. The tools' own variables (MLFLOW_TRACKING_URI, PREFECT_API_URL,
    RAY_ADDRESS) win over podium's embedded defaults."""

    model_config = SettingsConfigDict(env_prefix="PODIUM_", extra="ignore")

    home: Path = Field(Path(".podium"), description="Project-local folder for the embedded defaults.")
    tracking_uri: str | None = Field(
        None, validation_alias=AliasChoices("MLFLOW_TRACKING_URI", "PODIUM_TRACKING_URI"),
        description="MLflow tracking URI; default: a SQLite file under home.")
    prefect_api_url: str | None = Field(
        None, validation_alias=AliasChoices("PREFECT_API_URL", "PODIUM_PREFECT_API_URL"),
        description="Prefect API; default: a local `prefect server` podium starts under home.")
    prefect_port: int = Field(4200, description="Port of the local Prefect server podium starts.")
    cost_log: Path | None = Field(
        None, description="A file to which every costly start (a Ray Train run, a Prefect or MLflow server podium "
                          "starts, a `podium` command) appends one line: what a test suite or a benchmark cost, "
                          "counted where it happens (`count_start`).")
    mlflow_ui_url: str | None = Field(
        None, description="Base URL of an MLflow UI on the tracking store, for the links podium prints; default: "
                          "the tracking URI if it is an `mlflow server`, else none (`podium ui` starts one).")

    @property
    def home_dir(self) -> Path:
        """Absolute home folder."""
        return self.home.expanduser().resolve()

    def resolved_tracking_uri(self) -> str:
        """MLflow tracking URI (SQLite under home unless configured)."""
        return self.tracking_uri or f"sqlite:///{self.home_dir / 'mlflow.db'}"

    def mlflow_ui(self, tracking_uri: str) -> str | None:
        """Where an MLflow UI on this store is, as configured: PODIUM_MLFLOW_UI_URL, else the tracking URI
        of an `mlflow server` (it serves the UI too); None when nothing says (never a guessed port)."""
        if self.mlflow_ui_url:
            return self.mlflow_ui_url.rstrip("/")
        if tracking_uri.startswith(("http://", "https://")):
            parts = urlsplit(tracking_uri.rstrip("/"))
            return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))  # no credentials in links
        return None

    def default_location(self, name: str) -> str:
        """A default location under home: storage, serving, data."""
        return str(self.home_dir / name)

    def ray_address(self) -> str | None:
        """RAY_ADDRESS if set (podium connects to that cluster), else None (local Ray)."""
        return os.environ.get("RAY_ADDRESS") or None


COSTS = ("ray_train", "prefect_server", "mlflow_server", "podium")  # what `count_start` counts


def count_start(what: str) -> None:
    """Append one line (`what`, this process's id, and the test file pytest names in PYTEST_CURRENT_TEST, which
    a `podium` process a test starts inherits, else `-`) to PODIUM_COST_LOG, if it names a file: one append of
    a few bytes, which concurrent processes do not interleave. Nothing without the variable."""
    if what not in COSTS:
        raise ValueError(f"count_start({what!r}): expected one of {COSTS}")
    path = PodiumSettings().cost_log
    if path is None:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            where = os.environ.get("PYTEST_CURRENT_TEST", "-").split("::")[0].split()[0] or "-"
            os.write(fd, f"{what} {os.getpid()} {where}\n".encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # a count is never worth failing the work it counts
