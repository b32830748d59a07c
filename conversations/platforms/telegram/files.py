"""A message's file: `getFile` through python-telegram-bot (the file's path and size),
then the download itself, read as a capped stream (conversations.media.download): PTB's
own download reads the whole body whatever its size."""

from django.conf import settings
from telegram.error import BadRequest, InvalidToken, RetryAfter, TelegramError

from conversations.media.download import FileTooLarge, FileUnavailable, fetch_bytes
from conversations.platforms.telegram.transport import telegram_bot

# getFile's BadRequest descriptions that no retry changes (a bot may download 20 MB at most).
FOR_GOOD = ("wrong file_id", "invalid file_id", "file_id_invalid", "wrong remote file")


async def fetch_file(channel, file_id: str, limit: int) -> bytes:
    token = channel.setting("bot_token")
    bot = telegram_bot(token, channel.setting("api_base"), "files")
    try:
        found = await bot.get_file(file_id)
    except RetryAfter as exc:
        raise FileUnavailable(f"flood control: retry after {exc.retry_after} s") from None
    except InvalidToken:
        raise FileUnavailable("the bot token was refused", permanent=True) from None
    except BadRequest as exc:
        text = str(exc)
        if "too big" in text.lower():
            raise FileTooLarge(limit + 1, limit) from None
        raise FileUnavailable(f"getFile refused it: {text}", permanent=any(p in text.lower() for p in FOR_GOOD)) \
            from None
    except TelegramError as exc:
        raise FileUnavailable(f"getFile failed: {type(exc).__name__}: {exc}") from None
    if found.file_size and found.file_size > limit:
        raise FileTooLarge(found.file_size, limit)
    if not found.file_path:
        raise FileUnavailable("getFile gave no file_path", permanent=True)
    return await fetch_bytes(found.file_path, limit, settings.AGENTLOOP_MEDIA_FETCH_DEADLINE, secrets=(token,))
