"""Outcomes that reach a conversation from outside a turn (a person's decision on a
proposal): a note in the agent's context and, optionally, a short message to the user."""

from agentloop.core.redaction import redact
from conversations.models import ContextNote, Conversation
from delivery import ledger
from delivery.models import OutboundKind


def inform(conversation_id, *, for_agent: str, for_user: str = "") -> bool:
    """Call inside the caller's transaction: the note and the message exist exactly
    when the decision that caused them committed."""
    conversation = Conversation.objects.select_related("channel").filter(pk=conversation_id).first()
    if conversation is None:
        return False
    # Stored and replayed in the agent's history (pull agents read it too): never a secret.
    ContextNote.objects.create(conversation=conversation, text=redact(for_agent))
    if for_user:
        ledger.enqueue(conversation, for_user, kind=OutboundKind.NOTICE)
    return True
