"""An image a person pasted into a message, fetched: the contentUrl its attachment gave
(the Bot Connector's …/v3/attachments/<id>/views/original), with the bot's token — sent
only to the Connector (the channel's service URL's host, Microsoft's
smba.trafficmanager.net, or the host of a serviceUrl a verified activity of the channel
came from: conversations.addresses), never to another host a URL might name — read as a capped,
deadlined stream (conversations.media.download). The token is masked in every error text."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from asgiref.sync import sync_to_async
from django.conf import settings

from conversations import addresses
from conversations.media.download import FileUnavailable, fetch_bytes
from conversations.platforms.teams.transport import TOKEN_DEADLINE, TokenRefused, TokenUnavailable, access_token

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Channel

CONNECTOR_HOSTS = ("smba.trafficmanager.net",)


def connectors(channel: Channel) -> set[str]:
    return {*CONNECTOR_HOSTS, urlsplit(str(channel.setting("service_url") or "")).netloc}


async def is_connector(channel: Channel, scheme: str, host: str) -> bool:
    """The host is the Connector's: a known one, or one the channel's activities came from."""
    return host in connectors(channel) or await sync_to_async(addresses.names)(channel, "serviceUrl",
                                                                               f"{scheme}://{host}")


async def fetch_media(channel: Channel, url: str, limit: int) -> bytes:
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.netloc:
        raise FileUnavailable("the image has no download URL", permanent=True)
    headers: dict[str, str] = {}
    if await is_connector(channel, parts.scheme, parts.netloc):
        try:
            token = await asyncio.wait_for(asyncio.to_thread(access_token, channel), TOKEN_DEADLINE + 1)
        except TokenRefused as exc:
            raise FileUnavailable(str(exc), permanent=True) from None
        except (TokenUnavailable, TimeoutError) as exc:
            raise FileUnavailable(str(exc) or "no token for the download") from None
        headers["Authorization"] = f"Bearer {token}"
    secrets = tuple(value.removeprefix("Bearer ") for value in headers.values())
    return await fetch_bytes(url, limit, float(settings.AGENTLOOP_MEDIA_FETCH_DEADLINE), headers=headers,
                             secrets=secrets)
