"""Outcomes that reach a conversation from outside a turn (a person's decision on a
proposal): a note in the agent's context and, optionally, a short message to the user."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentloop.core.redaction import redact
from conversations.models import ContextNote, Conversation
from delivery import ledger
from delivery.models import OutboundKind

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise


def inform(conversation_id: int, *, for_agent: str, for_user: StrOrPromise = "") -> bool:
    """Call inside the caller's transaction: the note and the message exist exactly
    when the decision that caused them committed. `for_user` may be a lazy text: the
    ledger writes it in the conversation's language."""
    conversation = Conversation.objects.select_related("channel").filter(pk=conversation_id).first()
    if conversation is None:
        return False
    # Stored and replayed in the agent's history (pull agents read it too): never a secret.
    ContextNote.objects.create(conversation=conversation, text=redact(for_agent))
    if for_user:
        ledger.enqueue(conversation, for_user, kind=OutboundKind.NOTICE)
    return True
