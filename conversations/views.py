"""Inbound webhooks. Thin: validate, parse into our types, dispatch to `ingest.admit`."""

import hmac
import json
import logging
from dataclasses import dataclass

from django.core.exceptions import RequestDataTooBig
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from conversations import edits
from conversations import telegram as telegram_inbound
from conversations.ingest import admit, record_refusal, refusal
from conversations.models import Channel, ChannelKind

log = logging.getLogger(__name__)
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"


@csrf_exempt
@require_POST
def telegram_webhook(request, slug):
    try:
        body = request.body
    except RequestDataTooBig:
        body = None  # answered 413, after the checks that come first
    prepared = telegram_prepare(slug, request.headers.get(SECRET_HEADER), body)
    if isinstance(prepared, Answer):
        return prepared.response()
    # Anything failing from here on is ours: a 500 makes Telegram retry, and the dedup
    # makes the retry safe.
    channel, item = prepared
    if isinstance(item, edits.Edit):
        return telegram_edited(edits.apply(channel, item)).response()
    return telegram_admitted(admit(channel, item)).response()


@dataclass(frozen=True)
class Answer:
    """A webhook's answer, the same from this view and the lean ASGI path
    (conversations/lean_ingest.py)."""

    status: int
    body: dict

    def response(self):
        return JsonResponse(self.body, status=self.status)


def _error(status, message):
    return Answer(status, {"ok": False, "error": message})


def telegram_prepare(slug, supplied_secret, body):
    """Everything before the admission: the channel, its secret, the update parsed into
    an Inbound (or an edits.Edit). Returns the Answer to give at once, or (channel,
    inbound) to admit, or (channel, edit) to apply.
    `body` is None when it was over the size limit."""
    channel = Channel.objects.active(slug, ChannelKind.TELEGRAM)
    if channel is None:
        return _error(404, f"no active Telegram channel '{slug}'")
    if not channel.webhook_secret:
        return _error(403, "this channel has no webhook secret configured; set one (addchannel --secret)")
    if supplied_secret is None:
        return _error(401, f"missing {SECRET_HEADER} header")
    if not hmac.compare_digest(supplied_secret.encode(), channel.webhook_secret.encode()):
        return _error(403, f"wrong {SECRET_HEADER}")
    if body is None:
        return _error(413, "request body too large")
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return _error(400, "body is not valid JSON")
    if isinstance(data, dict) and "callback_query" in data:  # a tap on a question's button
        from tools.confirmations import handle_telegram_callback

        return Answer(200, handle_telegram_callback(channel, data))
    try:
        inbound = telegram_inbound.item_from_update(telegram_inbound.parse_update(data))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        return _error(400, f"not a valid Telegram update: {exc}")
    if inbound is None:
        # 200 so Telegram stops retrying an update we will never act on.
        return Answer(200, {"ok": True, "ignored": True})
    problem = edits.refusal(inbound) if isinstance(inbound, edits.Edit) else refusal(inbound)
    if problem:
        # 200 so Telegram stops retrying an update no retry could store; audited.
        record_refusal(channel, inbound, problem, "webhook")
        return Answer(200, {"ok": True, "refused": problem})
    return channel, inbound


def telegram_admitted(admission):
    return Answer(200, {"ok": True, "duplicate": admission.duplicate})


def telegram_edited(result):
    """200 whatever the edit did (Telegram would resend it otherwise); an edit of a
    message we never received is audited and ignored."""
    if result.outcome == edits.UNKNOWN:
        return Answer(200, {"ok": True, "ignored": True, "edit": result.outcome})
    return Answer(200, {"ok": True, "duplicate": result.duplicate, "edit": result.outcome})


def healthz(request):
    """Liveness for deploys and tests: the app answers and the database is reachable."""
    Channel.objects.exists()
    return JsonResponse({"ok": True})
