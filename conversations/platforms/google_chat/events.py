"""A Google Chat interaction event (the JSON POSTed to an HTTP endpoint app) into our own
types. The event is {"type", "eventTime", "space": {"name", "type" (DM / ROOM),
"spaceType" (DIRECT_MESSAGE / SPACE / GROUP_CHAT), "singleUserBotDm"}, "message": {"name",
"sender": {"name", "displayName", "type" (HUMAN / BOT)}, "createTime", "text",
"argumentText", "thread": {"name"}, "annotations": [{"type": "USER_MENTION",
"userMention": {"user": {"name", "type"}}}], "slashCommand", "attachment": [{"name",
"contentName", "contentType", "source" (UPLOADED_CONTENT / DRIVE_FILE),
"attachmentDataRef": {"resourceName"} | "driveDataRef": {"driveFileId"}}]}, "user",
"action", "common"}.

Files (`message.attachment[]`): one uploaded to Chat (`attachmentDataRef.resourceName`)
is a MediaRef the worker fetches later (media.fetch_media: the Chat API's media.download
with the app's token). A message's first such file rides on the message itself; each
further one is an Inbound of its own (id `<message name>#<n>`, the same in every
redelivery), all of them one album, so the burst counts them as one message. A Google
Drive file (`driveDataRef`) cannot be read with the app's credentials (the Drive API
wants the user's): its name and link are added to the message's text instead.

In a space an HTTP app is sent the messages that mention it (and slash commands); a
message that reaches it otherwise is kept as context, unaddressed (conversations.groups
decides at the flush). Our own messages never come back as events; another bot's are
flagged is_bot (conversations.loops)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from conversations.ingest import Inbound, MediaRef

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


def inbound_from(event: dict[str, Any]) -> list[Inbound] | Ignored:
    """A MESSAGE event's (or an ADDED_TO_SPACE's carrying the mention that added the
    app) message — one Inbound, or one per file uploaded with it — or why it is not one."""
    space, message = as_dict(event.get("space")), as_dict(event.get("message"))
    sender = as_dict(message.get("sender")) or as_dict(event.get("user"))
    name, space_name, user = (str(value or "") for value in (message.get("name"), space.get("name"), sender.get("name")))
    if not name or not space_name or not user:
        return Ignored("incomplete")
    direct = is_dm(space)
    mentioned = addressed(message)
    text = str(message.get("argumentText") if mentioned and message.get("argumentText") is not None
               else message.get("text") or "").strip()
    uploads, linked = attachments(message)
    text = "\n".join(part for part in (text, *linked) if part)
    if not text and not uploads:
        return Ignored("empty")
    thread = str(as_dict(message.get("thread")).get("name") or "")
    first = Inbound(
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
    if not uploads:
        return [first]
    album = hashlib.sha256(name.encode()).hexdigest()[:40] if len(uploads) > 1 else ""
    found = [replace(first, media=uploads[0], media_type=uploads[0].kind, album_id=album)]
    for number, ref in enumerate(uploads[1:], start=2):
        found.append(replace(first, platform_message_id=f"{name}#{number}", text="", media=ref,
                             media_type=ref.kind, album_id=album))
    return found


MAX_REF = 500  # what a MediaFile's ref holds: a longer resource name could not be fetched
DRIVE_LINK = "https://drive.google.com/open?id="


def attachments(message: dict[str, Any]) -> tuple[list[MediaRef], list[str]]:
    """A message's files: those uploaded to Chat as MediaRefs (fetched later), and a line
    of text for each the app cannot fetch (a Drive file: its name and link)."""
    uploads: list[MediaRef] = []
    linked: list[str] = []
    for item in message.get("attachment") or []:
        item = as_dict(item)
        file_name = str(item.get("contentName") or "")[:255]
        declared = str(item.get("contentType") or "")[:100]
        resource = str(as_dict(item.get("attachmentDataRef")).get("resourceName") or "")
        drive = str(as_dict(item.get("driveDataRef")).get("driveFileId") or "")
        if resource and len(resource) <= MAX_REF:
            key = str(item.get("name") or "") or f"media:{hashlib.sha256(resource.encode()).hexdigest()}"
            uploads.append(MediaRef(key=key, ref=resource, kind=kind_of(declared), declared_type=declared,
                                    file_name=file_name))
        elif drive:
            linked.append(f"📎 {file_name or 'Drive file'}: {DRIVE_LINK}{drive}")
        elif file_name:
            linked.append(f"📎 {file_name} (not readable by the app)")
    return uploads, linked


def kind_of(content_type: str) -> str:
    """A file's media kind from the type Chat declares (the stored bytes are sniffed again)."""
    major = content_type.partition("/")[0]
    return {"image": "photo", "audio": "audio", "video": "video"}.get(major, "document")


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
