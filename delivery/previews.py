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

import abc
from dataclasses import dataclass

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
