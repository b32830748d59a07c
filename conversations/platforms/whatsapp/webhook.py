"""WhatsApp's webhook, /webhooks/whatsapp/<slug>/.

GET is Meta's verification handshake: hub.mode=subscribe and our verify token (compared
in constant time) → the hub.challenge echoed as text; anything else 403.

POST is a notification, signed: X-Hub-Signature-256 = sha256=HMAC-SHA256(raw body, app
secret), compared in constant time (missing 401, wrong 403: nothing is stored). Every
message in it is admitted through the same ingest as any platform's (dedup by its
wamid, windows, double texting, control commands); every status updates the ledger row
our send got that wamid for (delivery.receipts). Meta retries anything but a 2xx, for
days, and may deliver a notification twice or out of order: the dedup and the receipts'
compare-and-swap make both harmless, so a failure of ours answers 500 and the retry is
the recovery.
"""

import hmac
import json

from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from conversations import reactions
from conversations.ingest import Unstorable, admit, record_refusal
from conversations.models import Channel
from conversations.platforms.webhooks import Answer, error
from conversations.platforms.whatsapp import inbound as parsing
from conversations.platforms.whatsapp.transport import UNREACHABLE
from delivery import receipts

KIND = "whatsapp"


@csrf_exempt
@require_http_methods(["GET", "POST"])
def webhook(request, slug):
    channel = Channel.objects.active(slug, KIND)
    if channel is None:
        return error(404, f"no active WhatsApp channel '{slug}'").response()
    if request.method == "GET":
        return verify(channel, request.GET)
    try:
        body = request.body
    except RequestDataTooBig:
        body = None  # answered 413, after the checks that come first
    answer = receive(channel, request.headers.get(parsing.SIGNATURE_HEADER), body)
    return answer.response()


def verify(channel, query):
    expected = channel.setting("verify_token")
    supplied = query.get("hub.verify_token", "")
    if (expected and query.get("hub.mode") == "subscribe"
            and hmac.compare_digest(supplied.encode(), expected.encode())):
        return HttpResponse(query.get("hub.challenge", ""), content_type="text/plain")
    return HttpResponse("verification refused", status=403, content_type="text/plain")


def receive(channel, supplied_signature, body) -> Answer:
    """A notification's answer; `body` is None when it was over the size limit."""
    app_secret = channel.setting("app_secret")
    if not app_secret:
        return error(403, "this channel has no app secret configured; set one (addchannel --app-secret)")
    if supplied_signature is None:
        return error(401, f"missing {parsing.SIGNATURE_HEADER} header")
    if body is None:
        return error(413, "request body too large")
    if not parsing.signature_ok(app_secret, body, supplied_signature):
        return error(403, f"wrong {parsing.SIGNATURE_HEADER}")
    try:
        notification = parsing.parse(json.loads(body), channel.setting("phone_number_id"))
    except (ValueError, UnicodeDecodeError, TypeError, AttributeError) as exc:
        return error(400, f"not a WhatsApp notification: {exc}")
    tally = {"admitted": 0, "duplicates": 0, "refused": 0, "ignored": notification.ignored}
    for message in notification.messages:
        try:
            admission = admit(channel, message)
        except Unstorable as exc:
            # Meta would resend it for days: refused alone and audited, the rest go on.
            record_refusal(channel, message, str(exc), "webhook")
            tally["refused"] += 1
            continue
        tally["duplicates" if admission.duplicate else "admitted"] += 1
    for reaction in notification.reactions:  # a note for the next turn, or a question answered
        result = reactions.apply(channel, reaction)
        counted = "ignored" if result.outcome == reactions.IGNORED else "reactions"  # not on a message of ours
        tally[counted] = tally.get(counted, 0) + (not result.duplicate)
    for receipt in notification.receipts:
        outcome = apply_receipt(channel, receipt)
        tally[outcome] = tally.get(outcome, 0) + 1
    return Answer(200, {"ok": True, **tally})


def apply_receipt(channel, receipt: parsing.Receipt) -> str:
    """sent, delivered, read: the row is delivered already, nothing to change (not even
    a read); failed: the ledger takes the row back (delivery.receipts)."""
    if receipt.status != "failed":
        return receipts.NOTED
    permanent = receipt.error_code in UNREACHABLE
    reason = " — ".join(filter(None, [UNREACHABLE.get(receipt.error_code, ""), receipt.error])) or "failed"
    return receipts.failed_after_send(channel, receipts.Failure(receipt.platform_message_id, reason, permanent))
