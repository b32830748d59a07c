"""A message's file from the WhatsApp Cloud API: the media id's metadata (GET
{api_base}/{api_version}/{media id}, with the channel's token: a short-lived download URL,
the size and type), then the download itself — which Meta also wants the bearer token
for — read as a capped, deadlined stream (conversations.media.download). Each try asks
for a fresh URL: Meta's expire after about five minutes."""

import asyncio
from urllib.parse import quote

from django.conf import settings

from conversations.media.download import FileTooLarge, FileUnavailable, fetch_bytes
from conversations.platforms.whatsapp.transport import TOKEN_DEAD_CODES, deadline, graph_client

# Graph codes for a media id that no retry will make fetchable (unknown, deleted, not ours).
GONE_CODES = {100, 131052, 131053}


async def fetch_media(channel, media_id: str, limit: int) -> bytes:
    token = channel.setting("token")
    if not token:
        raise FileUnavailable("the channel has no access token", permanent=True)
    found = await _metadata(channel, token, media_id)
    size = found.get("file_size")
    if isinstance(size, int) and size > limit:
        raise FileTooLarge(size, limit)
    url = found.get("url")
    if not isinstance(url, str) or not url.startswith(("https://", "http://")):
        raise FileUnavailable("the Graph API gave no download URL for the media", permanent=True)
    return await fetch_bytes(url, limit, settings.AGENTLOOP_MEDIA_FETCH_DEADLINE,
                             headers={"Authorization": f"Bearer {token}"}, secrets=(token,))


async def _metadata(channel, token, media_id) -> dict:
    base = channel.setting("api_base").rstrip("/")
    url = f"{base}/{channel.setting('api_version')}/{quote(media_id, safe='')}"
    limit = deadline()
    try:
        response = await asyncio.wait_for(
            graph_client().get(url, headers={"Authorization": f"Bearer {token}"}, timeout=limit), limit)
    except TimeoutError:
        raise FileUnavailable(f"the Graph API did not answer for the media within {limit:g} s") from None
    except Exception as exc:  # httpx's transport errors: worth another try
        raise FileUnavailable(f"the Graph API could not be reached: {type(exc).__name__}") from None
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if response.status_code == 200 and isinstance(answer, dict):
        return answer
    error = answer.get("error") if isinstance(answer, dict) and isinstance(answer.get("error"), dict) else {}
    code = error.get("code")
    said = f"HTTP {response.status_code}" + (f", code {code}" if code is not None else "") + \
        (f": {error.get('message')}" if error.get("message") else "")
    if code in TOKEN_DEAD_CODES:
        raise FileUnavailable(f"the access token was refused: {said}", permanent=True)
    permanent = code in GONE_CODES or response.status_code in (400, 403, 404)
    raise FileUnavailable(f"the media could not be looked up: {said}", permanent=permanent)
