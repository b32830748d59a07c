"""Telegram's webhook: validate, parse into our types, dispatch to `ingest.admit`.

`prepare` is everything before the admission; the Django view below and the lean ASGI
path (conversations/lean_ingest.py) both call it, so their answers are the same."""

import hmac
import json

from django.core.exceptions import RequestDataTooBig
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from conversations import edits, reactions
from conversations.ingest import Inbound, admit, record_refusal, refusal
from conversations.models import Channel
from conversations.platforms.telegram import callbacks, identity, parsing
from conversations.platforms.telegram.reactions import is_reaction, reaction_from
from conversations.platforms.webhooks import Answer, error

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
KIND = "telegram"


@csrf_exempt
@require_POST
def webhook(request, slug):
    try:
        body = request.body
    except RequestDataTooBig:
        body = None  # answered 413, after the checks that come first
    prepared = prepare(slug, request.headers.get(SECRET_HEADER), body)
    if isinstance(prepared, Answer):
        return prepared.response()
    # Anything failing from here on is ours: a 500 makes Telegram retry, and the dedup
    # makes the retry safe.
    channel, item = prepared
    if not isinstance(item, Inbound):
        return aside(channel, item).response()
    return admitted(admit(channel, item)).response()


def prepare(slug, supplied_secret, body):
    """Everything before the admission: the channel, its secret, the update parsed into
    an Inbound (or an edits.Edit). Returns the Answer to give at once, or (channel,
    inbound) to admit, or (channel, edit or reaction) to apply (`aside`).
    `body` is None when it was over the size limit."""
    channel = Channel.objects.active(slug, KIND)
    if channel is None:
        return error(404, f"no active Telegram channel '{slug}'")
    secret = channel.setting("webhook_secret")
    if not secret:
        return error(403, "this channel has no webhook secret configured; set one (addchannel --secret)")
    if supplied_secret is None:
        return error(401, f"missing {SECRET_HEADER} header")
    if not hmac.compare_digest(supplied_secret.encode(), secret.encode()):
        return error(403, f"wrong {SECRET_HEADER}")
    if body is None:
        return error(413, "request body too large")
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return error(400, "body is not valid JSON")
    if callbacks.is_callback(data):  # a tap on a question's button
        return Answer(200, callbacks.handle_callback(channel, data))
    if is_reaction(data):  # a reaction on a message (message_reaction)
        reaction = reaction_from(data)
        return (channel, reaction) if reaction is not None else Answer(200, {"ok": True, "ignored": True})
    try:
        inbound = parsing.item_from_update(parsing.parse_update(data), identity.asker(channel))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        return error(400, f"not a valid Telegram update: {exc}")
    if inbound is None:
        # 200 so Telegram stops retrying an update we will never act on.
        return Answer(200, {"ok": True, "ignored": True})
    problem = edits.refusal(inbound) if isinstance(inbound, edits.Edit) else refusal(inbound)
    if problem:
        # 200 so Telegram stops retrying an update no retry could store; audited.
        record_refusal(channel, inbound, problem, "webhook")
        return Answer(200, {"ok": True, "refused": problem})
    return channel, inbound


def admitted(admission):
    return Answer(200, {"ok": True, "duplicate": admission.duplicate})


def aside(channel, item):
    """What is not a new message: an edit or a reaction, each its own transaction."""
    if isinstance(item, reactions.Reaction):
        return reacted(reactions.apply(channel, item))
    return edited(edits.apply(channel, item))


def reacted(result):
    """200 whatever the reaction did (Telegram would resend it otherwise)."""
    return Answer(200, {"ok": True, "reaction": result.outcome, "duplicate": result.duplicate})


def edited(result):
    """200 whatever the edit did (Telegram would resend it otherwise); an edit of a
    message we never received is audited and ignored."""
    if result.outcome == edits.UNKNOWN:
        return Answer(200, {"ok": True, "ignored": True, "edit": result.outcome})
    return Answer(200, {"ok": True, "duplicate": result.duplicate, "edit": result.outcome})
