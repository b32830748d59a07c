"""The language agentloop writes to a user in: the contact's platform language (Telegram's
`from.language_code`, stored on the contact), else the channel's (admin), else the
deployment's (`AGENTLOOP_LANGUAGE`, Django's LANGUAGE_CODE). Each is narrowed to one of
the languages we have a catalog for (settings.LANGUAGES, `locale/`): "pt-BR" speaks
"pt", "fr" (no catalog) falls through to the next choice.

Texts are written with Django's gettext (`gettext_lazy` constants, rendered with
`text_in`); what the delivery ledger writes down keeps its language on the row, so the
recovery marker added at send time speaks it too."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from django.conf import settings
from django.utils import translation

if TYPE_CHECKING:
    from django.utils.functional import Promise


def supported(code: str | None) -> str:
    """The catalog language for a platform's code ("pt-BR" → "pt"), or "" when none fits."""
    code = (code or "").strip().lower().replace("_", "-")
    if not code:
        return ""
    known = {name for name, _ in settings.LANGUAGES}
    for candidate in (code, code.split("-", 1)[0]):
        if candidate in known:
            return candidate
    return ""


def default() -> str:
    return supported(settings.LANGUAGE_CODE) or "en"


def choose(*codes: str | None) -> str:
    """The first of `codes` we have a catalog for (contact's, channel's), else the deployment's."""
    for code in codes:
        found = supported(code)
        if found:
            return found
    return default()


class Spoken(Protocol):
    """A conversation as this module reads it (conversations' Conversation)."""

    language: str
    channel: Any  # its Channel, loaded with it: `.language`


def for_conversation(conversation: Spoken) -> str:
    """The language a conversation's texts are written in: its contact's, else its
    channel's, else the deployment's. No query: the contact's language is on the
    conversation, its channel is loaded with it (conversations', delivery's and tools'
    rows all reach a conversation through a foreign key)."""
    return choose(conversation.language, conversation.channel.language)


def text_in(language: str | None, text: str | Promise | Callable[[], str | Promise]) -> str:
    """`text` (a gettext_lazy string, or a callable building one) rendered in `language`."""
    with translation.override(language or default()):
        return str(text() if callable(text) else text)
