"""Who a live event is about, named as the console names people (agentloop.core.people):
the events are published where the change happens, with ids only, and the console's
sockets look the person up as they pass one on."""

from django.db.models import F

from agentloop.core.people import display_name, person_of
from conversations.models import Conversation
from delivery.models import OutboundMessage

# A person's reply reaches the page as its ledger row is sent: one of the conversation's
# latest rows. A few are read, since an agent's reply may go out between.
RECENT_ROWS = 5


def holder_of(conversation_id: int) -> str:
    """"olga" for a conversation console:olga holds; "" when nobody (or no such conversation)."""
    held_by = Conversation.objects.filter(pk=conversation_id).values_list("held_by", flat=True).first()
    return display_name(held_by or "")


def person_behind(conversation_id: int, text: str) -> str:
    """The person who wrote the reply just sent with `text` in the conversation, or ""
    when an agent wrote it. A long reply goes out in chunks: a chunk is the start of its row's text
    or a later part of it."""
    rows = (OutboundMessage.objects.filter(conversation_id=conversation_id).annotate(turn_owner=F("turn__owner"))
            .order_by("-pk").values_list("text", "turn_owner")[:RECENT_ROWS])
    for row_text, owner in rows:
        if text and text.strip() in (row_text or ""):
            return person_of(owner or "")
    return ""
