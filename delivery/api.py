"""What the REST API shows of the delivery ledger: a conversation's outbound rows (its
replies, control answers and notices) after a position in its timeline, each with its
ledger state. The conversation read API (conversations/timeline.py) merges them with
the inbound messages; delivery keeps its tables to itself."""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q

from delivery.models import OutboundMessage

# A timeline position orders rows by (time, rank, pk): an inbound message (rank 0)
# before a reply (rank 1) written in the same microsecond — the message came first.
INBOUND_RANK = 0
REPLY_RANK = 1


@dataclass(frozen=True, order=True)
class Position:
    time: datetime
    rank: int
    pk: int


def after(field: str, rank: int, position: Position | None) -> Q:
    """Rows of this rank strictly after `position` in (time, rank, pk) order."""
    if position is None:
        return Q()
    later = Q(**{f"{field}__gt": position.time})
    if rank > position.rank:
        return later | Q(**{field: position.time})
    if rank == position.rank:
        return later | Q(**{field: position.time, "pk__gt": position.pk})
    return later


def replies_after(conversation_id: int, position: Position | None, skip: Iterable[int] = (),
                  limit: int = 50) -> list[dict[str, Any]]:
    """Up to `limit` outbound rows of the conversation after `position` (those in `skip`,
    row ids already handed out, left out), oldest first, as the API shows them."""
    rows = (OutboundMessage.objects.filter(after("created_at", REPLY_RANK, position), conversation_id=conversation_id)
            .exclude(pk__in=list(skip)).order_by("created_at", "pk")[:limit])
    return [{
        "position": Position(row.created_at, REPLY_RANK, row.pk),
        "kind": "reply", "id": row.pk, "text": row.text, "time": row.created_at,
        "reply_kind": row.kind, "state": row.state,
        # The last (or current) send carried the "♻️ Recovered reply" label: it may
        # repeat a message that had arrived already.
        "recovered": row.needs_marker, "attempts": row.attempts, "delivered_at": row.delivered_at,
    } for row in rows]
