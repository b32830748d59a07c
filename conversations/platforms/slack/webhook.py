"""Slack's request URLs: /webhooks/slack/<slug>/ (the Events API) and
/webhooks/slack/<slug>/interactivity/ (clicks on a question's buttons).

Every request is signed (inbound.signature_ok): no signature or timestamp header → 401;
a wrong signature, a timestamp more than 5 minutes from our clock (a replay), or a
channel without a signing secret → 403; nothing is stored before the check passes.
Then the body: over AGENTLOOP_MAX_BODY_BYTES → 413 (Django's limit), not an envelope →
400.

The Events API's `url_verification` is answered with its challenge; an `event_callback`
is admitted through the same ingest as any platform's (dedup, windows, double texting,
control commands) and answered 200 once its transaction committed — Slack redelivers
anything it got no 2xx for within 3 s, and the redelivery (`X-Slack-Retry-Num`) stops
at the dedup. What we do not act on (bots, our own messages, other subtypes, channel
messages that do not mention the app) is answered 200 too, so Slack stops sending it.
A failure of ours answers 500 (a database outage 503, the middleware): Slack's retry is
the recovery.
"""

import json
import logging
import time
from urllib.parse import parse_qs

from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from conversations import edits
from conversations.ingest import Unstorable, admit, record_refusal
from conversations.models import Channel
from conversations.platforms.slack import inbound as parsing
from conversations.platforms.slack.buttons import clicked
from conversations.platforms.webhooks import Answer, error

KIND = "slack"
log = logging.getLogger(__name__)


def _request(request, slug):
    """(channel, body, answer): the answer is set when the request stops here."""
    channel = Channel.objects.active(slug, KIND)
    if channel is None:
        return None, None, error(404, f"no active Slack channel '{slug}'")
    try:
        body = request.body
    except RequestDataTooBig:
        body = None  # answered 413, after the checks that come first
    headers = request.headers
    answer = check(channel, headers.get(parsing.SIGNATURE_HEADER), headers.get(parsing.TIMESTAMP_HEADER), body)
    return channel, body, answer


def check(channel, signature, timestamp, body, now=None) -> Answer | None:
    """None when the request is Slack's, signed with the channel's secret, and fresh;
    else the refusal. `now`: our clock (seconds since the epoch)."""
    secret = channel.setting("signing_secret")
    if not secret:
        return error(403, "this channel has no signing secret configured; set one (addchannel --signing-secret)")
    if signature is None or timestamp is None:
        return error(401, f"missing {parsing.SIGNATURE_HEADER} or {parsing.TIMESTAMP_HEADER} header")
    if body is None:
        return error(413, "request body too large")
    if not parsing.fresh(timestamp, time.time() if now is None else now):
        return error(403, f"stale {parsing.TIMESTAMP_HEADER}: more than 5 minutes from our clock")
    if not parsing.signature_ok(secret, timestamp, body, signature):
        return error(403, f"wrong {parsing.SIGNATURE_HEADER}")
    return None


@csrf_exempt
@require_POST
def events(request, slug):
    channel, body, refused = _request(request, slug)
    if refused is not None:
        return refused.response()
    return receive(channel, body, request.headers.get("X-Slack-Retry-Num")).response()


def receive(channel, body, retry_num=None) -> Answer:
    """An Events API request that passed the checks."""
    try:
        envelope = json.loads(body)
        if not isinstance(envelope, dict):
            raise ValueError("not an object")
        if envelope.get("type") == "url_verification":
            return Answer(200, {"challenge": str(envelope.get("challenge", ""))})
        if envelope.get("type") != "event_callback":
            return Answer(200, {"ok": True, "ignored": [f"type:{envelope.get('type')}"]})
        parsed = parsing.parse(envelope, conversations=channel.setting("conversations"),
                               channel_messages=channel.setting("channel_messages"))
    except (ValueError, UnicodeDecodeError, TypeError, AttributeError) as exc:
        return error(400, f"not a Slack Events API envelope: {exc}")
    tally = {"admitted": 0, "duplicates": 0, "refused": 0, "edits": 0, "ignored": parsed.ignored}
    for message in parsed.messages:
        try:
            admission = admit(channel, message)
        except Unstorable as exc:
            # Slack would resend it: refused alone and audited, the rest go on.
            record_refusal(channel, message, str(exc), "slack events")
            tally["refused"] += 1
            continue
        tally["duplicates" if admission.duplicate else "admitted"] += 1
    for edit in parsed.edits:
        if edits.apply_or_refuse(channel, edit, "slack events") is not None:
            tally["edits"] += 1
    if retry_num is not None:
        tally["retry"] = str(retry_num)[:8]
    return Answer(200, {"ok": True, **tally})


@csrf_exempt
@require_POST
def interactivity(request, slug):
    """A click on a question's buttons (`block_actions`), form-encoded as `payload=<JSON>`."""
    channel, body, refused = _request(request, slug)
    if refused is not None:
        return refused.response()
    try:
        payload = json.loads(parse_qs(body.decode(), strict_parsing=False).get("payload", [""])[0])
        if not isinstance(payload, dict):
            raise ValueError("not an object")
    except (ValueError, UnicodeDecodeError) as exc:
        return error(400, f"not a Slack interaction payload: {exc}").response()
    if payload.get("type") != "block_actions":
        return HttpResponse(status=200)  # shortcuts, view submissions: nothing of ours
    status = clicked(channel, payload)
    return Answer(200, {"ok": True, "callback": status}).response()
