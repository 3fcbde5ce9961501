"""The MLflow run of a podium run: found or created (a resumed run reuses it), its params, its end."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podium.core.redaction import redact_uri, redact_value
from podium.errors import NotFound
from podium.tracking.client import (
    EXPERIMENT_KIND,
    MAX_TAG,
    RUNS_VIEW_STATE,
    RUNS_VIEW_TAG,
    TAG_CONFIG_PREFIX,
    TAG_FLOW_RUN,
    TAG_OUTCOME,
    TAG_REASON,
    TAG_RUN,
    TAG_STOPPED_EARLY,
    TrackingRun,
    tracking_call,
    tracking_client,
)

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

logger = logging.getLogger(__name__)

def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = redact_value(prefix, json.dumps(value) if isinstance(value, (list, tuple)) else str(value))


def flatten_params(config: dict[str, Any]) -> dict[str, str]:
    """Nested config -> MLflow params ('training.epochs': '5')."""
    out: dict[str, str] = {}
    _flatten("", config, out)
    return {k: v[:6000] for k, v in out.items()}


def _find_runs(client: MlflowClient, experiment_id: str, run_name: str) -> list[Any]:
    """The MLflow runs tagged with this podium run name, the one podium uses first.

    There is one, unless a create the HTTP client retried after a timeout landed more than
    once. Those copies share their start time (the client sets it), so the run podium uses
    is told apart by its params, logged right after the create: a copy that landed too late
    to be deleted has none."""
    runs = client.search_runs([experiment_id], filter_string=f"tags.`{TAG_RUN}` = '{run_name}'", max_results=100)
    return sorted(runs, key=lambda r: (not r.data.params, r.info.start_time or 0, r.info.run_id))


def artifact_location_for(tracking_uri: str) -> str | None:
    """Where a new experiment keeps its artifacts: beside a `sqlite:///` store's file (MLflow's default
    for a database store is `./mlruns` in whatever directory the process runs in), else the store's
    or the server's own default (None)."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    return str(Path(tracking_uri.removeprefix("sqlite:///")).resolve().parent / "mlartifacts")


def _get_or_create_experiment(client: MlflowClient, name: str) -> str:
    """The experiment's id. It says it is model training and has podium's runs view (tags someone
    set otherwise are theirs to keep)."""
    from mlflow.exceptions import MlflowException

    tags = {**EXPERIMENT_KIND, RUNS_VIEW_TAG: json.dumps(RUNS_VIEW_STATE)}
    exp = client.get_experiment_by_name(name)
    if exp and exp.lifecycle_stage == "deleted":  # MLflow refuses new runs in it, and its name stays taken
        uri = redact_uri(client.tracking_uri)
        raise NotFound(
            f"MLflow experiment {name!r} (id {exp.experiment_id}) was deleted at {uri}: restore it "
            f"(`MLFLOW_TRACKING_URI={uri} mlflow experiments restore --experiment-id {exp.experiment_id}`), or run "
            "with another --experiment")
    if exp:
        for key, value in tags.items():
            if key not in (exp.tags or {}):
                client.set_experiment_tag(exp.experiment_id, key, value)
        return exp.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location_for(client.tracking_uri),
                                        tags=tags)
    except MlflowException as exc:
        # a create retried after a timeout may have landed the first time
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


@tracking_call("opening the run's MLflow run")
def open_tracking_run(tracking_uri: str, experiment: str, run_name: str, params: dict[str, Any],
                      set_tags: dict[str, str] | None = None) -> TrackingRun:
    """Find the MLflow run of this podium run (same name: resumed), or create it; log config as params,
    and `set_tags` as tags."""
    from mlflow.entities import Param, RunTag

    client = tracking_client(tracking_uri)
    experiment_id = _get_or_create_experiment(client, experiment)
    found = _find_runs(client, experiment_id, run_name)
    if found:
        run_id = found[0].info.run_id
        if found[0].info.status != "RUNNING":
            client.update_run(run_id, status="RUNNING")
    else:
        client.create_run(experiment_id, run_name=run_name, tags={TAG_RUN: run_name})
        # a create retried after a timeout can land twice (the server got both requests): keep the
        # first of them in `_find_runs` order, which the params logged below keep first, and
        # delete the others
        found = _find_runs(client, experiment_id, run_name)
        run_id = found[0].info.run_id
        for extra in found[1:]:
            logger.warning("run %s: deleting duplicate MLflow run %s (a retried create)", run_name, extra.info.run_id)
            client.delete_run(extra.info.run_id)
    flat = flatten_params(params)
    data = client.get_run(run_id).data
    existing, tags = data.params, data.tags
    new = [(k, v) for k, v in flat.items() if k not in existing]
    for i in range(0, len(new), 100):
        client.log_batch(run_id, params=[Param(k, v) for k, v in new[i : i + 100]])
    # MLflow keeps a param's first value: a resumed run that changed a setting records the value in effect
    # as a tag (and keeps it current on every later resume, also when it goes back to the first value)
    effective = {TAG_CONFIG_PREFIX + k: v for k, v in flat.items()
                 if k in existing and (existing[k] != v or TAG_CONFIG_PREFIX + k in tags)}
    stale = [RunTag(k, v) for k, v in effective.items() if tags.get(k) != v]
    for i in range(0, len(stale), 100):
        client.log_batch(run_id, tags=stale[i : i + 100])
    if stale:
        logger.info("run %s resumed with changed settings, recorded as tags: %s", run_name,
                    {t.key: t.value for t in stale})
    if set_tags:
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in set_tags.items()])
    return TrackingRun(tracking_uri, experiment_id, run_id, run_name)


@tracking_call("tagging the run with its outcome")
def tag_outcome(tr: TrackingRun, outcome: str, description: str, tags: dict[str, str]) -> None:
    """The run's outcome where people look: a tag (a runs-table column) and the run's description."""
    from mlflow.entities import RunTag

    tags = {TAG_OUTCOME: outcome[:MAX_TAG], "mlflow.note.content": description, **tags}
    tr.client().log_batch(tr.run_id, tags=[RunTag(k, v) for k, v in tags.items()])


@tracking_call("recording the early stop")
def tag_stopped_early(tr: TrackingRun, step: int, reason: str) -> None:
    """The run's training was stopped early at `step`, and why (the run tag TAG_STOPPED_EARLY)."""
    tr.client().set_tag(tr.run_id, TAG_STOPPED_EARLY, f"step {step}: {reason}"[:MAX_TAG])


@tracking_call("closing the MLflow run")
def close_tracking_run(tr: TrackingRun, failed: bool = False, status: str | None = None) -> None:
    """Mark the MLflow run finished (or failed; or `status`, e.g. KILLED for a run stopped by a signal)."""
    tr.client().set_terminated(tr.run_id, status=status or ("FAILED" if failed else "FINISHED"))


TAG_ENDED_BY = "podium.ended_by"  # on an MLflow run another command ended: its process was gone, and why


@tracking_call("ending the MLflow runs a command that is gone left open")
def kill_orphan_runs(tracking_uri: str, flow_run_id: str, reason: str) -> list[str]:
    """Mark KILLED every MLflow run still RUNNING whose attempt was the flow run `flow_run_id` (tag TAG_FLOW_RUN),
    saying why (tag TAG_ENDED_BY): its process is gone (a SIGKILL), and nothing else would end it. The same words become
    the run's last outcome (TAG_REASON, the "why:" of `podium status`): what the next command settled for it, not the
    reason an earlier attempt left. Returns their ids."""
    client = tracking_client(tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    if not experiments:
        return []
    runs = client.search_runs(experiments, filter_string=f"tags.`{TAG_FLOW_RUN}` = '{flow_run_id}' and "
                                                         "attributes.status = 'RUNNING'")
    for run in runs:
        client.set_tag(run.info.run_id, TAG_ENDED_BY, reason[:MAX_TAG])
        client.set_tag(run.info.run_id, TAG_REASON, reason[:MAX_TAG])
        client.set_terminated(run.info.run_id, status="KILLED")
    return [run.info.run_id for run in runs]


@tracking_call("finding the run's MLflow run")
def find_tracking_run(tracking_uri: str, experiment: str, run_name: str) -> TrackingRun:
    """The MLflow run of an existing podium run; raises NotFound naming what was searched."""
    client = tracking_client(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise NotFound(f"MLflow experiment {experiment!r} does not exist at {tracking_uri}")
    found = _find_runs(client, exp.experiment_id, run_name)
    if not found:
        raise NotFound(f"no podium run named {run_name!r} in MLflow experiment {experiment!r} at {tracking_uri}")
    return TrackingRun(tracking_uri, exp.experiment_id, found[0].info.run_id, run_name)


@tracking_call("finding the latest run")
def latest_run_name(tracking_uri: str, experiment: str) -> str | None:
    """The podium run name of the experiment's most recently started run, or None if there is none."""
    client = tracking_client(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return None
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`{TAG_RUN}` != ''",
                              order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0].data.tags.get(TAG_RUN) if runs else None


@tracking_call("finding the models with runs")
def models_with_runs(tracking_uri: str) -> list[str]:
    """The experiments (podium's models) that hold at least one podium run, by name: what `--model` can name."""
    client = tracking_client(tracking_uri)
    names = {e.experiment_id: e.name for e in client.search_experiments()}
    if not names:
        return []
    runs = client.search_runs(list(names), filter_string=f"tags.`{TAG_RUN}` != ''", max_results=1000)
    return sorted({names[r.info.experiment_id] for r in runs})


@tracking_call("reading the run's tags")
def run_tags(tr: TrackingRun) -> dict[str, str]:
    """The MLflow run's tags (its outcome among them)."""
    return dict(tr.client().get_run(tr.run_id).data.tags)


@tracking_call("reading the run's recorded settings")
def recorded_params(tr: TrackingRun) -> dict[str, str]:
    """The run's configuration as recorded when it opened: its params (`flatten_params`), with the values a resume
    changed (tags `podium.config.<key>`, see `open_tracking_run`) laid over them. Empty for a run not made by podium."""
    data = tr.client().get_run(tr.run_id).data
    changed = {k.removeprefix(TAG_CONFIG_PREFIX): v for k, v in data.tags.items() if k.startswith(TAG_CONFIG_PREFIX)}
    return {**data.params, **changed}
