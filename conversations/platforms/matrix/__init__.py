"""Matrix (a bot account on a homeserver: `/sync` in, the client-server API out):
everything Matrix means to agentloop.

- sync.py: the `/sync` long poll the worker holds per channel (matrix-nio's AsyncClient),
  the position stored after each batch is admitted, invites joined (`auto_join`)
- events.py: room events into our Inbound, Edit (`m.replace`), Reaction (`m.reaction`)
  and Deletion (a redaction); an encrypted event into a refusal (logged and audited)
- transport.py: replies (`m.text` answering the person's message, in its thread), the
  transaction id the ledger row's, previews edited (`m.replace`), typing, status
  reactions, and each error mapped to the ledger's outcomes

Identities: a message's dedup key is its event id; a conversation's chat is the room.
A room of two members is a direct chat; a larger one is a group, where a message is
answered when it mentions the bot (the channel's `group_replies`); the others are kept
as context. End-to-end encrypted rooms are not supported (docs/matrix.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.utils.translation import gettext_lazy as _

from conversations.platforms.base import Platform, Setting, check_url, pace_settings

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Channel
    from conversations.platforms.matrix.sync import MatrixConnection
    from conversations.platforms.matrix.transport import MatrixTransport


class MatrixPlatform(Platform):
    kind = "matrix"
    label = "Matrix"
    settings = {
        "homeserver": Setting(label=_("Homeserver"), check=check_url, carries=("access_token",),
                              required_to_send=True, required_to_receive=True,
                              help=_("The homeserver's client-server API root (https://matrix.example.org). "
                                     "Changing it asks for the access token again.")),
        "access_token": Setting(label=_("Access token"), secret=True, required_to_send=True, required_to_receive=True,
                                option="--token", help=_("The bot account's access token (a login of its own: "
                                                         "/sync and every send use it).")),
        "auto_join": Setting(label=_("Join invites"), default="on", choices=("on", "off"),
                             help=_("Join the rooms the bot is invited to (on), or leave invites to an operator "
                                    "(off).")),
        # Synapse's default rc_message: 0.2 messages a second per user, a burst of 10; a
        # homeserver's admin can lift it for the bot (docs/matrix.md).
        **pace_settings(per_second=0.2, chat_interval=0.0),
    }

    # The package's modules are imported where they are used: they import models and
    # ingest, which the registry that loads this class from settings must not pull in.
    def transport(self, channel: Channel) -> MatrixTransport:
        from conversations.platforms.matrix.transport import MatrixTransport

        return MatrixTransport(channel)

    def connection(self) -> MatrixConnection:
        from conversations.platforms.matrix.sync import MatrixConnection

        return MatrixConnection(self)

    async def close_clients(self) -> None:
        from conversations.platforms.matrix.transport import close_clients

        await close_clients()
