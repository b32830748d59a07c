"""The sandbox: the kind of a replay's channel (agentloop.console.replay). Nothing comes
in from outside — the replay admits the recording's messages itself — and nothing goes
out: its transport answers every send as delivered and keeps the text in memory, so
the ledger does all it does (claim, label, record the outcome) and no platform hears it.

No webhook, no polling connection, no pacing, no typing: a sandbox channel exists only
inside a replay's transaction, which is rolled back when the replay ends, so no worker
ever sees it either."""

from __future__ import annotations

from typing import TYPE_CHECKING

from conversations.platforms.base import Platform

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Channel
    from delivery.transports import Transport

KIND = "sandbox"


class SandboxPlatform(Platform):
    kind = KIND
    label = "Sandbox (replays)"
    listed = False  # never a channel an operator makes
    # As on the platform it copies: a tool asking the user to confirm is proposed (its question
    # goes to the sandbox), and stays so — a replay's user never taps the answer.
    user_can_confirm = True

    def transport(self, channel: Channel) -> Transport:
        from conversations.platforms.sandbox.transport import SandboxTransport

        return SandboxTransport(channel)
