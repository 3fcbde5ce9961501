"""Real components for integration tests: a `prefect server` process, a local Ray, MLflow on SQLite."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory):
    """A real Prefect server (not the in-process one, which drops task-run records under load)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from podium.services import ensure_prefect_server, stop_prefect_server

    home = tmp_path_factory.mktemp("podium-home")
    url = ensure_prefect_server(home, _free_port())
    try:
        with temporary_settings(updates={PREFECT_API_URL: url}):
            yield url
    finally:
        stop_prefect_server(home)


@pytest.fixture(scope="session")
def _ray_stopped_at_end():
    from podium.training.cluster import shut_down_ray

    yield
    shut_down_ray()  # bounded: a bare ray.shutdown() once hung this process for good at the session's end


@pytest.fixture
def ray_cluster(_ray_stopped_at_end):
    """A local Ray runtime, sized for 2 training workers, 1 CPU of Ray Data reading and 2 validations
    (podium's defaults): the session's, or a new one where a test before stopped it (test_s3 does, to start
    Ray with its own variables). Never Ray's auto-init, which joins whatever cluster `ray start` last recorded
    on this machine (/tmp/ray/ray_current_cluster), dead or alive."""
    _local_ray()


def _local_ray() -> None:
    from podium.training import raytrain

    raytrain.ensure_ray(5, ["podium_user_code:train_func"])


@pytest.fixture(scope="session")
def shared_ray(tmp_path_factory):
    """One Ray head per test process (`ray start --head`, as a team's cluster runs), which the `podium` processes
    of tests about something else (the command's output, an outage of MLflow or Prefect, the UIs) join through
    RAY_ADDRESS instead of each starting and stopping a local Ray of its own. A test about podium's own local
    Ray (its start, its end with the process, a signal to the process group) does not use it."""
    from helpers.servers import RayHead

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    env.pop("RAY_ADDRESS", None)
    head = RayHead(tmp_path_factory.mktemp("shared-ray"), env, num_cpus=6)
    head.start()
    try:
        yield head
    finally:
        head.stop()


@pytest.fixture(scope="session")
def dataset(tmp_path_factory) -> tuple[str, str]:
    """The synthetic Parquet dataset, small."""
    from podium.training.data import make_classification_data

    out = tmp_path_factory.mktemp("data")
    return make_classification_data(str(out), train_rows=12000, val_rows=3000)


@pytest.fixture(scope="session")
def mlflow_template_db(tmp_path_factory) -> Path:
    """An empty MLflow SQLite store with its schema migrated once for the session (about 2 s a store)."""
    from podium.services import prepare_mlflow

    db = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    prepare_mlflow(f"sqlite:///{db}")
    return db


@pytest.fixture
def tracking_uri(tmp_path, mlflow_template_db) -> str:
    """This test's own MLflow store on SQLite (`<tmp_path>/mlflow.db`), empty, its schema already migrated."""
    shutil.copy(mlflow_template_db, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture
def locations(tmp_path, tracking_uri) -> dict[str, str]:
    """Per-test storage, serving and MLflow store."""
    return {"storage": str(tmp_path / "storage"), "serving": str(tmp_path / "serving"), "tracking_uri": tracking_uri}


def run_pipeline(config: dict, tracking_uri: str, name_suffix: str = ""):
    """The train-validate-promote flow, in this process, on the servers the caller's fixtures started; its flow
    run named after the run (and `name_suffix`); its summary (the RunResult's)."""
    from podium.config import build_config
    from podium.flows.pipeline import train_validate_promote

    cfg = build_config(config)
    return train_validate_promote.with_options(flow_run_name=f"{cfg.run_name}{name_suffix}")(
        config=cfg, tracking_uri=tracking_uri).summary


@pytest.fixture(scope="module")
def module_pipeline(prefect_api, _ray_stopped_at_end):
    """`pipeline`, for a module's shared training (a module-scoped fixture), on `ray_cluster`'s local Ray."""
    _local_ray()
    return run_pipeline


@pytest.fixture
def pipeline(prefect_api, ray_cluster):
    """Run the train-validate-promote flow against the real servers."""
    return run_pipeline


os.environ.setdefault("DO_NOT_TRACK", "1")


@pytest.fixture
def cli_env(prefect_api, shared_ray, tmp_path, tracking_uri):
    """The test's Prefect server and MLflow store, and the session's Ray head (RAY_ADDRESS, as on a team's
    cluster): what these tests check is the command, not the start of a local Ray (test_faults, test_startup and
    the browser's run on the embedded defaults start their own)."""
    env = dict(os.environ)
    env.update({"PODIUM_HOME": str(tmp_path / "home"), "PREFECT_API_URL": prefect_api,
                "MLFLOW_TRACKING_URI": tracking_uri, **shared_ray.driver_env()})
    return env
