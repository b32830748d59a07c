"""Bots that talk to bots (docs/routing.md#bots).

A message from a bot (Telegram's `from.is_bot`, Slack's `bot_id`, the API's `is_bot`)
makes a turn only where the channel's `allowed_bots` names that bot; any other bot's
message is stored as context (disposition `bot`), never answered — audited on the
first of each conversation, counted each (agentloop_bot_messages_ignored).

An allowed bot can still loop with the agent (two bots mentioning each other: mention
gating does not stop that). The loop breaker: when a bot's message arrives in a
conversation whose agent has already replied `loop_max_replies` times within
`loop_window_seconds`, with no human message since the first of those replies, the
conversation is taken over by "loop breaker" (conversations.handoff: the same
compare-and-swap as a person's takeover, so no turn runs there) until an operator gives
it back. The operator is told on the dashboard (the audit event, the conversations
paused: conversations.console.paused_by_loops), in the audit trail and by
agentloop_loops_broken.

Checked only when a bot's message is admitted, in its transaction (the conversation is
locked): a human's message, nearly all of them, costs nothing more.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from agentloop.core import metrics
from agentloop.core.people import PERSON_OWNER
from audit.events import record
from audit.models import EventKind
from conversations import handoff
from conversations.models import Conversation, ConversationState, Disposition, InboundMessage, Turn, TurnState

if TYPE_CHECKING:
    from conversations.ingest.values import Inbound
    from conversations.models import Channel

LOOP_BREAKER = handoff.LOOP_BREAKER


def allowed_names(channel: Channel) -> set[str]:
    """The channel's allowed bots, as compared: lower case, without a leading @."""
    return {name.strip().lstrip("@").lower() for name in (channel.allowed_bots or "").split(",") if name.strip()}


def bot_allowed(channel: Channel, inbound: Inbound) -> bool:
    """Whether this bot's messages are turns here: named by id or username."""
    names = allowed_names(channel)
    return bool(names) and (inbound.sender_id.lower() in names or (inbound.username or "").lower() in names)


def bot_ignored(conversation: Conversation, message: InboundMessage) -> None:
    """A bot's message the channel does not allow, just stored (disposition `bot`):
    counted, and audited if it is the first such message of the conversation."""
    metrics.after_commit(metrics.BOT_MESSAGES_IGNORED.inc)
    earlier = InboundMessage.objects.filter(conversation_id=conversation.pk, disposition=Disposition.BOT).exclude(
        pk=message.pk)
    if not earlier.exists():
        record(EventKind.BOT_MESSAGE_IGNORED, conversation=conversation, actor=conversation.sender_id,
               target=f"message {message.pk}", summary=message.text[:200],
               note="kept as context; later messages of this bot here are not audited again")


def replies_without_a_human(conversation: Conversation, now: datetime) -> int:
    """The agent's replies in this conversation within the channel's loop window, made
    after its last human message (and after its last takeover: a conversation given
    back starts counting again)."""
    channel = conversation.channel
    window_start = now - timedelta(seconds=channel.loop_window_seconds)
    since = max(filter(None, [window_start, _last_human_message(conversation.pk), conversation.held_at]))
    return (Turn.objects.filter(conversation_id=conversation.pk, state=TurnState.DONE, created_at__gt=since)
            .exclude(reply_text="").exclude(owner__startswith=PERSON_OWNER).count())


def _last_human_message(conversation_id: int) -> datetime | None:
    return (InboundMessage.objects.filter(conversation_id=conversation_id, from_bot__isnull=True)
            .order_by("-received_at").values_list("received_at", flat=True).first())


def breaks_the_loop(conversation: Conversation, now: datetime) -> bool:
    """Called as an allowed bot's message is admitted (the conversation locked): pause the
    agent here if it has replied its bound already. True if paused (the message is then
    stored as held, like any message of a held conversation)."""
    channel = conversation.channel
    if not channel.loop_max_replies or not channel.loop_window_seconds:
        return False
    held_at = Conversation.objects.filter(pk=conversation.pk).values_list("held_at", flat=True).first()
    conversation.held_at = held_at
    replies = replies_without_a_human(conversation, now)
    if replies < channel.loop_max_replies:
        return False
    why = (f"{replies} agent replies within {channel.loop_window_seconds} s without a human message "
           f"(the channel's bound: {channel.loop_max_replies})")
    if not handoff.take_over(conversation.pk, LOOP_BREAKER, now, reason=why):
        return False
    conversation.state = ConversationState.PERSON
    record(EventKind.LOOP_BROKEN, conversation=conversation, actor=LOOP_BREAKER,
           target=f"conversation {conversation.pk}", summary=why, replies=replies,
           window_seconds=channel.loop_window_seconds, bot=conversation.sender_id)
    metrics.after_commit(metrics.LOOPS_BROKEN.inc)
    return True

