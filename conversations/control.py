"""Control commands skip the buffer and are answered at once."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from django.utils import timezone
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from audit.events import record
from audit.models import EventKind
from conversations import routing, turns
from conversations.models import BufferState, Disposition, FlushReason, InboundMessage, MessageBuffer, Turn
from delivery import ledger
from delivery.models import OutboundKind

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

    from conversations.models import Conversation

COMMANDS = ("/start", "/stop", "/reset", "/help")

HELP = _(
    "Send me your message — several in a row are fine, I read them together.\n"
    "/stop — stop what I'm doing and drop what you've sent but I haven't read yet\n"
    "/reset — start a fresh conversation\n"
    "/help — this message"
)
GREETING = _("Hi!")
RESET = _("Conversation reset. What can I do for you?")
STOPPED = _("Stopped.")
NOTHING_TO_STOP = _("Nothing to stop.")
UNSTOPPABLE = _("I had already started an action, so that part will finish and I'll report it.")


def parse(text: str) -> str | None:
    """'/stop', '/stop@my_bot' and '/STOP now' are all /stop; anything else is None."""
    if not text or not text.startswith("/"):
        return None
    command = text.split(maxsplit=1)[0].split("@", 1)[0].lower()
    return command if command in COMMANDS else None


def handle(conversation: Conversation, message: InboundMessage, command: str, now: datetime | None = None) -> None:
    now = now or timezone.now()
    # Lazy texts: the ledger writes them in the conversation's language.
    if command == "/start":
        reply: StrOrPromise = format_lazy("{} {}", GREETING, HELP)
    elif command == "/help":
        reply = HELP
    else:
        dropped = drop_pending(conversation, now)
        stopped, unstoppable = stop_turns(conversation, command, now)
        if command == "/reset":
            conversation.context_reset_at = now
            conversation.save(update_fields=["context_reset_at"])
            routing.unpin(conversation.pk)  # an agent's handoff lasts until /reset
            reply = RESET
        else:
            reply = STOPPED if (dropped or stopped or unstoppable) else NOTHING_TO_STOP
        if unstoppable:
            reply = format_lazy("{} {}", reply, UNSTOPPABLE)
    ledger.enqueue(conversation, reply, kind=OutboundKind.CONTROL,
                   reply_target=message.reply_target, thread_id=message.thread_id)
    record(EventKind.CONTROL_COMMAND, conversation=conversation, actor=conversation.sender_id,
           target=f"message {message.pk}", summary=command)


def drop_pending(conversation: Conversation, now: datetime) -> int:
    """Drop the open buffer (compare-and-swap: the flusher may be claiming it)."""
    buffer = MessageBuffer.objects.filter(conversation=conversation, state=BufferState.OPEN).first()
    if buffer is None:
        return 0
    dropped = MessageBuffer.transition(buffer.pk, BufferState.OPEN, BufferState.DROPPED,
                                       flush_reason=FlushReason.CONTROL, flushed_at=now)
    if dropped:
        InboundMessage.objects.filter(buffer=buffer).update(disposition=Disposition.DROPPED)
    return dropped


def stop_turns(conversation: Conversation, command: str, now: datetime) -> tuple[int, int]:
    """Cancel ready and running turns that fired no effect; count those that did."""
    stopped = unstoppable = 0
    for turn in Turn.objects.filter(conversation=conversation, state__in=Turn.ACTIVE):
        if turns.cancel(turn.pk, f"{command} from the user", now):
            stopped += 1
        else:
            unstoppable += 1
    return stopped, unstoppable
