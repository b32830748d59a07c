"""The sandbox's transport: every send recorded, none made (see the package)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from delivery.transports import SendResult, Target, Transport

_sent_ids = itertools.count(1)


def next_message_id() -> str:
    """A platform id for a sandbox send: unique in the process, never a real platform's."""
    return f"sandbox-{next(_sent_ids)}"


@dataclass(frozen=True)
class Sent:
    chat_id: str
    text: str
    message_id: str


class SandboxTransport(Transport):
    max_units = 4096
    # What this process's sandbox transports were asked to send, per channel id (a replay
    # reads its own channel's, then forgets them: `taken`).
    sent: dict[int, list[Sent]] = {}

    async def send_text(self, target: Target, text: str) -> SendResult:
        message_id = next_message_id()
        self.sent.setdefault(self.channel.pk, []).append(Sent(target.chat_id, text, message_id))
        return SendResult.delivered(message_id)

    @classmethod
    def taken(cls, channel_id: int) -> list[Sent]:
        """The sends of a channel, forgotten here (a replay's channel id is reused once it rolls back)."""
        return cls.sent.pop(channel_id, [])
