"""What the operator console shows of the action guard: proposals awaiting a person,
and the claims per tool behind the guard's telemetry."""

from datetime import datetime
from typing import Any

from django.db.models import Count
from django.utils import timezone

from agentloop.core import big_tables
from tools.models import ActionClaim, Proposal, ProposalState


def pending_proposals(limit: int = 20) -> list[dict[str, Any]]:
    rows = (Proposal.objects.filter(state=ProposalState.PENDING, expires_at__gt=timezone.now())
            .select_related("claim").order_by("created_at")[:limit])
    return [{"proposal": p.pk, "tool": p.claim.action, "arguments": p.claim.arguments,
             "conversation": p.claim.conversation_id, "channel": p.claim.channel_slug,
             "created_at": p.created_at.isoformat(), "expires_at": p.expires_at.isoformat()} for p in rows]


def pending_count(cap: int) -> int:
    """Proposals waiting for a person now, counted up to `cap` (the admin's overview)."""
    return big_tables.count_up_to(
        Proposal.objects.filter(state=ProposalState.PENDING, expires_at__gt=timezone.now()), cap)


def claims_by_tool(since: datetime) -> dict[str, int]:
    """Guarded calls that went through (one claim each) per tool."""
    return dict(ActionClaim.objects.filter(created_at__gte=since).values_list("action")
                .annotate(n=Count("pk")).values_list("action", "n"))


def window_of_latest(since: datetime, claims: int) -> datetime:
    """When the window holding at most the latest `claims` claims since `since` starts."""
    start: datetime = big_tables.window_of_latest(ActionClaim.objects.all(), "created_at", since, claims)
    return start
