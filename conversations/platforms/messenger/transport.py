"""Sending to Messenger and Instagram: Meta's Send API, POST
{api_base}/{api_version}/{account_id}/messages with `Authorization: Bearer <token>` (a
Page access token; on Instagram the account's), one overall deadline per call
(Transport.exchange), plain httpx (conversations.platforms.meta).

A reply is `messaging_type: RESPONSE` inside the 24-hour window. Outside it Meta refuses
it (code 10, subcode 2018278 on Messenger, 2534022 on Instagram): permanent, unless the
channel sets a message tag (`HUMAN_AGENT`: up to 7 days after the person's last
message), with which the same message is sent once more, tagged (the refused one showed
nothing). A question's Yes / No go as quick replies on its last piece. "Typing…" is the
`typing_on` sender action (shown 20 s, or until a message), after one `mark_seen` per
message answered. Files go by upload (Messenger: the message and the file in one
multipart request) or, with `public_url` set (Instagram takes no uploads), by a signed
link to the stored file that Meta fetches.

Outcomes: the Graph codes every Meta platform shares (meta.outcome), with these:

| code / subcode | meaning | outcome |
|---|---|---|
| 551, 200/1545041 | this person isn't available right now (blocked the account, turned messages off) | permanent |
| 100/2018001, 100/2534014 | no matching user (not this account's scoped id) | permanent |
| 10/2018278, 10/2018065, 10/2534022 | outside the messaging window, no tag allows it | permanent |
| 10/2018108 | this person cannot receive messages now | permanent |
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from django.conf import settings

from agentloop.core.caches import BoundedCache
from conversations.media.links import path_for_outbound
from conversations.platforms import meta
from conversations.platforms.messenger.events import key_of
from delivery import attachments, chunks
from delivery.attachments import OutboundFile
from delivery.models import Outcome
from delivery.pacing import Pace
from delivery.transports import SendResult, Target, Transport

WINDOW_CLOSED = {(10, 2018278), (10, 2018065), (10, 2534022)}
UNREACHABLE: dict[Any, str] = {
    551: "this person isn't available right now (they blocked the account or turned its messages off)",
    (200, 1545041): "this person isn't available right now (they blocked the account or turned its messages off)",
    (100, 2018001): "no matching user: the id is not one of this account's people",
    (100, 2534014): "no matching user: the id is not one of this account's people",
    (10, 2018108): "this person cannot receive messages from the account now",
    **{pair: "outside the 24-hour messaging window and no message tag allows it: the person must write first"
       for pair in WINDOW_CLOSED},
}
ACTIONS = ("typing_on", "typing_off", "mark_seen")
QUICK_TITLE = 20  # characters of a quick reply's title
# What Meta shows each file as; anything else goes as a file.
SHOWN_AS = {"image/jpeg": "image", "image/png": "image", "image/gif": "image", "video/mp4": "video",
            "audio/mpeg": "audio", "audio/mp4": "audio", "audio/aac": "audio", "audio/wav": "audio"}
_seen: BoundedCache[str, bool] = BoundedCache(maxsize=4096)  # the messages marked seen already


def deadline() -> float:
    return float(settings.AGENTLOOP_CALLBACK_TIMEOUT)


class GraphRefused(Exception):
    """A sender action refused (raised: the typing loop logs it once per fault)."""

    def __init__(self, text: str, retry_after: float | None = None) -> None:
        super().__init__(text)
        self.retry_after = retry_after


class MessengerTransport(Transport):
    supports_typing = True
    typing_refresh = 15.0  # the indicator lasts 20 s
    max_units = 2000  # "UTF-8 and less than 2000 characters"
    max_bytes = 0  # Instagram: 1,000 bytes of UTF-8 as well

    def setting(self, name: str) -> Any:
        return self.channel.setting(name)

    @property
    def kind(self) -> str:
        return str(self.channel.kind)

    def endpoint(self) -> str:
        base = str(self.setting("api_base")).rstrip("/")
        return f"{base}/{self.setting('api_version')}/{self.setting('account_id')}/messages"

    def ready(self) -> SendResult | None:
        if not self.setting("token") or not self.setting("account_id"):
            return self.failed(Outcome.TEMPORARY, "refused: the channel has no token or account id")
        return None

    # --- text -----------------------------------------------------------------------------
    async def send_text(self, target: Target, text: str) -> SendResult:
        refused = self.ready()
        if refused is not None:
            return refused
        pieces = [p for chunk in chunks.split(text, self.max_units) for p in self._bytes(chunk)]
        last = ""
        for number, piece in enumerate(pieces):
            message: dict[str, Any] = {"text": piece}
            if target.buttons and number == len(pieces) - 1:
                message["quick_replies"] = [{"content_type": "text", "title": label[:QUICK_TITLE], "payload": data}
                                            for label, data in target.buttons]
            sent = await self._send(target, {"message": message})
            if isinstance(sent, SendResult):
                return sent
            last = sent
        return SendResult.delivered(last)

    def _bytes(self, text: str) -> list[str]:
        """Instagram counts bytes: a piece cut again where its UTF-8 would pass the limit."""
        if not self.max_bytes or len(text.encode()) <= self.max_bytes:
            return [text]
        pieces, piece = [], ""
        for char in text:
            if len((piece + char).encode()) > self.max_bytes:
                pieces.append(piece)
                piece = ""
            piece += char
        return [*pieces, piece] if piece else pieces

    async def _send(self, target: Target, content: dict[str, Any], files: Any = None) -> str | SendResult:
        """One message (or an upload with it), tagged once more if the window had closed
        and the channel has a tag: the message id, or the failed SendResult."""
        body = {"recipient": {"id": target.chat_id}, "messaging_type": "RESPONSE", **content}
        result = await self._post(body, files)
        tag = self.setting("message_tag")
        if isinstance(result, SendResult) and tag and result.outcome == Outcome.PERMANENT and \
                "messaging window" in result.error:
            result = await self._post({**body, "messaging_type": "MESSAGE_TAG", "tag": tag}, files)
        return result

    async def _post(self, body: dict[str, Any], files: Any = None) -> str | SendResult:
        limit = deadline()
        token = str(self.setting("token"))
        if files is None:
            def request_for(extensions: dict[str, Any]) -> Any:
                return meta.call("POST", self.endpoint(), token, limit, extensions, json=body)
        else:  # multipart: each field a JSON string, the file as `filedata`
            form = {name: json.dumps(value) if isinstance(value, dict) else value for name, value in body.items()}

            def request_for(extensions: dict[str, Any]) -> Any:
                return meta.call("POST", self.endpoint(), token, limit, extensions, data=form, files=files)
        exchanged = await self.exchange(request_for, self.endpoint().split("/")[2], limit)
        if isinstance(exchanged, SendResult):
            return exchanged
        if 200 <= exchanged.status < 300:
            mid = exchanged.body.get("message_id") if isinstance(exchanged.body, dict) else None
            if isinstance(mid, str) and mid:
                return key_of(mid)
            return self.failed(Outcome.AMBIGUOUS, f"HTTP {exchanged.status} without a message id: it may have been sent")
        return self.outcome(exchanged.status, exchanged.body, exchanged.headers)

    def outcome(self, status: int, answer: Any, headers: Any = None) -> SendResult:
        """A refusal's outcome, from its Graph error code (the module's table)."""
        return meta.outcome(self.failed, meta.fault_of(status, answer, headers), UNREACHABLE)

    # --- files -------------------------------------------------------------------------------
    async def send_files(self, target: Target, files: list[OutboundFile], caption: str) -> SendResult:
        """One file, by link (`public_url` set) or uploaded with its message; a caption
        (Meta's attachments have none) follows as a text."""
        refused = self.ready()
        if refused is not None:
            return refused
        item = files[0]
        shown = SHOWN_AS.get(item.type, "file")
        public = str(self.setting("public_url") or "").rstrip("/")
        if not public and self.max_bytes:  # Instagram takes files by link only: named under the text
            return await Transport.send_files(self, target, files, caption)
        if public:
            url = public + path_for_outbound(item.file, item.type, item.name)
            sent = await self._send(target, {"message": {"attachment": {"type": shown, "payload": {
                "url": url, "is_reusable": False}}}})
        else:
            try:
                data = await asyncio.to_thread(attachments.read, item.file)
            except OSError as exc:
                return self.failed(Outcome.TEMPORARY, f"the file could not be read from storage: {type(exc).__name__}")
            upload = {"filedata": (item.name, data, item.type or "application/octet-stream")}
            sent = await self._send(target, {"message": {"attachment": {"type": shown, "payload": {
                "is_reusable": False}}}}, upload)
        if isinstance(sent, SendResult) or not caption.strip():
            return sent if isinstance(sent, SendResult) else SendResult.delivered(sent)
        return await self.send_text(Target(target.chat_id), caption)

    # --- sender actions -----------------------------------------------------------------------
    async def send_typing(self, target: Target) -> None:
        """`mark_seen` once for the message being answered, then `typing_on`."""
        if not self.setting("token") or not self.setting("account_id"):
            return
        seen = f"{self.channel.pk}:{target.chat_id}:{target.reply_target}"
        if target.reply_target and _seen.get(seen) is None:
            await self.sender_action(target.chat_id, "mark_seen")
            _seen.set(seen, True)
        await self.sender_action(target.chat_id, "typing_on")

    async def sender_action(self, chat_id: str, action: str) -> None:
        limit = deadline()
        body = {"recipient": {"id": chat_id}, "sender_action": action}
        answer = await asyncio.wait_for(meta.call("POST", self.endpoint(), str(self.setting("token")), limit,
                                                  json=body), limit)
        if answer.status >= 300:
            result = self.outcome(answer.status, answer.body, answer.headers)
            raise GraphRefused(result.error, result.retry_after if result.outcome == Outcome.FLOOD else None)

    def pace(self, chat_id: str) -> Pace | None:
        """The account's send rate, and the channel's chat interval if it sets one."""
        return self.paced(f"{self.kind}:{self.setting('account_id')}", str(chat_id),
                          float(self.setting("chat_interval") or 0))


class InstagramTransport(MessengerTransport):
    max_units = 1000
    max_bytes = 1000  # "1000 bytes" of UTF-8 a text
