"""The language a conversation's texts are written in (agentloop.core.languages): the
contact's platform language, else the channel's, else the deployment's."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from agentloop.core import languages

if TYPE_CHECKING:
    from django.utils.functional import Promise

    from conversations.models import Conversation


def of(conversation: Conversation) -> str:
    """No query: the contact's language is on the conversation, its channel is loaded with it."""
    return languages.for_conversation(conversation)


def text_for(conversation: Conversation, text: str | Promise | Callable[[], str | Promise]) -> str:
    """A gettext_lazy text (or a callable building one) in the conversation's language."""
    return languages.text_in(of(conversation), text)
