"""A run's checkpoints made directly, for tests whose checkpoints exist only to be promoted (issue 52).

A training is what a test costs; the decision, the policy, approval, rollback and history need only checkpoints to
decide about. `make_trained_run` makes them as a `podium run` of the nightly tests' linear model
(tests/integration/podium_nightly_code.py) would have left them, without Ray Train: each epoch's weights.json (what
the loop writes) in the run's storage folder as Ray Train lays it out (`<storage>/<run name>/checkpoint_<time>`),
recorded in the real MLflow store with podium's own functions, as the pipeline records them: the MLflow run with the
run's config as params, its datasets and lineage, one record per checkpoint, then the verdict of the real
validation function on the real data (`validation.fn` with the plan's arguments, called as podium calls it). A
promotion (`podium promote`, the promote-run flow) finds the run as it finds a trained one.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from podium_nightly_code import weights, write_data

from helpers.commands import environment
from podium.config import build_config
from podium.core.events import CheckpointEvent
from podium.core.records import CheckpointRecord
from podium.core.verdict import ValidationOutcome
from podium.tasks.lineage import record_lineage
from podium.tasks.plan import plan_run
from podium.tasks.validate import verdict_after_validation
from podium.tracking.client import TrackingRun
from podium.tracking.records import record_checkpoint, record_verdict
from podium.tracking.runs import close_tracking_run, open_tracking_run
from podium.training.validation_call import call_validation

INTEGRATION = Path(__file__).parent.parent / "integration"  # the nightly model's code, imported by name


@dataclass
class MadeRun:
    """A run made by `make_trained_run`: its MLflow run, its checkpoint records (in step order), and the Prefect
    flow run that recorded it (None: recorded outside a flow run, as no lineage of one)."""

    tracking: TrackingRun
    records: list[CheckpointRecord] = field(default_factory=list)
    flow_run_id: str | None = None


def _checkpoint_folder(storage: str, run_name: str, loop_config: dict[str, Any], epoch: int) -> str:
    """Write epoch `epoch`'s weights.json where Ray Train persists a checkpoint (its own folder name: the time)."""
    folder = os.path.join(storage, run_name, f"checkpoint_{datetime.today().strftime('%Y-%m-%d_%H-%M-%S.%f')}")
    os.makedirs(folder)
    with open(os.path.join(folder, "weights.json"), "w") as f:
        json.dump(weights(loop_config, epoch), f)
    return folder


def _make(config: dict[str, Any], tracking_uri: str) -> MadeRun:
    cfg = build_config(config)
    plan = plan_run(cfg)
    tracking = open_tracking_run(tracking_uri, cfg.experiment, cfg.run_name, cfg.model_dump(mode="json"))
    lineage = record_lineage(plan, tracking)  # its data by digest, its code; the flow run when there is one
    made = MadeRun(tracking, flow_run_id=lineage.get("podium.prefect.flow_run_id"))
    loop_config = dict(cfg.training.train_loop_config)
    for epoch in range(int(loop_config["epochs"])):
        folder = _checkpoint_folder(plan.storage, cfg.run_name, loop_config, epoch)
        record = record_checkpoint(tracking, CheckpointEvent(
            run_name=cfg.run_name, step=epoch, metrics={"epoch": float(epoch)}, epoch=epoch, checkpoint_uri=folder,
            checkpoint_name=os.path.basename(folder)))
        try:
            result = call_validation(cfg.validation.fn, folder, {**plan.validate_kwargs, "step": epoch,
                                                                 "per_row": False}, dict(cfg.validation.kwargs))
            outcome = ValidationOutcome(result.metrics, result.non_numeric)
        except Exception as exc:  # a validation that raises fails its checkpoint, as after the run's retries
            outcome = ValidationOutcome(error=f"{type(exc).__name__}: {exc}")
        verdict = verdict_after_validation(plan, record, outcome)
        made.records.append(record_verdict(tracking, record, verdict, plan.data.get("val")))
    close_tracking_run(tracking)
    return made


def make_trained_run(config: dict[str, Any], tracking_uri: str, in_flow_run: bool = False) -> MadeRun:
    """Make and record the checkpoints a `podium run` of `config` (podium_nightly_code's loop and validation) would
    have: one per epoch of `training.train_loop_config`, each validated by `validation.fn` on `data.val`. With
    `in_flow_run`, recorded inside a Prefect flow run of its own (on the server this process's settings name), whose
    id the run's lineage carries as a trained run's carries its flow run's."""
    if not in_flow_run:
        return _make(config, tracking_uri)
    from prefect import flow

    made = flow(name="make-checkpoints", flow_run_name=f"{config['run_name']}-made", log_prints=False)(_make)
    return made(config, tracking_uri)


def nightly_home(root: Path, template_db: Path, prefect_api: str, ray_env: dict[str, str]) -> dict[str, str]:
    """A test module's own podium home and MLflow store under `root` (a copy of the session's template database),
    the nightly model's data (`train.parquet`, `val.parquet`), and the environment a `podium` process of the module
    runs with (the session's Prefect server, `ray_env`'s Ray, the integration tests' code importable)."""
    shutil.copy(template_db, root / "mlflow.db")
    write_data(str(root / "train.parquet"), 100, 0.0, seed=1)
    write_data(str(root / "val.parquet"), 400, 0.1, seed=2)
    return {**os.environ, "PODIUM_HOME": str(root / "home"), "PREFECT_API_URL": prefect_api,
            "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}", **ray_env,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(INTEGRATION), os.environ.get("PYTHONPATH")]))}


def promote_in_process(config: dict[str, Any], env: dict[str, str]) -> Any:
    """The promote-run flow of `config` in this process, with the environment `env` of the test's `podium` processes
    (its MLflow store, its home), on the Prefect server this process's settings name: a champion that a test needs in
    place before the promotion it checks through the `podium` process. The run's summary."""
    from podium.flows.promote import promote_run

    with environment(env):
        return promote_run(config=build_config(config), tracking_uri=env["MLFLOW_TRACKING_URI"]).summary
