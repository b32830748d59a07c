"""An MMS's files: each MediaUrl Twilio gave is fetched with the account's credentials
(HTTP basic auth: the Account SID and the Auth Token), only from the channel's API root —
the credentials go nowhere else. Twilio answers with a redirect to the file's short-lived
address on its storage, fetched without them, as a capped, deadlined stream
(conversations.media.download)."""

from __future__ import annotations

import asyncio

import httpx
from django.conf import settings

from conversations.media.download import FileUnavailable, fetch_bytes, read_body
from conversations.models import Channel
from conversations.platforms.sms.transport import sms_client


async def fetch_media(channel: Channel, url: str, limit: int) -> bytes:
    sid, token = str(channel.setting("account_sid") or ""), str(channel.setting("auth_token") or "")
    base = str(channel.setting("api_base") or "").rstrip("/")
    if not sid or not token:
        raise FileUnavailable("the channel has no account SID or auth token", permanent=True)
    if not url.startswith(base + "/"):
        raise FileUnavailable("the file is not on the channel's Twilio API root", permanent=True)
    wait = float(settings.AGENTLOOP_MEDIA_FETCH_DEADLINE)
    try:
        async with asyncio.timeout(wait):
            async with sms_client().stream("GET", url, auth=(sid, token), timeout=wait) as response:
                if response.status_code not in (301, 302, 303, 307, 308):
                    return await read_body(response, limit, "Twilio")
                location = response.headers.get("location") or ""
    except TimeoutError:
        raise FileUnavailable(f"Twilio did not answer for the file within {wait:g} s") from None
    except httpx.HTTPError as exc:
        raise FileUnavailable(f"Twilio could not be reached for the file: {type(exc).__name__}") from None
    if not location.startswith(("https://", "http://")):
        raise FileUnavailable("Twilio redirected the file nowhere", permanent=True)
    return await fetch_bytes(location, limit, wait)
