"""WhatsApp Cloud API notifications into our own types.

A notification (the webhook's POST body) is
{"object": "whatsapp_business_account", "entry": [{"id", "changes": [{"field": "messages",
"value": {"metadata": {"phone_number_id"}, "contacts": [...], "messages": [...],
"statuses": [...]}}]}]}: any number of entries, changes, messages and statuses in one
body. Each message becomes an Inbound (chat and sender: the user's wa_id; its wamid is
both the dedup key and what the reply threads to); each status a Receipt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from conversations.ingest import Inbound, MediaRef
from conversations.reactions import Reaction

# Kinds of message that carry something for the agent but are not text: they flush
# their buffer at once (the caption, if any, is the text).
MEDIA_KINDS = ("image", "audio", "video", "document", "sticker", "location", "contacts")


@dataclass(frozen=True)
class Receipt:
    """One `statuses` entry: what became of a message we sent."""

    platform_message_id: str  # the wamid our send got back
    status: str  # sent, delivered, read, failed (or whatever Meta adds)
    recipient: str
    error_code: int | None = None
    error: str = ""


@dataclass
class Notification:
    """What one webhook body carried for this channel's number."""

    messages: list[Inbound]
    receipts: list[Receipt]
    reactions: list[Reaction] = field(default_factory=list)
    ignored: int = 0  # messages, statuses and changes nothing is done with


def parse(data: Any, phone_number_id: str) -> Notification:
    """The messages and receipts of a notification addressed to `phone_number_id`; raises
    ValueError for a body that is not a WhatsApp notification at all."""
    if not isinstance(data, dict) or not isinstance(data.get("entry"), list):
        raise ValueError("not a WhatsApp notification: 'entry' missing")
    found = Notification([], [])
    changes = [change for entry in data["entry"] if isinstance(entry, dict)
               for change in entry.get("changes") or [] if isinstance(change, dict)]
    for change in changes:
        value = change.get("value")
        if change.get("field") != "messages" or not isinstance(value, dict):
            found.ignored += 1  # account updates, templates' quality…: nothing for us
            continue
        number = str((value.get("metadata") or {}).get("phone_number_id", ""))
        if phone_number_id and number != phone_number_id:
            found.ignored += 1  # another number of the same Meta app
            continue
        names = _names(value.get("contacts"))
        for message in value.get("messages") or []:
            reaction = reaction_from(message, names)
            if reaction is not None:
                found.reactions.append(reaction)
                continue
            inbound = inbound_from(message, names)
            if inbound is None:
                found.ignored += 1
            else:
                found.messages.append(inbound)
        for status in value.get("statuses") or []:
            receipt = receipt_from(status)
            if receipt is None:
                found.ignored += 1
            else:
                found.receipts.append(receipt)
    # A body gathering several changes may not list them in the order they were written:
    # admitted by their timestamps (seconds; a stable sort keeps the body's order within one).
    found.messages.sort(key=lambda m: m.sent_at or _NEVER)
    return found


def _names(contacts: Any) -> dict[str, str]:
    names: dict[str, str] = {}
    for contact in contacts or []:
        if isinstance(contact, dict) and contact.get("wa_id"):
            names[str(contact["wa_id"])] = str((contact.get("profile") or {}).get("name") or "")
    return names


def reaction_from(message: Any, names: dict[str, str]) -> Reaction | None:
    """A `reaction` message: the person's emoji on a message (ours: the wamid our send got
    back), "" when they took it back; deduplicated by the reaction message's own id."""
    if not isinstance(message, dict) or message.get("type") != "reaction" or not message.get("id") \
            or not message.get("from"):
        return None
    reaction: dict[str, Any] = message["reaction"] if isinstance(message.get("reaction"), dict) else {}
    if not reaction.get("message_id"):
        return None
    sender = str(message["from"])
    return Reaction(key=f"whatsapp:{message['id']}", platform_message_id=str(reaction["message_id"]), chat_id=sender,
                    sender_id=sender, emoji=str(reaction.get("emoji") or ""), source="whatsapp",
                    sender_name=names.get(sender, ""))


def inbound_from(message: Any, names: dict[str, str]) -> Inbound | None:
    """A message we act on, or None (system notices, unsupported types; a reaction is
    reaction_from's)."""
    if not isinstance(message, dict) or not message.get("id") or not message.get("from"):
        return None
    kind = message.get("type", "")
    text, media = "", ""
    if kind == "text":
        text = str((message.get("text") or {}).get("body") or "")
    elif kind in MEDIA_KINDS:
        media = kind
        text = str((message.get(kind) or {}).get("caption") or "") if isinstance(message.get(kind), dict) else ""
    elif kind == "interactive":  # a tap on a list or reply button: its title is the text
        tapped = message.get("interactive") or {}
        text = str((tapped.get("button_reply") or tapped.get("list_reply") or {}).get("title") or "")
    elif kind == "button":  # a template's quick reply
        text = str((message.get("button") or {}).get("text") or "")
    if not text and not media:
        return None
    sender = str(message["from"])
    return Inbound(
        platform_message_id=str(message["id"]),
        chat_id=sender,
        sender_id=sender,
        text=text,
        sender_name=names.get(sender, ""),
        media_type=media,
        reply_target=str(message["id"]),
        sent_at=_when(message.get("timestamp")),
        media=media_ref(message, media),
    )


FETCHED_KINDS = ("image", "audio", "video", "document", "sticker")


def media_ref(message: Any, kind: str) -> MediaRef | None:
    """The file a media message carries (a location or a contact card carries none). The
    media id is both its key and what fetching it takes: Meta gives a re-delivered
    notification the same id. An audio recorded in the app (`voice: true`) is a voice note."""
    item = message.get(kind) if kind in FETCHED_KINDS else None
    if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not item["id"]:
        return None
    name = "voice" if kind == "audio" and item.get("voice") else kind
    return MediaRef(key=item["id"], ref=item["id"], kind=name, declared_type=str(item.get("mime_type") or ""),
                    file_name=str(item.get("filename") or "")[:255])


def receipt_from(status: Any) -> Receipt | None:
    if not isinstance(status, dict) or not status.get("id") or not status.get("status"):
        return None
    errors = status.get("errors") or []
    first = errors[0] if errors and isinstance(errors[0], dict) else {}
    code = first.get("code")
    details = (first.get("error_data") or {}).get("details") if isinstance(first.get("error_data"), dict) else ""
    error = " — ".join(part for part in (f"({code})" if code is not None else "", first.get("title") or
                                         first.get("message") or "", details or "") if part)
    return Receipt(platform_message_id=str(status["id"]), status=str(status["status"]),
                   recipient=str(status.get("recipient_id") or ""),
                   error_code=code if isinstance(code, int) else None, error=error)


_NEVER = datetime.max.replace(tzinfo=UTC)


def _when(timestamp: Any) -> datetime | None:
    try:
        return datetime.fromtimestamp(int(timestamp), UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return None
