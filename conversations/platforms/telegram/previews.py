"""Telegram's previews of a streamed reply (delivery.previews, docs/streaming.md).

Private chats: `sendMessageDraft` (Bot API 9.3+, python-telegram-bot's
`send_message_draft`) — an ephemeral draft the chat animates, never a message; the final
`sendMessage` goes through the ledger as any reply. Groups have no drafts: one preview
message, sent with the first delta and edited after; the final edit of it is the
ledger's (delivery.ledger.sending.send_over_preview).

Previews use a Bot of their own ("preview"): a preview waiting for a connection must
never queue the final behind it. Every error is swallowed (best effort) except a 429,
which stops the chat's previews.
"""

from __future__ import annotations

import abc
import zlib
from typing import TYPE_CHECKING, Any, Protocol

from telegram.error import BadRequest, RetryAfter, TelegramError

from conversations.platforms.telegram.request import NotSent
from delivery import chunks
from delivery.previews import Preview, PreviewResult

if TYPE_CHECKING:
    import telegram

    from delivery.transports import SendResult, Target

# A preview shows at most this much (UTF-16 units) of a longer reply, then an ellipsis:
# the final is split into chunks by the ledger.
PREVIEW_MAX_UNITS = 4000
NOT_MODIFIED = "message is not modified"


def shown_text(text: str) -> str:
    if chunks.units(text) <= PREVIEW_MAX_UNITS:
        return text
    return chunks.split(text, PREVIEW_MAX_UNITS)[0] + " …"


class PreviewSender(Protocol):
    """What a preview needs of the transport that shows it (TelegramTransport: this
    module is below it, so it names the transport by what it does)."""

    def _bot(self, purpose: str = "send") -> Any: ...

    def reply_parameters(self, target: Target) -> telegram.ReplyParameters | None: ...

    async def delete_message(self, target: Target, message_id: str) -> SendResult: ...


class TelegramPreview(Preview, abc.ABC):
    def __init__(self, transport: PreviewSender, target: Target, turn_id: int):
        self.transport = transport
        self.target = target
        self.turn_id = turn_id

    @property
    def bot(self):
        return self.transport._bot("preview")

    @property
    def thread(self) -> int | None:
        return int(self.target.thread_id) if self.target.thread_id else None

    async def show(self, text: str) -> PreviewResult:
        try:
            return await self._show(shown_text(text))
        except RetryAfter:
            return PreviewResult(False, flood=True)
        except BadRequest as exc:
            return PreviewResult(NOT_MODIFIED in str(exc).lower())
        except NotSent:
            return PreviewResult(False)  # never left: nothing can be in the chat
        except (TelegramError, OSError, ValueError, TypeError, LookupError):
            return PreviewResult(False, stop=self.unseen())

    def unseen(self) -> bool:
        """After a failed preview that went out: whether it may have left a message we
        do not know of (then previews stop)."""
        return False

    @abc.abstractmethod
    async def _show(self, text: str) -> PreviewResult:
        """Show `text` (already cut to what a preview holds) in the chat."""


class DraftPreview(TelegramPreview):
    """A private chat's draft: animated while it changes (one draft id per turn)."""

    @property
    def draft_id(self) -> int:
        return zlib.crc32(f"turn:{self.turn_id}".encode()) or 1  # must be non-zero

    async def _show(self, text: str) -> PreviewResult:
        await self.bot.send_message_draft(chat_id=int(self.target.chat_id), draft_id=self.draft_id, text=text,
                                          message_thread_id=self.thread)
        return PreviewResult(True)


class MessagePreview(TelegramPreview):
    """A group's preview: one message, edited as the reply grows."""

    is_message = True

    def __init__(self, transport: PreviewSender, target: Target, turn_id: int, message_id: str = ""):
        super().__init__(transport, target, turn_id)
        self.message_id = message_id  # a preview a crashed run of this turn left: reused

    async def _show(self, text: str) -> PreviewResult:
        if not self.message_id:
            reply = self.transport.reply_parameters(self.target)
            self.message_id = await self.bot.send_message_id(self.target.chat_id, text, reply_parameters=reply,
                                                             message_thread_id=self.thread)
            return PreviewResult(True, message_id=self.message_id)
        await self.bot.edit_message_text(text, chat_id=int(self.target.chat_id), message_id=int(self.message_id))
        return PreviewResult(True, message_id=self.message_id)

    def unseen(self) -> bool:
        # The first send failed after it went out (timed out, 5xx): a preview message may
        # be in the chat without its id; a second would be two.
        return not self.message_id

    async def discard(self) -> None:
        if self.message_id:
            await self.transport.delete_message(self.target, self.message_id)
