"""Promotion in three parts, under the serving location's promotion lock: gather the evidence
(`podium.tasks.evidence`), decide once (`podium.core.promotion.decide_promotion`, a pure function), carry the
decision out (`podium.tasks.carry_out`: stage, verify, seal, switch, alias); then record the attempt."""

from __future__ import annotations

import logging
from collections.abc import Callable

from prefect import task
from prefect.cache_policies import NO_CACHE

from podium.core.approval import VIA_SHADOW, Approval, challenger_alias
from podium.core.promotion import CURRENT, PROMOTE, SHADOW, Decision, Policy, decide_promotion
from podium.core.records import Champion, CheckpointRecord
from podium.serving import layout
from podium.serving.live import check_no_shadow
from podium.storage.locations import join, normalize_location
from podium.tasks import carry_out as steps
from podium.tasks.carry_out import (
    NO_STOP,
    Candidate,
    Promoted,
    PromotionOutcome,
    Rollout,
    StopPoint,
    carry_out,
    record_attempt,
)
from podium.tasks.evidence import gather_evidence, read_champion
from podium.tasks.plan import RunPlan, promotion_policy
from podium.tasks.reconcile import claim_location, origin, promotion_lock, sync_alias, withdraw_orphans
from podium.tasks.watch import settle_orphan_watch
from podium.tracking import ledger
from podium.tracking.client import TrackingRun
from podium.tracking.records import list_records

logger = logging.getLogger(__name__)


def finish_cut_short(serving: str, tracking_uri: str, registered_model: str, alias: str, claim: bool = True,
                     alias_too: bool = True) -> list[str]:
    """What a command cut short, finished before anything is read or decided from the location (call it under the
    promotion lock), in order: the location claimed (`claim`), orphans withdrawn (versions staged by a command that
    is gone, a shadow it left; podium.tasks.reconcile), a watch it left settled (podium.tasks.watch), and the alias
    moved to what serves (`alias_too`: not for a rollback, whose switch brings the whole registry in line). Returns
    the versions withdrawn."""
    if claim:
        claim_location(serving, tracking_uri, registered_model, alias)
    withdrawn = withdraw_orphans(serving, tracking_uri, registered_model, alias)
    settle_orphan_watch(serving, tracking_uri, registered_model, alias)
    if alias_too:
        sync_alias(serving, tracking_uri, registered_model, alias)
    return withdrawn


def promote_best_checkpoint(plan: RunPlan, tracking: TrackingRun, approval: bool = False,
                            stop: StopPoint = NO_STOP) -> PromotionOutcome:
    """Decide on the run's records and carry the decision out (under the promotion lock). `stop`: the flow's stop
    request; one asked for before the switch withdraws what was staged and raises (`podium.tasks.carry_out`).

    `approval` (promotion.approval 'required'): a candidate the decision would promote is staged and registered
    under the `challenger` alias instead, and the outcome's `awaiting` says so; `settle_candidate` finishes it
    once a person (or the timeout) decided."""
    records = list_records(tracking)
    p = plan.config.promotion
    policy = promotion_policy(p, approval)
    with promotion_lock(plan.serving) as still_locked:
        # what a command cut short is finished first (an alias moved to what serves, orphans withdrawn): gathering
        # only reads, against the location as it is now, in the lock
        finish_cut_short(plan.serving, tracking.tracking_uri, p.registered_model, p.alias)
        evidence = gather_evidence(plan, tracking, records, policy)  # against the champion as it is now, in the lock
        decision = decide_promotion(evidence, policy)
        steps.record_decision(tracking, decision)
        outcome = carry_out_decision(plan, tracking, decision, policy, evidence.champion, still_locked, stop)
        record_attempt(plan.serving, tracking, outcome)
    logger.info("promotion: %s", outcome.reason)
    return outcome


def carry_out_decision(plan: RunPlan, tracking: TrackingRun, decision: Decision, policy: Policy,
                       champion: Champion | None, still_locked: Callable[[], None],
                       stop: StopPoint = NO_STOP) -> PromotionOutcome:
    """What `decision` says to do, the stage it names (`carry_out.SEQUENCES`): promote (`TO_PROMOTE`), stage a
    candidate for its shadow (`TO_SHADOW`) or to await a person (`TO_AWAIT`), bring the registry in line with a
    champion already current, or nothing; and the outcome."""
    p = plan.config.promotion
    promoted: Promoted | None = None
    awaiting: Candidate | None = None
    reason = decision.reason
    if decision.action == SHADOW:
        check_no_shadow(plan.serving)  # before anything is staged
    if decision.held:
        rollout = Rollout.of(plan, tracking, decision, policy, still_locked, stop=stop)
        awaiting = steps.candidate(carry_out(steps.SEQUENCES[decision.action], rollout))
        waits = (f"in shadow beside {champion.version}" if champion is not None and decision.action == SHADOW
                 else "awaiting approval")
        reason = (f"{decision.reason}; {waits} as {awaiting.version} (MLflow {p.registered_model} "
                  f"v{awaiting.mlflow_version} @{challenger_alias(p.alias)})")
    elif decision.action == PROMOTE:
        rollout = Rollout.of(plan, tracking, decision, policy, still_locked, origin(), stop)
        promoted = steps.promoted(carry_out(steps.SEQUENCES[PROMOTE], rollout))
    elif decision.action == CURRENT and decision.candidate is not None:
        steps.finish_registration(plan, tracking, policy, decision.candidate)
    return PromotionOutcome(promoted=promoted, reason=reason, awaiting=awaiting,
                            best_step=decision.candidate.step if decision.candidate else None,
                            champion_before=champion.version if champion else None,
                            # the reference line of the chart: only a value of the same metric
                            champion_before_value=champion.value if champion and champion.metric == policy.metric else None,
                            champion_before_run=champion.run_name if champion else None,
                            comparison=decision.comparison, checks=decision.checks)


def settle_candidate(plan: RunPlan, tracking: TrackingRun, outcome: PromotionOutcome,
                     approval: Approval, stop: StopPoint = NO_STOP) -> PromotionOutcome:
    """Carry out a person's decision (or the timeout's) on the candidate awaiting it: approved, it becomes current
    and takes the promotion's alias, the decision in its manifest, its history record and its registered version's
    tags; rejected, its staged copy is removed and the version tagged. An approval is refused if the champion
    changed while the candidate waited (it was compared with another): run the promotion again. A shadow's numbers
    (`outcome.shadow`) go with the decision: manifest, history record, registry tags and the attempt record."""
    p, candidate = plan.config.promotion, outcome.awaiting
    assert candidate is not None
    decided = approval.as_dict()  # as the manifest and the history record keep it
    # the numbers the decision was made on, as they keep them
    shadow = {"shadow": outcome.shadow.as_dict()} if outcome.shadow else {}
    # a person approving after a shadow: the reason says both (a shadow's own verdict says it already)
    shadow_said = f"{outcome.shadow.reason}; " if outcome.shadow and approval.via != VIA_SHADOW else ""
    version = layout.PromotedVersion(version=candidate.version, uri=candidate.uri,
                                     manifest={**candidate.manifest, "approval": decided, **shadow})
    with promotion_lock(plan.serving) as still_locked:
        champion = read_champion(plan.serving)
        now = champion.version if champion else None
        promoted = None
        discarded = None  # why a candidate decided on (approved) was never served
        tags = {**approval.tags(), **ledger.shadow_tags(outcome.shadow)}
        if approval.approved and now != outcome.champion_before:
            reason = discarded = (
                f"{approval.describe()}, but the champion changed while it waited ({outcome.champion_before or 'none'}"
                f" -> {now}): not promoted; run `podium promote --run-name {tracking.run_name}` to compare with it")
        elif approval.approved:
            reason = f"{candidate.reason}; {shadow_said}{approval.describe()}"
            record = CheckpointRecord(step=candidate.step, uri=candidate.checkpoint_uri, model_id=candidate.model_id)
            rollout = Rollout(plan, tracking, still_locked, record, candidate.value, reason,
                              promotion_policy(p, approval=True), {**origin(), "approval": decided, **shadow},
                              version=version,
                              provenance=candidate.provenance,
                              mlflow_version=candidate.mlflow_version, stop=stop)
            try:
                promoted = steps.promoted(carry_out(steps.ONCE_APPROVED, rollout))
            except BaseException as exc:
                # a stop before the switch withdrew its files already (carry_out's stop point): the person's approval
                # is kept on its registered version all the same (discarded, `podium.approval.decided` = approved)
                discard_unswitched(plan, tracking, candidate, approval, tags, exc, files=not rollout.withdrawn)
                raise
        else:
            reason = f"{approval.describe()}: step {candidate.step} not promoted"
        if promoted is None:
            layout.discard_version(join(normalize_location(plan.serving), "versions", candidate.version), reason)
        if candidate.mlflow_version is not None:
            ledger.settle_challenger(tracking.tracking_uri, p.registered_model, candidate.mlflow_version, p.alias,
                                     challenger_alias(p.alias), candidate.model_id, promoted is not None,
                                     {**tags, ledger.TAG_DECISION: reason[:5000]}, discarded=discarded)
        settled = outcome.model_copy(update={"promoted": promoted, "reason": reason, "awaiting": None,
                                             "approval": approval})
        record_attempt(plan.serving, tracking, settled)
    logger.info("promotion: %s", reason)
    return settled


def discard_unswitched(plan: RunPlan, tracking: TrackingRun, candidate: Candidate, approval: Approval,
                       tags: dict[str, str], exc: BaseException, files: bool = True) -> None:
    """An approved candidate whose switch did not happen (a full disk, a lost lock, a stop before the switch): its
    files go and its registered version says it was discarded, and why, instead of staying `pending` under the
    challenger alias (a sealed version is no longer staged: no later command would withdraw it). A candidate that
    did become current is left as it is: the next command brings the registry in line with it. Best effort: `exc`
    is what the caller hears. `files`: False where a stop's withdrawal removed them already (a tombstone)."""
    p = plan.config.promotion
    try:
        if (layout.read_pointer(plan.serving) or {}).get("version") == candidate.version:
            return
        why = f"{approval.describe()}, but it was not made current ({type(exc).__name__}: {exc}): not promoted"
        if files:
            layout.discard_version(join(normalize_location(plan.serving), "versions", candidate.version), why)
        if candidate.mlflow_version is not None:
            ledger.settle_challenger(tracking.tracking_uri, p.registered_model, candidate.mlflow_version, p.alias,
                                     challenger_alias(p.alias), candidate.model_id, False,
                                     {**tags, ledger.TAG_DECISION: why[:5000]}, discarded=why)
    except Exception as failed:  # the next command reconciles what is left; the switch's failure is the news
        logger.warning("candidate %s not discarded after its failed switch: %s: %s", candidate.version,
                       type(failed).__name__, failed)


@task(name="promote-best-checkpoint", cache_policy=NO_CACHE)
def promote_best_checkpoint_task(plan: RunPlan, tracking: TrackingRun, stop: StopPoint = NO_STOP) -> PromotionOutcome:
    """Promote the run's best checkpoint to the serving location if it beats the champion (with approval
    required: stage it as the challenger, to wait for a decision). `stop`: the flow's stop request."""
    return promote_best_checkpoint(plan, tracking, approval=plan.policy.approval, stop=stop)


@task(name="settle-approval", cache_policy=NO_CACHE)
def settle_candidate_task(plan: RunPlan, tracking: TrackingRun, outcome: PromotionOutcome,
                          approval: Approval, stop: StopPoint = NO_STOP) -> PromotionOutcome:
    """Promote the candidate that awaited approval, or not, as decided (a stop before its switch withdraws it)."""
    return settle_candidate(plan, tracking, outcome, approval, stop)
