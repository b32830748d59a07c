"""Reactions people put on the bot's messages (Telegram's `message_reaction`, Slack's
`reaction_added`, WhatsApp's `reaction` messages), applied once each.

A reaction is not a turn: the agent reads it as a note in its next turn ("the person
reacted 👍 to your message …"). On a confirmation question (tools.confirmations) a 👍 or
👎 from the conversation's own person is the tap it stands for — confirm or decline,
through `confirmations.decide`, whose compare-and-swap makes repeated reactions and a
racing button tap apply once; the question's message then shows the outcome, as after a
tap. The reacted message is found by the delivery ledger's row whose platform_message_id
it is, in the reaction's chat; a reaction on anything else (a person's message, another
bot's) is ignored and not stored.

Dedup: the platform's id of the event (Telegram's update_id, Slack's event_id, the
WhatsApp reaction message's id) is the unique key of its InboundReaction row, inserted
in the transaction that adds the note — a redelivered webhook stops at the INSERT. The
rows are the story page's record of the reactions.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, transaction
from django.db.models import Q

from conversations import notes
from conversations.models import InboundReaction, ReactionOutcome
from delivery.models import OutboundMessage
from tools import confirmations
from tools.models import Confirmation

if TYPE_CHECKING:
    from conversations.models import Channel, Conversation

log = logging.getLogger(__name__)

IGNORED = ReactionOutcome.IGNORED

# What stands for a tap on a question's buttons: Unicode emoji (Telegram, WhatsApp) and
# Slack's names for them, skin tones aside.
YES = frozenset({"👍", "+1", "thumbsup"})
NO = frozenset({"👎", "-1", "thumbsdown"})
_SKIN_TONES = re.compile("[\U0001F3FB-\U0001F3FF\uFE0F]|::skin-tone-[2-6]$")
QUOTE_CHARS = 80  # how much of the reacted message the note quotes


@dataclass(frozen=True)
class Reaction:
    """A reaction in our own terms. `chat_id`: the chat the reacted message is in, as the
    ledger stores it; with `thread_prefix`, any of that chat's per-thread conversations
    too ("C123" and "C123:<thread ts>": Slack names no thread in a reaction)."""

    key: str  # the platform's id of the event: the dedup
    platform_message_id: str  # the reacted message, as the ledger stores it
    chat_id: str
    sender_id: str
    emoji: str  # "" when the reaction was taken back
    source: str  # telegram, slack, whatsapp
    sender_name: str = ""
    thread_prefix: bool = False


@dataclass
class ReactionResult:
    outcome: str  # a ReactionOutcome
    duplicate: bool = False
    conversation_id: int | None = None


def base(emoji: str) -> str:
    """The emoji without its skin tone or presentation selector (👍🏽 → 👍, +1::skin-tone-3 → +1)."""
    return _SKIN_TONES.sub("", emoji or "")


def apply(channel: Channel, reaction: Reaction) -> ReactionResult:
    """Apply one reaction (see the module's docstring)."""
    row = _reacted_row(channel, reaction)
    if row is None:
        return ReactionResult(ReactionOutcome.IGNORED)
    confirmation = Confirmation.objects.select_related("conversation__contact", "conversation__channel").filter(
        question=row).first()
    yes = _answer(reaction.emoji) if confirmation is not None else None
    if confirmation is None or yes is None:
        return _noted(channel, reaction, row)
    conversation = confirmation.conversation
    if reaction.sender_id != conversation.sender_id:
        return _stored(channel, reaction, row, ReactionOutcome.NOT_YOURS)
    # The row first (the dedup), the decision after its commit: an action never runs in
    # a transaction that could still roll back. A crash in between loses the decision
    # (the question stays open: a tap or another 👍 answers it).
    stored = _stored(channel, reaction, row, ReactionOutcome.CONFIRMED if yes else ReactionOutcome.REJECTED)
    if stored.duplicate:
        return stored
    reply = confirmations.decide(confirmation, yes, by=confirmations.decided_by(conversation, reaction.sender_name))
    if reply.status not in ("confirmed", "rejected"):  # a tap or an earlier reaction won
        InboundReaction.objects.filter(channel=channel, key=reaction.key).update(outcome=ReactionOutcome.ALREADY)
        stored.outcome = ReactionOutcome.ALREADY
    elif reply.outcome:
        _show_outcome(channel, confirmation, reply)
    return stored


def _reacted_row(channel: Channel, reaction: Reaction) -> OutboundMessage | None:
    """The ledger's row of the bot's message reacted to, in the reaction's chat."""
    if not reaction.platform_message_id or not reaction.chat_id:
        return None
    chat = Q(chat_id=reaction.chat_id)
    if reaction.thread_prefix:
        chat |= Q(chat_id__startswith=f"{reaction.chat_id}:")
    return (OutboundMessage.objects.select_related("conversation").filter(
        chat, channel=channel, platform_message_id=reaction.platform_message_id).order_by("-pk").first())


def _answer(emoji: str) -> bool | None:
    emoji = base(emoji)
    return True if emoji in YES else False if emoji in NO else None


def _noted(channel: Channel, reaction: Reaction, row: OutboundMessage) -> ReactionResult:
    """A note for the conversation's next turn, in the transaction that stores the row.
    A reaction taken back is stored, not told (the agent acted on nothing)."""
    if not reaction.emoji:
        return _stored(channel, reaction, row, ReactionOutcome.IGNORED)
    with transaction.atomic():
        stored = _stored(channel, reaction, row, ReactionOutcome.NOTED)
        if not stored.duplicate:
            notes.inform(row.conversation_id, for_agent=note_text(reaction, row, row.conversation))
    return stored


def _stored(channel: Channel, reaction: Reaction, row: OutboundMessage, outcome: str) -> ReactionResult:
    """The row's INSERT, the dedup: a unique violation is a redelivery."""
    try:
        with transaction.atomic():
            InboundReaction.objects.create(
                channel=channel, key=reaction.key[:200], conversation_id=row.conversation_id,
                platform_message_id=reaction.platform_message_id[:200], emoji=reaction.emoji[:64],
                sender_id=reaction.sender_id[:100], outcome=outcome)
    except IntegrityError:  # what the first delivery did (as far as it has got)
        first = InboundReaction.objects.filter(channel=channel, key=reaction.key[:200]).values_list(
            "outcome", flat=True).first()
        return ReactionResult(first or outcome, duplicate=True, conversation_id=row.conversation_id)
    return ReactionResult(outcome, conversation_id=row.conversation_id)


def note_text(reaction: Reaction, row: OutboundMessage, conversation: Conversation) -> str:
    """What the agent reads. Who reacted, when it is not the conversation's person (a group)."""
    who = "The person" if reaction.sender_id == conversation.sender_id else (
        f"{reaction.sender_name or reaction.sender_id} (someone else in the chat)")
    quoted = " ".join(row.text.split())
    if len(quoted) > QUOTE_CHARS:
        quoted = quoted[:QUOTE_CHARS - 1] + "…"
    emoji = f":{reaction.emoji}:" if reaction.source == "slack" else reaction.emoji  # Slack names its emoji
    return (f"{who} reacted {emoji} to your message \"{quoted}\". A reaction, not a message: "
            "no answer is expected unless it changes what you are doing.")


def _show_outcome(channel: Channel, confirmation: Confirmation, reply: Any) -> None:
    """The question's message shows the outcome instead of its buttons, as after a tap
    (best effort: the decision stands; a later tap repeats the edit)."""
    try:
        channel.platform.question_decided(channel, confirmation, reply.outcome, reply.status)
    except Exception as exc:
        log.warning("channel %s: showing the outcome of confirmation %s failed: %s", channel.slug, confirmation.pk,
                    type(exc).__name__)
