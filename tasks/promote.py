"""Promotion: pick the best checkpoint (pure), then copy, verify, switch the pointer, move the alias."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel

from podium.core.approval import Approval, challenger_alias
from podium.core.numbers import format_number
from podium.core.promotion import Decision, apply_checks, decide_promotion, select_best
from podium.core.records import Champion, CheckpointRecord
from podium.serving import layout, staging
from podium.serving.location import ensure_location
from podium.serving.staged import this_process, unmark_staged
from podium.settings import current_user
from podium.storage.documents import write_json
from podium.storage.lease import LeaseError, location_lock
from podium.storage.locations import join, normalize_location
from podium.tasks.lineage import provenance, provenance_tags
from podium.tasks.package import build_served_model, load_hint
from podium.tasks.plan import RunPlan
from podium.tasks.policy import policy_checks
from podium.tasks.reconcile import claim_location, sync_alias, withdraw_orphans
from podium.tasks.rescore import checks_summary, comparison_summary, decide_on_same_data
from podium.tasks.train import connect_ray
from podium.tasks.validate import validate
from podium.tracking.client import TrackingRun
from podium.tracking.models import log_model_files
from podium.tracking.records import list_records
from podium.tracking.registry import (
    TAG_LOCATION_ID,
    alias_target,
    register_champion,
    registered_version_for,
    set_alias,
    settle_challenger,
)
from podium.training import promoted as load

logger = logging.getLogger(__name__)


class Promoted(BaseModel):
    """What was promoted: the serving version, where it is, and the metric that won."""

    version: str
    uri: str
    step: int
    metric: str
    value: float
    mlflow_version: str | None = None
    checkpoint_uri: str
    model: str | None = None  # the model name: registered model `model`, alias, serving location
    served_as: str | None = None  # "mlflow-model", or "files" for a checkpoint podium cannot load
    load: str | None = None  # how to load it, in one line
    provenance: dict[str, Any] | None = None  # the manifest's datasets, lineage and comparison


class Candidate(BaseModel):
    """A candidate staged at the serving location (its manifest not yet written) and registered under the
    `challenger` alias, waiting for a person's decision."""

    version: str
    uri: str
    manifest: dict[str, Any]
    mlflow_version: str | None
    step: int
    value: float
    checkpoint_uri: str
    model_id: str | None = None
    reason: str  # the promotion policy's decision, before the person's
    provenance: dict[str, Any] | None = None


class PromotionOutcome(BaseModel):
    """The decision in words, and the promoted version if there was one."""

    promoted: Promoted | None
    reason: str
    best_step: int | None = None
    champion_before: str | None = None
    # what the best was compared against: the champion's value and where it came from
    champion_before_value: float | None = None
    champion_before_run: str | None = None
    comparison: dict[str, Any] | None = None  # which numbers were compared, on which data (podium.core.comparison)
    checks: list[dict[str, Any]] = []  # the promotion policy's thresholds, guards, confidence (podium.core.policy)
    awaiting: Candidate | None = None  # a candidate staged and waiting for a person's decision (promotion.approval)
    approval: dict[str, Any] | None = None  # the decision on it (podium.core.approval.Approval), once made


def read_champion(serving: str) -> Champion | None:
    """The current champion as the decision function sees it."""
    current = layout.read_current(serving)
    if current is None:
        return None
    m = current.manifest
    return Champion(version=current.version, step=m.get("step"), metric=m.get("metric", ""),
                    value=m.get("value"), source=m.get("source"), mode=m.get("mode"),
                    run_name=m.get("run_name"))


def origin(command: str | None = None) -> dict[str, Any]:
    """What started a switch of CURRENT, for its history record: the Prefect flow run (and deployment)
    or the command, and who ran it where."""
    from prefect.runtime import flow_run

    # local: Prefect's runtime and API client load only when a promotion asks who started it
    from podium.prefect_api import current_deployment

    out: dict[str, Any] = {"user": current_user(), "host": socket.gethostname(), "pid": os.getpid()}
    if command:
        out["command"] = command
    if flow_run.id:
        out.update(flow=flow_run.flow_name, flow_run=flow_run.name, flow_run_id=str(flow_run.id))
        started_by = current_deployment()
        if started_by and started_by[1]:
            out["deployment"] = started_by[1]
    return out


def decide(plan: RunPlan, records: list[CheckpointRecord],
           tracking: TrackingRun | None = None) -> tuple[Decision, Champion | None]:
    """Best checkpoint of `records` against the serving location's champion (no side effects without
    `tracking`). With `tracking`, both are scored on the same validation data first: a number measured on
    other data is measured again and recorded there (podium.tasks.rescore).

    Checkpoints a rollback withdrew from this serving location are left out (its history says which)."""
    p = plan.config.promotion
    best, why = select_best(records, p.metric, p.mode, layout.withdrawn_checkpoints(plan.serving))
    champion = read_champion(plan.serving)
    if tracking is not None:
        return decide_on_same_data(plan, tracking, best, why, champion), champion
    decision = decide_promotion(best, champion, p.metric, p.mode, p.min_delta, p.always, why)
    if best is not None and decision.candidate is not None and not (champion and champion.source == best.uri):
        # without a tracking run nothing is measured again: the champion is not compared on the same data
        checks = policy_checks(plan, best, best.metrics, None, "not compared on the same data without a tracking run")
        decision = apply_checks(decision, checks, p.always)
    return decision, champion


def _flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    return str(flow_run.id) if flow_run.id else None


def check_copy(plan: RunPlan, record: CheckpointRecord, version: layout.PromotedVersion) -> None:
    """Check the staged copy beyond its hashes (`stage_version` already proved every file identical).

    'load': the copy loads, in this process, the way `load_promoted_model` loads it, and a served
    model answers its input example as the checkpoint did (other formats: hashes only).
    'revalidate': a served model is evaluated on the validation data as the built-in validation
    does; a checkpoint served as files goes through the validation function again (a Ray task).
    Either must give back the recorded metric.
    """
    p = plan.config.promotion
    if p.verify == "hashes":
        return
    load.check_loadable(version)
    if p.verify != "revalidate":
        return
    expected = record.metrics[p.metric]
    if layout.content_of(version.manifest) == "model":
        got = evaluate_served(plan, version).get(p.metric)
    else:
        connect_ray(plan)  # a no-op inside the pipeline; `podium promote` connects only when it promotes
        got = validate(plan, record, uri=version.uri).metrics.get(p.metric)
    if got is None or not math.isclose(got, expected, rel_tol=p.verify_tolerance, abs_tol=1e-9):
        raise layout.ServingError(f"promoted copy {version.uri} gives {p.metric} = {got}, but the checkpoint "
                                  f"was recorded with {expected}: not promoted")


def evaluate_served(plan: RunPlan, version: layout.PromotedVersion) -> dict[str, float]:
    """val_loss and val_accuracy of a served model's torch module on the validation data."""
    from podium.training.validate import evaluate_module  # torch loads here

    module = load.load_version(version).module
    if module is None:
        return {}
    return evaluate_module(module, plan.validate_kwargs["val_data"], plan.config.data.label_column,
                           list(plan.data_facts["feature_columns"]))


def promote(plan: RunPlan, tracking: TrackingRun, decision: Decision,
            still_locked: Callable[[], None] = lambda: None) -> Promoted:
    """Build the chosen checkpoint's served model, stage it as a new serving version, verify it, log it
    into the checkpoint's LoggedModel, make it current, register it and move the alias."""
    record = decision.candidate
    assert record is not None and decision.value is not None
    version, prov = stage(plan, tracking, decision, still_locked)
    make_current(plan, version, decision.reason, origin(), still_locked)
    mlflow_version = _register(plan, tracking, record, version, decision.value)
    return promoted_as(plan, record.step, record.uri, version, decision.value, mlflow_version, prov)


def promoted_as(plan: RunPlan, step: int, checkpoint_uri: str, version: layout.PromotedVersion, value: float,
                mlflow_version: str | None, prov: dict[str, Any] | None) -> Promoted:
    """What a promotion that made `version` current says it promoted."""
    p = plan.config.promotion
    logger.info("promoted step %d as %s (MLflow %s v%s @%s)", step, version.version, p.registered_model,
                mlflow_version, p.alias)
    return Promoted(version=version.version, uri=version.uri, step=step, metric=p.metric, value=value,
                    mlflow_version=mlflow_version, checkpoint_uri=checkpoint_uri, model=plan.config.model,
                    served_as=version.manifest.get("served_as"), load=version.manifest.get("load"), provenance=prov)


def stage(plan: RunPlan, tracking: TrackingRun, decision: Decision,
          still_locked: Callable[[], None]) -> tuple[layout.PromotedVersion, dict[str, Any]]:
    """The chosen checkpoint's served model, staged as a new serving version (not yet sealed), verified, and
    logged into the checkpoint's LoggedModel; with its provenance."""
    p = plan.config.promotion
    record = decision.candidate
    assert record is not None and decision.value is not None
    with tempfile.TemporaryDirectory(prefix="podium-promote-") as workdir:
        served = build_served_model(plan, tracking, record, workdir)
        prov = provenance(plan, tracking, record, decision)  # datasets, lineage, comparison (podium.tasks.lineage)
        uid = uuid.uuid4().hex  # the version's identity: its registered version is tagged with it
        info: dict[str, Any] = {"version_uid": uid,
                                "run_name": tracking.run_name, "mlflow_run_id": tracking.run_id, "step": record.step,
                                "metric": p.metric, "mode": p.mode, "value": decision.value,
                                "metrics": record.metrics, "model_id": record.model_id, "model": plan.config.model,
                                "source": record.uri, "checkpoint": record.uri, "checks": checks_summary(decision),
                                **served.info, **prov}
        version = staging.stage_version(plan.serving, served.files_uri, info, served.content,
                                        mark=this_process(tracking.run_name, version_uid=uid, checkpoint=record.uri,
                                                          flow_run_id=_flow_run_id()))
        check_copy(plan, record, version)
        if record.model_id:  # before the switch: a champion is never current without its MLflow model
            still_locked()
            log_model_files(tracking, record.model_id, served.local_folder)
    return version, prov


def make_current(plan: RunPlan, version: layout.PromotedVersion, reason: str, started_by: dict[str, Any],
                 still_locked: Callable[[], None]) -> None:
    """Seal a staged version and switch CURRENT to it (its history record says why and who started it)."""
    still_locked()
    try:
        layout.seal_version(plan.serving, version)
        unmark_staged(join(normalize_location(plan.serving), "versions", version.version))
        still_locked()
        layout.switch_current(plan.serving, version, reason, origin=started_by)
    except OSError as exc:  # CURRENT is switched last, by a rename: a disk that filled up left it as it was
        pointer = layout.read_pointer(plan.serving) or {}
        if not layout.is_disk_full(exc) or pointer.get("version") == version.version:
            raise
        layout.discard_version(join(normalize_location(plan.serving), "versions", version.version),
                               f"the disk filled up as it was made current ({exc})")
        raise layout.full_location_error(plan.serving, version.version, exc) from None


def _register(plan: RunPlan, tracking: TrackingRun, record: CheckpointRecord, version: layout.PromotedVersion,
              value: float | None, challenger: bool = False) -> str:
    """A registry version for a serving version (its tags and description say what it is and how to load it),
    under the promotion's alias, or `challenger` for a candidate awaiting a decision."""
    p = plan.config.promotion
    how = version.manifest.get("load") or load_hint(plan, layout.content_of(version.manifest))
    tags = {"podium.serving_version": version.version, "podium.step": str(record.step), "podium.metric": p.metric,
            "podium.mode": p.mode, "podium.value": repr(value), "podium.checkpoint_uri": record.uri,
            "podium.served_as": str(version.manifest.get("served_as", "files")), "podium.load": how,
            TAG_LOCATION_ID: ensure_location(plan.serving, p.registered_model, p.alias).id,  # claimed: read back
            **provenance_tags(version.manifest)}
    # the registry's versions table shows the first ~30 characters of the description: the value first
    shown = format_number(value)
    challenger_as = challenger_alias(p.alias)
    what = (f"awaiting approval (alias {challenger_as}) as serving {version.version}" if challenger
            else f"promoted by podium as serving {version.version}")
    description = (f"{p.metric} = {shown} ({p.mode}), step {record.step} of run {tracking.run_name}, {what}. "
                   f"Load: {how}. Checkpoint (to resume): {record.uri}")
    if challenger:
        tags["podium.approval"] = "pending"
    return register_champion(tracking, record, version.uri, p.registered_model, challenger_as if challenger else p.alias,
                             tags=tags, version_uid=str(version.manifest.get("version_uid") or ""),
                             description=description, promoted=not challenger)


def finish_registration(plan: RunPlan, tracking: TrackingRun, record: CheckpointRecord) -> str | None:
    """The champion is already current in serving; make sure the registry says so too.

    A promotion interrupted after the pointer switch but before the alias moved
    is finished here, when promotion runs again (its MLflow model was logged before the switch).
    """
    p = plan.config.promotion
    current = layout.read_current(plan.serving)
    if current is None:
        return None
    version = registered_version_for(tracking.tracking_uri, p.registered_model, current.manifest.get("version_uid"),
                                     current.uri)
    if version is None:
        version = _register(plan, tracking, record, current, current.manifest.get("value"))
        logger.info("registered the current champion %s as version %s", current.version, version)
    elif alias_target(tracking.tracking_uri, p.registered_model, p.alias) != version:
        set_alias(tracking.tracking_uri, p.registered_model, p.alias, version)
        logger.info("moved alias %s to version %s (the current champion)", p.alias, version)
    return version


@contextlib.contextmanager
def promotion_lock(serving: str, timeout_s: float = 600.0) -> Iterator[Callable[[], None]]:
    """One promoter at a time per serving location, from decision to alias; yields a `check()`.

    Without it two promoters could each switch CURRENT and move the alias in
    interleaved order, leaving the registry naming another version than serving.
    `<serving>/.promotion.lock`: an flock locally, a lease object on S3
    (`training.lease.location_lock`). `check()` raises if an S3 lease was lost
    (its holder stalled past the TTL and another promoter took it over):
    promotion calls it before every step that others can see.
    """
    locked = False
    try:
        with location_lock(serving, ".promotion.lock", timeout_s, "promotion") as check:
            locked = True
            yield check
    except LeaseError as exc:
        raise layout.ServingError(str(exc)) from None
    except OSError as exc:  # a full disk before anything was written: the lock file takes its holder's name
        if locked or not layout.is_disk_full(exc):
            raise
        raise layout.full_location_error(serving, "its promotion lock", exc) from None


def record_attempt(serving: str, tracking: TrackingRun, outcome: PromotionOutcome) -> None:
    """Every promotion attempt, promoted or not, is kept under <serving>/attempts/."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{time.time_ns():020d}"
    try:
        _write_attempt(serving, tracking, outcome, stamp)
    except OSError as exc:  # the decision stands and serving is consistent: only its record is missing
        if not layout.is_disk_full(exc):
            raise
        logger.warning("no space left at %s for the attempt record (%s)", serving, outcome.reason)


def _write_attempt(serving: str, tracking: TrackingRun, outcome: PromotionOutcome, stamp: str) -> None:
    write_json(join(normalize_location(serving), "attempts", f"{stamp}-{uuid.uuid4().hex[:6]}.json"),
                   {"run_name": tracking.run_name, "mlflow_run_id": tracking.run_id, "at": time.time(),
                    **outcome.model_dump(mode="json")})


def promote_best_checkpoint(plan: RunPlan, tracking: TrackingRun, approval: bool = False) -> PromotionOutcome:
    """Decide on the run's records and promote if the decision says so (under the promotion lock).

    `approval` (promotion.approval 'required'): a candidate the decision would promote is staged and registered
    under the `challenger` alias instead, and the outcome's `awaiting` says so; `settle_candidate` finishes it
    once a person (or the timeout) decided."""
    records = list_records(tracking)
    p = plan.config.promotion
    with promotion_lock(plan.serving) as still_locked:
        # what a command cut short left (podium.tasks.reconcile), before anything is decided from the location
        claim_location(plan.serving, tracking.tracking_uri, p.registered_model, p.alias)
        withdraw_orphans(plan.serving, tracking.tracking_uri, p.registered_model, p.alias)
        sync_alias(plan.serving, tracking.tracking_uri, p.registered_model, p.alias)
        decision, champion = decide(plan, records, tracking)  # against the champion as it is now, inside the lock
        promoted = awaiting = None
        reason = decision.reason
        if decision.promote and approval:
            awaiting = stage_candidate(plan, tracking, decision, still_locked)
            reason = (f"{decision.reason}; awaiting approval as {awaiting.version} (MLflow "
                      f"{p.registered_model} v{awaiting.mlflow_version} @{challenger_alias(p.alias)})")
        elif decision.promote:
            promoted = promote(plan, tracking, decision, still_locked)
        if not decision.promote and decision.candidate and champion and champion.source == decision.candidate.uri:
            finish_registration(plan, tracking, decision.candidate)
        outcome = PromotionOutcome(promoted=promoted, reason=reason, awaiting=awaiting,
                                   best_step=decision.candidate.step if decision.candidate else None,
                                   champion_before=champion.version if champion else None,
                                   # the reference line of the chart: only a value of the same metric
                                   champion_before_value=(champion.value if champion and champion.metric
                                                          == plan.config.promotion.metric else None),
                                   champion_before_run=champion.run_name if champion else None,
                                   comparison=comparison_summary(decision), checks=checks_summary(decision))
        record_attempt(plan.serving, tracking, outcome)
    logger.info("promotion: %s", reason)
    return outcome


def stage_candidate(plan: RunPlan, tracking: TrackingRun, decision: Decision,
                    still_locked: Callable[[], None]) -> Candidate:
    """Stage and verify the candidate as a promotion would, and register it under the `challenger` alias; CURRENT
    and the promotion's alias stay as they are until a person decides."""
    record = decision.candidate
    assert record is not None and decision.value is not None
    version, prov = stage(plan, tracking, decision, still_locked)
    still_locked()
    mlflow_version = _register(plan, tracking, record, version, decision.value, challenger=True)
    return Candidate(version=version.version, uri=version.uri, manifest=version.manifest, mlflow_version=mlflow_version,
                     step=record.step, value=decision.value, checkpoint_uri=record.uri, model_id=record.model_id,
                     reason=decision.reason, provenance=prov)


def settle_candidate(plan: RunPlan, tracking: TrackingRun, outcome: PromotionOutcome,
                     approval: Approval) -> PromotionOutcome:
    """Carry out a person's decision (or the timeout's) on the candidate awaiting it: approved, it becomes current
    and takes the promotion's alias, the decision in its manifest, its history record and its registered version's
    tags; rejected, its staged copy is removed and the version tagged. An approval is refused if the champion
    changed while the candidate waited (it was compared with another): run the promotion again."""
    p, candidate = plan.config.promotion, outcome.awaiting
    assert candidate is not None
    decided = approval.as_dict()
    version = layout.PromotedVersion(version=candidate.version, uri=candidate.uri,
                                     manifest={**candidate.manifest, "approval": decided})
    with promotion_lock(plan.serving) as still_locked:
        champion = read_champion(plan.serving)
        now = champion.version if champion else None
        promoted = None
        if approval.approved and now != outcome.champion_before:
            reason = (f"{approval.describe()}, but the champion changed while it waited ({outcome.champion_before or 'none'}"
                      f" -> {now}): not promoted; run `podium promote --run-name {tracking.run_name}` to compare with it")
        elif approval.approved:
            reason = f"{candidate.reason}; {approval.describe()}"
            make_current(plan, version, reason, {**origin(), "approval": decided}, still_locked)
            promoted = promoted_as(plan, candidate.step, candidate.checkpoint_uri, version, candidate.value,
                                   candidate.mlflow_version, candidate.provenance)
        else:
            reason = f"{approval.describe()}: step {candidate.step} not promoted"
        if promoted is None:
            layout.discard_version(join(normalize_location(plan.serving), "versions", candidate.version), reason)
        if candidate.mlflow_version is not None:
            settle_challenger(tracking.tracking_uri, p.registered_model, candidate.mlflow_version, p.alias,
                              challenger_alias(p.alias), candidate.model_id, promoted is not None,
                              {**approval.tags(), "podium.decision": reason})
        settled = outcome.model_copy(update={"promoted": promoted, "reason": reason, "awaiting": None,
                                             "approval": decided})
        record_attempt(plan.serving, tracking, settled)
    logger.info("promotion: %s", reason)
    return settled


@task(name="promote-best-checkpoint", cache_policy=NO_CACHE)
def promote_best_checkpoint_task(plan: RunPlan, tracking: TrackingRun) -> PromotionOutcome:
    """Promote the run's best checkpoint to the serving location if it beats the champion (with approval
    required: stage it as the challenger, to wait for a decision)."""
    return promote_best_checkpoint(plan, tracking, approval=plan.config.promotion.approval == "required")


@task(name="settle-approval", cache_policy=NO_CACHE)
def settle_candidate_task(plan: RunPlan, tracking: TrackingRun, outcome: PromotionOutcome,
                          approval: Approval) -> PromotionOutcome:
    """Promote the candidate that awaited approval, or not, as decided."""
    return settle_candidate(plan, tracking, outcome, approval)
