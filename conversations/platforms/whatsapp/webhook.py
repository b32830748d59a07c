"""WhatsApp's webhook, /webhooks/whatsapp/<slug>/ (conversations.platforms.inbound drives
the steps).

GET is Meta's verification handshake and POST a notification signed with
X-Hub-Signature-256, both checked as for every Meta platform (conversations.platforms.meta:
missing 401, wrong 403, nothing stored). Every
message in it is admitted through the same ingest as any platform's (dedup by its
wamid, windows, double texting, control commands); every status updates the ledger row
our send got that wamid for (delivery.receipts). Meta retries anything but a 2xx, for
days, and may deliver a notification twice or out of order: the dedup and the receipts'
compare-and-swap make both harmless, so a failure of ours answers 500 and the retry is
the recovery. A message no retry could store is refused alone and audited; the rest go on.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from conversations.platforms import meta
from conversations.platforms.inbound import Parsed, Received, Request, Webhook
from conversations.platforms.webhooks import Answer, error
from conversations.platforms.whatsapp import inbound as parsing
from conversations.platforms.whatsapp.transport import UNREACHABLE
from delivery import receipts

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Channel


class WhatsAppWebhook(Webhook):
    methods = ("GET", "POST")

    def handshake(self, channel: Channel, request: Request) -> Answer:
        """Meta's verification of the webhook's address: the challenge echoed as text."""
        return meta.handshake(channel.setting("verify_token"), request.query)

    def authenticate(self, channel: Channel, request: Request) -> Answer | None:
        return meta.verify_signature(request, channel.setting("app_secret"))

    def parse(self, channel: Channel, request: Request) -> Answer | Parsed:
        """A notification's messages, then its reactions, then its delivery receipts."""
        try:
            notification = parsing.parse(json.loads(request.body or b""), channel.setting("phone_number_id"))
        except (ValueError, UnicodeDecodeError, TypeError, AttributeError) as exc:
            return error(400, f"not a WhatsApp notification: {exc}")
        return Parsed([*notification.messages, *notification.reactions, *notification.receipts],
                      ignored=notification.ignored)

    def apply(self, channel: Channel, item: object) -> object:
        if isinstance(item, parsing.Receipt):
            return apply_receipt(channel, item)
        return super().apply(channel, item)

    def answer(self, received: Received, results: list[object]) -> Answer:
        """What became of the notification's items, counted."""
        return meta.counted(received.parsed.ignored, results, str)


def apply_receipt(channel: Channel, receipt: parsing.Receipt) -> str:
    """sent, delivered, read: the row is delivered already, nothing to change (not even
    a read); failed: the ledger takes the row back (delivery.receipts)."""
    if receipt.status != "failed":
        return receipts.NOTED
    known = UNREACHABLE.get(receipt.error_code, "") if receipt.error_code is not None else ""
    permanent = receipt.error_code in UNREACHABLE
    reason = " — ".join(filter(None, [known, receipt.error])) or "failed"
    return receipts.failed_after_send(channel, receipts.Failure(receipt.platform_message_id, reason, permanent))
