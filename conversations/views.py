"""Inbound webhooks. Thin: validate, parse into our types, dispatch to `ingest.admit`."""

import hmac
import json
import logging
from dataclasses import dataclass

from django.core.exceptions import RequestDataTooBig
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

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
    return telegram_admitted(admit(*prepared)).response()


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
    an Inbound. Returns the Answer to give at once, or (channel, inbound) to admit.
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
    try:
        inbound = telegram_inbound.inbound_from_update(telegram_inbound.parse_update(data))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        return _error(400, f"not a valid Telegram update: {exc}")
    if inbound is None:
        # 200 so Telegram stops retrying an update we will never act on.
        return Answer(200, {"ok": True, "ignored": True})
    problem = refusal(inbound)
    if problem:
        # 200 so Telegram stops retrying an update no retry could store; audited.
        record_refusal(channel, inbound, problem, "webhook")
        return Answer(200, {"ok": True, "refused": problem})
    return channel, inbound


def telegram_admitted(admission):
    return Answer(200, {"ok": True, "duplicate": admission.duplicate})


def healthz(request):
    """Liveness for deploys and tests: the app answers and the database is reachable."""
    Channel.objects.exists()
    return JsonResponse({"ok": True})
