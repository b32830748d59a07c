"""Confirmation questions as Adaptive Cards, and the `adaptiveCard/action` invoke a tap
sends.

A question goes out as a card holding its text and one Action.Execute per answer (verb
`confirm`, the question's data in `data`). A tap comes back as an invoke activity named
`adaptiveCard/action` (verified like any activity) and is decided by tools.confirmations
(one compare-and-swap from pending: a double tap, two people, a redelivered invoke apply
the action once). It is answered in the same request with an invokeResponse — the
synchronous path is safe here, as nothing is sent that the ledger would have to account
for: an AdaptiveCardInvokeResponse (statusCode 200) whose card, the outcome and no
buttons, replaces the question's; a tap that decides nothing (someone else's question, a
stale button) is answered with a message to the tapper alone
(application/vnd.microsoft.activity.message).

A question decided elsewhere (an operator, its expiry) is updated through the Connector
(PUT the activity: the outcome, no card), best effort under UPDATE_DEADLINE."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import httpx
from microsoft_agents.activity import Activity, AdaptiveCardInvokeResponse, AdaptiveCardInvokeValue
from pydantic import ValidationError

from agentloop.core.redaction import channel_secrets, redact
from conversations.platforms.teams.activities import chat_of
from conversations.platforms.teams.transport import (
    TokenRefused,
    TokenUnavailable,
    access_token,
    bounded,
    reply_url,
)
from conversations.platforms.teams.wire import CARD, VERB, card, message, wire
from tools.confirmations import tap

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Channel
    from tools.models import Confirmation

log = logging.getLogger(__name__)

ACTION = "adaptiveCard/action"
MESSAGE_ANSWER = "application/vnd.microsoft.activity.message"
UPDATE_DEADLINE = 5.0


def tapped_data(activity: Activity) -> str:
    """The `data` of the Action.Execute tapped ("" when it is not one of ours)."""
    try:
        value = AdaptiveCardInvokeValue.model_validate(activity.value)
    except (ValidationError, ValueError):
        return ""
    if value.action.type != "Action.Execute" or value.action.verb != VERB:
        return ""
    return str(value.action.data.get("data") or "")


def invoked(channel: Channel, activity: Activity) -> dict[str, Any]:
    """An adaptiveCard/action invoke decided: the invokeResponse's body Teams shows."""
    data = tapped_data(activity)
    conversation, sender = activity.conversation, activity.from_property
    if not data or conversation is None or sender is None or not conversation.id or not sender.id:
        return _answer(MESSAGE_ANSWER, "")
    reply, _confirmation = tap(channel, data, sender_id=str(sender.id), sender_name=str(sender.name or ""),
                               chat_id=chat_of(activity))
    log.info("channel %s: a card's Action.Execute: %s", channel.slug, reply.status)
    if reply.outcome:
        return _answer(CARD, card(reply.outcome))
    return _answer(MESSAGE_ANSWER, reply.toast)


def _answer(kind: str, value: object) -> dict[str, Any]:
    found: dict[str, Any] = AdaptiveCardInvokeResponse(status_code=200, type=kind, value=value).model_dump(
        mode="json", by_alias=True, exclude_none=True)
    return found


def question_decided(channel: Channel, confirmation: Confirmation, outcome: str) -> None:
    """The question shows `outcome` instead of its card. Best effort."""
    question = confirmation.question
    if question is None or not question.platform_message_id:
        return
    try:
        url = reply_url(channel, confirmation.conversation.chat_id, question.platform_message_id, UPDATE_DEADLINE)
        token = access_token(channel, UPDATE_DEADLINE)
        status, _headers, _answer = bounded("PUT", url, UPDATE_DEADLINE,
                                            json=wire(message(outcome, activity_id=question.platform_message_id)),
                                            headers={"Authorization": f"Bearer {token}"})
        if status >= 300:
            log.warning("channel %s: updating a question failed: HTTP %s", channel.slug, status)
    except (TokenRefused, TokenUnavailable, httpx.HTTPError, TimeoutError, ValueError) as exc:
        log.warning("channel %s: updating a question failed: %s", channel.slug,
                    redact(str(exc), channel_secrets(channel))[:200])
