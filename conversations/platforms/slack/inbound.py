"""Slack's requests into our own types: the signature check every request passes first,
and an Events API envelope's event into an Inbound message, an Edit, or the reason it is
ignored.

An envelope is {"type": "event_callback", "event_id", "event_time", "team_id",
"api_app_id", "authorizations": [{"user_id": <the app's bot user>, …}], "event": {…}};
the `url_verification` handshake is {"type": "url_verification", "challenge"}. Slack
redelivers an envelope it got no 2xx for within 3 s (after about 1 and 5 minutes,
`X-Slack-Retry-Num`) with the same event id and the same event: the message key below is
the same every time, so the durable inbound dedup drops the copy whenever it comes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from conversations.deletions import Deletion
from conversations.edits import Edit
from conversations.ingest import Inbound
from conversations.platforms.inbound import hmac_sha256
from conversations.platforms.slack.names import PER_THREAD
from conversations.reactions import Reaction

SIGNATURE_HEADER = "X-Slack-Signature"
TIMESTAMP_HEADER = "X-Slack-Request-Timestamp"
MAX_AGE = 5 * 60  # seconds: an older (or as much newer) request is refused as a replay
# Subtypes of `message` that are a message like any other (a thread reply also sent to
# the channel, a message with files: its text counts; a legacy bot's or an incoming
# webhook's message: a bot's, conversations.loops decides). Every other subtype (joins,
# topics, …) is acknowledged and ignored; message_changed and message_deleted are
# handled on their own.
PLAIN_SUBTYPES = ("", "thread_broadcast", "file_share", "bot_message")


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """What X-Slack-Signature holds: "v0=" and the hex HMAC-SHA256 of
    `v0:<timestamp>:<raw body>` keyed by the signing secret (compared in constant time)."""
    return "v0=" + hmac_sha256(secret, b"v0:" + timestamp.encode() + b":" + body)


def fresh(timestamp: str, now: float) -> bool:
    """The request was signed within MAX_AGE of `now` (either way: clocks drift)."""
    try:
        return abs(now - int(timestamp)) <= MAX_AGE
    except ValueError:
        return False


@dataclass
class Parsed:
    """What one envelope carried for this channel."""

    messages: list[Inbound] = field(default_factory=list)
    edits: list[Edit] = field(default_factory=list)
    deletions: list[Deletion] = field(default_factory=list)
    reactions: list[Reaction] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # why, one word each ("bot", "subtype:channel_join", …)


# bot_in_thread(Slack channel id, thread ts): whether the app has posted in that thread.
BotInThread = Callable[[str, str], bool]


def parse(envelope: Any, *, conversations: str, bot_in_thread: BotInThread | None = None) -> Parsed:
    """The event of an `event_callback` envelope; raises ValueError for a body that is
    not one. `conversations`: the channel's setting. `bot_in_thread(channel id, thread
    ts)`: whether the app has posted in that thread (asked only of a channel message in a
    thread that does not mention the app; None: never)."""
    if not isinstance(envelope, dict) or not isinstance(envelope.get("event"), dict):
        raise ValueError("no 'event' in the envelope")
    event = envelope["event"]
    found = Parsed()
    bot_user = _bot_user(envelope)
    kind, subtype = event.get("type"), str(event.get("subtype") or "")
    if kind in ("reaction_added", "reaction_removed"):
        _reaction(envelope, event, bot_user, found)
    elif kind not in ("message", "app_mention"):
        found.ignored.append(f"event:{kind}")
    elif subtype == "message_changed":
        _edit(event, conversations, bot_user, found)
    elif subtype == "message_deleted":
        _deletion(event, conversations, bot_user, found)
    elif subtype not in PLAIN_SUBTYPES:
        found.ignored.append(f"subtype:{subtype}")
    else:
        inbound = inbound_from(event, conversations, bot_user, own_app=str(envelope.get("api_app_id") or ""))
        if isinstance(inbound, str):
            found.ignored.append(inbound)
        else:
            # Every channel message is stored; the channel's group_replies decides at the
            # flush which bursts are answered (conversations.groups), by this flag.
            if inbound.is_group:
                inbound = replace(inbound, mentioned=addressed(event, kind, bot_user, bot_in_thread))
            found.messages.append(inbound)
    return found


def addressed(event: dict[str, Any], kind: str, bot_user: str, bot_in_thread: BotInThread | None) -> bool:
    """A channel message is addressed to the app when it mentions it (an `app_mention`,
    or `<@app>` in its text: the `message` event of the same message says so too), or
    when it is a reply in a thread the app is in — the thread under the app's own message
    (`parent_user_id`), or one the app has posted in (it answered someone there): Slack's
    counterpart of a reply to the bot in a Telegram group."""
    if kind == "app_mention" or (bot_user and f"<@{bot_user}" in str(event.get("text") or "")):
        return True
    thread_ts, ts = str(event.get("thread_ts") or ""), str(event.get("ts") or "")
    if not thread_ts or thread_ts == ts:
        return False  # not a reply in a thread
    if bot_user and str(event.get("parent_user_id") or "") == bot_user:
        return True
    return bool(bot_in_thread and bot_in_thread(str(event.get("channel") or ""), thread_ts))


def _bot_user(envelope: dict[str, Any]) -> str:
    for authorization in envelope.get("authorizations") or []:
        if isinstance(authorization, dict) and authorization.get("is_bot") and authorization.get("user_id"):
            return str(authorization["user_id"])
    return ""


def chat_of(channel_id: str, thread_ts: str, ts: str, conversations: str) -> str:
    """The conversation's chat: the Slack channel, or one of its threads."""
    return f"{channel_id}:{thread_ts or ts}" if conversations == PER_THREAD else channel_id


def inbound_from(event: dict[str, Any], conversations: str, bot_user: str, own_app: str = "") -> Inbound | str:
    """A person's or another bot's message, or why it is not one (our own, no text). A
    bot's (`bot_id`, `bot_profile`) is flagged is_bot, named by its profile: whether it
    makes a turn is the channel's allowed_bots (conversations.loops). Our own (our bot
    user, or our app: `api_app_id`) is never a message, not even context."""
    profile = _object(event.get("bot_profile"))
    is_bot = bool(event.get("bot_id") or profile)
    # A legacy bot's or an incoming webhook's message has no user: its bot id stands for it.
    user = str(event.get("user") or "") or (str(event.get("bot_id") or "") if is_bot else "")
    channel_id, ts = (str(event.get(k) or "") for k in ("channel", "ts"))
    if not user or not channel_id or not ts:
        return "incomplete"
    if user == bot_user or (is_bot and own_app and own_app == str(event.get("app_id") or profile.get("app_id") or "")):
        return "own"
    bot_name = str(profile.get("name") or event.get("username") or "").strip() if is_bot else ""
    text = without_mention(str(event.get("text") or ""), bot_user)
    if not text.strip():
        return "empty"
    is_dm = event.get("channel_type") == "im" or channel_id.startswith("D")
    thread_ts = str(event.get("thread_ts") or "")
    # In a channel the reply opens (or joins) a thread under the user's message; in a DM it
    # answers in the user's thread if they wrote in one, else in the DM itself.
    reply_thread = thread_ts or ("" if is_dm and conversations != PER_THREAD else ts)
    return Inbound(
        platform_message_id=f"{channel_id}:{ts}",
        chat_id=chat_of(channel_id, thread_ts, ts, conversations),
        sender_id=user,
        sender_name=bot_name or name_of(event, user),
        username=bot_name,  # what allowed_bots names a bot by, besides its user id
        text=text,
        is_group=not is_dm,
        thread_id=reply_thread,
        reply_target=ts,
        sent_at=moment(ts),
        is_bot=is_bot,
    )


def name_of(event: dict[str, Any], user: str) -> str:
    """Who wrote, as a group's context lines name them: the profile's name when the event
    carries one, else Slack's own reference to the user (`<@U…>`, which the model reads as
    a person and Slack shows as their name): several people in a channel must not all be
    "Someone"."""
    profile = _object(event.get("user_profile"))
    name = str(profile.get("display_name") or profile.get("real_name") or "").strip()
    return name or f"<@{user}>"


def _edit(event: dict[str, Any], conversations: str, bot_user: str, found: Parsed) -> None:
    """message_changed: the message as it is now, under `message`. Slack also sends one
    when it unfurls a link (no `edited` in it): nothing the user changed."""
    message = _object(event.get("message"))
    channel_id = str(event.get("channel") or "")
    edited = message.get("edited") if isinstance(message.get("edited"), dict) else None
    if message.get("bot_id") or not message.get("user") or str(message.get("user")) == bot_user:
        found.ignored.append("bot")
        return
    if edited is None or not message.get("ts") or not channel_id:
        found.ignored.append("unfurl")
        return
    ts = str(message["ts"])
    text = without_mention(str(message.get("text") or ""), bot_user)
    found.edits.append(Edit(platform_message_id=f"{channel_id}:{ts}", text=text,
                            edited_at=moment(str(edited.get("ts") or "")) or datetime.now(UTC),
                            source="slack",
                            chat_id=chat_of(channel_id, str(message.get("thread_ts") or ""), ts, conversations),
                            sender_id=str(message["user"])))


def _deletion(event: dict[str, Any], conversations: str, bot_user: str, found: Parsed) -> None:
    """message_deleted: the deleted message's ts in `deleted_ts`, the message itself (who
    wrote it, its thread) in `previous_message`. Our own replies deleted are not ours to
    undo; a deletion without its author is checked against the stored message alone."""
    previous = _object(event.get("previous_message"))
    channel_id = str(event.get("channel") or "")
    ts = str(event.get("deleted_ts") or previous.get("ts") or "")
    user = str(previous.get("user") or "")
    if previous.get("bot_id") or (user and user == bot_user):
        found.ignored.append("bot")
        return
    if not channel_id or not ts:
        found.ignored.append("incomplete")
        return
    chat = chat_of(channel_id, str(previous.get("thread_ts") or ""), ts, conversations) if user else None
    found.deletions.append(Deletion(platform_message_id=f"{channel_id}:{ts}",
                                    deleted_at=moment(str(event.get("event_ts") or event.get("ts") or ""))
                                    or datetime.now(UTC), source="slack", chat_id=chat, sender_id=user))


def _reaction(envelope: dict[str, Any], event: dict[str, Any], bot_user: str, found: Parsed) -> None:
    """reaction_added / reaction_removed (the app subscribes to both; reactions:read):
    only one on the app's own message (`item_user`) is ours. Deduplicated by the
    envelope's event_id; the message is its channel and ts (the ledger's id of a reply),
    in any of the channel's per-thread conversations."""
    item = _object(event.get("item"))
    user, event_id = str(event.get("user") or ""), str(envelope.get("event_id") or "")
    if item.get("type") != "message" or (bot_user and str(event.get("item_user") or "") != bot_user):
        found.ignored.append("reaction:not_ours")
        return
    if not user or not event_id or not item.get("channel") or not item.get("ts") or user == bot_user:
        found.ignored.append("reaction:incomplete")
        return
    removed = event.get("type") == "reaction_removed"
    found.reactions.append(Reaction(key=f"slack:{event_id}", platform_message_id=str(item["ts"]),
                                    chat_id=str(item["channel"]), sender_id=user,
                                    emoji="" if removed else str(event.get("reaction") or ""),
                                    source="slack", thread_prefix=True))


def _object(value: Any) -> dict[str, Any]:
    """A JSON object from the payload, or {} when it is missing or not an object."""
    return value if isinstance(value, dict) else {}


def without_mention(text: str, bot_user: str) -> str:
    """The text without the app's own mention in front ("<@U…> agenda…" → "agenda…");
    anyone else's mention is the user's words and stays."""
    if not bot_user:
        return text
    return re.sub(rf"^\s*<@{re.escape(bot_user)}(\|[^>]*)?>[\s:,]*", "", text, count=1)


def moment(ts: str) -> datetime | None:
    """A Slack `ts` ("1700000000.000100": seconds and a sequence) as a time."""
    try:
        return datetime.fromtimestamp(float(ts), UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return None
