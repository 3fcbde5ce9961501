"""Where podium keeps its embedded state, and which servers it talks to. Built when asked for, never at import."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


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
    mlflow_ui_url: str = Field("http://127.0.0.1:5000", description="Base URL printed for the MLflow UI.")

    @property
    def home_dir(self) -> Path:
        """Absolute home folder."""
        return self.home.expanduser().resolve()

    def resolved_tracking_uri(self) -> str:
        """MLflow tracking URI (SQLite under home unless configured)."""
        return self.tracking_uri or f"sqlite:///{self.home_dir / 'mlflow.db'}"

    def default_location(self, name: str) -> str:
        """A default location under home: storage, serving, data."""
        return str(self.home_dir / name)

    def ray_address(self) -> str | None:
        """RAY_ADDRESS if set (podium connects to that cluster), else None (local Ray)."""
        return os.environ.get("RAY_ADDRESS") or None
