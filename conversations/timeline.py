"""A conversation's timeline for the read API: inbound messages and replies in one list,
paginated by an opaque cursor that neither repeats nor skips an item.

Rows are ordered by (time, rank, pk): an inbound message's `received_at` or a ledger
row's `created_at`, inbound before reply on a tie of the same microsecond (the message
came first), then the row id. A time is stamped before its row commits, so a row can
become visible *after* a later one was read (an inbound admitted while a turn's reply
commits). A cursor therefore holds two things:

- a boundary: every row at or before it was handed out or was already committed when
  the page was read; it only moves to `SETTLE` before the read (no transaction of ours
  stays open that long);
- the positions handed out above the boundary (at most `MAX_SEEN`), so a row that
  commits late, below newer rows already read, is still returned once — later than
  its neighbours — and the rows handed out are not returned twice.

An empty page returns the cursor it was given: a client keeps polling from where it is.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone

from conversations.models import InboundMessage
from delivery import api as delivery_api
from delivery.api import INBOUND_RANK, REPLY_RANK, Position

Item = dict[str, Any]  # a timeline item as the API shows it, with its "position"

SETTLE = timedelta(seconds=5)  # longer than any transaction writing these rows (plus clock skew)
MAX_SEEN = 100  # positions a cursor carries; a bound on its length
MAX_CURSOR_CHARS = 4096
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


class BadCursor(ValueError):
    pass


@dataclass(frozen=True)
class Cursor:
    boundary: Position | None = None
    seen: tuple[Position, ...] = ()

    def encode(self) -> str:
        body = {"b": _pack(self.boundary) if self.boundary else None, "s": [_pack(p) for p in self.seen]}
        raw = json.dumps(body, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor:
        if not text:
            return cls()
        if len(text) > MAX_CURSOR_CHARS:
            raise BadCursor("cursor too long")
        try:
            body = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
            boundary = _unpack(body["b"]) if body["b"] is not None else None
            seen = tuple(sorted(_unpack(p) for p in body["s"]))
        except (binascii.Error, ValueError, TypeError, KeyError, OverflowError, UnicodeDecodeError):
            raise BadCursor("not a cursor this API returned") from None
        if len(seen) > MAX_SEEN or (boundary is not None and any(p <= boundary for p in seen)):
            raise BadCursor("not a cursor this API returned")
        return cls(boundary, seen)


def _pack(position: Position) -> list[int]:
    return [(position.time - _EPOCH) // _US, position.rank, position.pk]


def _unpack(packed: Any) -> Position:  # JSON from a client: checked here
    micros, rank, pk = packed
    if not all(type(v) is int for v in packed) or rank not in (INBOUND_RANK, REPLY_RANK, _AFTER_ALL) or pk < 0:
        raise ValueError("bad position")
    return Position(_EPOCH + micros * _US, rank, pk)


_AFTER_ALL = 2  # a boundary at "everything stamped up to this instant"


def read(conversation_id: int, cursor: Cursor, limit: int, now: datetime | None = None) -> tuple[list[Item], Cursor]:
    """Up to `limit` items after the cursor, oldest first, and the cursor to go on from."""
    now = now or timezone.now()  # before the queries: rows stamped SETTLE before this are all visible to them
    skip: dict[int, set[int]] = {INBOUND_RANK: set(), REPLY_RANK: set()}
    for position in cursor.seen:
        skip.setdefault(position.rank, set()).add(position.pk)
    items = sorted(_inbound_after(conversation_id, cursor.boundary, skip[INBOUND_RANK], limit)
                   + delivery_api.replies_after(conversation_id, cursor.boundary, skip[REPLY_RANK], limit),
                   key=lambda item: item["position"])[:limit]
    if not items:
        return [], cursor
    settled = Position(now - SETTLE, _AFTER_ALL, 0)
    # A full page may have left rows after its last item; a short one left none that was visible.
    boundary = min(items[-1]["position"], settled) if len(items) == limit else settled
    if cursor.boundary is not None:
        boundary = max(boundary, cursor.boundary)
    seen = sorted(p for p in (*cursor.seen, *(item["position"] for item in items)) if p > boundary)
    if len(seen) > MAX_SEEN:  # a conversation writing >100 rows within SETTLE: the oldest leave the cursor
        boundary, seen = seen[-MAX_SEEN - 1], seen[-MAX_SEEN:]
    return items, Cursor(boundary, tuple(seen))


def _inbound_after(conversation_id: int, position: Position | None, skip: Collection[int],
                   limit: int) -> list[Item]:
    rows = (InboundMessage.objects.filter(delivery_api.after("received_at", INBOUND_RANK, position),
                                          conversation_id=conversation_id)
            .exclude(pk__in=list(skip)).order_by("received_at", "pk")[:limit])
    return [{
        "position": Position(row.received_at, INBOUND_RANK, row.pk),
        "kind": "inbound", "id": row.pk, "text": row.text, "time": row.received_at,
        "message_id": row.platform_message_id, "disposition": row.disposition, "media_type": row.media_type,
        "deleted_at": row.deleted_at,
    } for row in rows]
