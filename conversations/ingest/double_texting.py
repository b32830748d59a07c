"""Double texting: the channel's strategy for a message that arrives while a turn of
its conversation runs (reject, interrupt, roll back, or enqueue)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.utils.translation import gettext_lazy as _

from audit.events import record
from audit.models import EventKind
from conversations import turns
from conversations.models import (
    Disposition,
    DoubleTexting,
)
from delivery import ledger
from delivery.models import OutboundKind

if TYPE_CHECKING:
    from datetime import datetime

    from conversations.models import Channel, Conversation, InboundMessage, Turn

REJECT_NOTICE = _("I'm still working on your previous message. Please send this again once I've answered.")


def double_text(channel: Channel, conversation: Conversation, running: Turn, message: InboundMessage,
                now: datetime) -> str:
    """Apply the channel's strategy to a message that arrived while `running` runs.
    Returns "rejected", "interrupted", "rolled_back" or "enqueued"."""
    strategy = channel.double_texting
    if strategy == DoubleTexting.REJECT:
        message.disposition = Disposition.REJECTED
        message.save(update_fields=["disposition"])
        ledger.enqueue(conversation, REJECT_NOTICE, kind=OutboundKind.NOTICE,
                       reply_target=message.reply_target, thread_id=message.thread_id)
        record(EventKind.MESSAGE_REJECTED, conversation=conversation, target=f"turn {running.pk}",
               actor=conversation.sender_id, summary=message.text[:200])
        return "rejected"
    if strategy in (DoubleTexting.INTERRUPT, DoubleTexting.ROLLBACK):
        if turns.cancel(running.pk, f"{strategy}: a new message arrived", now):
            kind = EventKind.TURN_INTERRUPTED if strategy == DoubleTexting.INTERRUPT else EventKind.TURN_ROLLED_BACK
            record(kind, conversation=conversation, target=f"turn {running.pk}", actor=conversation.sender_id)
            return "interrupted" if strategy == DoubleTexting.INTERRUPT else "rolled_back"
        # The turn already touched the outside world: it cannot be undone, so the
        # message waits for it like `enqueue`.
        record(EventKind.STRATEGY_FELL_BACK, conversation=conversation, target=f"turn {running.pk}",
               summary=f"{strategy} refused: the turn has fired an external effect; enqueued instead")
    return "enqueued"
