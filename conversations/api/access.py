"""Which channels and conversations an agent key may reach."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.shortcuts import get_object_or_404
from rest_framework import exceptions, status  # type: ignore[import-untyped]  # DRF ships no types

from agentloop.core.api import row_id
from conversations.models import Channel, Conversation

if TYPE_CHECKING:
    from conversations.models import AgentKey


def channel_for_key(key: AgentKey, slug: str, kind: str | None = None) -> Channel:
    channel = get_object_or_404(Channel, slug=slug, is_active=True)
    if not key.channels.filter(pk=channel.pk).exists():
        raise exceptions.PermissionDenied(f"this agent key has no access to channel '{slug}'")
    if kind and channel.kind != kind:
        raise exceptions.ValidationError({"channel": f"'{slug}' is a {channel.kind} channel, not {kind}"})
    return channel


def conversation_for_key(key: AgentKey, conversation_id: int) -> Conversation:
    """The conversation, if it is in one of the key's channels; 404 otherwise (another
    agent's conversations do not exist as far as this key is concerned)."""
    conversation: Conversation | None = Conversation.objects.select_related("channel", "contact").filter(
        pk=row_id(conversation_id, "conversation"), channel__agent_keys=key).first()
    if conversation is None:
        raise exceptions.NotFound(f"no conversation {conversation_id}")
    return conversation


class Conflict(exceptions.APIException):  # type: ignore[misc]  # DRF's classes are Any here
    status_code = status.HTTP_409_CONFLICT
    default_detail = "conflict"
