"""A Bot Connector activity (the JSON POSTed to the messaging endpoint), read with the
Agents SDK's model (microsoft_agents.activity.Activity), into our own types:

- `message` → an Inbound (and one more per further image pasted into it or file sent
  with it, as an album): its activity id the dedup key (the same in every redelivery),
  `from.id` its sender, and its chat the Teams conversation id — except in a personal
  chat, whose chat is the person's id (29:…): a personal conversation id runs to 130
  characters and more, past what a chat id holds. The conversation reference (serviceUrl,
  conversation id, tenant: `reference`) rides on the Inbound as its `address`, kept per
  chat, and replies go by it; a message we start in a chat no activity came from asks
  the Connector for the person's conversation (transport.TeamsTransport.conversation).
  `conversation.conversationType` says where: `personal` (a one-to-one chat, always answered), `groupChat` or `channel`
  (groups: addressed when the bot's mention entity is among its entities, that mention's
  `<at>…</at>` text taken out). A channel message's conversation id carries its thread
  (`;messageid=<root>`): the reply goes into that thread;
- `messageUpdate` → an Edit, `messageDelete` → a Deletion (Teams reports both for
  messages in chats and channels the bot is in);
- anything else (conversationUpdate, installationUpdate, typing, messageReaction, …) is
  only acknowledged. Invokes are the webhook's (cards.py).
"""

from __future__ import annotations

import json
import mimetypes
import re
from dataclasses import dataclass, replace
from typing import Any

from django.utils import timezone
from microsoft_agents.activity import Activity

from conversations.deletions import Deletion
from conversations.edits import Edit
from conversations.ingest import Inbound, MediaRef

SOURCE = "teams"
MESSAGE, UPDATE, DELETE, INVOKE = "message", "messageUpdate", "messageDelete", "invoke"
PERSONAL = "personal"
_THREAD = re.compile(r";messageid=(\d+)$")
_ATTACHMENT = re.compile(r"/v3/attachments/([^/?#]+)")
MAX_IMAGES = 10  # pasted images and files a message brings, at most
# A file sent in a personal chat: its attachment's content type, and the content's fields
# ("Send and receive files using bot": downloadUrl, pre-authorised and short-lived, fetched
# with a plain GET and no token; uniqueId, the OneDrive item's id; fileType, its extension).
FILE_DOWNLOAD_INFO = "application/vnd.microsoft.teams.file.download.info"
_KINDS = {"image": "image", "audio": "audio", "video": "video"}


@dataclass(frozen=True)
class Ignored:
    why: str  # one word ("empty", "incomplete", …)


class NotAnActivity(ValueError):
    """The body is no Bot Connector activity (answered 400)."""


def read(body: bytes) -> Activity:
    """The body as the SDK's Activity; raises NotAnActivity. What is not even a JSON
    object with a `type` is refused before the SDK sees it (its validator logs every
    failure with a traceback)."""
    found = _json_object(body)
    if found is None or not isinstance(found.get("type"), str) or not found["type"]:
        raise NotAnActivity("not a JSON object with a 'type'")
    try:
        return Activity.model_validate(found)
    except Exception as exc:  # ValidationError; a bare Exception for a channelId/productInfo conflict
        raise NotAnActivity(str(exc).splitlines()[0][:200]) from None


def peek(body: bytes | None) -> tuple[str, str]:
    """(channelId, serviceUrl) of a body, read before it is verified ("" where it has
    none): plain JSON, never the SDK's validator (an unauthenticated body must not make
    it log)."""
    found = _json_object(body or b"") or {}
    channel, service = found.get("channelId"), found.get("serviceUrl")
    return (channel if isinstance(channel, str) else "", service if isinstance(service, str) else "")


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        found = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return found if isinstance(found, dict) else None


def parse(activity: Activity) -> list[Inbound] | Edit | Deletion | Ignored:
    if activity.type == MESSAGE:
        return message(activity)
    if activity.type == UPDATE:
        return edit(activity)
    if activity.type == DELETE:
        return deletion(activity)
    return Ignored("other")


def _ids(activity: Activity) -> tuple[str, str, str]:
    sender = activity.from_property
    return str(activity.id or ""), chat_of(activity), str((sender.id if sender else "") or "")


def chat_of(activity: Activity) -> str:
    """The activity's chat: a personal chat's is the person's id (29:…), the
    conversation id otherwise (see the module's docstring)."""
    conversation, sender = activity.conversation, activity.from_property
    if is_personal(activity) and sender is not None and sender.id:
        return str(sender.id)
    return str((conversation.id if conversation else "") or "")


def is_personal(activity: Activity) -> bool:
    conversation = activity.conversation
    kind = str(conversation.conversation_type or "") if conversation else ""
    return kind == PERSONAL or (not kind and not (conversation and conversation.is_group))


def own_text(activity: Activity) -> tuple[str, bool]:
    """The text without the bot's mention, and whether the bot was mentioned."""
    recipient = activity.recipient.id if activity.recipient else ""
    mentioned = bool(recipient) and any(
        mention.mentioned is not None and mention.mentioned.id == recipient for mention in activity.get_mentions())
    text = activity.remove_recipient_mention() if mentioned else (activity.text or "")
    return text.strip(), mentioned


def message(activity: Activity) -> list[Inbound] | Ignored:
    """A message's Inbounds: its text with its first image or file, then one per other
    (the platform message id `<id>.<n>`, as an album); none for a message with neither."""
    message_id, chat, sender = _ids(activity)
    if not (message_id and chat and sender):
        return Ignored("incomplete")
    text, mentioned = own_text(activity)
    images = _media(activity)
    if not text and not images:
        return Ignored("empty")  # a card alone: nothing to answer
    personal = is_personal(activity)
    thread = _THREAD.search(chat)
    account = activity.from_property
    first = Inbound(
        platform_message_id=message_id, chat_id=chat, sender_id=sender, text=text,
        sender_name=str(account.name or "").strip() if account else "",
        is_group=not personal, thread_id=thread[1] if thread else "", reply_target=message_id,
        sent_at=activity.timestamp, mentioned=None if personal else mentioned,
        is_bot=bool(account and account.role == "bot"),
        media=images[0] if images else None, media_type=images[0].kind if images else "",
        album_id=message_id if len(images) > 1 else "", address=reference(activity))
    return [first, *(replace(first, platform_message_id=f"{message_id}.{number}", text="", media=image,
                             media_type=image.kind) for number, image in enumerate(images[1:], start=1))]


def reference(activity: Activity) -> dict[str, str]:
    """The conversation reference replies to the activity's chat go by (its Inbound's
    `address`, kept per chat by conversations.addresses): the serviceUrl it came from
    (verified: the Connector's token claims it), its conversation id (a personal chat's
    `a:…` too) and the tenant. Bot Framework: reply to the serviceUrl of the conversation's
    last activity; it can change."""
    conversation = activity.conversation
    conversation_id = str((conversation.id if conversation else "") or "")
    tenant = str((conversation.tenant_id if conversation else "") or "") or \
        str(as_dict(as_dict(activity.channel_data).get("tenant")).get("id") or "")
    found = {"serviceUrl": str(activity.service_url or ""), "conversationId": conversation_id, "tenantId": tenant}
    return {key: value for key, value in found.items() if value}


def _media(activity: Activity) -> list[MediaRef]:
    """The images pasted into a message and the files sent with it, in order, at most
    MAX_IMAGES. An image: an attachment of an `image/*` type whose contentUrl is the
    Connector's (…/v3/attachments/<id>/views/original, fetched with the bot's token:
    media.py). A file (a personal chat's; in group chats and channels Teams shares a
    SharePoint link the bot cannot read without Graph): a `file.download.info`
    attachment, its content's downloadUrl fetched with no token, its uniqueId the key.
    Other attachments (the message's HTML rendition, cards) are not taken."""
    found = []
    for attachment in activity.attachments or []:
        declared = str(attachment.content_type or "").split(";")[0].strip().lower()
        ref = _file(attachment) if declared == FILE_DOWNLOAD_INFO else _image(attachment, declared)
        if ref is not None:
            found.append(ref)
        if len(found) == MAX_IMAGES:
            break
    return found


def _image(attachment: Any, declared: str) -> MediaRef | None:
    url = str(attachment.content_url or "")
    if not declared.startswith("image/") or not _is_url(url):
        return None
    key = _ATTACHMENT.search(url)
    return MediaRef(key=(key[1] if key else url)[:200], ref=url, kind="image", declared_type=declared,
                    file_name=str(attachment.name or "")[:255])


def _file(attachment: Any) -> MediaRef | None:
    content = as_dict(attachment.content)
    url, unique = str(content.get("downloadUrl") or ""), str(content.get("uniqueId") or "")
    if not _is_url(url):
        return None
    name = str(attachment.name or "")[:255]
    extension = str(content.get("fileType") or "").strip().lower().lstrip(".")[:16]
    declared = (mimetypes.guess_type(f"file.{extension}")[0] if extension else None) or \
        mimetypes.guess_type(name)[0] or ""
    return MediaRef(key=(unique or url)[:200], ref=url, kind=_KINDS.get(declared.split("/")[0], "document"),
                    declared_type=declared, file_name=name)


def _is_url(url: str) -> bool:
    return url.startswith(("https://", "http://")) and len(url) <= 2000


def edit(activity: Activity) -> Edit | Ignored:
    message_id, chat, sender = _ids(activity)
    if not (message_id and chat):
        return Ignored("incomplete")
    text, _mentioned = own_text(activity)
    return Edit(platform_message_id=message_id, text=text, edited_at=activity.timestamp or timezone.now(),
                source=SOURCE, chat_id=chat, sender_id=sender)


def deletion(activity: Activity) -> Deletion | Ignored:
    message_id, chat, sender = _ids(activity)
    if not (message_id and chat):
        return Ignored("incomplete")
    return Deletion(platform_message_id=message_id, deleted_at=timezone.now(), source=SOURCE, chat_id=chat,
                    sender_id=sender)


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
