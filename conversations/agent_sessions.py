"""What a remote agent keeps for a conversation between its turns (models.turns.AgentSession):
read and written on the worker's database threads, through the turn's context
(`TurnContext.load_session`, `save_session`)."""

from typing import Any

from django.utils import timezone

from conversations.models.turns import AgentSession


def load(conversation_id: int, key: str) -> dict[str, Any]:
    """The session's state, or {} when there is none or it predates the conversation's
    /reset (or an erasure, which resets it too): the agent then starts afresh."""
    row = (AgentSession.objects.filter(conversation_id=conversation_id, key=key)
           .values("state", "started_at", "conversation__context_reset_at").first())
    if row is None:
        return {}
    reset = row["conversation__context_reset_at"]
    if reset is not None and reset > row["started_at"]:
        return {}
    return dict(row["state"] or {})


def save(conversation_id: int, key: str, state: dict[str, Any], *, new: bool) -> None:
    """Keep `state`; `new`: the agent began another session this turn (its start is now,
    so a /reset before it no longer hides it)."""
    now = timezone.now()
    fields = {"state": state, "updated_at": now, **({"started_at": now} if new else {})}
    AgentSession.objects.update_or_create(conversation_id=conversation_id, key=key, defaults=fields,
                                          create_defaults={**fields, "started_at": now})
