"""Sending to WhatsApp: POST {api_base}/{api_version}/{phone_number_id}/messages with
`Authorization: Bearer <token>`, one overall deadline per call (Transport.exchange).

Outcomes, from the Graph error `code` (conversations.platforms.meta: the rate limits,
the dead token and Meta's own failures every Graph API shares), with WhatsApp's own:

| code | meaning | outcome |
|---|---|---|
| 131047 | outside the 24-hour customer service window | permanent: the user must write first |
| 132000, 132001, 132005, 132007, 132012, 132015, 132016, 132018 | a template refused (parameters, name, language, paused…) | permanent; the chat is not marked unreachable |
| 131026, 131051, 131021 | undeliverable, unsupported, recipient is the sender | permanent |

No answer after the request went out (the deadline, a dropped connection): ambiguous.
The request never went out (no connection could be had or made): not sent — resent
unlabelled, no attempt spent.
"""

import asyncio

import httpx
from django.conf import settings

from conversations.platforms import meta
from delivery import attachments, chunks
from delivery.models import Outcome
from delivery.pacing import Pace
from delivery.transports import SendResult, Target, Transport

MAX_UNITS = 4096  # a text message's body (characters; UTF-16 units never undercount them)
# WhatsApp's throughput errors carry no Retry-After. Its pair limit (131056) lets a
# business write one user about once every 6 s, and its throughput limit (130429) is per
# second; Meta's minute (meta.FLOOD_BACKOFF) clears both with room to spare.
FLOOD_BACKOFF = meta.FLOOD_BACKOFF
IMAGE_TYPES = ("image/jpeg", "image/png")  # what WhatsApp shows as an image; the rest go as documents
IMAGE_MAX_BYTES = 5 * 1024 * 1024
TOKEN_DEAD_CODES = meta.TOKEN_DEAD_CODES
UNREACHABLE = {
    131047: "outside WhatsApp's 24-hour customer service window: the user must write first "
            "(only an approved template reaches them; scheduled messages use the channel's)",
    131026: "message undeliverable (the number is not on WhatsApp, or cannot receive it)",
    131051: "unsupported message type",
    131021: "the recipient is the sender's own number",
}


# A template the Graph API refused: what to fix, said in the operator's terms. Never
# retried (the same request fails the same way), and the chat is not marked unreachable:
# the message was refused, not the user.
TEMPLATE_ERRORS = {
    132000: "the template's parameter count differs from what was sent (its body's {{n}} against the fill: "
            "'text' sends one, 'lines' one per line)",
    132001: "no such approved template in that language (check its name and language code in WhatsApp Manager)",
    132005: "the template filled with this text is too long",
    132007: "the template's text breaks WhatsApp's format rules",
    132012: "a template parameter is not in the format the template expects",
    132015: "the template is paused (low quality)",
    132016: "the template is disabled",
    132018: "a template parameter was refused (new lines, tabs or more than 4 spaces in a row)",
}


REFUSED = {code: f"template refused: {why}" for code, why in TEMPLATE_ERRORS.items()}


class GraphAnswer(Exception):
    """A typing call refused (raised: the typing loop logs it once per fault)."""

    def __init__(self, text, retry_after=None):
        super().__init__(text)
        self.retry_after = retry_after


def deadline() -> float:
    """Each call's whole deadline: the one every outbound HTTP call of a channel uses."""
    return settings.AGENTLOOP_CALLBACK_TIMEOUT


class WhatsAppTransport(Transport):
    supports_typing = True
    # The indicator shows until our reply or for 25 s: refreshed well before it lapses.
    typing_refresh = 20.0
    max_units = MAX_UNITS
    caption_units = 1024  # an image's or a document's caption

    def setting(self, name):
        return self.channel.setting(name)

    def endpoint(self) -> str:
        base = self.setting("api_base").rstrip("/")
        return f"{base}/{self.setting('api_version')}/{self.setting('phone_number_id')}/messages"

    async def send_text(self, target: Target, text: str) -> SendResult:
        if not self.setting("token") or not self.setting("phone_number_id"):
            return self.failed(Outcome.TEMPORARY, "refused: the channel has no token or phone number id")
        last_id = ""
        context = target.reply_target
        # The ledger sends a long reply chunk by chunk (delivery.chunks); this split only
        # guards a text that reaches the transport whole.
        for chunk in chunks.split(text, MAX_UNITS):
            body = {"messaging_product": "whatsapp", "recipient_type": "individual", "to": target.chat_id,
                    "type": "text", "text": {"preview_url": False, "body": chunk}}
            if context:
                body["context"] = {"message_id": context}  # shown as a reply to the user's message
            result = await self._post(body)
            if not isinstance(result, str):
                return result
            last_id, context = result, ""  # only the first chunk threads to the user's message
        return SendResult.delivered(last_id)

    async def send_template(self, target: Target, template: dict) -> SendResult:
        """An approved template (delivery.templates: name, language, the body's text
        parameters), the only message WhatsApp takes outside the 24-hour window."""
        if not self.setting("token") or not self.setting("phone_number_id"):
            return self.failed(Outcome.TEMPORARY, "refused: the channel has no token or phone number id")
        content = {"name": template["name"], "language": {"code": template["language"]}}
        values = template.get("parameters") or []
        if values:
            content["components"] = [{"type": "body",
                                      "parameters": [{"type": "text", "text": value} for value in values]}]
        body = {"messaging_product": "whatsapp", "recipient_type": "individual", "to": target.chat_id,
                "type": "template", "template": content}
        result = await self._post(body)
        return SendResult.delivered(result) if isinstance(result, str) else result

    async def send_files(self, target: Target, files: list, caption: str) -> SendResult:
        """One file: uploaded (POST …/media), then sent as a message naming its media id —
        an image (JPEG or PNG up to 5 MB) shown as one, anything else as a document. The
        upload alone shows the user nothing: if it fails or never answers, no message
        has left (not sent: resent unlabelled); only the message's own send can be
        ambiguous."""
        item = files[0]
        try:
            data = await asyncio.to_thread(attachments.read, item.file)
        except OSError as exc:
            return self.failed(Outcome.TEMPORARY, f"the file could not be read from storage: {type(exc).__name__}")
        media_id = await self._upload(item, data)
        if isinstance(media_id, SendResult):
            return media_id
        kind = "image" if item.type in IMAGE_TYPES and item.size <= IMAGE_MAX_BYTES else "document"
        media = {"id": media_id, **({"caption": caption} if caption else {}),
                 **({"filename": item.name} if kind == "document" else {})}
        body = {"messaging_product": "whatsapp", "recipient_type": "individual", "to": target.chat_id,
                "type": kind, kind: media}
        if target.reply_target:
            body["context"] = {"message_id": target.reply_target}
        result = await self._post(body)
        return SendResult.delivered(result) if isinstance(result, str) else result

    async def _upload(self, item, data) -> str | SendResult:
        """The uploaded file's media id, or the failed SendResult (never ambiguous)."""
        limit = deadline()
        url = self.endpoint().rsplit("/", 1)[0] + "/media"
        upload = ("file", (item.name, data, item.type or "application/octet-stream"))

        async def call(extensions):
            response = await graph_client().post(
                url, data={"messaging_product": "whatsapp", "type": item.type}, files=[upload], timeout=limit,
                extensions=extensions, headers={"Authorization": f"Bearer {self.setting('token')}"})
            try:
                return response.status_code, response.json()
            except ValueError:
                return response.status_code, None

        exchanged = await self.exchange(call, url.split("/")[2], limit)
        if isinstance(exchanged, SendResult):
            return self.failed(Outcome.NOT_SENT, f"the upload failed, no message sent: {exchanged.error}")
        status, answer = exchanged
        if 200 <= status < 300 and isinstance(answer, dict) and answer.get("id"):
            return str(answer["id"])
        if status < 300:
            return self.failed(Outcome.NOT_SENT, f"the upload answered HTTP {status} without a media id")
        return self.outcome(status, answer)

    async def _post(self, body) -> str | SendResult:
        """The wamid of a sent message, or the failed SendResult."""
        limit = deadline()
        exchanged = await self.exchange(lambda extensions: self._call(body, limit, extensions),
                                        self.endpoint().split("/")[2], limit)
        if isinstance(exchanged, SendResult):
            return exchanged
        status, answer = exchanged
        if 200 <= status < 300:
            wamid = _wamid(answer)
            if wamid:
                return wamid
            return self.failed(Outcome.AMBIGUOUS, f"HTTP {status} without a message id: it may have been sent")
        return self.outcome(status, answer)

    def outcome(self, status, answer, headers=None) -> SendResult:
        """A refusal's outcome, from its Graph error code (see the module's table)."""
        return meta.outcome(self.failed, meta.fault_of(status, answer, headers), UNREACHABLE, REFUSED)

    async def _call(self, body, limit, extensions=None):
        response = await graph_client().post(self.endpoint(), json=body, timeout=limit, extensions=extensions,
                                             headers={"Authorization": f"Bearer {self.setting('token')}"})
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, None

    def pace(self, chat_id: str) -> Pace | None:
        """The business number's throughput, and the channel's chat interval if it sets one."""
        return self.paced(f"whatsapp:{self.setting('phone_number_id')}", str(chat_id),
                          float(self.setting("chat_interval") or 0))

    # --- status reactions (conversations/worker/reactions.py) ---------------------------------
    status_reactions = ("👀", "✅")

    async def set_reaction(self, target: Target, message_id: str, emoji: str, previous: str = "") -> None:
        """A `reaction` message: one per sender and message, so a new emoji replaces ours and
        "" takes it away. A message of its own (inside the 24 h window, like any)."""
        body = {"messaging_product": "whatsapp", "recipient_type": "individual", "to": target.chat_id,
                "type": "reaction", "reaction": {"message_id": message_id, "emoji": emoji}}
        sent = await self._post(body)
        if isinstance(sent, SendResult):
            raise GraphAnswer(sent.error, sent.retry_after if sent.outcome == Outcome.FLOOD else None)


    async def send_typing(self, target: Target) -> None:
        """WhatsApp shows "typing…" against the user's last message (marking it read):
        the target names it (the turn's, or the open window's last message)."""
        wamid = target.reply_target
        if not wamid or not self.setting("token"):
            return  # nothing to show it against
        body = {"messaging_product": "whatsapp", "status": "read", "message_id": wamid,
                "typing_indicator": {"type": "text"}}
        limit = deadline()
        status, answer = await asyncio.wait_for(self._call(body, limit), limit)
        if status >= 300:
            result = self.outcome(status, answer)
            raise GraphAnswer(result.error, result.retry_after if result.outcome == Outcome.FLOOD else None)


def graph_client() -> httpx.AsyncClient:
    return meta.client()  # one httpx client per event loop, shared with Meta's other platforms


async def close_clients() -> None:
    await meta.close_clients()


def _wamid(answer) -> str:
    try:
        return str(answer["messages"][0]["id"])
    except (KeyError, IndexError, TypeError):
        return ""
