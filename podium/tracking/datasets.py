"""Datasets and lineage in MLflow: a run's dataset inputs and lineage tags, re-scores, lookups by digest.

- A run's training and validation data are MLflow dataset inputs (`log_inputs`: source URI, digest,
  schema, row count as profile; context `training` / `validation`), their digests also run tags
  (`podium.data.train.digest`, `podium.data.val.digest`), searchable on every backend.
- Validation metrics name the dataset they were measured on (MLflow 3 metrics carry dataset_name and
  dataset_digest), and each checkpoint's record has its validation digest (`records.merge_validation`).
- A re-score (the champion measured again on tonight's data, `podium.tasks.evidence`) is a nested run
  `<run>-rescore-<who>` under the run that decided: its dataset input has context `evaluation`, and its
  metrics go on the champion's LoggedModel with the dataset digest, beside the numbers it was promoted
  with. The training runs' own metric histories are left alone.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from podium.core.redaction import redact_uri
from podium.outages import is_unreachable
from podium.storage.backends import backend_for
from podium.storage.fingerprint import DatasetDigest
from podium.tracking.client import MAX_TAG, TrackingRun, tracking_call, tracking_client

if TYPE_CHECKING:
    from mlflow.entities import Dataset, Metric

logger = logging.getLogger(__name__)

TAG_TRAIN_DIGEST, TAG_TRAIN_DATA = "podium.data.train.digest", "podium.data.train.uri"
TAG_VAL_DIGEST, TAG_VAL_DATA = "podium.data.val.digest", "podium.data.val.uri"
TAG_COMPARISON = "podium.comparison"  # the last promotion decision's numbers and data (JSON)
TAG_RESCORE_OF = "podium.rescore_of"  # on a re-score run: whose number it measured (e.g. v000001)
CONTEXTS = {"train": "training", "val": "validation", "evaluation": "evaluation"}
# run tags that say where a run came from: its data, the Prefect flow run, the code
LINEAGE_PREFIXES = ("podium.data.", "podium.prefect.", "podium.code.", "mlflow.source.git.", "podium.version")

# Arrow type names -> MLflow column types, for the schema MLflow's UI shows
_MLFLOW_TYPES = {"int8": "integer", "int16": "integer", "int32": "integer", "int64": "long", "uint8": "integer",
                 "uint16": "integer", "uint32": "long", "uint64": "long", "halffloat": "float", "float": "float",
                 "double": "double", "bool": "boolean", "string": "string", "large_string": "string",
                 "binary": "binary", "large_binary": "binary"}


def mlflow_dataset(d: DatasetDigest) -> Dataset:
    """The MLflow dataset entity of a digested Parquet dataset."""
    from mlflow.entities import Dataset

    columns = [{"name": n, "type": _MLFLOW_TYPES.get(t, "string"), "required": True} for n, t in d.schema.items()]
    profile = {"num_rows": d.rows, "num_files": d.files, "num_row_groups": d.row_groups, "size_bytes": d.size_bytes}
    uri = redact_uri(d.uri)
    return Dataset(name=d.name, digest=d.digest, source_type=backend_for(d.uri).name,
                   source=json.dumps({"uri": uri}), schema=json.dumps({"mlflow_colspec": columns}),
                   profile=json.dumps(profile))


def dataset_tags(datasets: dict[str, DatasetDigest]) -> dict[str, str]:
    """`podium.data.<role>.digest` / `.uri` for each dataset ('train', 'val')."""
    out = {}
    for role, d in datasets.items():
        out[f"podium.data.{role}.digest"] = d.digest
        out[f"podium.data.{role}.uri"] = redact_uri(d.uri)[:MAX_TAG]
    return out


@tracking_call("recording the run's datasets and lineage")
def record_run_inputs(tr: TrackingRun, datasets: dict[str, DatasetDigest], tags: dict[str, str]) -> None:
    """The run's datasets as MLflow inputs (idempotent per name and digest) and its lineage as run tags."""
    from mlflow.entities import DatasetInput, InputTag, RunTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    client = tr.client()
    if datasets:
        client.log_inputs(tr.run_id, datasets=[DatasetInput(mlflow_dataset(d), [InputTag(MLFLOW_DATASET_CONTEXT,
                                                                                         CONTEXTS[role])])
                                               for role, d in datasets.items()])
    all_tags = {**dataset_tags(datasets), **tags}
    if all_tags:
        client.log_batch(tr.run_id, tags=[RunTag(k, str(v)[:MAX_TAG]) for k, v in all_tags.items()])


@tracking_call("recording a re-score")
def record_rescore(tr: TrackingRun, who: str, model_id: str | None, step: int, metrics: dict[str, float],
                   dataset: DatasetDigest) -> str:
    """Record a number measured again on `dataset` for a comparison: a nested run under `tr` whose metrics
    also go on the LoggedModel `model_id` with the dataset's digest. Returns the nested run's id."""
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.exceptions import MlflowException
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT, MLFLOW_PARENT_RUN_ID

    client = tr.client()
    run = client.create_run(tr.experiment_id, run_name=f"{tr.run_name}-rescore-{who}",
                            tags={MLFLOW_PARENT_RUN_ID: tr.run_id, TAG_RESCORE_OF: who, TAG_VAL_DIGEST: dataset.digest,
                                  TAG_VAL_DATA: redact_uri(dataset.uri)[:MAX_TAG]})
    run_id = run.info.run_id
    client.log_inputs(run_id, datasets=[DatasetInput(mlflow_dataset(dataset),
                                                     [InputTag(MLFLOW_DATASET_CONTEXT, CONTEXTS["evaluation"])])])
    now = int(time.time() * 1000)

    def batch(model: str | None) -> list[Metric]:
        from mlflow.entities import Metric

        return [Metric(k, float(v), now, int(step), model_id=model, dataset_name=dataset.name,
                       dataset_digest=dataset.digest) for k, v in sorted(metrics.items())]
    try:
        client.log_batch(run_id, metrics=batch(model_id))
    except MlflowException as exc:
        if is_unreachable(exc) or model_id is None:
            raise
        # the LoggedModel is gone (deleted, or in another tracking store): the number stays on this run
        logger.warning("re-score of %s: could not attach it to LoggedModel %s (%s)", who, model_id, exc.message)
        client.log_batch(run_id, metrics=batch(None))
    client.set_terminated(run_id)
    return run_id


@tracking_call("recording the comparison")
def record_comparison(tr: TrackingRun, comparison: dict[str, Any]) -> None:
    """The promotion decision's numbers and data, as a run tag `podium status` reads: JSON that fits a tag
    (the checks' phrases, then the reason's tail, are left out of a record too long for one; the
    attempt record under the serving location keeps them whole)."""
    tr.client().set_tag(tr.run_id, TAG_COMPARISON, fitted_json(comparison, MAX_TAG))


def fitted_json(record: dict[str, Any], limit: int) -> str:
    """`record` as JSON of at most `limit` characters, still parseable: long texts shortened first."""
    text = json.dumps(record)
    if len(text) <= limit:
        return text
    record = {**record, "checks": [{k: v for k, v in c.items() if k != "text"} for c in record.get("checks") or []]}
    over = len(json.dumps(record)) - limit
    reason = str(record.get("reason", ""))
    if over > 0 and reason:
        record["reason"] = reason[:max(0, len(reason) - over - 3)] + "..."
    text = json.dumps(record)
    return text if len(text) <= limit else json.dumps({k: record.get(k) for k in ("promote", "reason")})[:limit]


@tracking_call("reading the run's lineage")
def lineage_tags(tags: dict[str, str]) -> dict[str, str]:
    """The tags of a run that say where it came from (data, Prefect flow run, code)."""
    return {k: v for k, v in sorted(tags.items()) if k.startswith(LINEAGE_PREFIXES)}


@tracking_call("searching runs by dataset digest")
def runs_using(tracking_uri: str, digest: str) -> list[dict[str, Any]]:
    """Every run, in every active experiment, with a dataset input whose digest starts with `digest`:
    its name, ids, and in which role (training, validation, evaluation) it used the data."""
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT, MLFLOW_PARENT_RUN_ID

    client = tracking_client(tracking_uri)
    experiments = {e.experiment_id: e.name for e in client.search_experiments()}
    if not experiments:
        return []
    out: list[dict[str, Any]] = []
    token = None
    while True:
        page = client.search_runs(list(experiments), filter_string=f"dataset.digest LIKE '{digest}%'",
                                  max_results=1000, page_token=token, order_by=["attributes.start_time ASC"])
        for run in page:
            uses = [{"context": next((t.value for t in i.tags if t.key == MLFLOW_DATASET_CONTEXT), ""),
                     "name": i.dataset.name, "digest": i.dataset.digest, "source": i.dataset.source}
                    for i in (run.inputs.dataset_inputs if run.inputs else []) if i.dataset.digest.startswith(digest)]
            tags = run.data.tags
            out.append({"run_name": run.info.run_name, "run_id": run.info.run_id,
                        "experiment": experiments.get(run.info.experiment_id, run.info.experiment_id),
                        "start_time": run.info.start_time, "status": run.info.status, "uses": uses,
                        "rescore_of": tags.get(TAG_RESCORE_OF), "parent_run_id": tags.get(MLFLOW_PARENT_RUN_ID),
                        "metrics": dict(run.data.metrics) if tags.get(TAG_RESCORE_OF) else {}})
        token = page.token
        if not token:
            return out
