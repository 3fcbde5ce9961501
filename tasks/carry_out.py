"""Carry out: a promotion decision (`podium.core.promotion.decide_promotion`) made real at the serving location and
in the registry, as a sequence of named steps, each a function of the `Rollout` it moves along:

| step        | what it does                                                                                   |
|-------------|------------------------------------------------------------------------------------------------|
| `stage`     | builds the served model and copies it as a new serving version (hashes checked), marked as ours |
| `verify`    | checks the copy beyond its hashes (`promotion.verify`), logs it into the checkpoint's LoggedModel |
| `seal`      | writes the version's manifest: it is complete, no longer this process's to withdraw            |
| `switch`    | makes it CURRENT, by a rename; its history record says why and who started it                  |
| `alias`     | registers it in MLflow under the promotion's alias                                             |
| `challenge` | registers it under the `challenger` alias instead, to wait for a person's decision             |
| `shadow`    | puts the challenger in shadow (`promotion.rollout = "shadow"`): `podium serve` mirrors live requests to it |

`TO_PROMOTE`, `TO_AWAIT`, `TO_SHADOW` and `ONCE_APPROVED` are the sequences a decision runs (`SEQUENCES`: the one
each of the decision's stages names).

The point of no return is `switch` (or, for a candidate, `challenge`: from there a stop is the approval's or the
shadow's to settle, and they withdraw it). Before it, `carry_out` asks the flow's stop request (`Rollout.stop`, the
flow's `podium.flows.stop.StopRequest`, passed down) before each step and inside `stage`; a stop asked for withdraws
what was staged (its files discarded, a registered challenger settled as withdrawn) and the stop's exception goes on
up: nothing was promoted. After it, no step looks at the stop: the promotion runs to its end. A candidate in shadow
waits as one awaiting approval does (staged, under `challenger`); the shadow's verdict (`podium.tasks.shadow`)
settles it, or is handed to the person who decides. Every step that others can see first checks that the promotion
lock is still held. The decision is recorded on the run before its steps (`record_decision`, the tag
`podium status` reads), and every attempt, promoted or not, after them, under `<serving>/attempts/`
(`record_attempt`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prefect.runtime import flow_run
from pydantic import BaseModel, field_serializer, field_validator

from podium.core.approval import Approval, challenger_alias
from podium.core.comparison import Comparison, comparison_from_dict, comparison_to_dict
from podium.core.live import ShadowVerdict, WatchOutcome
from podium.core.numbers import format_number
from podium.core.policy import Check, check_from_dict, check_to_dict
from podium.core.promotion import AWAIT, PROMOTE, SHADOW, Decision, Policy, checks_summary, comparison_summary
from podium.core.records import CheckpointRecord
from podium.progress import say
from podium.serving import layout, staging
from podium.serving.live import start_shadow
from podium.serving.location import ensure_location
from podium.serving.staged import this_process, unmark_staged
from podium.storage.documents import write_json
from podium.storage.locations import join, normalize_location
from podium.tasks.lineage import provenance, provenance_tags
from podium.tasks.package import ServedModel, build_served_model, load_hint
from podium.tasks.plan import RunPlan
from podium.tasks.reconcile import sync_alias, withdraw_candidate
from podium.tasks.train import connect_ray
from podium.tasks.validate import validate
from podium.tracking import ledger
from podium.tracking.client import TrackingRun
from podium.tracking.datasets import record_comparison
from podium.tracking.models import log_served_model, served_files_path
from podium.tracking.registry import TAG_LOCATION_ID, registered_version_for
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
    shadow_id: str | None = None  # in shadow (promotion.rollout 'shadow'): the SHADOW pointer's id


class PromotionOutcome(BaseModel):
    """The decision in words, and the promoted version if there was one."""

    promoted: Promoted | None
    reason: str
    best_step: int | None = None
    champion_before: str | None = None
    # what the best was compared against: the champion's value and where it came from
    champion_before_value: float | None = None
    champion_before_run: str | None = None
    comparison: Comparison | None = None  # which numbers were compared, on which data (podium.core.comparison)
    checks: tuple[Check, ...] = ()  # the promotion policy's thresholds, guards, confidence (podium.core.policy)
    awaiting: Candidate | None = None  # a candidate staged and waiting for a person's decision (promotion.approval)
    approval: Approval | None = None  # the decision on it (podium.core.approval), once made
    shadow: ShadowVerdict | None = None  # its shadow's verdict and numbers (podium.core.live)
    watch: WatchOutcome | None = None  # the watch after its switch: passed, rolled-back, ... (podium.tasks.watch)

    # the core types travel as they are; as data (the attempt record, `--json`, a Prefect result) each takes the
    # form it always had: the plain data of its own `as_dict` / `check_to_dict` / `comparison_to_dict`
    @field_validator("comparison", mode="before")
    @classmethod
    def _read_comparison(cls, value: Any) -> Any:
        return comparison_from_dict(value) if isinstance(value, Mapping) else value

    @field_validator("checks", mode="before")
    @classmethod
    def _read_checks(cls, value: Any) -> Any:
        return tuple(check_from_dict(c) if isinstance(c, Mapping) else c for c in value or ())

    @field_validator("approval", mode="before")
    @classmethod
    def _read_approval(cls, value: Any) -> Any:
        return Approval.from_dict(value) if isinstance(value, Mapping) else value

    @field_validator("shadow", mode="before")
    @classmethod
    def _read_shadow(cls, value: Any) -> Any:
        return ShadowVerdict.from_dict(value) if isinstance(value, Mapping) else value

    @field_validator("watch", mode="before")
    @classmethod
    def _read_watch(cls, value: Any) -> Any:
        return WatchOutcome.from_dict(value) if isinstance(value, Mapping) else value

    @field_serializer("comparison")
    def _comparison_data(self, value: Comparison | None) -> dict[str, Any] | None:
        return comparison_to_dict(value) if value is not None else None

    @field_serializer("checks")
    def _checks_data(self, value: tuple[Check, ...]) -> list[dict[str, Any]]:
        return [check_to_dict(c) for c in value]

    @field_serializer("approval")
    def _approval_data(self, value: Approval | None) -> dict[str, Any] | None:
        return value.as_dict() if value is not None else None

    @field_serializer("shadow")
    def _shadow_data(self, value: ShadowVerdict | None) -> dict[str, Any] | None:
        return value.as_dict() if value is not None else None

    @field_serializer("watch")
    def _watch_data(self, value: WatchOutcome | None) -> dict[str, Any] | None:
        return value.as_dict() if value is not None else None


class StopPoint(Protocol):
    """A stop asked for (a signal), as a promotion sees it: the flow's `podium.flows.stop.StopRequest` fits (tasks do
    not import flows)."""

    @property
    def requested(self) -> bool:
        """A stop was asked for."""

    def check(self) -> None:
        """Raise if a stop was asked for (the flow's own exception: it ends the flow run Cancelled)."""


class _NoStop:
    """No stop can be asked for: a promotion called outside a flow that handles signals."""

    requested = False

    def check(self) -> None:
        """Never raises."""


NO_STOP: StopPoint = _NoStop()


@dataclass
class Rollout:
    """A decision on its way through the steps: the checkpoint and its value, why and by whom, and what each step
    made (the staged version, its provenance, its registered version)."""

    plan: RunPlan
    tracking: TrackingRun
    still_locked: Callable[[], None]  # raises once the promotion lock is lost (podium.tasks.reconcile.promotion_lock)
    record: CheckpointRecord
    value: float
    reason: str
    policy: Policy  # what the decision was made under: the promotion's metric and direction, read from here on
    started_by: dict[str, Any] = field(default_factory=dict)  # the history record's origin
    decision: Decision | None = None  # the decision being carried out (None: a candidate settled by a person)
    version: layout.PromotedVersion | None = None
    provenance: dict[str, Any] | None = None
    mlflow_version: str | None = None
    build: tempfile.TemporaryDirectory[str] | None = None  # the served model, built locally until it is verified
    served: ServedModel | None = None
    shadow_id: str | None = None  # the shadow the `shadow` step started
    stop: StopPoint = NO_STOP  # asked before each step until the point of no return (`carry_out`)
    withdrawn: bool = False  # a stop before the switch withdrew what it staged (`withdraw_staged`)

    @classmethod
    def of(cls, plan: RunPlan, tracking: TrackingRun, decision: Decision, policy: Policy,
           still_locked: Callable[[], None], started_by: dict[str, Any] | None = None,
           stop: StopPoint = NO_STOP) -> Rollout:
        """The rollout of a decision to promote (or to stage a candidate) made under `policy`; `stop`: the flow's
        stop request."""
        assert decision.candidate is not None and decision.value is not None
        return cls(plan, tracking, still_locked, decision.candidate, decision.value, decision.reason, policy,
                   started_by or {}, decision, stop=stop)

    @property
    def staged(self) -> layout.PromotedVersion:
        """The version `stage` made."""
        assert self.version is not None, "stage comes first"
        return self.version


Step = Callable[[Rollout], None]


def stage(r: Rollout) -> None:
    """Build the checkpoint's served model and copy it as a new serving version (not yet sealed; every file's hash
    checked against the source), marked as this process's; with its provenance (datasets, lineage, comparison)."""
    record, decision = r.record, r.decision
    assert decision is not None
    r.build = tempfile.TemporaryDirectory(prefix="podium-promote-")
    r.served = build_served_model(r.plan, r.tracking, record, r.build.name)
    r.provenance = provenance(r.plan, r.tracking, record, decision)  # podium.tasks.lineage
    # the build takes seconds (torch.export): a stop asked for meanwhile ends here, before anything is copied
    pause_for_tests("stage-copy", r)
    _stop_point(r)
    uid = uuid.uuid4().hex  # the version's identity: its registered version is tagged with it
    info: dict[str, Any] = {"version_uid": uid,
                            "run_name": r.tracking.run_name, "mlflow_run_id": r.tracking.run_id, "step": record.step,
                            "metric": r.policy.metric, "mode": r.policy.mode, "value": r.value,
                            "metrics": record.metrics, "model_id": record.model_id, "model": r.plan.config.model,
                            "source": record.uri, "checkpoint": record.uri, "checks": checks_summary(decision),
                            **r.served.info, **r.provenance}
    r.version = staging.stage_version(r.plan.serving, r.served.files_uri, info, r.served.content,
                                      mark=this_process(r.tracking.run_name, version_uid=uid, checkpoint=record.uri,
                                                        flow_run_id=_flow_run_id()))


def verify(r: Rollout) -> None:
    """Check the staged copy beyond its hashes (`check_copy`), then log the build it was copied from into the
    checkpoint's LoggedModel, at this serving version's own path (its registered version's files, the same bytes):
    before the switch, so that a champion is never current without its MLflow model. The local build goes."""
    assert r.build is not None and r.served is not None
    check_copy(r.plan, r.policy, r.record, r.staged)
    if r.record.model_id:
        r.still_locked()
        log_served_model(r.tracking, r.record.model_id, r.served.local_folder,
                         served_files_path(r.staged.version, r.staged.manifest.get("version_uid")))
    _drop_build(r)


def seal(r: Rollout) -> None:
    """Write the staged version's manifest: it is complete, and no longer this process's to withdraw."""
    r.still_locked()
    with _discarded_on_full_disk(r):
        layout.seal_version(r.plan.serving, r.staged)
        unmark_staged(join(normalize_location(r.plan.serving), "versions", r.staged.version))


def switch(r: Rollout) -> None:
    """Make the sealed version CURRENT, by a rename (its history record says why and who started it)."""
    r.still_locked()
    with _discarded_on_full_disk(r):
        layout.switch_current(r.plan.serving, r.staged, r.reason, origin=r.started_by)


def alias(r: Rollout) -> None:
    """Register the version in MLflow under the promotion's alias (podium.tracking.ledger.promote_version)."""
    r.mlflow_version = register(r.plan, r.tracking, r.policy, r.record, r.staged, r.value)


def challenge(r: Rollout) -> None:
    """Register the staged version under the `challenger` alias: CURRENT and the promotion's alias stay as they
    are until a person decides."""
    r.still_locked()
    r.mlflow_version = register(r.plan, r.tracking, r.policy, r.record, r.staged, r.value, challenger=True)


def shadow(r: Rollout) -> None:
    """Put the staged challenger in shadow: the SHADOW pointer names it (with its manifest, the requests wanted and
    the agreement tolerance), and the replicas of `podium serve` start mirroring live requests to it."""
    s = r.plan.config.promotion.shadow
    r.still_locked()
    current = layout.read_pointer(r.plan.serving) or {}
    r.shadow_id = f"{r.staged.version}-{uuid.uuid4().hex[:8]}"
    start_shadow(r.plan.serving, r.shadow_id, r.staged, current.get("version"),
                 this_process(r.tracking.run_name, flow_run_id=_flow_run_id()), requests=s.requests,
                 duration_s=s.duration_s, agreement_tolerance=s.agreement_tolerance)


TO_PROMOTE: tuple[Step, ...] = (stage, verify, seal, switch, alias)
TO_AWAIT: tuple[Step, ...] = (stage, verify, challenge)
TO_SHADOW: tuple[Step, ...] = (stage, verify, challenge, shadow)
ONCE_APPROVED: tuple[Step, ...] = (seal, switch)  # a candidate staged and verified, approved by a person
# the sequence each stage a decision names runs (podium.core.promotion's actions)
SEQUENCES: dict[str, tuple[Step, ...]] = {PROMOTE: TO_PROMOTE, SHADOW: TO_SHADOW, AWAIT: TO_AWAIT}


POINTS_OF_NO_RETURN: tuple[Step, ...] = (switch, challenge)  # after them, a stop no longer withdraws in the steps


def carry_out(steps: Sequence[Step], rollout: Rollout) -> Rollout:
    """Run `steps` in order on `rollout`. Before each step up to the point of no return (`switch`; `challenge` for a
    candidate) a stop asked for withdraws what was staged and raises (`_stop_point`); after it the steps run to their
    end whatever is asked. A step that raises stops it; what it staged is withdrawn by the next command
    (`podium.tasks.reconcile`)."""
    stoppable = True
    try:
        for step in steps:
            pause_for_tests(f"before-{step.__name__}", rollout)
            if stoppable:
                _stop_point(rollout)
            step(rollout)
            stoppable = stoppable and step not in POINTS_OF_NO_RETURN
            pause_for_tests(f"after-{step.__name__}", rollout)
    finally:
        _drop_build(rollout)
    return rollout


def _stop_point(r: Rollout) -> None:
    """If a stop was asked for: withdraw what `r` staged, then raise the stop's exception (the flow's)."""
    if not r.stop.requested:
        return
    _drop_build(r)
    if r.version is not None:
        withdraw_staged(r, "the promotion was stopped before the switch")
    r.stop.check()


def withdraw_staged(r: Rollout, why: str) -> None:
    """Withdraw the version `r` staged and never made current: its files (a tombstone keeps its number), and a
    registered challenger's alias and tags (`podium.tasks.reconcile.withdraw_candidate`)."""
    p, version = r.plan.config.promotion, r.staged
    if r.mlflow_version is None:  # nothing registered yet
        layout.discard_version(join(normalize_location(r.plan.serving), "versions", version.version), why)
    else:
        withdraw_candidate(r.plan.serving, r.tracking.tracking_uri, p.registered_model, p.alias, version.version,
                           str(version.manifest.get("version_uid") or "") or None, why)
    r.withdrawn = True
    say("stopped before the switch: %s withdrawn (%s); nothing promoted", version.version, why)


PAUSE_AT = "PODIUM_TEST_PAUSE_AT"  # test-only: the point of a promotion where it waits (see pause_for_tests)
PAUSE_FILE = "PODIUM_TEST_PAUSE_FILE"
PAUSE_MAX_S = 120.0


def pause_for_tests(point: str, r: Rollout) -> None:
    """A test-only hook, so that a test can land a signal at a chosen point of a promotion (tests/integration/
    test_stop_points.py, benchmarks/lifecycle.py): with PODIUM_TEST_PAUSE_AT=`point` (`before-<step>`,
    `after-<step>`, or `stage-copy`: inside `stage`, the served model built, nothing copied yet), the promotion writes
    the file PODIUM_TEST_PAUSE_FILE (the point's name in it) when it gets there, then waits until a stop is asked
    for (at most PAUSE_MAX_S), and goes on. Unset (always, outside tests), it does nothing."""
    if os.environ.get(PAUSE_AT) != point:
        return
    logger.warning("test hook %s: paused at %s until a stop is asked for", PAUSE_AT, point)
    marker = os.environ.get(PAUSE_FILE)
    if marker:  # last: the test's signal comes once it is there, while this waits
        with open(marker, "w") as f:
            f.write(point)
    deadline = time.monotonic() + PAUSE_MAX_S
    while not r.stop.requested and time.monotonic() < deadline:
        time.sleep(0.05)


def _drop_build(r: Rollout) -> None:
    if r.build is not None:
        r.build.cleanup()
        r.build = None


@contextlib.contextmanager
def _discarded_on_full_disk(r: Rollout) -> Iterator[None]:
    """A disk that filled up while a version was sealed or made current: CURRENT is switched last, by a rename, so
    it stayed as it was; the version is discarded and the error says where."""
    try:
        yield
    except OSError as exc:
        pointer = layout.read_pointer(r.plan.serving) or {}
        if not layout.is_disk_full(exc) or pointer.get("version") == r.staged.version:
            raise
        layout.discard_version(join(normalize_location(r.plan.serving), "versions", r.staged.version),
                               f"the disk filled up as it was made current ({exc})")
        raise layout.full_location_error(r.plan.serving, r.staged.version, exc) from None


def _flow_run_id() -> str | None:
    return str(flow_run.id) if flow_run.id else None


def check_copy(plan: RunPlan, policy: Policy, record: CheckpointRecord, version: layout.PromotedVersion) -> None:
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
    metric = policy.metric
    expected = record.metrics[metric]
    if layout.content_of(version.manifest) == "model":
        got = evaluate_served(plan, version).get(metric)
    else:
        connect_ray(plan)  # a no-op inside the pipeline; `podium promote` connects only when it promotes
        got = validate(plan, record, uri=version.uri).metrics.get(metric)
    if got is None or not math.isclose(got, expected, rel_tol=p.verify_tolerance, abs_tol=1e-9):
        raise layout.ServingError(f"promoted copy {version.uri} gives {metric} = {got}, but the checkpoint "
                                  f"was recorded with {expected}: not promoted")


def evaluate_served(plan: RunPlan, version: layout.PromotedVersion) -> dict[str, float]:
    """val_loss and val_accuracy of a served model's torch module on the validation data."""
    from podium.training.validate import evaluate_module  # torch loads here

    module = load.load_version(version).module
    if module is None:
        return {}
    return evaluate_module(module, plan.validate_kwargs["val_data"], plan.config.data.label_column,
                           list(plan.data_facts["feature_columns"]))


def promoted(r: Rollout) -> Promoted:
    """What a rollout that made its version current says it promoted."""
    p, version = r.plan.config.promotion, r.staged
    logger.info("promoted step %d as %s (MLflow %s v%s @%s)", r.record.step, version.version, p.registered_model,
                r.mlflow_version, p.alias)
    return Promoted(version=version.version, uri=version.uri, step=r.record.step, metric=r.policy.metric, value=r.value,
                    mlflow_version=r.mlflow_version, checkpoint_uri=r.record.uri, model=r.plan.config.model,
                    served_as=version.manifest.get("served_as"), load=version.manifest.get("load"),
                    provenance=r.provenance)


def candidate(r: Rollout) -> Candidate:
    """The candidate a rollout staged to await a person's decision."""
    version = r.staged
    return Candidate(version=version.version, uri=version.uri, manifest=version.manifest,
                     mlflow_version=r.mlflow_version, step=r.record.step, value=r.value, checkpoint_uri=r.record.uri,
                     model_id=r.record.model_id, reason=r.reason, provenance=r.provenance, shadow_id=r.shadow_id)


def register(plan: RunPlan, tracking: TrackingRun, policy: Policy, record: CheckpointRecord,
             version: layout.PromotedVersion, value: float | None, challenger: bool = False) -> str:
    """A registry version for a serving version (its tags and description say what it is and how to load it),
    under the promotion's alias, or `challenger` for a candidate awaiting a decision."""
    p = plan.config.promotion
    how = version.manifest.get("load") or load_hint(plan, layout.content_of(version.manifest))
    tags = {"podium.serving_version": version.version, "podium.step": str(record.step),
            "podium.metric": policy.metric, "podium.mode": policy.mode, "podium.value": repr(value),
            "podium.checkpoint_uri": record.uri,
            "podium.served_as": str(version.manifest.get("served_as", "files")), "podium.load": how,
            TAG_LOCATION_ID: ensure_location(plan.serving, p.registered_model, p.alias).id,  # claimed: read back
            **provenance_tags(version.manifest)}
    # the registry's versions table shows the first ~30 characters of the description: the value first
    shown = format_number(value)
    challenger_as = challenger_alias(p.alias)
    what = (f"awaiting approval (alias {challenger_as}) as serving {version.version}" if challenger
            else f"promoted by podium as serving {version.version}")
    description = (f"{policy.metric} = {shown} ({policy.mode}), step {record.step} of run {tracking.run_name}, {what}. "
                   f"Load: {how}. Checkpoint (to resume): {record.uri}")
    register_as = ledger.await_decision if challenger else ledger.promote_version
    return register_as(tracking, record, version.uri, p.registered_model, challenger_as if challenger else p.alias,
                       tags=tags, version_uid=str(version.manifest.get("version_uid") or ""), description=description,
                       files_path=served_files_path(version.version, version.manifest.get("version_uid")))


def finish_registration(plan: RunPlan, tracking: TrackingRun, policy: Policy, record: CheckpointRecord) -> str | None:
    """The champion is already current in serving; make sure the registry says so too: registered if it never was
    (its MLflow model was logged before the switch), the alias moved to it if a promotion was interrupted after the
    pointer switch but before the alias moved (`podium.tasks.reconcile.sync_alias`, the one repair of the alias)."""
    p = plan.config.promotion
    current = layout.read_current(plan.serving)
    if current is None:
        return None
    if registered_version_for(tracking.tracking_uri, p.registered_model, current.manifest.get("version_uid"),
                              current.uri) is None:
        version = register(plan, tracking, policy, record, current, current.manifest.get("value"))
        logger.info("registered the current champion %s as version %s", current.version, version)
        return version
    return sync_alias(plan.serving, tracking.tracking_uri, p.registered_model, p.alias)


def record_decision(tracking: TrackingRun, decision: Decision) -> None:
    """The decision's numbers and data, as the run tag `podium status` reads (podium.tracking.datasets)."""
    record_comparison(tracking, {"promote": decision.promote, "reason": decision.reason,
                                 "comparison": comparison_summary(decision), "checks": checks_summary(decision)})


def record_attempt(serving: str, tracking: TrackingRun, outcome: PromotionOutcome) -> None:
    """Every promotion attempt, promoted or not, is kept under <serving>/attempts/."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{time.time_ns():020d}"
    try:
        write_json(join(normalize_location(serving), "attempts", f"{stamp}-{uuid.uuid4().hex[:6]}.json"),
                   {"run_name": tracking.run_name, "mlflow_run_id": tracking.run_id, "at": time.time(),
                    **outcome.model_dump(mode="json")})
    except OSError as exc:  # the decision stands and serving is consistent: only its record is missing
        if not layout.is_disk_full(exc):
            raise
        logger.warning("no space left at %s for the attempt record (%s)", serving, outcome.reason)
