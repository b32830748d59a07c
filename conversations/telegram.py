"""Telegram inbound: updates (from the webhook or long polling) into our Inbound type."""

import logging
from datetime import timedelta

import telegram
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from conversations import edits
from conversations.engine import owner_gone
from conversations.ingest import Inbound, Unstorable, admit, record_refusal
from conversations.models import Channel, ChannelKind, TelegramMode

log = logging.getLogger(__name__)

# Non-text messages flush their buffer at once; the first attribute present names the kind.
MEDIA_KINDS = (
    "photo", "voice", "audio", "video", "video_note", "document", "sticker", "animation",
    "location", "venue", "contact", "poll", "dice",
)
GROUP_TYPES = ("group", "supergroup")
LEASE = timedelta(seconds=60)
# The updates we ask Telegram for (setWebhook, getUpdates): anything else is never sent.
ALLOWED_UPDATES = ["message", "edited_message", "callback_query"]


def item_from_update(update: telegram.Update) -> Inbound | edits.Edit | None:
    """A new message, an edit of one, or None for updates we do not act on."""
    if update.message is not None:
        return inbound_from_update(update)
    if update.edited_message is not None:
        return edit_from_update(update)
    return None


def edit_from_update(update: telegram.Update) -> edits.Edit | None:
    """An `edited_message` as an Edit of the message we stored as "<chat>:<message id>",
    deduplicated by its `edit_date`."""
    message = update.edited_message
    if message is None or message.from_user is None:
        return None
    return edits.Edit(
        platform_message_id=f"{message.chat.id}:{message.message_id}",
        text=message.text or message.caption or "",
        edited_at=message.edit_date or message.date,
        source="telegram",
        chat_id=str(message.chat.id),
        sender_id=str(message.from_user.id),
    )


def inbound_from_update(update: telegram.Update) -> Inbound | None:
    """The message we act on, or None for updates we ignore (service messages…)."""
    message = update.message
    if message is None or message.from_user is None:
        return None
    media = next((kind for kind in MEDIA_KINDS if getattr(message, kind, None)), "")
    text = message.text or message.caption or ""
    if not text and not media:
        return None
    sender = message.from_user
    thread = message.message_thread_id if message.is_topic_message else None
    return Inbound(
        platform_message_id=f"{message.chat.id}:{message.message_id}",
        chat_id=str(message.chat.id),
        sender_id=str(sender.id),
        text=text,
        sender_name=sender.full_name,
        username=sender.username or "",
        media_type=media,
        is_group=message.chat.type in GROUP_TYPES,
        thread_id=str(thread) if thread else "",
        reply_target=str(message.message_id),
        sent_at=message.date,
    )


def admit_or_refuse(channel, inbound: Inbound, source: str) -> bool:
    """Admit an update's message; True when it is new. One the database cannot store is
    refused and audited instead (Telegram would resend it forever if we failed)."""
    try:
        return not admit(channel, inbound).duplicate
    except Unstorable as exc:
        record_refusal(channel, inbound, str(exc), source)
        return False


def parse_update(data: dict) -> telegram.Update:
    """python-telegram-bot's own parser; raises on payloads that are not an Update."""
    if not isinstance(data, dict) or not isinstance(data.get("update_id"), int):
        raise ValueError("not a Telegram Update: 'update_id' missing")
    return telegram.Update.de_json(data, None)


# --- long polling ------------------------------------------------------------

def polling_channels():
    return list(Channel.objects.filter(kind=ChannelKind.TELEGRAM, telegram_mode=TelegramMode.POLLING,
                                       is_active=True).exclude(bot_token="").values_list("pk", flat=True))


def take_lease(channel_id, owner, now=None) -> Channel | None:
    """Become (or stay) the one poller of this bot; the channel, or None if another worker
    is. A holder whose process is visibly gone from this host (a restart) is not waited
    for: its lease is taken at once."""
    now = now or timezone.now()
    free = Q(poll_lease_until__isnull=True) | Q(poll_lease_until__lt=now) | Q(poll_owner=owner)
    holder = Channel.objects.filter(pk=channel_id).values_list("poll_owner", flat=True).first()
    if holder and holder != owner and owner_gone(holder):
        free |= Q(poll_owner=holder)  # still a compare-and-swap: only from that holder
    taken = Channel.objects.filter(free, pk=channel_id, is_active=True,
                                   telegram_mode=TelegramMode.POLLING).update(
        poll_owner=owner, poll_lease_until=now + LEASE)
    return Channel.objects.get(pk=channel_id) if taken else None


def release_lease(channel_id, owner):
    Channel.objects.filter(pk=channel_id, poll_owner=owner).update(poll_owner="", poll_lease_until=None)


def admit_polled(channel_id, owner, updates: list[dict]) -> int:
    """Admit a polled batch, then persist the next offset. A crash in between re-polls the
    batch, and the durable dedup drops what was already admitted."""
    channel = Channel.objects.get(pk=channel_id)
    admitted = 0
    for data in updates:
        if isinstance(data, dict) and "callback_query" in data:  # a tap on a question's button
            from tools.confirmations import handle_telegram_callback

            handle_telegram_callback(channel, data)
            continue
        try:
            inbound = item_from_update(parse_update(data))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            log.warning("channel %s: skipping malformed update %s: %s", channel.slug, data.get("update_id"), exc)
            continue
        if isinstance(inbound, edits.Edit):
            # Applied in its own transaction, in update order (after its message).
            result = edits.apply_or_refuse(channel, inbound, "long polling")
            admitted += bool(result and not result.duplicate and result.outcome in edits.WAKES_THE_FLUSHER)
            continue
        # A message that cannot be stored is refused alone (audited): the others are
        # admitted and the offset moves past it, so one bad update never stalls the bot
        # (an edit of a message never received is audited and skipped likewise).
        # Any other error propagates: the offset is not advanced, the batch is polled
        # again, and the dedup drops what was admitted before the error.
        admitted += bool(inbound and admit_or_refuse(channel, inbound, "long polling"))
    if updates:
        offset = max(u["update_id"] for u in updates) + 1
        with transaction.atomic():
            Channel.objects.filter(pk=channel_id, poll_owner=owner).update(poll_offset=offset)
    return admitted
