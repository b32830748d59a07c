"""Messenger's and Instagram's webhook, /webhooks/<kind>/<slug>/ (conversations.platforms.
inbound drives the steps).

GET is Meta's verification handshake, POST an event notification signed with
X-Hub-Signature-256: both checked as for every Meta platform (conversations.platforms.
meta: missing 401, wrong 403, nothing stored). Every message is admitted through the same
ingest as any platform's (dedup by its mid, windows, double texting, control commands);
a reaction on one of our replies is a note for the next turn. A quick reply (or a
postback) answering a question decides it (tools.confirmations: one compare-and-swap, so
a redelivered tap applies nothing twice); the outcome is written to the ledger, once,
by the tap that decided — Meta lets no Page edit a message it sent, so the question
cannot show it. Meta retries anything but a 2xx: a failure of ours answers 500, and the
retry, stopped at the dedup, is the recovery.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from django.db import transaction

from conversations.platforms import meta
from conversations.platforms.inbound import Parsed, Received, Request, Webhook
from conversations.platforms.messenger import events
from conversations.platforms.webhooks import Answer, error
from delivery import ledger
from delivery.models import OutboundKind
from tools.confirmations import CALLBACK_DATA, tap

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Channel

log = logging.getLogger(__name__)
DECIDED = ("confirmed", "rejected")  # a tap that decided its question (the others change nothing)


def is_answer(payload: str) -> bool:
    return bool(CALLBACK_DATA.match(payload))


class MessengerWebhook(Webhook):
    methods = ("GET", "POST")
    lean = True  # its POSTs may take the lean ASGI path (batched admission)

    def takes_lean(self, body: bytes | None) -> bool:
        # A quick reply or postback may answer a question, which runs the action
        # (tools.confirmations): Django's view takes it, off the lean path's admitter threads.
        return not (body and (b'"quick_reply"' in body or b'"postback"' in body))

    def handshake(self, channel: Channel, request: Request) -> Answer:
        return meta.handshake(channel.setting("verify_token"), request.query)

    def authenticate(self, channel: Channel, request: Request) -> Answer | None:
        return meta.verify_signature(request, channel.setting("app_secret"))

    def parse(self, channel: Channel, request: Request) -> Answer | Parsed:
        try:
            found = events.parse(json.loads(request.body or b""), self.kind, str(channel.setting("account_id")),
                                 is_answer)
        except (ValueError, UnicodeDecodeError, TypeError, AttributeError) as exc:
            return error(400, f"not a {self.label} webhook event: {exc}")
        return Parsed(list(found.items), ignored=found.ignored)

    def apply(self, channel: Channel, item: object) -> object:
        if isinstance(item, events.Tap):
            return answer_tap(channel, item)
        return super().apply(channel, item)

    def answer(self, received: Received, results: list[object]) -> Answer:
        """What became of the body's items, counted."""
        return meta.counted(received.parsed.ignored, results, lambda status: f"tap_{status}")


def answer_tap(channel: Channel, item: events.Tap) -> str:
    """A question's answer decided; its outcome told in the chat once, through the ledger."""
    reply, confirmation = tap(channel, item.data, sender_id=item.sender_id, chat_id=item.chat_id)
    log.info("channel %s: a quick reply answering a question: %s", channel.slug, reply.status)
    said = (reply.outcome or "").rsplit("\n\n", 1)[-1] or reply.toast  # "✅ Confirmed at 10:02: done."
    if confirmation is not None and reply.status in DECIDED and said:
        with transaction.atomic():
            ledger.enqueue(confirmation.conversation, said, kind=OutboundKind.NOTICE)
    return str(reply.status)
