"""Refusal: a message the database cannot store as given (a NUL, an unpaired
surrogate, a field too long) is refused alone, audited, never retried."""

from __future__ import annotations

import functools
import logging
import re
from typing import TYPE_CHECKING, Protocol

from django.db.models import Field, Model

from audit.events import record
from audit.models import EventKind
from conversations.ingest.values import MAX_TEXT_CHARS, Inbound
from conversations.models import (
    Conversation,
    InboundMessage,
)

if TYPE_CHECKING:
    from conversations.models import Channel

log = logging.getLogger("conversations.ingest")  # the name it had as one module

# PostgreSQL refuses NUL in text; no database can encode an unpaired UTF-16 surrogate
# (JSON's "\ud800" decodes to one).
_UNSTORABLE_CHARACTER = re.compile("[\x00\ud800-\udfff]")


@functools.cache
class Refused(Protocol):
    """What a refusal's audit names: an Inbound, or an edit of one (conversations.edits.Edit)."""

    @property
    def platform_message_id(self) -> str: ...
    @property
    def sender_id(self) -> str: ...


def _field_limits() -> dict[str, int]:
    """Fields of an Inbound stored in columns of bounded length, and those lengths."""
    column = {"platform_message_id": (InboundMessage, "platform_message_id"), "chat_id": (Conversation, "chat_id"),
              "sender_id": (Conversation, "sender_id"), "reply_target": (InboundMessage, "reply_target"),
              "thread_id": (InboundMessage, "thread_id"), "media_type": (InboundMessage, "media_type"),
              "album_id": (InboundMessage, "album_id")}
    limits = {name: column_length(model, field) for name, (model, field) in column.items()}
    return {**limits, "text": MAX_TEXT_CHARS}


def column_length(model: type[Model], name: str) -> int:
    """The length a text column of `model` holds (a CharField's max_length)."""
    field = model._meta.get_field(name)
    assert isinstance(field, Field) and field.max_length is not None  # each a CharField
    return field.max_length


def refusal(inbound: Inbound) -> str:
    """Why this message cannot be stored, or "" when it can."""
    limits = _field_limits()
    for name in ("platform_message_id", "chat_id", "sender_id", "text", "sender_name", "username",
                 "media_type", "album_id", "thread_id", "reply_target"):
        value = getattr(inbound, name)
        found = _UNSTORABLE_CHARACTER.search(value)
        if found:
            what = "a NUL character" if found.group() == "\x00" else "an unpaired surrogate"
            return f"{name} contains {what} (U+{ord(found.group()):04X}), which cannot be stored"
        if name in limits and len(value) > limits[name]:
            return f"{name} is {len(value)} characters long; at most {limits[name]} can be stored"
    return ""


def printable(value: str, limit: int = 100) -> str:
    """`value` safe to store in an audit row: unstorable characters escaped, cut to `limit`."""
    return _UNSTORABLE_CHARACTER.sub(lambda m: f"\\u{ord(m.group()):04x}", value)[:limit]


def record_refusal(channel: Channel, inbound: Refused, reason: str, source: str) -> None:
    """Audit a refused message (it has no row of its own to show)."""
    record(EventKind.MESSAGE_REFUSED, channel_slug=channel.slug, actor=printable(inbound.sender_id),
           target=f"message {printable(inbound.platform_message_id, 150)}", summary=f"{source}: {reason}")
    log.warning("channel %s: refused message %s from %s: %s", channel.slug,
                printable(inbound.platform_message_id), source, reason)
