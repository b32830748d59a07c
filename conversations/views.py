"""Inbound webhooks. Thin: validate, parse into our types, dispatch to `ingest.admit`."""

import hmac
import json
import logging

from django.core.exceptions import RequestDataTooBig
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from conversations import telegram as telegram_inbound
from conversations.ingest import Unstorable, admit, record_refusal
from conversations.models import Channel, ChannelKind

log = logging.getLogger(__name__)
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"


def _error(status, message):
    return JsonResponse({"ok": False, "error": message}, status=status)


@csrf_exempt
@require_POST
def telegram_webhook(request, slug):
    channel = Channel.objects.active(slug, ChannelKind.TELEGRAM)
    if channel is None:
        return _error(404, f"no active Telegram channel '{slug}'")
    supplied = request.headers.get(SECRET_HEADER)
    if not channel.webhook_secret:
        return _error(403, "this channel has no webhook secret configured; set one (addchannel --secret)")
    if supplied is None:
        return _error(401, f"missing {SECRET_HEADER} header")
    if not hmac.compare_digest(supplied.encode(), channel.webhook_secret.encode()):
        return _error(403, f"wrong {SECRET_HEADER}")
    try:
        data = json.loads(request.body)
    except RequestDataTooBig:
        return _error(413, "request body too large")
    except (ValueError, UnicodeDecodeError):
        return _error(400, "body is not valid JSON")
    try:
        inbound = telegram_inbound.inbound_from_update(telegram_inbound.parse_update(data))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        return _error(400, f"not a valid Telegram update: {exc}")
    if inbound is None:
        # 200 so Telegram stops retrying an update we will never act on.
        return JsonResponse({"ok": True, "ignored": True})
    try:
        # Anything failing from here on is ours: a 500 makes Telegram retry, and the
        # dedup makes the retry safe.
        admission = admit(channel, inbound)
    except Unstorable as exc:
        # 200 so Telegram stops retrying an update no retry could store; audited.
        record_refusal(channel, inbound, str(exc), "webhook")
        return JsonResponse({"ok": True, "refused": str(exc)})
    return JsonResponse({"ok": True, "duplicate": admission.duplicate})


def healthz(request):
    """Liveness for deploys and tests: the app answers and the database is reachable."""
    Channel.objects.exists()
    return JsonResponse({"ok": True})
