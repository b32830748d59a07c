"""Telegram's `message_reaction` updates (from the webhook and from long polling alike)
as conversations.reactions.Reaction. Telegram sends them only when asked for
(`allowed_updates`, parsing.ALLOWED_UPDATES) and, in groups, only to a bot that is an
administrator; in private chats always. An anonymous reaction (`actor_chat`, a channel or
an anonymous admin) names no person and is not one."""

from conversations.reactions import Reaction


def is_reaction(data) -> bool:
    return isinstance(data, dict) and isinstance(data.get("message_reaction"), dict)


def reaction_from(data: dict) -> Reaction | None:
    """The reaction added (the first emoji in `new_reaction` that was not in
    `old_reaction`), or one taken back (emoji ""); None for what names no person."""
    update = data["message_reaction"]
    chat = update.get("chat") if isinstance(update.get("chat"), dict) else {}
    user = update.get("user") if isinstance(update.get("user"), dict) else {}
    if not isinstance(data.get("update_id"), int) or chat.get("id") is None or not user.get("id") \
            or update.get("message_id") is None:
        return None
    old = {_emoji(item) for item in update.get("old_reaction") or []}
    new = [_emoji(item) for item in update.get("new_reaction") or []]
    added = next((emoji for emoji in new if emoji not in old), None)
    if added is None and new:
        return None  # the same reactions as before (a reordering): nothing to tell
    name = " ".join(str(user.get(k) or "") for k in ("first_name", "last_name")).strip()
    return Reaction(key=f"telegram:{data['update_id']}", platform_message_id=str(update["message_id"]),
                    chat_id=str(chat["id"]), sender_id=str(user["id"]), emoji=added or "", source="telegram",
                    sender_name=name)


def _emoji(item) -> str:
    """A ReactionType: an emoji, or a custom emoji / paid star named in words."""
    if not isinstance(item, dict):
        return ""
    if item.get("type") == "emoji":
        return str(item.get("emoji") or "")
    return f"[{item.get('type', 'reaction')}]"
