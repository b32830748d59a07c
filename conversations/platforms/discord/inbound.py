"""Discord's Gateway dispatches into our own types: MESSAGE_CREATE into an Inbound (one
per attachment beyond the first),
MESSAGE_UPDATE into an Edit, MESSAGE_DELETE into a Deletion, READY into the session a
new holder of the connection resumes, INTERACTION_CREATE (a tap on a question's button)
into a buttons.Tap; anything else is nothing to act on.

A message's chat is its Discord channel: a DM channel, a guild text channel, or a thread
(a thread is a channel of its own, its id the `channel_id` of the messages in it). Our
reply threads to the message (`message_reference`). The Gateway sends a dispatch again
after a RESUME when the resumed-from sequence number was older: the message id is the
dedup key, so the copy stops at the admission.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from discord.utils import parse_time
from django.utils import timezone

from conversations.deletions import Deletion
from conversations.edits import Edit
from conversations.ingest import Inbound, MediaRef
from conversations.platforms.discord.buttons import tap_of

SOURCE = "discord"
MAX_ATTACHMENTS = 10  # what Discord lets a message carry
VOICE_MESSAGE = 1 << 13  # a message's flag: a voice message (its one attachment an audio with duration_secs)


@dataclass(frozen=True)
class SessionStarted:
    """READY: what RESUME needs later (and the bot's own user id, for mentions)."""

    session_id: str
    resume_url: str
    bot_user_id: str

    def state(self) -> dict[str, str]:
        return {"session_id": self.session_id, "resume_url": self.resume_url, "bot_user_id": self.bot_user_id}


def parse(event: str, data: Any, bot_user_id: str) -> object | None:
    """One dispatch (`t`, `d`) into our own type (a MESSAGE_CREATE's first Inbound:
    parse_all gives all); None: nothing to act on (another event, our own message, a
    message with neither text nor a file)."""
    if not isinstance(data, dict):
        return None
    if event == "READY":
        return _session(data)
    if event == "MESSAGE_CREATE":
        found = messages(data, bot_user_id)
        return found[0] if found else None
    if event == "MESSAGE_UPDATE":
        return _edit(data, bot_user_id)
    if event == "MESSAGE_DELETE":
        return _deletion(data)
    if event == "INTERACTION_CREATE":
        return tap_of(data)
    return None


def parse_all(event: str, data: Any, bot_user_id: str) -> list[object]:
    """One dispatch into everything it carries: a MESSAGE_CREATE with several
    attachments is several Inbounds; anything else one item or none."""
    if event == "MESSAGE_CREATE" and isinstance(data, dict):
        return list(messages(data, bot_user_id))
    item = parse(event, data, bot_user_id)
    return [item] if item is not None else []


def _session(data: dict[str, Any]) -> SessionStarted | None:
    user = data.get("user")
    user = user if isinstance(user, dict) else {}
    session_id, resume_url = str(data.get("session_id") or ""), str(data.get("resume_gateway_url") or "")
    return SessionStarted(session_id, resume_url, str(user.get("id") or "")) if session_id else None


def _author(data: dict[str, Any]) -> dict[str, Any]:
    author = data.get("author")
    return author if isinstance(author, dict) else {}


def messages(data: dict[str, Any], bot_user_id: str) -> list[Inbound]:
    """A MESSAGE_CREATE's Inbounds: its text with its first attachment, then one per
    other attachment; none for our own message, a malformed one, or one with neither
    text nor a file (an embed alone, a sticker)."""
    author = _author(data)
    message_id, chat, sender = str(data.get("id") or ""), str(data.get("channel_id") or ""), str(author.get("id") or "")
    if not (message_id and chat and sender) or sender == bot_user_id:
        return []  # malformed, or our own message coming back through the Gateway
    text = _without_own_mention(str(data.get("content") or ""), bot_user_id)
    files = _files(data)
    if not text and not files:
        return []
    in_guild = bool(data.get("guild_id"))
    first = Inbound(platform_message_id=message_id, chat_id=chat, sender_id=sender, text=text,
                    sender_name=str(author.get("global_name") or author.get("username") or ""),
                    username=str(author.get("username") or ""), is_group=in_guild, reply_target=message_id,
                    sent_at=_time(data.get("timestamp")), is_bot=bool(author.get("bot")),
                    mentioned=addressed(data, bot_user_id) if in_guild else None,
                    media=files[0] if files else None, media_type=files[0].kind if files else "",
                    album_id=message_id if len(files) > 1 else "")
    return [first, *(replace(first, platform_message_id=f"{message_id}.{number}", text="", media=ref,
                             media_type=ref.kind) for number, ref in enumerate(files[1:], start=1))]


def _files(data: dict[str, Any]) -> list[MediaRef]:
    found = data.get("attachments")
    voice = isinstance(data.get("flags"), int) and bool(data["flags"] & VOICE_MESSAGE)
    refs = []
    for item in found[:MAX_ATTACHMENTS] if isinstance(found, list) else []:
        if not (isinstance(item, dict) and item.get("id") and isinstance(item.get("url"), str) and item["url"]):
            continue
        declared = str(item.get("content_type") or "").split(";")[0].strip().lower()
        size, duration = item.get("size"), item.get("duration_secs")
        refs.append(MediaRef(key=str(item["id"]), ref=item["url"], kind=_kind(declared, voice), declared_type=declared,
                             file_name=str(item.get("filename") or "")[:255],
                             declared_size=size if isinstance(size, int) and size >= 0 else None,
                             duration=float(duration) if isinstance(duration, int | float) else None))
    return refs


def _kind(content_type: str, voice: bool) -> str:
    major = content_type.split("/")[0]
    if major == "audio":
        return "voice" if voice else "audio"
    return {"image": "image", "video": "video"}.get(major, "document")


def addressed(data: dict[str, Any], bot_user_id: str) -> bool:
    """A guild message is the bot's to answer when it mentions the bot (`mentions` holds
    its user id) or replies to one of its messages; the rest are kept as context."""
    mentions = data.get("mentions")
    mentions = mentions if isinstance(mentions, list) else []
    if bot_user_id and any(isinstance(user, dict) and str(user.get("id")) == bot_user_id for user in mentions):
        return True
    replied = data.get("referenced_message")
    return bool(bot_user_id and isinstance(replied, dict) and str(_author(replied).get("id") or "") == bot_user_id)


def _without_own_mention(text: str, bot_user_id: str) -> str:
    if bot_user_id:
        text = re.sub(rf"<@!?{re.escape(bot_user_id)}>", "", text)
    return text.strip()


def _edit(data: dict[str, Any], bot_user_id: str) -> Edit | None:
    author = _author(data)
    if "content" not in data or not data.get("id") or str(author.get("id") or "") == bot_user_id:
        return None  # an embed unfolded (no content), or our own message edited
    return Edit(platform_message_id=str(data["id"]), text=_without_own_mention(str(data["content"] or ""), bot_user_id),
                edited_at=_time(data.get("edited_timestamp")) or timezone.now(), source=SOURCE,
                chat_id=str(data.get("channel_id") or "") or None, sender_id=str(author.get("id") or ""))


def _deletion(data: dict[str, Any]) -> Deletion | None:
    if not data.get("id"):
        return None
    # MESSAGE_DELETE names no author, so no sender is checked (a chat without its sender
    # would match no conversation): the id alone, a snowflake unique across Discord, as
    # only Discord sends this channel's Gateway events.
    return Deletion(platform_message_id=str(data["id"]), deleted_at=timezone.now(), source=SOURCE)


def _time(value: Any) -> datetime | None:
    try:
        return parse_time(value) if isinstance(value, str) and value else None
    except ValueError:
        return None
