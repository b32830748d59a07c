"""Who the bot is in a group: its user id (a reply to its message is addressed to it)
and its @username (a mention of it). The id is the bot token's prefix, as Telegram
issues tokens; the username is the channel's `bot_username` setting, else learned from
getMe once per token per process (a group message that arrives while getMe fails counts
only replies and text mentions, and getMe is asked again at the next one)."""

import logging
from dataclasses import dataclass

import httpx

from conversations.platforms.telegram.transport import bot_url

log = logging.getLogger(__name__)

GET_ME_TIMEOUT = 5.0
_usernames: dict[str, str] = {}


@dataclass(frozen=True)
class BotIdentity:
    id: int | None
    username: str


def asker(channel):
    """What parsing asks for the bot's identity, or None when the channel's groups do not
    depend on mentions (no getMe is asked then)."""
    return (lambda: of(channel)) if channel.group_replies == "mention" else None


def of(channel) -> BotIdentity:
    token = channel.setting("bot_token") or ""
    prefix = token.split(":", 1)[0]
    username = channel.setting("bot_username") or learned(token, channel.setting("api_base"))
    return BotIdentity(int(prefix) if prefix.isdigit() else None, username.lstrip("@"))


def learned(token, api_base) -> str:
    """The bot's username from getMe, cached per token ("" when getMe failed: not cached)."""
    if not token:
        return ""
    if token not in _usernames:
        try:
            answer = httpx.get(f"{bot_url(api_base)}{token}/getMe", timeout=GET_ME_TIMEOUT).json()
            _usernames[token] = str(answer["result"]["username"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            log.warning("getMe failed: group mentions of the bot by @username are not seen until it answers")
            return ""
    return _usernames[token]
