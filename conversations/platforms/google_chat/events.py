"""A Google Chat interaction event (the JSON POSTed to an HTTP endpoint app) into our own
types. The event is {"type", "eventTime", "space": {"name", "type" (DM / ROOM),
"spaceType" (DIRECT_MESSAGE / SPACE / GROUP_CHAT), "singleUserBotDm"}, "message": {"name",
"sender": {"name", "displayName", "type" (HUMAN / BOT)}, "createTime", "text",
"argumentText", "thread": {"name"}, "annotations": [{"type": "USER_MENTION",
"userMention": {"user": {"name", "type"}}}], "slashCommand"}, "user", "action",
"common"}.

In a space an HTTP app is sent the messages that mention it (and slash commands); a
message that reaches it otherwise is kept as context, unaddressed (conversations.groups
decides at the flush). Our own messages never come back as events; another bot's are
flagged is_bot (conversations.loops)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from conversations.ingest import Inbound

MESSAGE = "MESSAGE"
CARD_CLICKED = "CARD_CLICKED"
ADDED_TO_SPACE = "ADDED_TO_SPACE"
REMOVED_FROM_SPACE = "REMOVED_FROM_SPACE"


@dataclass(frozen=True)
class Ignored:
    why: str  # one word ("empty", "incomplete", …)


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def is_dm(space: dict[str, Any]) -> bool:
    return space.get("type") == "DM" or space.get("spaceType") == "DIRECT_MESSAGE" or bool(space.get("singleUserBotDm"))


def inbound_from(event: dict[str, Any]) -> Inbound | Ignored:
    """A MESSAGE event's (or an ADDED_TO_SPACE's carrying the mention that added the
    app) message, or why it is not one."""
    space, message = as_dict(event.get("space")), as_dict(event.get("message"))
    sender = as_dict(message.get("sender")) or as_dict(event.get("user"))
    name, space_name, user = (str(value or "") for value in (message.get("name"), space.get("name"), sender.get("name")))
    if not name or not space_name or not user:
        return Ignored("incomplete")
    direct = is_dm(space)
    mentioned = addressed(message)
    text = str(message.get("argumentText") if mentioned and message.get("argumentText") is not None
               else message.get("text") or "").strip()
    if not text:
        return Ignored("empty")
    thread = str(as_dict(message.get("thread")).get("name") or "")
    return Inbound(
        platform_message_id=name,
        chat_id=space_name,
        sender_id=user,
        sender_name=str(sender.get("displayName") or "").strip() or user,
        text=text,
        is_group=not direct,
        # In a space the reply goes into the user's thread; in a DM, into the DM.
        thread_id="" if direct else thread,
        reply_target=name,
        sent_at=moment(str(message.get("createTime") or event.get("eventTime") or "")),
        mentioned=None if direct else mentioned,
        is_bot=sender.get("type") == "BOT",
    )


def addressed(message: dict[str, Any]) -> bool:
    """Addressed to the app: a slash command, or a mention of a bot user (an HTTP app is
    only sent its own mentions)."""
    if message.get("slashCommand"):
        return True
    for annotation in message.get("annotations") or []:
        mention = as_dict(as_dict(annotation).get("userMention"))
        if as_dict(annotation).get("type") == "USER_MENTION" and as_dict(mention.get("user")).get("type") == "BOT":
            return True
    return False


def clicked_data(event: dict[str, Any]) -> str:
    """A CARD_CLICKED event's `data` parameter (the button's), "" when it has none: in
    `common.parameters` (a map) or `action.parameters` (a list of key/value pairs)."""
    found = as_dict(as_dict(event.get("common")).get("parameters")).get("data")
    if found:
        return str(found)
    for parameter in as_dict(event.get("action")).get("parameters") or []:
        if as_dict(parameter).get("key") == "data":
            return str(as_dict(parameter).get("value") or "")
    return ""


def moment(value: str) -> datetime | None:
    """An RFC 3339 time ("2026-03-02T19:02:59.910959Z") as a datetime."""
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None
    except ValueError:
        return None
