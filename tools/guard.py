"""The action guard: an effectful action asked for twice is carried out once.

Claim before, confirm after. A claim row is inserted under a unique constraint
(one live claim per scope, action and semantic fingerprint) *before* the effect runs,
so a crash can never slip between doing and recording. Success confirms the claim and
keeps its result; a failure releases it so a legitimate retry works. A claim still in
flight after its lease was interrupted: it becomes *uncertain* and is never re-run
blindly — the tool reconciles it when it can look itself up, otherwise the model is
told that it may have happened.

A caught duplicate is not an error: the caller gets a success carrying
`duplicate: true`, a note for the model and the original result; it is audited.
"""

import logging
import re
import time
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from agentloop.core.caches import BoundedCache
from audit.events import record
from audit.failpoints import failpoint
from audit.models import EventKind
from tools import hooks, registry
from tools.fingerprint import Fingerprint, compute
from tools.models import ActionClaim, ClaimState, Confirmation, ToolPolicy
from tools.registry import CannotReconcile, OutcomeUnknown, Scope, ToolCall, ToolError

log = logging.getLogger(__name__)


class Status:
    DONE = "done"  # it ran now
    DUPLICATE = "duplicate"  # already done within the window: not run again
    IN_PROGRESS = "in_progress"  # an identical call is running right now
    UNCERTAIN = "uncertain"  # an identical call was interrupted: it may have happened
    AWAITING_APPROVAL = "awaiting_approval"  # a person must apply it first
    FAILED = "failed"  # it ran and failed; nothing happened


@dataclass
class Outcome:
    status: str
    result: object = None
    note: str = ""
    error: str = ""
    claim_id: int | None = None
    proposal_id: int | None = None
    original: dict | None = None
    # An identical call got here first: this one was not carried out (said to the model).
    duplicate: bool = False

    def for_model(self) -> dict:
        """What the model gets back as the tool's result: never an error for a duplicate."""
        body = {"status": self.status, "duplicate": self.duplicate}
        if self.note:
            body["note"] = self.note
        if self.status == Status.FAILED:
            body["error"] = self.error
        if self.result is not None:
            body["result"] = self.result
        if self.original is not None:
            body["original"] = self.original
        if self.proposal_id is not None:
            body["proposal"] = self.proposal_id
        return body


# --- policies ------------------------------------------------------------------------

POLICY_CACHE_SECONDS = 2.0
# Bounded: hosted tools plus each agent key's guard-only actions (AGENTLOOP_MAX_ACTIONS_PER_KEY).
_policies = BoundedCache(maxsize=1024, max_age=POLICY_CACHE_SECONDS)


def policy_for(name: str) -> ToolPolicy:
    """The operator's policy for an action, created with defaults on first use; cached
    briefly per process (edits in the admin apply within two seconds)."""
    cached = _policies.get(name)
    if cached is not None:
        return cached
    policy = ToolPolicy.objects.filter(name=name).first()
    if policy is None:
        try:
            with transaction.atomic():
                policy = ToolPolicy.objects.create(name=name, **_policy_defaults(name))
        except IntegrityError:
            policy = ToolPolicy.objects.get(name=name)
    return _policies.set(name, policy)


def _policy_defaults(name) -> dict:
    try:
        return dict(registry.get(name).policy_defaults)
    except registry.UnknownTool:
        return {}  # an external agent's own action


def forget_policies():
    _policies.clear()


def offered_tools() -> list:
    """The enabled tools as OpenAI function definitions (what a model is offered)."""
    return [tool.as_function() for name, tool in registry.all_tools().items() if policy_for(name).enabled]


def ensure_policies():
    """One policy row per registered tool, so operators find them all in the admin."""
    for name in registry.all_tools():
        policy_for(name)


# --- helpers -----------------------------------------------------------------------------


def humanize(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 90:
        return f"{seconds} second{'s' * (seconds != 1)}"
    if seconds < 90 * 60:
        minutes = round(seconds / 60)
        return f"{minutes} minutes"
    hours = round(seconds / 3600, 1)
    return f"{hours:g} hours"


def _original(claim, now) -> dict:
    return {"claim": claim.pk, "at": claim.created_at.isoformat(), "state": claim.state,
            "age_seconds": round((now - claim.created_at).total_seconds(), 1), "result": claim.result}


def _scope_of(claim) -> Scope:
    return Scope(key=claim.scope, conversation_id=claim.conversation_id, channel_slug=claim.channel_slug)


def _call_of(claim) -> ToolCall:
    return ToolCall(arguments=claim.arguments, scope=_scope_of(claim), idempotency_key=f"agentloop-claim-{claim.pk}")


def transition(claim_id, old_states, new_state, **fields) -> bool:
    """Compare-and-swap through the claim's checked transition: move a claim on only from
    one of the states it is expected in. A released claim stops being live (a retry may
    claim its fingerprint again); a finished one records when."""
    if new_state in (ClaimState.RELEASED,):
        fields["live"] = False
    if new_state in (ClaimState.DONE, ClaimState.RELEASED):
        fields.setdefault("finished_at", timezone.now())
    return bool(ActionClaim.transition(claim_id, old_states, new_state, **fields))


# --- claiming ------------------------------------------------------------------------------


@dataclass
class Attempt:
    claim: ActionClaim
    created: bool


def take_claim(action, arguments, scope: Scope, fp: Fingerprint, policy, *, owner, agent_key_id=None,
               proposed=False, on_created=None) -> Attempt:
    """Insert the claim, or return the live claim that holds this fingerprint.

    The insert is the guard: the unique constraint admits one live claim per
    fingerprint, across threads and processes. A claim whose window has passed is
    retired (no longer live) so the same action later is a new action.
    """
    for _ in range(5):
        now = timezone.now()
        try:
            with transaction.atomic():
                claim = ActionClaim.objects.create(
                    scope=scope.key, action=action, fingerprint=fp.digest, fingerprint_fields=fp.fields,
                    fingerprint_material=fp.material, arguments=arguments,
                    state=ClaimState.PROPOSED if proposed else ClaimState.IN_FLIGHT, owner=owner,
                    conversation_id=scope.conversation_id, channel_slug=scope.channel_slug,
                    agent_key_id=agent_key_id, created_at=now,
                    expires_at=now + timedelta(seconds=policy.window_seconds),
                    lease_until=now + timedelta(seconds=policy.timeout_seconds),
                )
                _check_rate(claim, policy)
                if on_created is not None:
                    on_created(claim)
            return Attempt(claim, True)
        except IntegrityError:
            existing = ActionClaim.objects.filter(scope=scope.key, action=action, fingerprint=fp.digest,
                                                  live=True).first()
            if existing is None:
                continue  # released between our insert and our look: try again
            if existing.expires_at <= now and existing.state not in (ClaimState.IN_FLIGHT, ClaimState.PROPOSED):
                ActionClaim.objects.filter(pk=existing.pk, live=True).update(live=False)
                continue
            return Attempt(existing, False)
    raise RuntimeError(f"could not claim {action} for {scope.key}: the claim kept changing")


class RateLimited(Exception):
    """The scope has used its calls of this action for the hour (ToolPolicy.max_per_hour)."""


def _check_rate(claim, policy):
    """Called just after the new claim's insert, in its transaction: an identical call
    never gets here (it is a duplicate, not a new action), and a refusal rolls the insert
    back. Released claims (failed, rejected) did nothing and do not count."""
    if not policy.max_per_hour:
        return
    used = (ActionClaim.objects.filter(scope=claim.scope, action=claim.action,
                                       created_at__gt=claim.created_at - timedelta(hours=1))
            .exclude(pk=claim.pk).exclude(state=ClaimState.RELEASED).count())
    if used >= policy.max_per_hour:
        raise RateLimited(f"{claim.action}: the limit of {policy.max_per_hour} per hour for this contact is reached")


def rate_limited_outcome(exc) -> Outcome:
    return Outcome(Status.FAILED, error=str(exc),
                   note="Not done: too many of these were asked for in the last hour. Tell the user it cannot be "
                        "done right now; do not retry it in this conversation.")


def note_duplicate(claim, status, *, actor, scope: Scope, now=None):
    """Audit a caught duplicate and count it on the original claim."""
    now = now or timezone.now()
    age = (now - claim.created_at).total_seconds()
    with transaction.atomic():
        ActionClaim.objects.filter(pk=claim.pk).update(duplicates_caught=F("duplicates_caught") + 1)
        record(EventKind.DUPLICATE_PREVENTED, conversation_id=scope.conversation_id or claim.conversation_id,
               channel_slug=scope.channel_slug or claim.channel_slug, actor=actor, target=f"claim {claim.pk}",
               summary=f"{claim.action} not repeated ({status}); original {humanize(age)} old",
               tool=claim.action, fingerprint=claim.fingerprint, original_claim=claim.pk, status=status,
               age_seconds=round(age, 1), scope=scope.key, agent_key=claim.agent_key_id)


def duplicate_outcome(claim, status, now=None) -> Outcome:
    now = now or timezone.now()
    age = humanize((now - claim.created_at).total_seconds())
    notes = {
        Status.DUPLICATE: f"Not done again: this exact action was already carried out {age} ago. "
                          "Do not repeat it; tell the user it is already done.",
        Status.IN_PROGRESS: f"Not done again: an identical action started {age} ago and is still in progress. "
                            "Do not repeat it; tell the user it is being done.",
        Status.UNCERTAIN: f"Not done again: an identical action was started {age} ago and interrupted before "
                          "its outcome was known, so it may or may not have happened. Do not retry it; tell the "
                          "user it may already be done and ask them to check.",
        Status.AWAITING_APPROVAL: f"Not proposed again: an identical action was proposed {age} ago and still "
                                  f"awaits {_approver(claim)}. Tell the user it is waiting for approval.",
    }
    proposal_id = getattr(getattr(claim, "proposal", None), "pk", None) if status == Status.AWAITING_APPROVAL else None
    return Outcome(status, result=claim.result if status == Status.DUPLICATE else None, note=notes[status],
                   claim_id=claim.pk, proposal_id=proposal_id, original=_original(claim, now), duplicate=True)


def _approver(claim) -> str:
    """Who the proposal waits for: the user (a question in the chat) or an operator."""
    proposal_id = getattr(getattr(claim, "proposal", None), "pk", None)
    if proposal_id is not None and Confirmation.objects.filter(proposal_id=proposal_id).exists():
        return "the user's own confirmation (the question with Yes/No buttons in this chat)"
    return "a person's approval"


# --- uncertainty -------------------------------------------------------------------------


def mark_uncertain(claim, reason="its run was interrupted") -> bool:
    with transaction.atomic():
        moved = transition(claim.pk, [ClaimState.IN_FLIGHT], ClaimState.UNCERTAIN, error=reason[:1000])
        if moved:
            record(EventKind.ACTION_UNCERTAIN, conversation_id=claim.conversation_id, channel_slug=claim.channel_slug,
                   actor="guard", target=f"claim {claim.pk}", summary=f"{claim.action}: {reason}"[:300],
                   tool=claim.action, claim=claim.pk, agent_key=claim.agent_key_id)
    return moved


def reconcile(claim, actor="guard") -> str:
    """Ask the tool whether an uncertain action happened. Returns the claim's state after."""
    try:
        tool = registry.get(claim.action)
    except registry.UnknownTool:
        return claim.state  # an external agent's own action: only it (or an operator) knows
    try:
        found = tool.reconcile(_call_of(claim))
    except CannotReconcile:
        return claim.state
    except Exception:
        log.exception("reconciling claim %s failed", claim.pk)
        return claim.state
    with transaction.atomic():
        if found is not None:
            moved, state = transition(claim.pk, [ClaimState.UNCERTAIN], ClaimState.DONE, result=found), ClaimState.DONE
        else:
            moved, state = transition(claim.pk, [ClaimState.UNCERTAIN], ClaimState.RELEASED,
                                       error="reconciled: it did not happen"), ClaimState.RELEASED
        if moved:
            what = "it had happened" if found is not None else "it had not happened"
            record(EventKind.ACTION_RECONCILED, conversation_id=claim.conversation_id,
                   channel_slug=claim.channel_slug, actor=actor, target=f"claim {claim.pk}",
                   summary=f"{claim.action}: {what}", tool=claim.action, claim=claim.pk, found=found is not None,
                   agent_key=claim.agent_key_id)
    return state if moved else ActionClaim.objects.values_list("state", flat=True).get(pk=claim.pk)


def release(claim_id, *, by, reason="released by an operator") -> bool:
    """An operator's decision for an uncertain (or stuck) claim: it did not happen."""
    claim = ActionClaim.objects.get(pk=claim_id)
    with transaction.atomic():
        moved = transition(claim_id, [ClaimState.UNCERTAIN, ClaimState.IN_FLIGHT], ClaimState.RELEASED,
                            error=reason)
        if moved:
            record(EventKind.CLAIM_RELEASED, conversation_id=claim.conversation_id, channel_slug=claim.channel_slug,
                   actor=by, target=f"claim {claim.pk}", summary=f"{claim.action}: {reason}", tool=claim.action,
                   claim=claim.pk)
    return moved


# --- running -------------------------------------------------------------------------------


def execute(tool, claim) -> Outcome:
    """Run the effect for a claim we hold, then confirm or release it."""
    failpoint("tool.after_claim")
    try:
        result = tool.run(_call_of(claim))
    except OutcomeUnknown as exc:
        mark_uncertain(claim, f"outcome unknown: {exc}")
        state = reconcile(claim)
        if state == ClaimState.DONE:
            claim.refresh_from_db()
            return Outcome(Status.DONE, result=claim.result, claim_id=claim.pk)
        note = ("The action was attempted but its outcome is unknown (" + str(exc) + "); it may have happened. "
                "Do not retry it; tell the user it may be done and ask them to check.")
        return Outcome(Status.UNCERTAIN, note=note, claim_id=claim.pk)
    except Exception as exc:
        error = str(exc) if isinstance(exc, ToolError) else f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, ToolError):
            log.exception("tool %s failed on claim %s", tool.name, claim.pk)
        transition(claim.pk, [ClaimState.IN_FLIGHT], ClaimState.RELEASED, error=error[:2000])
        return Outcome(Status.FAILED, error=error, claim_id=claim.pk,
                       note="The action failed and did not happen; you may tell the user or try again.")
    failpoint("tool.after_effect")
    # From UNCERTAIN too: the run outlived its lease, but its success is the truth.
    transition(claim.pk, [ClaimState.IN_FLIGHT, ClaimState.UNCERTAIN], ClaimState.DONE, result=result)
    return Outcome(Status.DONE, result=result, claim_id=claim.pk)


def settle_existing(claim, *, wait: float, actor: str, scope: Scope) -> Outcome | None:
    """Decide what an identical call gets while `claim` holds the fingerprint. None means
    the claim went away (released or reconciled as not done): the caller may claim anew.

    A claim still in flight is waited on briefly: the answer is then usually the real
    outcome (a duplicate of a done action) rather than "in progress"."""
    deadline = time.monotonic() + wait
    pause = 0.01
    while True:
        now = timezone.now()
        if not claim.live or claim.state == ClaimState.RELEASED:
            return None
        if claim.state == ClaimState.IN_FLIGHT and claim.lease_until <= now:
            mark_uncertain(claim, "still in flight after its timeout (its process probably died)")
            claim.refresh_from_db()
            continue
        if claim.state == ClaimState.PROPOSED and _expire_overdue_proposal(claim, now):
            claim.refresh_from_db()
            continue
        if claim.state == ClaimState.UNCERTAIN and reconcile(claim) != ClaimState.UNCERTAIN:
            claim.refresh_from_db()
            continue
        if claim.state == ClaimState.IN_FLIGHT and time.monotonic() < deadline:
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 0.1)
            claim.refresh_from_db()
            continue
        status = {ClaimState.DONE: Status.DUPLICATE, ClaimState.IN_FLIGHT: Status.IN_PROGRESS,
                  ClaimState.UNCERTAIN: Status.UNCERTAIN, ClaimState.PROPOSED: Status.AWAITING_APPROVAL}[claim.state]
        note_duplicate(claim, status, actor=actor, scope=scope, now=now)
        return duplicate_outcome(claim, status, now)


def _expire_overdue_proposal(claim, now) -> bool:
    """A proposal past its time, not yet swept, must not keep blocking a new call."""
    proposal = getattr(claim, "proposal", None)
    return proposal is not None and proposal.expires_at <= now and hooks.expire(proposal)


def default_wait():
    return settings.AGENTLOOP_GUARD_WAIT


def invoke(name, arguments, scope: Scope, *, actor, agent_key_id=None, wait=None) -> Outcome:
    """Run a hosted tool behind the guard. Raises UnknownTool, InvalidArguments or
    ToolDisabled before anything is written."""
    tool = registry.get(name)
    policy = policy_for(name)
    if not policy.enabled:
        raise ToolDisabled(f"tool {name!r} is switched off")
    arguments = tool.validate(arguments)
    if not tool.guarded or not policy.guarded:
        return _run_unguarded(tool, arguments, scope)
    fp = tool.fingerprint(arguments, scope, policy.fingerprint_fields or None)
    attempt, outcome = claim_or_settle(name, arguments, scope, fp, policy, actor=actor, agent_key_id=agent_key_id,
                                       wait=wait, proposed=policy.requires_approval)
    if outcome is not None:
        return outcome
    if policy.requires_approval:
        return proposed_outcome(attempt.claim)
    return execute(tool, attempt.claim)


def claim_or_settle(action, arguments, scope, fp, policy, *, actor, agent_key_id=None, wait=None, proposed=False):
    """(our new claim, None), or (None, the answer an identical call gets). Retried when
    the claim holding the fingerprint is released while we look at it."""
    wait = default_wait() if wait is None else wait
    for _ in range(5):
        try:
            attempt = take_claim(action, arguments, scope, fp, policy, owner=actor, agent_key_id=agent_key_id,
                                 proposed=proposed, on_created=_proposer(policy) if proposed else None)
        except RateLimited as exc:
            return None, rate_limited_outcome(exc)
        if attempt.created:
            return attempt, None
        outcome = settle_existing(attempt.claim, wait=wait, actor=actor, scope=scope)
        if outcome is not None:
            return None, outcome
    raise RuntimeError(f"{action}: the claim kept being released under us")


def _run_unguarded(tool, arguments, scope) -> Outcome:
    try:
        return Outcome(Status.DONE, result=tool.run(ToolCall(arguments=arguments, scope=scope)))
    except Exception as exc:
        if not isinstance(exc, ToolError):
            log.exception("tool %s failed", tool.name)
        return Outcome(Status.FAILED, error=str(exc) if isinstance(exc, ToolError) else f"{type(exc).__name__}: {exc}")


class ToolDisabled(Exception):
    pass


def _proposer(policy):
    return lambda claim: hooks.open_proposal(claim, policy)


def proposed_outcome(claim) -> Outcome:
    proposal = claim.proposal
    if hasattr(proposal, "confirmation"):  # the user was asked in the chat (tools.confirmations)
        note = (f"This action needs the user's confirmation. A question asking them to confirm it has been sent "
                f"to them in this chat (proposal {proposal.pk}); it has NOT been carried out yet. Tell the user "
                "briefly to confirm it there; do not ask again in your own words. You will be told the decision.")
    else:
        note = (f"This action needs a person's approval. It has been proposed (proposal {proposal.pk}) and has NOT "
                "been carried out yet; tell the user it is waiting for approval. You will be told the decision.")
    return Outcome(Status.AWAITING_APPROVAL, note=note, claim_id=claim.pk, proposal_id=proposal.pk)


# --- the guard alone, for tools an external agent runs itself ------------------------------------


def claim_action(action, arguments, scope: Scope, *, fields=None, actor, agent_key_id=None, wait=None):
    """Guard-only: (Outcome, created). Created means: proceed, run it, then call
    `succeed` or `fail` with the claim id."""
    action = guard_only_name(action, agent_key_id)
    if not isinstance(arguments, dict):
        raise registry.InvalidArguments("arguments must be a JSON object")
    policy = policy_for(action)
    tool = None
    if fields is not None and not (isinstance(fields, list) and all(isinstance(f, str) for f in fields)):
        raise registry.InvalidArguments("fingerprint must be a list of argument names")
    fields = fields or policy.fingerprint_fields or (list(tool.fingerprint_fields) if tool else [])
    normalizers = tool.normalizers if tool else {}
    fp = compute(action, fields, arguments, normalizers, scope)
    attempt, outcome = claim_or_settle(action, arguments, scope, fp, policy, actor=actor, agent_key_id=agent_key_id,
                                       wait=wait)
    if outcome is not None:
        return outcome, False
    return Outcome("proceed", claim_id=attempt.claim.pk), True


class ClaimConflict(Exception):
    pass


# Guard-only actions live in their agent key's namespace: stored as "ext:<key id>:<name>",
# so no key takes a hosted tool's name (nor another key's), and each key has a bounded
# number of them (each is a policy row operators see). 48 characters leave room for the
# prefix in the 64-character name columns.
GUARD_ONLY_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,48}$")


class HostedToolName(Exception):
    pass


class TooManyActions(Exception):
    pass


def guard_only_name(action, agent_key_id) -> str:
    """The stored name of an agent key's own action; raises when it may not have it."""
    if not GUARD_ONLY_NAME.match(action or ""):
        raise registry.InvalidArguments("action must be 1-48 letters, digits, '_' or '-'")
    if action in registry.all_tools():
        raise HostedToolName(f"'{action}' is a hosted tool: run it with POST /api/v1/tools/{action}/invoke; "
                             "actions you run yourself need names of their own")
    prefix = f"ext:{agent_key_id or 0}:"
    name = prefix + action
    limit = settings.AGENTLOOP_MAX_ACTIONS_PER_KEY
    if (_policies.get(name) is None and not ToolPolicy.objects.filter(name=name).exists()
            and ToolPolicy.objects.filter(name__startswith=prefix).count() >= limit):
        raise TooManyActions(f"this agent key already uses {limit} action names (AGENTLOOP_MAX_ACTIONS_PER_KEY); "
                             "reuse one of them, or ask an operator to delete the policies of unused ones")
    return name


def succeed(claim_id, result, *, agent_key_id=None) -> ActionClaim:
    claim = _own_claim(claim_id, agent_key_id)
    if claim.state == ClaimState.DONE:
        return claim  # a retried confirmation changes nothing
    if not transition(claim.pk, [ClaimState.IN_FLIGHT, ClaimState.UNCERTAIN], ClaimState.DONE, result=result):
        claim.refresh_from_db()
        if claim.state != ClaimState.DONE:
            raise ClaimConflict(f"claim {claim.pk} is {claim.state}: it can no longer succeed")
    claim.refresh_from_db()
    return claim


def fail(claim_id, error, *, agent_key_id=None) -> ActionClaim:
    claim = _own_claim(claim_id, agent_key_id)
    if claim.state == ClaimState.RELEASED:
        return claim
    if not transition(claim.pk, [ClaimState.IN_FLIGHT, ClaimState.UNCERTAIN], ClaimState.RELEASED,
                       error=str(error)[:2000]):
        claim.refresh_from_db()
        if claim.state != ClaimState.RELEASED:
            raise ClaimConflict(f"claim {claim.pk} is {claim.state}: it can no longer fail")
    claim.refresh_from_db()
    return claim


def _own_claim(claim_id, agent_key_id):
    claim = ActionClaim.objects.filter(pk=claim_id).first()
    if claim is None or (agent_key_id is not None and claim.agent_key_id != agent_key_id):
        raise ActionClaim.DoesNotExist(f"no claim {claim_id}")
    return claim


# --- the sweep ----------------------------------------------------------------------------


def sweep(now=None) -> dict:
    """Claims in flight past their lease become uncertain (and are reconciled where the
    tool can); proposals past their time expire; an Apply interrupted between its two
    steps is undone. Run by the worker and by django-q2."""
    now = now or timezone.now()
    stuck = list(ActionClaim.objects.filter(state=ClaimState.IN_FLIGHT, lease_until__lte=now)[:200])
    reconciled = 0
    for claim in stuck:
        if mark_uncertain(claim, "still in flight after its timeout (its process probably died)"):
            claim.state = ClaimState.UNCERTAIN
            reconciled += reconcile(claim) != ClaimState.UNCERTAIN
    reopened = hooks.reopen_interrupted()  # before expiring: a reopened one past its time expires now
    expired = hooks.expire_due(now)
    hooks.settle_applying()
    return {"uncertain": len(stuck), "reconciled": reconciled, "expired": expired, "reopened": reopened}
