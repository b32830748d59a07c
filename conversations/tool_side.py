"""What tools asks of conversations (tools.conversation_side.ConversationSide): named by
the setting AGENTLOOP_CONVERSATION_SIDE, since tools sits below this app and cannot import it."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from django.db.models import Q

from conversations import notes
from conversations.models import AgentKey, Channel, Conversation, Turn

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

    from tools import conversation_side


class ConversationSide:
    def inform(self, conversation_id: int, *, for_agent: str, for_user: StrOrPromise = "") -> bool:
        return notes.inform(conversation_id, for_agent=for_agent, for_user=for_user)

    def conversation_for_key(self, key: AgentKey, conversation_id: object) -> Conversation:
        # The API package imports DRF and drf_spectacular: a worker that never asks does not
        # pay for them at start-up (a third of it).
        from conversations.api.access import conversation_for_key

        # An MCP call's meta may carry any JSON: the API's path id check refuses a non-number
        # (its TypeError is the caller's refusal, tools.mcp.server._scope).
        return conversation_for_key(key, conversation_id)  # type: ignore[arg-type]

    def agent_key_for(self, raw: str) -> AgentKey | None:
        return AgentKey.objects.for_key(raw)

    def channel(self, slug: str) -> Channel | None:
        return Channel.objects.filter(slug=slug).first()

    def channels(self) -> list[Channel]:
        return list(Channel.objects.order_by("slug"))

    def turn_running_at(self, conversation_id: int, worker: str, at: datetime) -> int | None:
        """Claims do not record their turn; a claim taken inside a turn is owned by the
        worker running it, and a conversation runs one turn at a time."""
        return (Turn.objects.filter(Q(finished_at__isnull=True) | Q(finished_at__gte=at),
                                    conversation_id=conversation_id, owner=worker, started_at__lte=at)
                .order_by("-started_at").values_list("pk", flat=True).first())


if TYPE_CHECKING:
    def _is_the_interface(side: ConversationSide) -> conversation_side.ConversationSide:
        return side  # mypy checks here that this class is what tools asks for
