"""Matrix room events (the client-server API's JSON, as `/sync` gives them) into our own
types: `m.room.message` into an Inbound (an `m.replace` relation into an Edit),
`m.reaction` into a Reaction, `m.room.redaction` into a Deletion, `m.room.encrypted`
into an Encrypted refusal (end-to-end encryption is not supported: docs/matrix.md), and
the sync position a batch ends with into a SyncPosition (stored after the batch's
events are admitted). Anything else is nothing to act on.

The payloads are built by the sync session (sync.py): `{"room": <room id>, "event":
<the event>, "members": <joined members>, "bot": <the bot's user id>, "bot_name": <its
display name in the room>, "sender_name": <the sender's>}`, or `{"next_batch": <token>,
"bot": <the bot's user id>}`.

Identities: a message's dedup key is its event id (unique on the homeserver); its chat
is the room. A room of two members (the bot and one person) is a direct chat; a larger
one is a group, where a message is the bot's to answer when it mentions the bot (its
user id in `m.mentions`, or its user id or display name in the text) — the others are
kept as context (conversations.groups). A message in a thread (`m.thread`) keeps the
thread's root as its thread, and the reply goes into that thread.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.utils import timezone

from conversations.deletions import Deletion
from conversations.edits import Edit
from conversations.ingest import Inbound
from conversations.reactions import Reaction

SOURCE = "matrix"
TEXT_TYPES = ("m.text", "m.notice", "m.emote")
ENCRYPTED_REFUSAL = ("end-to-end encrypted rooms are not supported (docs/matrix.md): the bot cannot read this "
                     "message; invite it to an unencrypted room")


@dataclass(frozen=True)
class SyncPosition:
    """Where the next `/sync` resumes (its `since`): stored once the batch before it is in."""

    next_batch: str
    user_id: str = ""  # the bot's (the transport's typing names it)


@dataclass(frozen=True)
class Encrypted:
    """A message the bot cannot read (`m.room.encrypted`): refused, logged and audited."""

    platform_message_id: str
    sender_id: str
    room: str


def parse(payload: Any) -> object | None:
    """One payload of the sync session into our own type; None: nothing to act on."""
    if not isinstance(payload, dict):
        return None
    if isinstance(payload.get("next_batch"), str) and payload["next_batch"]:
        return SyncPosition(payload["next_batch"], str(payload.get("bot") or ""))
    event, room = payload.get("event"), payload.get("room")
    if not (isinstance(event, dict) and isinstance(room, str) and room):
        return None
    event_id, sender = str(event.get("event_id") or ""), str(event.get("sender") or "")
    content = event.get("content")
    bot = str(payload.get("bot") or "")
    if not (event_id and sender and isinstance(content, dict)) or sender == bot:
        return None  # malformed, or our own event coming back through the sync
    kind = event.get("type")
    if kind == "m.room.encrypted":
        return Encrypted(event_id, sender, room)
    if kind == "m.reaction":
        return _reaction(event_id, room, sender, content, str(payload.get("sender_name") or ""))
    if kind == "m.room.redaction":
        redacts = event.get("redacts") or content.get("redacts")
        return Deletion(platform_message_id=str(redacts), deleted_at=timezone.now(), source=SOURCE,
                        chat_id=room, sender_id=sender) if redacts else None
    if kind != "m.room.message":
        return None
    relation = content.get("m.relates_to")
    relation = relation if isinstance(relation, dict) else {}
    if relation.get("rel_type") == "m.replace":
        return _edit(event, room, sender, content, relation, payload)
    return _message(event, room, sender, content, relation, payload)


def _message(event: dict[str, Any], room: str, sender: str, content: dict[str, Any], relation: dict[str, Any],
             payload: dict[str, Any]) -> Inbound | None:
    if content.get("msgtype") not in TEXT_TYPES or not isinstance(content.get("body"), str):
        return None  # a file, a location, a poll: not read (docs/matrix.md)
    text = _without_reply_fallback(content["body"]).strip()
    if not text:
        return None
    members = payload.get("members")
    is_group = isinstance(members, int) and members > 2
    thread = str(relation.get("event_id") or "") if relation.get("rel_type") == "m.thread" else ""
    return Inbound(platform_message_id=str(event["event_id"]), chat_id=room, sender_id=sender, text=text,
                   sender_name=str(payload.get("sender_name") or ""), username=sender, is_group=is_group,
                   thread_id=thread, reply_target=str(event["event_id"]), sent_at=_time(event.get("origin_server_ts")),
                   mentioned=addressed(content, str(payload.get("bot") or ""), str(payload.get("bot_name") or ""))
                   if is_group else None)


def addressed(content: dict[str, Any], bot: str, bot_name: str) -> bool:
    """A group message is the bot's when it mentions the bot: `m.mentions` names its user
    id, or the text (or its HTML) holds its user id or its display name."""
    mentions = content.get("m.mentions")
    if isinstance(mentions, dict) and isinstance(mentions.get("user_ids"), list) and bot in mentions["user_ids"]:
        return True
    text = " ".join(str(content.get(field) or "") for field in ("body", "formatted_body"))
    if bot and bot in text:
        return True
    return bool(bot_name) and re.search(rf"(?<!\w){re.escape(bot_name)}(?!\w)", text, re.IGNORECASE) is not None


def _without_reply_fallback(body: str) -> str:
    """A reply's body quotes the message it answers (lines starting "> "), then a blank line."""
    lines = body.split("\n")
    if lines and lines[0].startswith("> "):
        while lines and lines[0].startswith(">"):
            lines.pop(0)
    return "\n".join(lines)


def _edit(event: dict[str, Any], room: str, sender: str, content: dict[str, Any], relation: dict[str, Any],
          payload: dict[str, Any]) -> Edit | None:
    new = content.get("m.new_content")
    if not (isinstance(new, dict) and isinstance(new.get("body"), str) and relation.get("event_id")):
        return None
    return Edit(platform_message_id=str(relation["event_id"]), text=new["body"].strip(),
                edited_at=_time(event.get("origin_server_ts")) or timezone.now(), source=SOURCE, chat_id=room,
                sender_id=sender)


def _reaction(event_id: str, room: str, sender: str, content: dict[str, Any], sender_name: str) -> Reaction | None:
    relation = content.get("m.relates_to")
    if not (isinstance(relation, dict) and relation.get("rel_type") == "m.annotation" and relation.get("event_id")
            and isinstance(relation.get("key"), str)):
        return None
    return Reaction(key=event_id, platform_message_id=str(relation["event_id"]), chat_id=room, sender_id=sender,
                    emoji=relation["key"], source=SOURCE, sender_name=sender_name)


def _time(value: Any) -> datetime | None:
    if not isinstance(value, int) or value <= 0:
        return None
    try:
        return datetime.fromtimestamp(value / 1000, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None
