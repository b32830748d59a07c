"""A file someone uploaded to Chat with their message: the Chat API's media.download,
GET {api_base}media/{attachmentDataRef.resourceName}?alt=media, with the app's own access
token (the service account's, scope chat.bot: app authentication may download what was
sent to the app), read as a capped, deadlined stream (conversations.media.download).

Each download is a read in Chat's quotas (900 a minute per space, 3,000 attachment reads a
minute per project): one per file, far below either, so downloads are not paced.

Uploading the other way (media.upload) takes a user's authentication, which an app does
not have: a reply's files are named in its text instead (transport.py)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING
from urllib.parse import quote

from django.conf import settings

from conversations.media.download import FileUnavailable, fetch_bytes
from conversations.platforms.google_chat.transport import (
    TOKEN_DEADLINE,
    TokenRefused,
    TokenUnavailable,
    access_token,
    key_of,
)

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Channel

# The characters a resource name keeps unescaped in the path ({+resourceName}: reserved
# expansion, its slashes included).
RESERVED = "/:@!$&'()*+,;="


def media_url(channel: Channel, resource_name: str) -> str:
    return f"{str(channel.setting('api_base')).rstrip('/')}/media/{quote(resource_name, safe=RESERVED)}?alt=media"


async def fetch_media(channel: Channel, resource_name: str, limit: int) -> bytes:
    """The file's bytes, at most `limit` of them, within AGENTLOOP_MEDIA_FETCH_DEADLINE
    (the token's own fetch, if one is due, within TOKEN_DEADLINE). Raises FileUnavailable
    (`permanent` for a key that cannot be used, a refused token, 401/403/404) or
    FileTooLarge."""
    if not key_of(channel):
        raise FileUnavailable("the channel's service account key cannot be read", permanent=True)
    try:
        token = await asyncio.wait_for(asyncio.to_thread(access_token, channel), TOKEN_DEADLINE + 1)
    except TokenRefused as exc:
        raise FileUnavailable(str(exc), permanent=True) from None
    except (TokenUnavailable, TimeoutError) as exc:
        raise FileUnavailable(str(exc) or f"no access token within {TOKEN_DEADLINE:g} s") from None
    return await fetch_bytes(media_url(channel, resource_name), limit, settings.AGENTLOOP_MEDIA_FETCH_DEADLINE,
                             headers={"Authorization": f"Bearer {token}"}, secrets=(token,))
