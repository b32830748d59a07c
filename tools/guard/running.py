"""Running: a hosted tool behind the guard — claim, run the effect, confirm or release;
an identical call settled against the claim that holds its fingerprint."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.utils import timezone

from agentloop.core import tracing
from audit.failpoints import failpoint
from tools import registry, sandbox
from tools.conversation_side import conversation_side
from tools.guard.claiming import (
    ClaimRequest,
    RateLimited,
    duplicate_outcome,
    note_duplicate,
    rate_limited_outcome,
    take_claim,
)
from tools.guard.helpers import _call_of, transition
from tools.guard.outcomes import Outcome, Status
from tools.guard.policies import policy_for
from tools.guard.proposals import expire, open_proposal
from tools.guard.uncertainty import mark_uncertain, reconcile
from tools.models import ActionClaim, ApprovalMode, ClaimState, ToolPolicy
from tools.registry import OutcomeUnknown, Scope, Tool, ToolCall, ToolError

if TYPE_CHECKING:
    from tools.conversation_side import Channel
    from tools.guard.claiming import Attempt

log = logging.getLogger("tools.guard")  # the name it had as one module


def execute(tool: Tool, claim: ActionClaim) -> Outcome:
    """Run the effect for a claim we hold, then confirm or release it."""
    failpoint("tool.after_claim")
    try:
        result = sandbox.run(tool, _call_of(claim))  # a replay's stub in place of the effect
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


def settle_existing(claim: ActionClaim, *, wait: float, actor: str, scope: Scope) -> Outcome | None:
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
        status = DUPLICATE_STATUS[claim.state]
        note_duplicate(claim, status, actor=actor, scope=scope, now=now)
        return duplicate_outcome(claim, status, now)


# What an identical call is told, by the state of the claim that holds the fingerprint.
DUPLICATE_STATUS: dict[str, str] = {ClaimState.DONE: Status.DUPLICATE, ClaimState.IN_FLIGHT: Status.IN_PROGRESS,
                                    ClaimState.UNCERTAIN: Status.UNCERTAIN, ClaimState.PROPOSED: Status.AWAITING_APPROVAL}


def _expire_overdue_proposal(claim: ActionClaim, now: datetime) -> bool:
    """A proposal past its time, not yet swept, must not keep blocking a new call."""
    proposal = getattr(claim, "proposal", None)
    return proposal is not None and proposal.expires_at <= now and expire(proposal)


def default_wait() -> float:
    wait: float = settings.AGENTLOOP_GUARD_WAIT
    return wait


def invoke(name: str, arguments: object, scope: Scope, *, actor: str, agent_key_id: int | None = None,
           wait: float | None = None) -> Outcome:
    """Run a hosted tool behind the guard. Raises UnknownTool, InvalidArguments or
    ToolDisabled before anything is written.

    Traced (agentloop.core.tracing), under the span current here (a turn's agent call
    in a worker): the tool, what the guard made of the call, the claim; never its
    arguments."""
    if not tracing.on():
        return _invoke(name, arguments, scope, actor=actor, agent_key_id=agent_key_id, wait=wait)
    with tracing.span(TOOL_SPAN, attributes={"agentloop.tool": name,
                                             "agentloop.conversation.id": scope.conversation_id}) as span:
        outcome = _invoke(name, arguments, scope, actor=actor, agent_key_id=agent_key_id, wait=wait)
        span.set({"agentloop.guard.outcome": guard_outcome(outcome), "agentloop.tool.status": outcome.status,
                  "agentloop.claim.id": outcome.claim_id, "agentloop.proposal.id": outcome.proposal_id})
        if outcome.status == Status.FAILED:
            span.fail(outcome.error)
        return outcome


TOOL_SPAN = "agentloop.tool"
GUARD_OUTCOMES = {Status.DONE: "executed", Status.UNCERTAIN: "uncertain", Status.AWAITING_APPROVAL: "proposed",
                  Status.FAILED: "failed"}


def guard_outcome(outcome: Outcome) -> str:
    """What the guard made of a call, for its span: executed, duplicate_prevented (an
    identical call got there first: done, in progress, uncertain or awaiting approval),
    uncertain (run, its outcome unknown), proposed (awaiting a person), failed."""
    if outcome.duplicate:
        return "duplicate_prevented"
    return GUARD_OUTCOMES.get(outcome.status, outcome.status)


def _invoke(name: str, arguments: object, scope: Scope, *, actor: str, agent_key_id: int | None = None,
            wait: float | None = None) -> Outcome:
    tool = registry.get(name)
    policy = policy_for(name)
    if not policy.enabled:
        raise ToolDisabled(f"tool {name!r} is switched off")
    checked = tool.validate(arguments)
    refuse_unconfirmable(name, policy, scope)
    if not tool.guarded or not policy.guarded:
        return _run_unguarded(tool, checked, scope)
    fp = tool.fingerprint(checked, scope, policy.fingerprint_fields or None)
    attempt, outcome = claim_or_settle(ClaimRequest(name, checked, scope, fp, policy), actor=actor,
                                       agent_key_id=agent_key_id, wait=wait, proposed=policy.requires_approval)
    if outcome is not None:
        return outcome
    assert attempt is not None  # claim_or_settle gives one or the other
    if policy.requires_approval:
        return proposed_outcome(attempt.claim)
    return execute(tool, attempt.claim)


def claim_or_settle(request: ClaimRequest, *, actor: str, agent_key_id: int | None = None, wait: float | None = None,
                    proposed: bool = False) -> tuple[Attempt, None] | tuple[None, Outcome]:
    """(our new claim, None), or (None, the answer an identical call gets). Retried when
    the claim holding the fingerprint is released while we look at it."""
    wait = default_wait() if wait is None else wait
    for _ in range(5):
        try:
            attempt = take_claim(request, owner=actor, agent_key_id=agent_key_id, proposed=proposed,
                                 on_created=_proposer(request.policy) if proposed else None)
        except RateLimited as exc:
            return None, rate_limited_outcome(exc)
        if attempt.created:
            return attempt, None
        outcome = settle_existing(attempt.claim, wait=wait, actor=actor, scope=request.scope)
        if outcome is not None:
            return None, outcome
    raise RuntimeError(f"{request.action}: the claim kept being released under us")


def _run_unguarded(tool: Tool, arguments: dict[str, Any], scope: Scope) -> Outcome:
    try:
        return Outcome(Status.DONE, result=sandbox.run(tool, ToolCall(arguments=arguments, scope=scope)))
    except Exception as exc:
        if not isinstance(exc, ToolError):
            log.exception("tool %s failed", tool.name)
        return Outcome(Status.FAILED, error=str(exc) if isinstance(exc, ToolError) else f"{type(exc).__name__}: {exc}")


class ToolDisabled(Exception):
    pass


class UserConfirmationUnavailable(ToolDisabled):
    """`approval = user` in a conversation whose user's answer could come from the asker."""


def user_can_confirm(channel: Channel) -> bool:
    """The channel's user, and only they, can answer a question in the chat (conversations.platforms)."""
    try:
        return channel.platform.user_can_confirm
    except LookupError:  # a kind no longer registered: nobody answers there
        return False


def unconfirmable_channels() -> list[str]:
    """The channels on which `approval = user` is refused (said when an operator sets it)."""
    return [c.slug for c in conversation_side().channels() if not user_can_confirm(c)]


def refuse_unconfirmable(name: str, policy: ToolPolicy, scope: Scope) -> None:
    """Refuse, before anything is claimed, a call needing the user's confirmation in a
    conversation where "yes" could be posted by the agent that asked (an api channel)."""
    if policy.approval != ApprovalMode.USER or not scope.conversation_id:
        return  # without a conversation the proposal waits for an operator
    channel = conversation_side().channel(scope.channel_slug)
    if channel is not None and not user_can_confirm(channel):
        raise UserConfirmationUnavailable(
            f"tool {name!r} needs the user's confirmation (approval = user), which channel {channel.slug!r} "
            f"({channel.kind}) cannot give: its messages are posted with agent keys, so the agent that asked "
            "could answer itself. An operator must set approval = operator (or none) for this tool.")


def _proposer(policy: ToolPolicy) -> Callable[[ActionClaim], object]:
    return lambda claim: open_proposal(claim, policy)


def proposed_outcome(claim: ActionClaim) -> Outcome:
    proposal = claim.proposal
    if hasattr(proposal, "confirmation"):  # the user was asked in the chat (tools.confirmations)
        note = (f"This action needs the user's confirmation. A question asking them to confirm it has been sent "
                f"to them in this chat (proposal {proposal.pk}); it has NOT been carried out yet. Tell the user "
                "briefly to confirm it there; do not ask again in your own words. You will be told the decision.")
    else:
        note = (f"This action needs a person's approval. It has been proposed (proposal {proposal.pk}) and has NOT "
                "been carried out yet; tell the user it is waiting for approval. You will be told the decision.")
    return Outcome(Status.AWAITING_APPROVAL, note=note, claim_id=claim.pk, proposal_id=proposal.pk)
