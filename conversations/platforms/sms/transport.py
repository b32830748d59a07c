"""Sending SMS through Twilio's Messages API with the `twilio` library:
`Client(account_sid, auth_token).messages.create_async(to, from_, body, status_callback)`,
POST {api_base}/2010-04-01/Accounts/{AccountSid}/Messages.json with HTTP basic auth.

The library's async client is its aiohttp session; ours is given instead through its own
extension point (`http_client`: a twilio.http.AsyncHttpClient, here `HttpxTwilio`) so a
send runs on the worker's shared httpx client under one overall deadline
(Transport.exchange: not sent told from ambiguous by whether the request went out), and
the API's root is the channel's `api_base` (the library's `client.api.base_url`, the
domain every Messages call is built on): Twilio's in production, the tests' local fake.

A reply's files go as one MMS: their signed links on the channel's public base as
MediaUrls (Twilio fetches them), the caption as the body.

Each reply names a StatusCallback (the channel's public base and
/webhooks/sms/<slug>/status/): Twilio reports queued → sent → delivered, or undelivered
/ failed, and the ledger row is taken back on the last two (webhook.apply_status).

Outcomes, from Twilio's error `code` (the HTTP status where the code says nothing):

| code | meaning | outcome |
|---|---|---|
| 20429, HTTP 429 | too many requests | flood: resent after Retry-After (else FLOOD_BACKOFF) |
| 21610 | the person replied STOP | permanent: the chat is unreachable |
| 21211, 21214, 21408, 21612, 21614, 21608 | the number cannot be sent to | permanent |
| 21617 | the body is over 1,600 characters | permanent; the chat is not marked unreachable |
| 20003, 21212, 21606, 21659, 20404 | the credentials or the From number refused | channel blocked |
| HTTP 5xx, 408 | Twilio's side | temporary |
| other 4xx | this request refused | permanent ("rejected: …") |
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import httpx
from django.conf import settings
from django.urls import reverse
from twilio.base.exceptions import TwilioException, TwilioRestException, TwilioServiceException
from twilio.http import AsyncHttpClient
from twilio.http.response import Response
from twilio.rest import Client

from conversations.media import links
from conversations.platforms.sms import segments
from delivery.attachments import OutboundFile
from delivery.models import Outcome
from delivery.pacing import Pace
from delivery.retry_after import retry_after_header
from delivery.transports import LoopClients, SendResult, Target, Transport

log = logging.getLogger(__name__)

MAX_UNITS = 1600  # Twilio's limit on one message's body; it cuts it into segments itself
MAX_MEDIA = 10  # MediaUrls in one message
MMS_MAX_BYTES = 5 * 1024 * 1024  # an MMS's files in all (carriers refuse more: error 30019)
FLOOD_BACKOFF = 5.0  # a 429 without Retry-After
FLOOD_CODES = {20429}
OPTED_OUT = 21610
UNREACHABLE = {
    OPTED_OUT: "the person replied STOP: Twilio sends them nothing until they reply START",
    21211: "not a valid phone number",
    21214: "the number cannot be reached",
    21408: "sending to this number's region is not enabled (Messaging Geographic Permissions)",
    21612: "Twilio cannot route to this number",
    21614: "not a mobile number",
    21608: "a trial account sends only to verified numbers",
}
TOO_LONG = 21617
CREDENTIALS_REFUSED = {
    20003: "the Account SID or Auth Token was refused",
    20404: "the account or the Messaging Service was not found",
    21212: "the From number is not valid",
    21606: "the From number is not an SMS-capable number of this account",
    21659: "the From number is not a Twilio number of this account",
}


def deadline() -> float:
    return float(settings.AGENTLOOP_CALLBACK_TIMEOUT)


class HttpxTwilio(AsyncHttpClient):  # type: ignore[misc]  # twilio ships no types
    """twilio's async HTTP client interface on the worker's shared httpx client: one
    request, its trace given to Transport.exchange, its answer's headers kept (a 429's
    Retry-After, which the library's exception does not carry)."""

    def __init__(self, client: httpx.AsyncClient, extensions: dict[str, Any], limit: float) -> None:
        super().__init__(log, True, limit)
        self.client, self.extensions = client, extensions
        self.headers: Mapping[str, str] = {}

    async def request(self, method: str, uri: str, params: dict[str, object] | None = None,
                      data: dict[str, object] | None = None, headers: dict[str, str] | None = None,
                      auth: tuple[str, str] | None = None, timeout: float | None = None,
                      allow_redirects: bool = False) -> Response:
        response = await self.client.request(method, uri, params=params, data=data, headers=headers,  # type: ignore[arg-type]
                                             auth=auth, timeout=timeout or self.timeout,
                                             follow_redirects=allow_redirects, extensions=self.extensions)
        self.headers = response.headers
        return Response(response.status_code, response.text, response.headers)


class SmsTransport(Transport):
    max_units = MAX_UNITS
    max_album = MAX_MEDIA
    caption_units = MAX_UNITS

    def setting(self, name: str) -> str:
        return str(self.channel.setting(name) or "")

    def client(self, http: HttpxTwilio) -> Client:
        client = Client(self.setting("account_sid"), self.setting("auth_token"), http_client=http)
        client.api.base_url = self.setting("api_base").rstrip("/")
        return client

    def status_callback(self) -> str | None:
        base = self.setting("public_base")
        if not base:
            return None
        return base.rstrip("/") + reverse(f"{self.channel.kind}:status", kwargs={"slug": self.channel.slug})

    async def send_text(self, target: Target, text: str) -> SendResult:
        cost = segments.count(text)  # what Twilio bills (docs/sms.md): logged, the person's number not
        log.debug("sms reply: %s, %d unit(s), %d segment(s)", cost.encoding, cost.units, cost.segments)
        return await self._create(target, {"body": text})

    async def send_files(self, target: Target, files: list[OutboundFile], caption: str) -> SendResult:
        """An MMS: each file's signed link on this product's public address
        (conversations.media.links: it lasts AGENTLOOP_MEDIA_URL_TTL) as a MediaUrl, which
        Twilio fetches, the caption as the body. Over MMS_MAX_BYTES in all, or without a
        public address, the files are named in the text instead."""
        base = self.setting("public_base").rstrip("/")
        if not base or sum(item.size for item in files) > MMS_MAX_BYTES:
            return await super().send_files(target, files, caption)
        urls = [base + links.path_for_outbound(item.file, item.type, item.name) for item in files]
        return await self._create(target, {"media_url": urls, **({"body": caption} if caption.strip() else {})})

    async def _create(self, target: Target, content: dict[str, Any]) -> SendResult:
        if not (self.setting("account_sid") and self.setting("auth_token") and self.setting("from_number")):
            return self.failed(Outcome.TEMPORARY, "refused: the channel has no account SID, auth token or From")
        sender = self.setting("from_number")
        fields: dict[str, Any] = {"to": target.chat_id, "status_callback": self.status_callback(), **content}
        fields.update({"messaging_service_sid": sender} if sender.startswith("MG") else {"from_": sender})
        limit = deadline()
        http: list[HttpxTwilio] = []

        async def create(extensions: dict[str, Any]) -> Any:
            http.append(HttpxTwilio(sms_client(), extensions, limit))
            return await self.client(http[-1]).messages.create_async(**fields)

        try:
            sent = await self.exchange(create, self.setting("api_base").split("/")[2], limit)
        except TwilioRestException as exc:
            return self.outcome(exc.status, exc.code, exc.msg, http[-1].headers if http else {})
        except TwilioServiceException as exc:
            return self.outcome(exc.status, exc.code, exc.detail or exc.title, http[-1].headers if http else {})
        except (TwilioException, ValueError) as exc:  # an answer the library could not read
            return self.failed(Outcome.AMBIGUOUS, f"Twilio's answer could not be read: {type(exc).__name__}")
        if isinstance(sent, SendResult):
            return sent
        if not getattr(sent, "sid", None):
            return self.failed(Outcome.AMBIGUOUS, "Twilio answered without a message SID: it may have been sent")
        return SendResult.delivered(sent.sid)

    def outcome(self, status: int, code: int | None, message: object, headers: Mapping[str, str]) -> SendResult:
        """A refusal's outcome, from its Twilio error code (see the module's table)."""
        said = f"HTTP {status}" + (f", error {code}" if code is not None else "") + (f": {message}" if message else "")
        if code in FLOOD_CODES or status == 429:
            wait = retry_after_header(headers.get("retry-after"), FLOOD_BACKOFF)
            return self.failed(Outcome.FLOOD, f"rate limited, retried in {wait:g} s: {said}", wait)
        if code in UNREACHABLE:
            return self.failed(Outcome.PERMANENT, f"{UNREACHABLE[code]} — {said}")
        if code == TOO_LONG:
            return self.failed(Outcome.PERMANENT, f"the message is too long — {said}", chat_unreachable=False)
        if code in CREDENTIALS_REFUSED or status == 401:
            why = CREDENTIALS_REFUSED.get(code or 0, "the credentials were refused")
            return self.failed(Outcome.CHANNEL_BLOCKED, f"{why} (fix the channel's settings): {said}")
        if status >= 500 or status == 408:
            return self.failed(Outcome.TEMPORARY, said)
        return self.failed(Outcome.PERMANENT, f"rejected: {said}")

    def pace(self, chat_id: str) -> Pace | None:
        """The sending number's throughput (a long code: 1 a second). One slot a message:
        Twilio counts segments, so a channel whose replies run to several sets its rate
        lower (docs/sms.md)."""
        return self.paced(f"sms:{self.setting('from_number')}", str(chat_id),
                          float(self.channel.setting("chat_interval") or 0))


_clients = LoopClients()  # one httpx client per event loop (delivery.transports)


def sms_client() -> httpx.AsyncClient:
    return _clients.get()


async def close_clients() -> None:
    await _clients.close()
