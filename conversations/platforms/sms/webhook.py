"""Twilio's requests: the incoming-message webhook, /webhooks/sms/<slug>/, and the status
callback each reply names, /webhooks/sms/<slug>/status/ (conversations.platforms.inbound
drives the steps).

Both are form posts signed as Twilio documents: X-Twilio-Signature = base64 HMAC-SHA1,
keyed by the account's Auth Token, of the exact URL Twilio requested followed by every
POST parameter (name and value, sorted by name) — checked with the `twilio` library's
RequestValidator. The URL is the channel's `public_base` and the path Django routes:
behind a proxy or a tunnel the address this process sees is not the one Twilio signed,
so it is never read from the request (docs/sms.md). Missing 401, wrong 403: nothing stored.

A message is admitted by its MessageSid (Twilio retries a webhook that failed; the dedup
makes a retry harmless); its files (MMS: NumMedia, MediaUrl0…) go with it, one Inbound
each after the first, as one album. An opt-out keyword (STOP and its kin, or Twilio's
OptOutType) starts no turn — Twilio confirms it to the person itself and refuses every
message to them after it (error 21610) — and marks the chat unreachable; START clears
the mark. A status callback (queued → sent → delivered, or undelivered / failed with an
ErrorCode) updates the ledger row that got that MessageSid (delivery.receipts).
The answer is empty TwiML: a text/plain body would be sent to the person as a reply.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlencode

from django.core.exceptions import TooManyFieldsSent
from django.http import HttpResponse, QueryDict
from django.urls import reverse
from twilio.request_validator import RequestValidator

from conversations.ingest import Inbound, MediaRef
from conversations.models import Channel
from conversations.platforms.inbound import Parsed, Received, Request, Webhook, missing, unconfigured, wrong
from conversations.platforms.webhooks import Answer, error
from delivery import receipts

SIGNATURE_HEADER = "X-Twilio-Signature"
MAX_MEDIA = 10  # Twilio's own limit on an MMS's files
# Twilio's default opt-out and opt-in keywords (matched alone, any case; Advanced Opt-Out
# names its own in OptOutType, which wins).
STOP_WORDS = frozenset({"STOP", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT", "OPTOUT", "REVOKE"})
START_WORDS = frozenset({"START", "UNSTOP"})
# Undelivered or failed after Twilio accepted the message: which ErrorCodes no resend can
# help (the number cannot take SMS, the person opted out, the carrier filters it); the
# rest (30003 handset unreachable, 30008 unknown, a carrier's outage) are resent.
UNDELIVERABLE = {
    21610: "the person replied STOP (opted out)",
    30004: "message blocked (the person blocked the number, or their carrier did)",
    30005: "unknown destination handset (the number does not exist)",
    30006: "a landline or an unreachable carrier",
    30007: "filtered by the carrier as spam",
    30034: "the sending number is not registered for A2P 10DLC",
}
FAILED_STATUSES = ("undelivered", "failed")


class TwiML(Answer):
    """An answer in TwiML (text/xml): Twilio would send a text/plain body as an SMS."""

    def response(self) -> HttpResponse:
        return HttpResponse(str(self.body), status=self.status, content_type="text/xml")


EMPTY = TwiML(200, '<?xml version="1.0" encoding="UTF-8"?><Response></Response>')


@dataclass(frozen=True)
class OptOut:
    """The person sent an opt-out (`stop`) or opt-in (`start`) keyword."""

    chat_id: str
    kind: str
    word: str


@dataclass(frozen=True)
class Status:
    """A status callback: what became of a message we sent."""

    platform_message_id: str
    status: str
    error_code: int | None = None


def form(body: bytes) -> QueryDict:
    """The POST parameters (ValueError for more fields than Django takes: no Twilio request)."""
    try:
        return QueryDict(body, encoding="utf-8")
    except TooManyFieldsSent as exc:
        raise ValueError(str(exc)) from None


class Signed(Webhook):
    """What both of Twilio's URLs share: the signature over the exact public URL."""

    # Not the lean path: it answers a text body as text/plain, which Twilio would send to
    # the person as an SMS; this answer must go as TwiML (the Django view's `TwiML`).
    lean = False

    def public_url(self, channel: Channel, request: Request) -> str:
        """The URL Twilio signed: the channel's public origin and this route's path."""
        path = reverse(f"{self.kind}:{self.url_name}", kwargs={"slug": channel.slug})
        url = channel.setting("public_base").rstrip("/") + path
        return f"{url}?{urlencode(dict(request.query))}" if request.query else url

    def authenticate(self, channel: Channel, request: Request) -> Answer | None:
        token = channel.setting("auth_token")
        if not token or not channel.setting("public_base"):
            return unconfigured("auth token and public base URL", "--token --public-base")
        supplied = request.header(SIGNATURE_HEADER)
        if supplied is None:
            return missing(SIGNATURE_HEADER)
        if request.body is None:
            return error(413, "request body too large")
        try:
            params = form(request.body)
        except ValueError as exc:
            return error(400, f"not a Twilio form post: {exc}")
        valid = RequestValidator(token).validate(self.public_url(channel, request), params, supplied.strip())
        if not valid:
            return wrong(SIGNATURE_HEADER)
        if params.get("AccountSid") and params.get("AccountSid") != channel.setting("account_sid"):
            return error(403, "another Twilio account's request")
        return None


class SmsWebhook(Signed):
    def parse(self, channel: Channel, request: Request) -> Answer | Parsed:
        params = form(request.body or b"")
        sid, sender = params.get("MessageSid") or params.get("SmsMessageSid"), params.get("From")
        if not sid or not sender:
            return error(400, "not a Twilio message: MessageSid and From are required")
        text = params.get("Body") or ""
        word = text.strip().upper()
        said = (params.get("OptOutType") or "").upper()
        if said == "STOP" or (not said and word in STOP_WORDS):
            return Parsed([OptOut(sender, "stop", word)])
        items: list[object] = []
        if said == "START" or (not said and word in START_WORDS):
            items.append(OptOut(sender, "start", word))
            if word in START_WORDS:
                return Parsed(items)  # the keyword alone: Twilio confirms it to the person
        try:
            count = min(int(params.get("NumMedia") or 0), MAX_MEDIA)
        except ValueError:
            return error(400, "NumMedia is not a number")
        files = [media for index in range(count) if (media := _media(params, index)) is not None]
        album = sid if len(files) > 1 else ""
        base = Inbound(platform_message_id=sid, chat_id=sender, sender_id=sender, text=text, album_id=album,
                       media_type=files[0].kind if files else "", media=files[0] if files else None)
        items.append(base)
        items += [Inbound(platform_message_id=f"{sid}/{index}", chat_id=sender, sender_id=sender, album_id=album,
                          media_type=media.kind, media=media) for index, media in enumerate(files[1:], 1)]
        return Parsed(items)

    def apply(self, channel: Channel, item: object) -> object:
        if isinstance(item, OptOut):
            if item.kind == "stop":
                return receipts.chat_opted_out(channel, item.chat_id, f"the person sent {item.word or 'STOP'}")
            return receipts.chat_opted_in(channel, item.chat_id)
        return super().apply(channel, item)

    def answer(self, received: Received, results: list[object]) -> Answer:
        return EMPTY  # admitted, a duplicate, refused or an opt-out: Twilio needs nothing more


def _media(params: QueryDict, index: int) -> MediaRef | None:
    url = params.get(f"MediaUrl{index}") or ""
    if not url.startswith(("https://", "http://")):
        return None
    declared = params.get(f"MediaContentType{index}") or ""
    major = declared.split("/")[0]
    kind = {"image": "photo", "audio": "audio", "video": "video"}.get(major, "document")
    return MediaRef(key=url.rstrip("/").rsplit("/", 1)[-1], ref=url, kind=kind, declared_type=declared)


class StatusCallback(Signed):
    route = "<slug:slug>/status/"
    url_name = "status"

    def parse(self, channel: Channel, request: Request) -> Answer | Parsed:
        params = form(request.body or b"")
        sid = params.get("MessageSid") or params.get("SmsSid")
        status = params.get("MessageStatus") or params.get("SmsStatus")
        if not sid or not status:
            return error(400, "not a Twilio status callback: MessageSid and MessageStatus are required")
        code = params.get("ErrorCode") or ""
        return Parsed([Status(sid, status.lower(), int(code) if code.isascii() and code.isdigit() else None)])

    def apply(self, channel: Channel, item: object) -> object:
        if isinstance(item, Status):
            return apply_status(channel, item)
        return super().apply(channel, item)

    def answer(self, received: Received, results: list[object]) -> Answer:
        return EMPTY


def apply_status(channel: Channel, status: Status) -> str:
    """queued, sending, sent, delivered, read: the row is delivered already (Twilio took
    the message), nothing to change; undelivered or failed: the ledger takes it back —
    unreachable for the codes in UNDELIVERABLE, else resent labelled (delivery.receipts)."""
    if status.status not in FAILED_STATUSES:
        return receipts.NOTED
    known = UNDELIVERABLE.get(status.error_code or 0, "")
    said = f"{status.status}" + (f", error {status.error_code}" if status.error_code is not None else "")
    reason = " — ".join(filter(None, [known, said]))
    return receipts.failed_after_send(channel, receipts.Failure(status.platform_message_id, reason,
                                                                permanent=status.error_code in UNDELIVERABLE))
