"""Telegram's webhook, /webhooks/telegram/<slug>/: the secret Telegram sends back in
X-Telegram-Bot-Api-Secret-Token, an update parsed into our types
(conversations.platforms.inbound drives the steps, for the Django view and the lean ASGI
path alike, so their answers are the same)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from conversations import edits, reactions
from conversations.ingest import Admission
from conversations.platforms.inbound import Parsed, Received, Refused, Request, Webhook, shared_secret
from conversations.platforms.telegram import callbacks, identity, parsing
from conversations.platforms.telegram.reactions import is_reaction, reaction_from
from conversations.platforms.webhooks import Answer, error

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Channel

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
IGNORED = Answer(200, {"ok": True, "ignored": True})  # 200 so Telegram stops retrying it


# What parsing a malformed update raises (the webhook answers 400, long polling skips it).
MALFORMED = (ValueError, TypeError, KeyError, AttributeError)


def parse_update(channel: Channel, data: Any) -> Parsed | None:
    """An update other than a tap on a button, the webhook's and long polling's
    (conversations.platforms.telegram.polling) alike: a message, an edit or a reaction
    (message_reaction); None: nothing to act on. Raises one of MALFORMED."""
    if is_reaction(data):
        reaction = reaction_from(data)
        return Parsed([reaction]) if reaction is not None else None
    asker = identity.asker(channel)  # type: ignore[no-untyped-call]  # identity.py is not annotated yet
    item = parsing.item_from_update(parsing.parse_update(data), asker)
    return Parsed([item]) if item is not None else None


class TelegramWebhook(Webhook):
    lean = True

    def authenticate(self, channel: Channel, request: Request) -> Answer | None:
        return shared_secret(request, SECRET_HEADER, channel.setting("webhook_secret"), "--secret", "webhook secret")

    def parse(self, channel: Channel, request: Request) -> Answer | Parsed:
        """One update: a message, an edit, a reaction, or a tap on a question's button
        (answered here: it runs the action and calls the Bot API)."""
        try:
            data = json.loads(request.body or b"")
        except (ValueError, UnicodeDecodeError):
            return error(400, "body is not valid JSON")
        if callbacks.is_callback(data):
            return Answer(200, callbacks.handle_callback(channel, data))
        try:
            parsed = parse_update(channel, data)
        except MALFORMED as exc:
            return error(400, f"not a valid Telegram update: {exc}")
        return parsed if parsed is not None else IGNORED

    def answer(self, received: Received, results: list[object]) -> Answer:
        """200 whatever became of the update (Telegram would resend it otherwise): a
        refusal is audited, an edit of a message we never received audited and ignored."""
        [result] = results
        if isinstance(result, Refused):
            return Answer(200, {"ok": True, "refused": result.problem})
        if isinstance(result, reactions.ReactionResult):
            return Answer(200, {"ok": True, "reaction": result.outcome, "duplicate": result.duplicate})
        if isinstance(result, edits.EditResult):
            if result.outcome == edits.UNKNOWN:
                return Answer(200, {"ok": True, "ignored": True, "edit": result.outcome})
            return Answer(200, {"ok": True, "duplicate": result.duplicate, "edit": result.outcome})
        if isinstance(result, Admission):
            return Answer(200, {"ok": True, "duplicate": result.duplicate})
        raise TypeError(f"no answer for {result!r}")

    def takes_lean(self, body: bytes | None) -> bool:
        # A tap on a question's button runs the action and calls the Bot API
        # (tools.confirmations): Django's view takes it, off the lean path's admitter threads.
        return not (body and b'"callback_query"' in body)
