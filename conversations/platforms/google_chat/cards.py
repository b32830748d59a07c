"""Confirmation questions as cards v2 buttons, and the CARD_CLICKED event a tap sends.

A question goes out with a card under its text: one button list, each button's
`onClick.action` the function "confirm" with the question's data as its `data`
parameter. A tap comes back as a CARD_CLICKED event (verified like any request) and is
decided by tools.confirmations (one compare-and-swap from pending: a double tap, two
people, a redelivered event apply the action once). It is answered in the same request —
the synchronous path is safe here, as nothing is sent that the ledger would have to
account for: `actionResponse: UPDATE_MESSAGE` replaces the question with its outcome and
no buttons; a tap that decides nothing (someone else's question, a stale button) is
answered to the tapper alone (a private message, `privateMessageViewer`).

A question decided elsewhere (an operator, its expiry) is updated through the API
(spaces.messages.patch, updateMask=text,cardsV2), best effort under UPDATE_DEADLINE."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import httpx

from agentloop.core.redaction import channel_secrets, redact
from conversations.platforms.google_chat import events
from conversations.platforms.google_chat.transport import TokenRefused, TokenUnavailable, access_token, bounded
from tools.confirmations import tap

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Channel
    from tools.models import Confirmation

log = logging.getLogger(__name__)

UPDATE_DEADLINE = 5.0


def clicked(channel: Channel, event: dict[str, Any]) -> dict[str, Any]:
    """A CARD_CLICKED event decided: the synchronous answer Chat shows."""
    user, space = events.as_dict(event.get("user")), events.as_dict(event.get("space"))
    data = events.clicked_data(event)
    if not data or not space.get("name"):
        return {}
    reply, _confirmation = tap(channel, data, sender_id=str(user.get("name") or ""),
                               sender_name=str(user.get("displayName") or ""), chat_id=str(space["name"]))
    log.info("channel %s: a card click: %s", channel.slug, reply.status)
    if reply.outcome:
        return {"actionResponse": {"type": "UPDATE_MESSAGE"}, "text": reply.outcome, "cardsV2": []}
    if reply.toast and user.get("name"):
        return {"actionResponse": {"type": "NEW_MESSAGE"}, "text": reply.toast,
                "privateMessageViewer": {"name": str(user["name"])}}
    return {}


def question_decided(channel: Channel, confirmation: Confirmation, outcome: str) -> None:
    """The question shows `outcome` instead of its buttons. Best effort."""
    question = confirmation.question
    if question is None or not question.platform_message_id:
        return
    base = str(channel.setting("api_base")).rstrip("/")
    try:
        token = access_token(channel, UPDATE_DEADLINE)
        answer = bounded("PATCH", f"{base}/{question.platform_message_id}", UPDATE_DEADLINE,
                         params={"updateMask": "text,cardsV2"}, json={"text": outcome, "cardsV2": []},
                         headers={"Authorization": f"Bearer {token}"})
        if answer.status >= 300:
            log.warning("channel %s: updating a question failed: HTTP %s", channel.slug, answer.status)
    except (TokenRefused, TokenUnavailable, httpx.HTTPError, TimeoutError) as exc:
        log.warning("channel %s: updating a question failed: %s", channel.slug,
                    redact(str(exc), channel_secrets(channel))[:200])
