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
at the dedup. What we do not act on (bots, our own messages, other subtypes) is
answered 200 too, so Slack stops sending it.
Channel messages that do not mention the app are stored like any other (the channel's
`group_replies` decides at the flush whether they are answered or kept as context).
A failure of ours answers 500 (a database outage 503, the middleware): Slack's retry is
the recovery.

`prepare`, `admitted` and `edited` are also the lean ASGI path's hooks
(SlackPlatform.lean_webhook, conversations/lean_ingest.py): under daphne an Events API
POST skips Django's request stack and is admitted in a batch, with these same answers.
"""

import json
import time
from urllib.parse import parse_qs

from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from conversations import deletions, edits, reactions
from conversations.ingest import Inbound, admit, record_refusal, refusal
from conversations.models import Channel, Conversation
from conversations.platforms.slack import inbound as parsing
from conversations.platforms.slack.buttons import clicked
from conversations.platforms.slack.names import PER_THREAD
from conversations.platforms.webhooks import Answer, error
from delivery.models import OutboundMessage

KIND = "slack"


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


def _checked(slug, headers, body):
    """(channel, refusal): the refusal is None when the request may go on."""
    channel = Channel.objects.active(slug, KIND)
    if channel is None:
        return None, error(404, f"no active Slack channel '{slug}'")
    signature, timestamp = headers.get(parsing.SIGNATURE_HEADER.lower()), headers.get(parsing.TIMESTAMP_HEADER.lower())
    return channel, check(channel, signature, timestamp, body)


def prepare(slug, headers, body):
    """Everything before the admission (shared by the view and the lean ASGI path,
    conversations/lean_ingest.py): the channel, the signature, the envelope parsed.
    Returns the Answer to give at once, or (channel, Inbound) to admit, or (channel,
    Edit or Deletion) to apply (`aside`). `headers`: lower-case names; `body` None when over the size limit."""
    channel, refused = _checked(slug, headers, body)
    if refused is not None:
        return refused
    try:
        envelope = json.loads(body)
        if not isinstance(envelope, dict):
            raise ValueError("not an object")
        if envelope.get("type") == "url_verification":
            return Answer(200, {"challenge": str(envelope.get("challenge", ""))})
        if envelope.get("type") != "event_callback":
            return Answer(200, {"ok": True, "admitted": 0, "ignored": [f"type:{envelope.get('type')}"]})
        parsed = parsing.parse(envelope, conversations=channel.setting("conversations"),
                               bot_in_thread=lambda slack_channel, thread_ts: bot_in_thread(
                                   channel, slack_channel, thread_ts))
    except (ValueError, UnicodeDecodeError, TypeError, AttributeError) as exc:
        return error(400, f"not a Slack Events API envelope: {exc}")
    found = parsed.messages + parsed.edits + parsed.deletions + parsed.reactions  # one event: one of them, or nothing
    if not found:
        return Answer(200, {"ok": True, "admitted": 0, "ignored": parsed.ignored})
    if isinstance(found[0], deletions.Deletion | reactions.Reaction):
        return channel, found[0]  # ids only: an unknown one is audited as such
    problem = edits.refusal(found[0]) if isinstance(found[0], edits.Edit) else refusal(found[0])
    if problem:
        # 200 so Slack stops resending what no retry could store; audited.
        record_refusal(channel, found[0], problem, "slack events")
        return Answer(200, {"ok": True, "admitted": 0, "refused": problem})
    return channel, found[0]


def bot_in_thread(channel, slack_channel, thread_ts) -> bool:
    """Whether the app has posted in this thread: a ledger row of this channel's
    conversations in that Slack channel went (or goes) into it. Through the
    conversations (their index on the chat) so only their few rows are read."""
    chats = [slack_channel, parsing.chat_of(slack_channel, thread_ts, thread_ts, PER_THREAD)]
    talks = Conversation.objects.filter(channel=channel, chat_id__in=chats).values("pk")
    return OutboundMessage.objects.filter(conversation_id__in=talks, thread_id=thread_ts).exists()


def admitted(admission) -> Answer:
    return Answer(200, {"ok": True, "admitted": int(not admission.duplicate), "duplicates": int(admission.duplicate)})


def edited(result) -> Answer:
    """200 whatever the edit did; an edit of a message we never received is audited and ignored."""
    return Answer(200, {"ok": True, "admitted": 0, "edits": 1, "edit": result.outcome, "duplicate": result.duplicate})


def deleted(result) -> Answer:
    """200 whatever the deletion did; one of a message we never received is audited and ignored."""
    return Answer(200, {"ok": True, "admitted": 0, "deletions": 1, "deletion": result.outcome,
                        "duplicate": result.duplicate})


def aside(channel, item) -> Answer:
    """What is not a new message: an edit, a deletion or a reaction, each its own transaction."""
    if isinstance(item, reactions.Reaction):
        result = reactions.apply(channel, item)
        return Answer(200, {"ok": True, "admitted": 0, "reaction": result.outcome, "duplicate": result.duplicate})
    if isinstance(item, deletions.Deletion):
        return deleted(deletions.apply(channel, item))
    return edited(edits.apply(channel, item))


@csrf_exempt
@require_POST
def events(request, slug):
    try:
        body = request.body
    except RequestDataTooBig:
        body = None  # answered 413, after the checks that come first
    prepared = prepare(slug, request.headers, body)
    if isinstance(prepared, Answer):
        return prepared.response()
    channel, item = prepared
    if not isinstance(item, Inbound):
        return aside(channel, item).response()
    return admitted(admit(channel, item)).response()


@csrf_exempt
@require_POST
def interactivity(request, slug):
    """A click on a question's buttons (`block_actions`), form-encoded as `payload=<JSON>`."""
    try:
        body = request.body
    except RequestDataTooBig:
        body = None
    channel, refused = _checked(slug, request.headers, body)
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
