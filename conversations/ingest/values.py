"""The values of an admission: a platform message in our terms (Inbound), one being
admitted (Arrival), what became of it (Admission), and the refusal of one that cannot be stored."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from conversations.models import (
    Channel,
    Conversation,
)

# Longest text admitted (the inbound API's limit; Telegram's own is 4096).
MAX_TEXT_CHARS = 20000


@dataclass(frozen=True)
class MediaRef:
    """The file a media message carries, as its platform names it (conversations.media
    fetches it after the message is stored)."""

    key: str  # the platform's stable id of the file (Telegram's file_unique_id): stored once per channel
    ref: str  # what fetching it takes (Telegram's file_id)
    kind: str  # photo, voice, document, …
    declared_type: str = ""  # the MIME type the platform gave (never trusted: the bytes are sniffed)
    file_name: str = ""
    declared_size: int | None = None
    duration: float | None = None


@dataclass(frozen=True)
class Inbound:
    """A platform message in our own terms (parsed from Telegram, the API, the web chat)."""

    platform_message_id: str
    chat_id: str
    sender_id: str
    text: str = ""
    sender_name: str = ""
    username: str = ""
    media_type: str = ""  # "photo", "voice", … ; empty for plain text
    album_id: str = ""  # the album it is an item of (Telegram's media_group_id), if any
    is_group: bool = False
    thread_id: str = ""
    reply_target: str = ""  # the platform id our reply threads to
    sent_at: datetime | None = None
    media: MediaRef | None = None  # the file it carries, if the platform gave one
    language: str = ""  # the sender's language as the platform gives it (Telegram's language_code)
    # In a group: addressed to the agent (a mention, a reply to it)? None: the platform
    # does not say, and the message counts as addressed.
    mentioned: bool | None = None
    # Sent by a bot (Telegram's from.is_bot, Slack's bot_id, the API's is_bot): a turn
    # only where the channel allows that bot (conversations.loops).
    is_bot: bool = False
    # Where the platform wants the chat's replies sent, if it says with each message
    # (Teams: the conversation reference): stored per chat when it changes
    # (conversations.addresses), read by the platform's transport. None: nothing to keep.
    address: Mapping[str, str] | None = None
    # Its admission span's traceparent (agentloop.core.tracing), stored with it; None
    # while tracing is off. Set by the admission, never by a platform.
    traceparent: str | None = None


@dataclass
class Admission:
    duplicate: bool
    conversation_id: int | None = None
    message_id: int | None = None
    disposition: str = ""
    buffer_id: int | None = None
    flush_at: datetime | None = None
    planned_reason: str = ""
    window_kind: str = ""
    window_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Arrival:
    """One message being admitted: where it came from, the conversation it goes to (read
    or created by this admission's transaction), and when it arrived."""

    channel: Channel
    conversation: Conversation
    inbound: Inbound
    now: datetime


class Unstorable(ValueError):
    """A message the database cannot store as given. Refused alone: its caller answers or
    skips it (and audits the refusal), never retries it."""
