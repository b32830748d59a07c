"""Messenger and Instagram webhook events into our own types.

A POST body is {"object": "page" | "instagram", "entry": [{"id": <Page or Instagram
account id>, "time", "messaging": [event, ...]}]}: any number of entries and events. Each
event names its `sender` and `recipient` (page-scoped or Instagram-scoped ids) and a
`timestamp` in milliseconds, and carries one of:

- `message`: {"mid", "text", "attachments": [{"type", "payload": {"url"}}],
  "quick_reply": {"payload"}, "reply_to": {"mid"} or {"story": {"url", "id"}},
  "is_echo", "is_deleted", "is_unsupported"} — a message (an echo of one the account sent
  is ignored); a quick reply whose payload is a question's answer is a `Tap`; on
  Instagram, a reply to the account's story and a mention of it in a person's story
  (an attachment of type `story_mention`) are messages of their own kinds;
- `postback`: {"mid", "title", "payload"} — a button tapped: its title is the text (or
  a `Tap`, when its payload answers a question);
- `reaction`: {"mid", "action": "react" | "unreact", "emoji"} — a person's reaction;
- `read`, `delivery`, `referral`, …: nothing for us (counted as ignored).

Messenger and Instagram DMs have no group chats: every chat is one person (chat and
sender: their scoped id). The mid is the dedup key: Meta redelivers an event unchanged.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from conversations.ingest import Inbound, MediaRef
from conversations.reactions import Reaction

OBJECTS = {"messenger": "page", "instagram": "instagram"}
# Attachment types whose payload URL is a file the worker fetches (a `fallback` is a
# shared link, a `template` a structured message: no file; `location`: coordinates).
FILE_TYPES = {"image": "photo", "video": "video", "audio": "audio", "file": "document", "story_mention": "story",
              "ig_reel": "video", "reel": "video", "animated_image_share": "photo"}


def key_of(mid: str) -> str:
    """A message id as we store it: Messenger's fit (~60 characters), Instagram's can be
    longer than a platform message id column (~170): a digest of those, the same for every
    delivery of the message (its dedup key) and for the reply our send got back."""
    return mid if len(mid) <= 100 else "sha256:" + hashlib.sha256(mid.encode()).hexdigest()[:64]


@dataclass(frozen=True)
class Tap:
    """A quick reply or postback whose payload answers a question (tools.confirmations)."""

    key: str  # the message's mid: a redelivered tap is the same tap
    chat_id: str
    sender_id: str
    data: str


@dataclass
class Events:
    """What one webhook body carried for this channel's account."""

    items: list[Inbound | Reaction | Tap] = field(default_factory=list)
    ignored: int = 0


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def parse(data: Any, kind: str, account_id: str, is_answer: Any) -> Events:
    """The events of a body addressed to `account_id` (every entry when it is empty);
    raises ValueError for a body that is not this platform's webhook at all. `is_answer`:
    whether a payload answers a question (tools.confirmations' data)."""
    if not isinstance(data, dict) or not isinstance(data.get("entry"), list):
        raise ValueError("'entry' missing")
    if data.get("object") != OBJECTS[kind]:
        raise ValueError(f"object {str(data.get('object'))[:40]!r}, not {OBJECTS[kind]!r}")
    found, timed = Events(), []
    for entry in data["entry"]:
        entry = as_dict(entry)
        messaging = entry.get("messaging")
        events: list[Any] = messaging if isinstance(messaging, list) else []
        if account_id and str(entry.get("id", "")) != account_id:
            found.ignored += max(len(events), 1)  # another Page or account of the same Meta app
            continue
        for event in events:
            item = item_from(as_dict(event), kind, account_id, is_answer)
            if item is None:
                found.ignored += 1
            else:
                timed.append((_when(as_dict(event).get("timestamp")) or _NEVER, item))
    # A body gathering several events may not list them in the order they were written:
    # applied by their timestamps (a stable sort keeps the body's order within one).
    found.items = [item for _when_, item in sorted(timed, key=lambda pair: pair[0])]
    return found


def item_from(event: dict[str, Any], kind: str, account_id: str, is_answer: Any) -> Inbound | Reaction | Tap | None:
    sender = str(as_dict(event.get("sender")).get("id") or "")
    if not sender or (account_id and sender == account_id):
        return None  # the account's own (an echo without its flag)
    if "message" in event:
        return message_from(as_dict(event["message"]), sender, _when(event.get("timestamp")), kind, is_answer)
    if "postback" in event:
        postback = as_dict(event["postback"])
        mid = key_of(str(postback.get("mid") or f"postback:{sender}:{event.get('timestamp')}"))
        payload = str(postback.get("payload") or "")
        if is_answer(payload):
            return Tap(mid, sender, sender, payload)
        title = str(postback.get("title") or "")
        return Inbound(platform_message_id=mid, chat_id=sender, sender_id=sender, text=title,
                       reply_target=mid, sent_at=_when(event.get("timestamp"))) if title else None
    if "reaction" in event:
        reaction = as_dict(event["reaction"])
        if not reaction.get("mid"):
            return None
        emoji = str(reaction.get("emoji") or "") if reaction.get("action", "react") == "react" else ""
        mid, when = key_of(str(reaction["mid"])), event.get("timestamp")
        return Reaction(key=f"{kind}:" + key_of(f"{mid}:{sender}:{when}:{reaction.get('action')}:{emoji}"),
                        platform_message_id=mid, chat_id=sender, sender_id=sender, emoji=emoji,
                        source=kind)
    return None  # read, delivery, referral, optin…


def message_from(message: dict[str, Any], sender: str, sent_at: datetime | None, kind: str,
                 is_answer: Any) -> Inbound | Tap | None:
    mid = key_of(str(message.get("mid") or ""))
    if not message.get("mid") or message.get("is_echo") or message.get("is_deleted") or message.get("is_unsupported"):
        return None
    payload = str(as_dict(message.get("quick_reply")).get("payload") or "")
    if payload and is_answer(payload):
        return Tap(mid, sender, sender, payload)
    text = str(message.get("text") or "")
    media_type, media = "", None
    attachments = [as_dict(a) for a in message.get("attachments") or [] if isinstance(a, dict)]
    story = as_dict(as_dict(message.get("reply_to")).get("story"))
    if story:  # Instagram: a reply to the account's story (the story itself: a file to fetch)
        media_type = "story reply"
        media = _file(mid, "story", story.get("url"), "")
    elif attachments:
        first = attachments[0]
        kind_of = str(first.get("type") or "file")
        media_type = "story mention" if kind_of == "story_mention" else FILE_TYPES.get(kind_of, kind_of)
        media = _file(mid, FILE_TYPES.get(kind_of, ""), as_dict(first.get("payload")).get("url"),
                      str(as_dict(first.get("payload")).get("title") or ""))
        if kind_of == "fallback" and not text:  # a shared link: its URL is what was said
            text = str(as_dict(first.get("payload")).get("url") or first.get("url") or "")
    if not text and not media_type:
        return None
    return Inbound(platform_message_id=mid, chat_id=sender, sender_id=sender, text=text, media_type=media_type[:20],
                   reply_target=mid, sent_at=sent_at, media=media)


def _file(mid: str, kind: str, url: Any, name: str) -> MediaRef | None:
    """The file an attachment's URL names: fetched by the worker from Meta's CDN (the URL is
    signed and expires; its key is the message's, so a redelivery is the same file)."""
    if not kind or not isinstance(url, str) or not url.startswith(("https://", "http://")) or len(url) > 2000:
        return None
    return MediaRef(key=f"{mid}:0"[:200], ref=url, kind=kind, file_name=name[:255])


_NEVER = datetime.min.replace(tzinfo=UTC)


def _when(milliseconds: Any) -> datetime | None:
    try:
        return datetime.fromtimestamp(int(milliseconds) / 1000, tz=UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return None
