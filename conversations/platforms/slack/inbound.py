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

import hashlib
import hmac
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

from conversations.edits import Edit
from conversations.ingest import Inbound
from conversations.platforms.slack.names import ALL, PER_THREAD

SIGNATURE_HEADER = "X-Slack-Signature"
TIMESTAMP_HEADER = "X-Slack-Request-Timestamp"
MAX_AGE = 5 * 60  # seconds: an older (or as much newer) request is refused as a replay
# Subtypes of `message` that are a person's message like any other (a thread reply also
# sent to the channel, a message with files: its text counts). Every other subtype
# (joins, topics, bot_message, …) is acknowledged and ignored; message_changed and
# message_deleted are handled on their own.
PLAIN_SUBTYPES = ("", "thread_broadcast", "file_share")


def signature_ok(secret: str, timestamp: str, body: bytes, supplied: str) -> bool:
    """X-Slack-Signature is "v0=" and the hex HMAC-SHA256 of `v0:<timestamp>:<raw body>`
    keyed by the signing secret; compared in constant time."""
    base = b"v0:" + timestamp.encode() + b":" + body
    expected = "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), supplied.strip().encode())


def fresh(timestamp: str, now: float) -> bool:
    """The request was signed within MAX_AGE of `now` (either way: clocks drift)."""
    try:
        return abs(now - int(timestamp)) <= MAX_AGE
    except ValueError:
        return False


@dataclass
class Parsed:
    """What one envelope carried for this channel."""

    messages: list = field(default_factory=list)  # Inbound
    edits: list = field(default_factory=list)  # Edit
    ignored: list = field(default_factory=list)  # why, one word each ("bot", "subtype:channel_join", …)


def parse(envelope, *, conversations: str, channel_messages: str) -> Parsed:
    """The event of an `event_callback` envelope; raises ValueError for a body that is
    not one. `conversations`, `channel_messages`: the channel's settings."""
    if not isinstance(envelope, dict) or not isinstance(envelope.get("event"), dict):
        raise ValueError("no 'event' in the envelope")
    event = envelope["event"]
    found = Parsed()
    bot_user = _bot_user(envelope)
    kind, subtype = event.get("type"), str(event.get("subtype") or "")
    if kind not in ("message", "app_mention"):
        found.ignored.append(f"event:{kind}")
    elif subtype == "message_changed":
        _edit(event, conversations, bot_user, found)
    elif subtype == "message_deleted":
        found.ignored.append("deleted")  # the product has no rule for a deletion yet: noted, nothing undone
    elif subtype not in PLAIN_SUBTYPES:
        found.ignored.append(f"subtype:{subtype}")
    else:
        inbound = inbound_from(event, conversations, bot_user)
        mentioned = kind == "app_mention" or (bot_user and f"<@{bot_user}>" in str(event.get("text") or ""))
        if isinstance(inbound, str):
            found.ignored.append(inbound)
        elif inbound.is_group and channel_messages != ALL and not mentioned:
            found.ignored.append("not_mentioned")
        else:
            found.messages.append(inbound)
    return found


def _bot_user(envelope) -> str:
    for authorization in envelope.get("authorizations") or []:
        if isinstance(authorization, dict) and authorization.get("is_bot") and authorization.get("user_id"):
            return str(authorization["user_id"])
    return ""


def chat_of(channel_id: str, thread_ts: str, ts: str, conversations: str) -> str:
    """The conversation's chat: the Slack channel, or one of its threads."""
    return f"{channel_id}:{thread_ts or ts}" if conversations == PER_THREAD else channel_id


def inbound_from(event, conversations: str, bot_user: str) -> Inbound | str:
    """A person's message, or why it is not one (a bot's, our own, no text)."""
    if event.get("bot_id") or event.get("bot_profile"):
        return "bot"
    user, channel_id, ts = (str(event.get(k) or "") for k in ("user", "channel", "ts"))
    if not user or not channel_id or not ts:
        return "incomplete"
    if user == bot_user:
        return "own"
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
        text=text,
        is_group=not is_dm,
        thread_id=reply_thread,
        reply_target=ts,
        sent_at=moment(ts),
    )


def _edit(event, conversations, bot_user, found):
    """message_changed: the message as it is now, under `message`. Slack also sends one
    when it unfurls a link (no `edited` in it): nothing the user changed."""
    message = event.get("message") if isinstance(event.get("message"), dict) else {}
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
