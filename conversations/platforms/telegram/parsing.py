"""Telegram updates (from the webhook or long polling) into our own types: an
Inbound message (conversations.ingest) or an Edit of one (conversations.edits)."""

import telegram

from conversations import edits
from conversations.ingest import Inbound, MediaRef

# Non-text messages: the first attribute present names the kind (conversations.windows
# gives them their window; an album's items share `media_group_id`).
MEDIA_KINDS = (
    "photo", "voice", "audio", "video", "video_note", "document", "sticker", "animation",
    "location", "venue", "contact", "poll", "dice",
)
GROUP_TYPES = ("group", "supergroup")
# The updates we ask Telegram for (setWebhook, getUpdates): anything else is never sent.
# message_reaction must be named: Telegram never sends it by default (reactions.py).
ALLOWED_UPDATES = ["message", "edited_message", "callback_query", "message_reaction"]


def item_from_update(update: telegram.Update, bot=None) -> Inbound | edits.Edit | None:
    """A new message, an edit of one, or None for updates we do not act on. `bot`: a
    callable giving the bot's identity.BotIdentity, asked only for a group's message."""
    if update.message is not None:
        return inbound_from_update(update, bot)
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


def inbound_from_update(update: telegram.Update, bot=None) -> Inbound | None:
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
    is_group = message.chat.type in GROUP_TYPES
    return Inbound(
        platform_message_id=f"{message.chat.id}:{message.message_id}",
        chat_id=str(message.chat.id),
        sender_id=str(sender.id),
        text=text,
        sender_name=sender.full_name,
        username=sender.username or "",
        media_type=media,
        album_id=message.media_group_id or "",
        is_group=is_group,
        mentioned=mentions(message, bot()) if is_group and bot is not None else None,
        thread_id=str(thread) if thread else "",
        reply_target=str(message.message_id),
        sent_at=message.date,
        media=media_ref(message, media),
        language=sender.language_code or "",
        is_bot=bool(sender.is_bot),
    )


def mentions(message: telegram.Message, bot) -> bool:
    """Addressed to the bot: a reply to one of its messages, a text mention of it (a
    user without a username), or an @mention of its username, in the text or a caption."""
    reply = message.reply_to_message
    if bot.id is not None and reply is not None and reply.from_user is not None and reply.from_user.id == bot.id:
        return True
    found = {**message.parse_entities(["mention", "text_mention"]),
             **message.parse_caption_entities(["mention", "text_mention"])}
    for entity, text in found.items():
        if entity.type == "text_mention" and entity.user is not None and entity.user.id == bot.id:
            return True
        if entity.type == "mention" and bot.username and text[1:].lower() == bot.username.lower():
            return True
    return False


def media_ref(message: telegram.Message, kind: str) -> MediaRef | None:
    """The file a message carries (a photo: its largest size), or None (a location, a
    poll… carry none). Keyed by `file_unique_id`, the same for every bot and every time
    the file is sent; fetched by `file_id`."""
    item = getattr(message, kind, None) if kind else None
    if isinstance(item, tuple):  # a photo's sizes, smallest first
        item = item[-1] if item else None
    if not isinstance(item, telegram.TelegramObject) or not getattr(item, "file_id", None):
        return None
    duration = getattr(item, "duration", None)
    return MediaRef(
        key=item.file_unique_id, ref=item.file_id, kind=kind,
        declared_type=getattr(item, "mime_type", None) or "", file_name=getattr(item, "file_name", None) or "",
        declared_size=getattr(item, "file_size", None),
        duration=duration.total_seconds() if hasattr(duration, "total_seconds") else duration,
    )


def parse_update(data: dict) -> telegram.Update:
    """python-telegram-bot's own parser; raises on payloads that are not an Update."""
    if not isinstance(data, dict) or not isinstance(data.get("update_id"), int):
        raise ValueError("not a Telegram Update: 'update_id' missing")
    return telegram.Update.de_json(data, None)
