"""A throwaway platform that keeps a connection open (issue 52): "sock" speaks JSON over
a WebSocket, as Discord's Gateway or Slack's Socket Mode do in their own words.

The client opens the channel's `url` and says {"resume": <the last seq it stored, or
null>}; the platform sends {"seq": n, "message": {"id", "chat", "from", "text"}} and
the client answers {"ack": n} once the message is admitted and n stored. Like the real
ones, the platform may send again what it sent before a drop (at least once).

Loaded by the real worker through AGENTLOOP_EXTRA_PLATFORMS=sock=tests.socket_platform.
SocketPlatform (tests/end_to_end/test_connection.py); replies are not its subject: its
channels' agent is `pull`, and its transport sends nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.utils.translation import gettext_lazy as _

from conversations.platforms.base import Platform, Setting

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Channel
    from delivery.transports import Transport
    from tests.socket_platform.connection import SocketConnection


class SocketPlatform(Platform):
    kind = "sock"
    label = "Socket"
    settings = {"url": Setting(label=_("URL"), required_to_receive=True, help=_("The platform's WebSocket address."))}

    def transport(self, channel: Channel) -> Transport:
        # Imports delivery's transports, which the registry loads first.
        from tests.socket_platform.connection import SilentTransport

        return SilentTransport(channel)

    def connection(self) -> SocketConnection:
        from tests.socket_platform.connection import SocketConnection  # imports models: the registry loads before apps

        return SocketConnection(self)
