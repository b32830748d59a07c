"""Previews of a streamed reply (docs/streaming.md): what a chat shows while the agent
writes. Best effort and never a ledger row: the final reply is one, always.

A transport offers a preview for a chat where its platform can show one
(`Transport.preview_for`): Telegram's drafts in private chats, one edited message in
groups, the web chat's deltas. A preview that is a message staying in the chat
(`is_message`: a group's) is the one kind the ledger must know about: the final's first
chunk is an edit of it, and a failed or unknown edit removes it
(delivery.ledger.sending.send_over_preview), so the chat never shows two finished
answers nor a truncated one as finished.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from delivery.models import Outcome

if TYPE_CHECKING:  # annotations only: delivery.transports imports this module
    from delivery.transports import SendResult, Target, Transport

# A preview ends with this: a text still being written never looks finished (the
# final, sent or edited in through the ledger, has none).
CURSOR = " ▍"


@dataclass(frozen=True)
class PreviewResult:
    shown: bool
    # The platform asked us to slow down (a 429): previews stop for this chat; the
    # final, a ledger row, is untouched.
    flood: bool = False
    message_id: str = ""  # a preview that is a message: its id in the chat
    # Previews must end for this turn for another reason (a preview message whose send
    # may have landed unseen: another would be a second one).
    stop: bool = False


class Preview(abc.ABC):
    """One turn's preview in one chat."""

    # A message that stays in the chat: its id is recorded (the turn, then the final's
    # row), the final edits it.
    is_message = False
    # Seconds between two previews; None: AGENTLOOP_PREVIEW_INTERVAL.
    interval: float | None = None

    @abc.abstractmethod
    async def show(self, text: str) -> PreviewResult:
        """Show `text` (the whole reply so far, the cursor already on it)."""

    async def discard(self) -> None:
        """The stream was cancelled (an interrupt, a new turn): take the preview away,
        best effort."""


class EditedPreview(Preview):
    """A preview that is one message in the chat, sent once and then edited: what a
    platform with no draft or stream of its own shows (Discord, Google Chat, Teams
    outside one-to-one chats). A platform says how its first message goes (`first`) and
    how much of the text one message holds (`fit`); the ledger edits the final into it."""

    is_message = True

    def __init__(self, transport: Transport, target: Target, message_id: str = "") -> None:
        self.transport, self.target, self.message_id = transport, replace(target, buttons=()), message_id
        self.shown = ""

    async def first(self, text: str) -> SendResult:
        """The preview's message, sent (threaded as the reply will be)."""
        return await self.transport.send_text(self.target, text)

    def fit(self, text: str) -> str:
        """`text` as one message holds it (the final, in chunks, says the rest)."""
        return text

    async def show(self, text: str) -> PreviewResult:
        text = self.fit(text)
        if text == self.shown:
            return PreviewResult(False)
        if self.message_id:
            result = await self.transport.edit_text(self.target, self.message_id, text)
        else:
            result = await self.first(text)
            self.message_id = result.platform_message_id if result.ok else ""
        if result.ok:
            self.shown = text
            return PreviewResult(True, message_id=self.message_id)
        # A first send that may have landed unseen: another would be a second preview.
        return PreviewResult(False, flood=result.outcome == Outcome.FLOOD,
                             stop=not self.message_id and result.outcome == Outcome.AMBIGUOUS)

    async def discard(self) -> None:
        if self.message_id:
            await self.transport.delete_message(self.target, self.message_id)
