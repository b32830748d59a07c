"""A person takes a conversation over, answers in it, and gives it back.

The conversation's `state` (ConversationState) says who answers; every move is one
compare-and-swap through `Conversation.transition`. While a person holds it:

- ingest stores every message (Disposition.HELD) and shows it on the console, but opens
  no buffer, answers no command: the user hears only from the person;
- ready turns wait (`turns.ready_candidates` and `turns.start` skip held conversations);
- the person's replies go through the delivery ledger like the agent's, each written as
  a finished turn owned by "person:<who>" whose input is what the user wrote since the
  previous one, so the agent's history (engine.conversation_history) reads them as
  its own earlier answers.

Given back (by the person, or after the channel's idle time), the agent gets a note of
what happened meanwhile (conversations.notes) and answers again.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from agentloop.core.people import PERSON_OWNER  # one spelling: the console and the ledger's pages read it
from audit.events import record
from audit.models import EventKind
from conversations import notes, turns
from conversations.models import (
    BufferState,
    Conversation,
    ConversationState,
    Disposition,
    FlushReason,
    InboundMessage,
    MessageBuffer,
    Turn,
    TurnState,
)
from delivery import ledger
from delivery.models import OutboundKind

if TYPE_CHECKING:
    from django.db.models import QuerySet

# Who holds a conversation the loop breaker paused (conversations.loops).
LOOP_BREAKER = "loop breaker"


class NotHeld(Exception):
    """A person's reply in a conversation that no person holds."""


def take_over(conversation_id: int, by: str, now: datetime | None = None, reason: str = "") -> bool:
    """Hand the conversation to a person, in one transaction: AGENT → PERSON, its open
    buffer closed without a turn, a running turn that fired no effect cancelled (one that
    did finishes: its effect happened, its answer is owed). True if this call took it;
    False if a person held it already (the call is idempotent)."""
    now = now or timezone.now()
    with transaction.atomic():
        if not Conversation.transition(conversation_id, ConversationState.AGENT, ConversationState.PERSON,
                                       held_by=by[:150], held_at=now, person_active_at=now):
            return False
        open_ids = list(MessageBuffer.objects.filter(conversation_id=conversation_id, state=BufferState.OPEN)
                        .values_list("pk", flat=True))
        if open_ids:
            MessageBuffer.transition(open_ids, BufferState.OPEN, BufferState.DROPPED, flushed_at=now,
                                     flushed_by=f"{PERSON_OWNER}{by}"[:120])
            InboundMessage.objects.filter(buffer_id__in=open_ids).update(disposition=Disposition.HELD)
        running = Turn.objects.filter(conversation_id=conversation_id, state=TurnState.RUNNING).values_list(
            "pk", flat=True)
        cancelled = [pk for pk in running if turns.cancel(pk, f"a person took the conversation over ({by})", now)]
        conversation = Conversation.objects.select_related("channel").get(pk=conversation_id)
        record(EventKind.CONVERSATION_TAKEN_OVER, conversation=conversation, actor=by,
               target=f"conversation {conversation_id}", summary=reason, buffers_closed=open_ids, turns_cancelled=cancelled)
    return True


def give_back(conversation_id: int, by: str, now: datetime | None = None) -> bool:
    """PERSON → AGENT, with a note for the agent of what happened meanwhile; its waiting
    turns run again. False if the agent held it already (idempotent)."""
    now = now or timezone.now()
    with transaction.atomic():
        conversation = Conversation.objects.select_related("channel").filter(pk=conversation_id).first()
        if conversation is None or not Conversation.transition(
                conversation_id, ConversationState.PERSON, ConversationState.AGENT):
            return False
        notes.inform(conversation_id, for_agent=_what_happened(conversation, by, now))
        record(EventKind.CONVERSATION_GIVEN_BACK, conversation=conversation, actor=by,
               target=f"conversation {conversation_id}")
    return True


def reply(conversation_id: int, text: str, by: str, key: str = "",
          now: datetime | None = None) -> tuple[Turn, bool]:
    """A person's reply, written down (a finished turn, its ledger row) in one
    transaction. The ready turns it answers are cancelled, their input folded into it.
    With `key`, a repeated call returns the first reply's turn: (turn, created)."""
    now = now or timezone.now()
    with transaction.atomic():
        conversation = Conversation.objects.select_for_update().select_related("channel").get(pk=conversation_id)
        if key:
            done = Turn.objects.filter(conversation_id=conversation_id, request_key=key).first()
            if done is not None:
                return done, False
        if conversation.state != ConversationState.PERSON:
            raise NotHeld(f"conversation {conversation_id} is not held by a person; take it over first")
        turn = Turn.objects.create(
            conversation=conversation, merged_input=_unanswered(conversation, now), flush_reason=FlushReason.PERSON,
            state=TurnState.DONE, owner=f"{PERSON_OWNER}{by}"[:100], reply_text=text, request_key=key,
            created_at=now, started_at=now, finished_at=now, **_thread_of(conversation))
        ledger.enqueue(conversation, text, kind=OutboundKind.REPLY, turn=turn,
                       reply_target=turn.reply_target, thread_id=turn.thread_id)
        Conversation.objects.filter(pk=conversation_id).update(person_active_at=now)
        record(EventKind.PERSON_REPLIED, conversation=conversation, actor=by, target=f"turn {turn.pk}",
               summary=text[:200])
    return turn, True


def give_back_idle(now: datetime | None = None) -> list[int]:
    """Conversations whose person has been quiet for their channel's idle time go back
    to the agent (the worker's housekeeping). Returns their ids."""
    now = now or timezone.now()
    given: list[int] = []
    for pk, minutes, active in held_with_idle_time():
        if active is None or active + timedelta(minutes=minutes) <= now:
            if give_back(pk, "idle", now):
                given.append(pk)
    return given


def held_with_idle_time() -> QuerySet[Conversation, tuple[int, int, datetime | None]]:
    """(id, the channel's idle minutes, the person's last sign of life) of each held
    conversation whose channel gives it back when idle: read through the partial index of
    held conversations (`conversation_held_idx`), whatever the number of the others."""
    held = Conversation.objects.filter(state=ConversationState.PERSON, channel__handoff_idle_minutes__gt=0)
    # The loop breaker's pause waits for an operator (conversations.loops): nobody is idle.
    held = held.exclude(held_by=LOOP_BREAKER)
    return held.values_list("pk", "channel__handoff_idle_minutes", "person_active_at")


def _since(conversation: Conversation) -> datetime:
    """What the user wrote after this instant is not answered yet: the last finished turn
    (the agent's or a person's), else the start of the conversation."""
    last = Turn.objects.filter(conversation=conversation, state=TurnState.DONE).aggregate(at=Max("created_at"))["at"]
    return last or conversation.created_at


def _unanswered(conversation: Conversation, now: datetime) -> str:
    """The text of the waiting turns (cancelled here: the person answers them) and the
    held messages since the last finished turn, in order."""
    texts: list[str] = []
    for turn in Turn.objects.filter(conversation=conversation, state=TurnState.READY).order_by("created_at", "pk"):
        if turns.cancel(turn.pk, "answered by a person", now):
            texts.append(turn.merged_input)
    texts += _held_texts(conversation)
    return "\n".join(texts)


def _held_texts(conversation: Conversation) -> list[str]:
    return list(InboundMessage.objects.filter(
        conversation=conversation, disposition=Disposition.HELD, received_at__gt=_since(conversation)
    ).order_by("received_at", "pk").values_list("text", flat=True))


def _thread_of(conversation: Conversation) -> dict[str, str]:
    """The reply threads to the user's latest message, as the agent's would."""
    latest = InboundMessage.objects.filter(conversation=conversation).order_by("-received_at", "-pk").first()
    if latest is None:
        return {"reply_target": "", "thread_id": ""}
    return {"reply_target": latest.reply_target, "thread_id": latest.thread_id}


def _what_happened(conversation: Conversation, by: str, now: datetime) -> str:
    if conversation.held_by == LOOP_BREAKER:
        return (f"This conversation was paused at {conversation.held_at:%Y-%m-%d %H:%M} UTC because you were "
                "replying to another bot in a loop, without a human message; an operator let you answer again "
                f"at {now:%H:%M} UTC. Do not keep answering the other bot back and forth.")
    replies = Turn.objects.filter(conversation=conversation, owner__startswith=PERSON_OWNER,
                                  created_at__gte=conversation.held_at or now).count()
    unanswered = _held_texts(conversation)
    held_by = conversation.held_by or "a person"
    text = (f"A person ({held_by}) held this conversation from {conversation.held_at:%Y-%m-%d %H:%M} UTC until "
            f"{now:%H:%M} UTC ({'given back by ' + by if by != 'idle' else 'given back after the idle time'}); "
            f"you did not answer meanwhile. The person replied {replies} time(s): those replies are in your "
            "history as your own earlier answers.")
    if unanswered:
        text += " Messages from the user the person did not answer: " + " | ".join(t[:300] for t in unanswered[-10:])
    return text
