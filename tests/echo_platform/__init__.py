"""A throwaway platform written from docs/adding-a-platform.md alone: "echo" speaks JSON
over plain HTTP. Its webhook takes {"id", "chat", "from", "text"} with the channel's
secret in X-Echo-Secret; its replies are POSTed as {"chat", "text"} to the channel's
reply URL, which answers as a platform does (200, 429 with Retry-After, 5xx, 4xx).

It proves the contract: this folder and one setting
(AGENTLOOP_EXTRA_PLATFORMS=echo=tests.echo_platform.EchoPlatform) are all a platform
takes — no edit anywhere else (tests/end_to_end/test_echo_platform.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.utils.translation import gettext_lazy as _

from conversations.platforms.base import Platform, Setting, check_url, pace_settings

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Channel
    from tests.echo_platform.transport import EchoTransport
    from tests.echo_platform.webhook import EchoWebhook


class EchoPlatform(Platform):
    kind = "echo"
    label = "Echo"
    settings = {
        "secret": Setting(label=_("Secret"), secret=True, required_to_receive=True,
                          help=_("Sent back by the platform in X-Echo-Secret.")),
        "reply_url": Setting(label=_("Reply URL"), check=check_url, required_to_send=True,
                             help=_("Where replies are POSTed.")),
        # The platform's documented limit (its fake keeps it): 10 sends a second, one a
        # second into one chat.
        **pace_settings(per_second=10, chat_interval=1.0),
    }

    def transport(self, channel: Channel) -> EchoTransport:
        from tests.echo_platform.transport import EchoTransport  # imports delivery's, which the registry loads first

        return EchoTransport(channel)

    def webhook(self) -> EchoWebhook:
        from tests.echo_platform.webhook import EchoWebhook  # imports ingest, which imports the models

        return EchoWebhook(self)

    async def close_clients(self) -> None:
        from tests.echo_platform.transport import close_clients

        await close_clients()
