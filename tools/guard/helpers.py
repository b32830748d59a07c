"""Helpers: the claim's scope and call, its age in words, and its checked transition."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

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


def _original(claim: ActionClaim, now: datetime) -> dict[str, Any]:
    return {"claim": claim.pk, "at": claim.created_at.isoformat(), "state": claim.state,
            "age_seconds": round((now - claim.created_at).total_seconds(), 1), "result": claim.result}


def _scope_of(claim: ActionClaim) -> Scope:
    return Scope(key=claim.scope, conversation_id=claim.conversation_id, channel_slug=claim.channel_slug)


def _call_of(claim: ActionClaim) -> ToolCall:
    return ToolCall(arguments=claim.arguments, scope=_scope_of(claim), idempotency_key=f"agentloop-claim-{claim.pk}")


# What a claim stores of a call, at most (issue 51): its arguments and its result, as
# compact JSON. Arguments over it are refused, not cut: they are what the fingerprint is
# made of and what a retry or a reconciliation runs with. A result over it is kept cut,
# marked `truncated`: the action happened and its claim must say so.
MAX_STORED_BYTES = 64 * 1024


def stored_size(value: object) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode())


def check_arguments(arguments: object) -> None:
    """InvalidArguments when a call's arguments are too large to claim."""
    from tools.registry import InvalidArguments

    if (size := stored_size(arguments)) > MAX_STORED_BYTES:
        raise InvalidArguments(f"the arguments are larger than {MAX_STORED_BYTES} bytes ({size}): pass a reference "
                               "(an id, a URL) instead of the content")


def capped_result(result: Any) -> Any:  # JSON in, JSON out
    """The result as a claim keeps it: cut to MAX_STORED_BYTES when it is longer."""
    if result is None or stored_size(result) <= MAX_STORED_BYTES:
        return result
    text = json.dumps(result, ensure_ascii=False, default=str).encode()[: MAX_STORED_BYTES - 256]
    return {"truncated": True, "text": text.decode(errors="ignore"),
            "note": f"The result was larger than {MAX_STORED_BYTES} bytes; only its beginning was kept."}


def transition(claim_id: int, old_states: Sequence[str], new_state: str, **fields: Any) -> bool:
    """Compare-and-swap through the claim's checked transition: move a claim on only from
    one of the states it is expected in. A released claim stops being live (a retry may
    claim its fingerprint again); a finished one records when."""
    if "result" in fields:
        fields["result"] = capped_result(fields["result"])
    if new_state in (ClaimState.RELEASED,):
        fields["live"] = False
    if new_state in (ClaimState.DONE, ClaimState.RELEASED):
        fields.setdefault("finished_at", timezone.now())
    return bool(ActionClaim.transition(claim_id, old_states, new_state, **fields))
