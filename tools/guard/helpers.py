"""Helpers: the claim's scope and call, its age in words, and its checked transition."""


from django.utils import timezone

from tools.models import ActionClaim, ClaimState
from tools.registry import Scope, ToolCall


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
