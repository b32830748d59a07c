"""A person's image or file, fetched as a capped, deadlined stream
(conversations.media.download):

- an image pasted into a message: the contentUrl its attachment gave (the Bot
  Connector's …/v3/attachments/<id>/views/original), with the bot's token — sent only to
  the Connector (the channel's service URL's host, Microsoft's smba.trafficmanager.net, or
  the host of a serviceUrl a verified activity of the channel came from:
  conversations.addresses) and only for its attachments' path, never to another host a
  URL might name;
- a file sent in a personal chat: its `file.download.info`'s downloadUrl (the user's
  OneDrive, pre-authorised and short-lived: "Send and receive files using bot"), a plain
  GET with no token at all.

The token and a download URL's query (its pre-authorisation) are masked in every error
text."""

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


async def needs_token(channel: Channel, url: str) -> bool:
    """Whether `url` is one of the Connector's attachments (the bot's token goes with it)."""
    parts = urlsplit(url)
    return "/v3/attachments/" in parts.path and await is_connector(channel, parts.scheme, parts.netloc)


async def fetch_media(channel: Channel, url: str, limit: int) -> bytes:
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.netloc:
        raise FileUnavailable("the file has no download URL", permanent=True)
    headers: dict[str, str] = {}
    if await needs_token(channel, url):
        try:
            token = await asyncio.wait_for(asyncio.to_thread(access_token, channel), TOKEN_DEADLINE + 1)
        except TokenRefused as exc:
            raise FileUnavailable(str(exc), permanent=True) from None
        except (TokenUnavailable, TimeoutError) as exc:
            raise FileUnavailable(str(exc) or "no token for the download") from None
        headers["Authorization"] = f"Bearer {token}"
    secrets = (*(value.removeprefix("Bearer ") for value in headers.values()),
               *(piece for piece in parts.query.split("&") if piece))
    return await fetch_bytes(url, limit, float(settings.AGENTLOOP_MEDIA_FETCH_DEADLINE), headers=headers,
                             secrets=secrets)
