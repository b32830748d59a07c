"""A message's attachment, fetched: the CDN URL its MESSAGE_CREATE gave (signed by
Discord, `ex`/`is`/`hm`, valid for about a day; no bot token needed, none sent), read as a
capped, deadlined stream (conversations.media.download). The signature is masked in
every error text."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from django.conf import settings

from conversations.media.download import FileUnavailable, fetch_bytes

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Channel


async def fetch_media(channel: Channel, url: str, limit: int) -> bytes:
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.netloc:
        raise FileUnavailable("the attachment has no download URL", permanent=True)
    signature = tuple(piece for piece in parts.query.split("&") if piece)
    return await fetch_bytes(url, limit, float(settings.AGENTLOOP_MEDIA_FETCH_DEADLINE), secrets=signature)
