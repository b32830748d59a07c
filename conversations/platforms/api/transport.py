"""The API channel's two transports: the reply row kept for the read API, or POSTed
signed to the channel's callback URL."""

import json
from urllib.parse import urlsplit

import httpx
from django.conf import settings

from agentloop.core import live
from agentloop.core.tls import shared_tls_context
from delivery import signing
from delivery.models import Outcome
from delivery.previews import CURSOR, Preview, PreviewResult
from delivery.retry_after import retry_after_header
from delivery.transports import SendResult, Target, Transport, outcome_for_http_status


class StreamPreview(Preview):
    """A turn's text so far, published to the conversation's SSE readers (the read API's
    stream, conversations.api.streaming: `delta` events). Best effort: nothing is
    written or sent while no reader listens, and a lost one costs a reader a delta,
    never the reply row."""

    interval = 0.1  # a reader takes events far faster than a chat platform

    def __init__(self, target: Target, turn_id: int):
        self.group = live.api_stream_group(target.conversation_id)
        self.event = {"kind": "delta", "conversation": target.conversation_id, "turn": turn_id}

    async def show(self, text: str) -> PreviewResult:
        try:
            await live.apublish([self.group], {**self.event, "text": text.removesuffix(CURSOR)})
        except Exception:  # e.g. Redis unreachable: a preview is best effort
            return PreviewResult(False)
        return PreviewResult(True)

    async def discard(self) -> None:
        try:
            await live.apublish([self.group], {**self.event, "kind": "cancelled"})
        except Exception:
            pass  # best effort


class StoredTransport(Transport):
    """api channels without a callback: the reply row *is* the delivery; clients read it
    (and watch it being written over the read API's stream: `preview_for`)."""

    async def send_text(self, target: Target, text: str) -> SendResult:
        return SendResult.delivered()

    def preview_for(self, target: Target, turn_id: int, message_id: str = "") -> Preview | None:
        return StreamPreview(target, turn_id)


class ApiCallbackTransport(Transport):
    """api channels with a callback URL (a webhook): the reply is POSTed, signed (see
    `delivery.signing`: HMAC-SHA256 over the timestamp and the body). A channel without
    a callback secret is never sent to unsigned: saving it is refused, its replies wait
    (Channel.send_blocked), and a row claimed anyway (a secret cleared straight in the
    database) blocks the channel instead of going out.
    The whole exchange has one deadline (Transport.exchange)."""

    async def send_text(self, target: Target, text: str) -> SendResult:
        values = self.channel.platform_settings or {}
        secret, url = values.get("callback_secret", ""), values.get("callback_url", "")
        if not secret:
            return self.failed(Outcome.CHANNEL_BLOCKED, "refused: the channel's callback has no secret to sign with")
        body = json.dumps({"chat": target.chat_id, "reply_to": target.reply_target, "text": text}).encode()
        headers = {"Content-Type": "application/json", **signing.signed_headers(secret, body)}
        host = urlsplit(url).netloc.rpartition("@")[2]
        deadline = settings.AGENTLOOP_CALLBACK_TIMEOUT
        answer = await self.exchange(lambda extensions: self._post(url, body, headers, deadline, extensions),
                                     host, deadline)
        if isinstance(answer, SendResult):
            return answer
        status, retry_after = answer
        outcome = outcome_for_http_status(status)
        if outcome == Outcome.DELIVERED:
            return SendResult.delivered()
        gone = status in (404, 410)  # the receiver is gone, rather than refusing this reply
        said = f"rejected: HTTP {status}" if outcome == Outcome.PERMANENT and not gone else f"HTTP {status}"
        return self.failed(outcome, said, retry_after)

    async def _post(self, url, body, headers, timeout, extensions):
        # Streamed, and the body never read: the status and Retry-After say all we use, and
        # a receiver answering without end must not hold the send (or the worker's memory).
        async with httpx.AsyncClient(timeout=timeout, verify=shared_tls_context()) as client:
            async with client.stream("POST", url, content=body, headers=headers, extensions=extensions) as response:
                return response.status_code, retry_after_header(response.headers.get("Retry-After"))
