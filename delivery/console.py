"""What the operator console shows of the delivery ledger: a live nudge when sends
are recorded, and the dashboard's figures (replies by ledger state, outcomes, the queue
per channel and how long it takes to drain)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypedDict

from django.db.models import Count, F

from agentloop.core import big_tables, live
from agentloop.core.people import person_of
from delivery import attachments, pacing
from delivery.models import OutboundMessage, OutboundState, Outcome, channel_model
from delivery.questions import buttons_for_rows
from delivery.transports import transport_for

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

    from delivery.attachments import OutboundFile
    from delivery.transports import SendResult

# A failed row whose last send provably never left waits its turn; it is not failing.
DEFERRED = (Outcome.FLOOD, Outcome.NOT_SENT)


def sends_recorded(outcomes: Sequence[tuple[OutboundMessage, SendResult]]) -> None:
    """`outcomes`: (row, SendResult) pairs just written down."""
    if outcomes and live.anyone_listening():
        live.publish([live.DASHBOARD], {
            "kind": "delivery", "delivered": sum(1 for _, result in outcomes if result.ok),
            "failed": sum(1 for _, result in outcomes if not result.ok)})


# The dashboard counts each state's rows up to this many ("10000+" past it): a count of
# a million delivered rows read the whole index on every refresh (issue 30).
STATE_COUNT_CAP = big_tables.COUNT_CAP


class StateCount(TypedDict):
    state: str
    label: StrOrPromise  # in the reader's language
    count: int  # at most STATE_COUNT_CAP
    more: bool  # more than that


def replies_by_state() -> list[StateCount]:
    """Every ledger row still kept, by state (all states listed, zeros included), each
    count exact up to STATE_COUNT_CAP (`more`: there are more than that)."""
    counts = {state: big_tables.count_up_to(OutboundMessage.objects.filter(state=state), STATE_COUNT_CAP)
              for state in OutboundState.values}
    return [{"state": state.value, "label": state.label, "count": min(counts[state.value], STATE_COUNT_CAP),
             "more": counts[state.value] > STATE_COUNT_CAP} for state in OutboundState]


def backlog() -> list[dict[str, Any]]:
    """Per channel with replies still owed: how many wait their turn (pending, or deferred
    by a flood or a send that never left), how many are being sent, how many failed and
    will be retried; the channel's pace and the time its queue takes to drain at it; and
    how long its bot is paused for (a 429's penalty), if it is."""
    counts: dict[int, dict[str, int]] = {}
    for state, channel_id, outcome in _open_rows():
        entry = counts.setdefault(channel_id, {"queued": 0, "sending": 0, "retrying": 0})
        if state == OutboundState.ATTEMPTING:
            entry["sending"] += 1
        elif state == OutboundState.PENDING or outcome in DEFERRED:
            entry["queued"] += 1
        else:
            entry["retrying"] += 1
    Channel: Any = channel_model()  # conversations' (its manager is not typed down here)
    channels = Channel.objects.in_bulk(list(counts))
    found = []
    for channel_id, entry in sorted(counts.items()):
        channel = channels.get(channel_id)
        if channel is None:
            continue
        pace = transport_for(channel).pace("0")
        per_second = round(1 / pace.bot_interval, 1) if pace is not None and pace.bot_interval else None
        owed = entry["queued"] + entry["sending"]
        found.append({"channel": channel.slug, **entry, "per_second": per_second,
                      "drain_seconds": round(owed / per_second, 1) if per_second else None,
                      "paused_seconds": round(pacing.waiting(pacing.flood_pause_key(pace, channel.pk)), 1)})
    return found


def _open_rows() -> Iterator[tuple[str, int, str]]:
    """(state, channel, last outcome) of the open rows, at most STATE_COUNT_CAP per state:
    one equality on the state each, which the queue's index answers (grouped in SQL,
    SQLite's planner read a million rows along another index to find none)."""
    for state in OutboundMessage.OPEN:
        rows = OutboundMessage.objects.filter(state=state).values_list("channel_id", "last_outcome")
        yield from ((state, channel_id, outcome) for channel_id, outcome in rows[:STATE_COUNT_CAP])


def replies_window(since: datetime, rows: int) -> datetime:
    """When the window holding at most the latest `rows` ledger rows since `since` starts."""
    start: datetime = big_tables.window_of_latest(OutboundMessage.objects.all(), "created_at", since, rows)
    return start


def outcomes_since(since: datetime) -> dict[str, int]:
    """The last outcome of rows created since then (delivered, flood, temporary…)."""
    return dict(OutboundMessage.objects.filter(created_at__gte=since).exclude(last_outcome="")
                .values_list("last_outcome").annotate(n=Count("pk")).values_list("last_outcome", "n"))


def replies_of(conversation_id: int, limit: int = 30) -> list[dict[str, Any]]:
    """The conversation's latest outbound rows, oldest first, with their ledger state."""
    rows = list(OutboundMessage.objects.filter(conversation_id=conversation_id).annotate(turn_owner=F("turn__owner"))
                .order_by("-created_at", "-pk")[:limit])
    # A question still waiting for the user keeps its buttons after a page reload.
    buttons = buttons_for_rows([r.pk for r in rows])
    return [{"kind": "reply", "text": r.text, "at": r.created_at.isoformat(), "state": r.state, "row": r.pk,
             **({"buttons": [{"label": label, "data": data} for label, data in buttons[r.pk]]}
                if r.pk in buttons else {}),
             **({"files": files} if (files := _files(r)) else {}),
             **({"by": by} if (by := person_of(r.turn_owner or "")) else {})}  # a person's reply: who wrote it
            for r in reversed(rows)]


def _files(row: OutboundMessage) -> list[OutboundFile]:
    """The reply's files (delivery.attachments): the console makes links of them."""
    return [item for piece in row.chunks or () if attachments.is_files(piece) for item in attachments.files_of(piece)]


def given_up_since(since: datetime, cap: int = 999) -> int:
    """Replies written since `since` that the ledger stopped trying (abandoned, or the chat
    unreachable): a person never got them, and the overview asks someone to look."""
    rows = OutboundMessage.objects.filter(state__in=[OutboundState.ABANDONED, OutboundState.UNREACHABLE],
                                          created_at__gte=since)
    return big_tables.count_up_to(rows, cap)


def owed(cap: int = 999) -> int:
    """Replies still owed to someone (pending, being sent, or failed and to be retried)."""
    return big_tables.count_up_to(OutboundMessage.objects.filter(state__in=OutboundMessage.OPEN), cap)
