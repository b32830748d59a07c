"""What the operator console shows of conversations: the live events this app
publishes, and the dashboard's figures (open buffers, turns in flight, flush reasons)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from django.db.models import Count
from django.utils import timezone

from agentloop.core import big_tables, live
from conversations.handoff import LOOP_BREAKER
from conversations.media import links
from conversations.models import (
    BufferState,
    Contact,
    Conversation,
    ConversationState,
    InboundMessage,
    MessageBuffer,
    Turn,
    TurnState,
)

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

    from agentloop.core.live import Event
    from conversations.models import Channel, MediaFile

# The admin's overview counts up to this many of each kind ("999+" past it): a number a
# person reads at a glance, read in one bounded statement on any table size.
OVERVIEW_CAP = 999


# What an admitted message's event reads of intake's values (conversations.ingest.values:
# a layer above the flush, which calls this module too).
class Admitted(Protocol):
    @property
    def sender_id(self) -> str: ...
    @property
    def sender_name(self) -> str: ...


class Admission(Protocol):
    @property
    def disposition(self) -> str: ...
    @property
    def buffer_id(self) -> int | None: ...
    @property
    def flush_at(self) -> datetime | None: ...
    @property
    def planned_reason(self) -> str: ...
    @property
    def window_kind(self) -> str: ...
    @property
    def window_seconds(self) -> float: ...


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _groups(conversation_id: int) -> tuple[str, str]:
    return (live.DASHBOARD, live.conversation_group(conversation_id))


# --- live events (published inside the transaction of the change) ---------------------


def message_admitted(channel: Channel, conversation_id: int | None, inbound: Admitted, admission: Admission,
                     text: str) -> None:
    """A message reached a conversation: buffered (with its deadline), a control
    command, or rejected."""
    if not live.anyone_listening():  # every inbound message passes here: build nothing
        return
    assert conversation_id is not None, "an admission that is no duplicate has its conversation"
    live.publish(_groups(conversation_id), {
        "kind": "message", "conversation": conversation_id, "channel": channel.slug,
        "contact": inbound.sender_name or inbound.sender_id, "text": text[:300],
        "disposition": admission.disposition, "buffer": admission.buffer_id,
        "flush_at": _iso(admission.flush_at), "window_seconds": admission.window_seconds,
        "window_kind": admission.window_kind, "reason": admission.planned_reason,
        "at": _iso(timezone.now()),
    })


def turns_created(new_turns: Iterable[Turn]) -> None:
    """Buffers flushed: each became a turn (ready, or already running)."""
    if not live.anyone_listening():
        return
    live.publish_many([(_groups(turn.conversation_id), {
        "kind": "turn", "turn": turn.pk, "conversation": turn.conversation_id,
        "channel": turn.conversation.channel.slug, "state": turn.state, "reason": turn.flush_reason,
        "text": turn.merged_input[:500], "at": _iso(turn.created_at),
    }) for turn in new_turns])


def turns_finished(finished: Iterable[tuple[Turn, str, StrOrPromise | None, str | None]]) -> None:
    """`finished`: (turn, state, reply, outcome) of turns that just ended."""
    if not live.anyone_listening():
        return
    live.publish_many([(_groups(turn.conversation_id), {
        "kind": "turn", "turn": turn.pk, "conversation": turn.conversation_id, "state": state,
        "reply": (reply or "")[:500], "outcome": (outcome or "")[:300], "at": _iso(timezone.now()),
    }) for turn, state, reply, outcome in finished])


# --- the dashboard's figures ---------------------------------------------------------------


def open_buffers(limit: int = 50) -> list[Event]:
    """Buffers waiting for their window, soonest deadline first, with the window each got."""
    rows = (MessageBuffer.objects.filter(state=BufferState.OPEN)
            .select_related("conversation__channel", "conversation__contact").order_by("flush_at")[:limit])
    return [{
        "buffer": b.pk, "conversation": b.conversation_id, "channel": b.conversation.channel.slug,
        "contact": str(b.conversation.contact), "messages": b.message_count, "flush_at": _iso(b.flush_at),
        "window_seconds": b.window_seconds, "window_kind": b.window_kind, "reason": b.planned_reason,
    } for b in rows]


def turns_in_flight(limit: int = 50) -> list[Event]:
    # One equality per state, each the queue index's range: with `state IN (…)` SQLite
    # walked every turn along the date's index to find the few active ones (issue 30).
    rows = sorted((t for state in Turn.ACTIVE for t in Turn.objects.filter(state=state)
                   .select_related("conversation__channel").order_by("created_at")[:limit]),
                  key=lambda t: (t.created_at, t.pk))[:limit]
    return [{
        "turn": t.pk, "conversation": t.conversation_id, "channel": t.conversation.channel.slug,
        "agent": t.conversation.channel.agent, "state": t.state, "fired_effect": t.fired_effect,
        "created_at": _iso(t.created_at), "started_at": _iso(t.started_at), "text": t.merged_input[:200],
    } for t in rows]


def turns_window(since: datetime, turns: int) -> datetime:
    """When the window holding at most the latest `turns` turns since `since` starts."""
    start: datetime = big_tables.window_of_latest(Turn.objects.all(), "created_at", since, turns)
    return start


def flush_reasons(since: datetime) -> dict[str, int]:
    return dict(Turn.objects.filter(created_at__gte=since).values_list("flush_reason")
                .annotate(n=Count("pk")).values_list("flush_reason", "n"))


def turn_count(since: datetime) -> int:
    return Turn.objects.filter(created_at__gte=since).count()


def messages_of(conversation_id: int, limit: int = 30) -> list[Event]:
    """The conversation's latest inbound messages, oldest first (the playground's
    transcript on reconnect)."""
    rows = (InboundMessage.objects.filter(conversation_id=conversation_id).select_related("media_file")
            .order_by("-received_at", "-pk")[:limit])
    return [{"kind": "message", "text": m.text, "at": _iso(m.received_at), "disposition": m.disposition,
             "id": m.platform_message_id, "edited": m.edited_at is not None,
             "deleted": m.deleted_at is not None, "file": _file(m.media_file)}
            for m in reversed(rows)]


def _file(file: MediaFile | None) -> Event | None:
    """A message's file as the playground shows it: a thumbnail of an image, by its signed link."""
    if file is None:
        return None
    return {"id": file.pk, "kind": file.kind, "name": file.file_name, "state": file.state,
            "content_type": file.content_type, "url": links.path_for(file.pk)}


def paused_by_loops(limit: int = 50) -> list[Event]:
    """Conversations the loop breaker paused (conversations.loops), newest first: each
    waits for an operator to give it back. Read through the partial index of held ones."""
    rows = (Conversation.objects.filter(state=ConversationState.PERSON, held_by=LOOP_BREAKER)
            .select_related("channel", "contact").order_by("-held_at")[:limit])
    return [{"conversation": c.pk, "channel": c.channel.slug, "contact": str(c.contact), "chat": c.chat_id,
             "held_at": _iso(c.held_at)} for c in rows]


def needing_people(cap: int = OVERVIEW_CAP) -> dict[str, int]:
    """The overview's counts of what waits for a person: conversations a person holds (taken
    over), those the loop breaker paused, turns that failed in the last day, contacts over a
    limit now; and the workers alive (none alive: nothing is answered). Each count exact up
    to `cap`."""
    now = timezone.now()
    held = Conversation.objects.filter(state=ConversationState.PERSON)
    return {
        "held": big_tables.count_up_to(held.exclude(held_by=LOOP_BREAKER), cap),
        "paused": big_tables.count_up_to(held.filter(held_by=LOOP_BREAKER), cap),
        "failed_turns": big_tables.count_up_to(
            Turn.objects.filter(state=TurnState.FAILED, created_at__gte=now - timedelta(days=1)), cap),
        "limited": big_tables.count_up_to(Contact.objects.filter(limited_until__gt=now), cap),
    }
