"""A confirmation question's buttons as Discord components, and a tap on one.

The question goes out with an action row of two buttons (`custom_id`: the question's
data, tools.confirmations); a tap arrives over the Gateway as INTERACTION_CREATE (a
message component). It is decided by tools.confirmations.tap (one compare-and-swap from
pending: three taps, two people, a replayed dispatch after a RESUME apply the action
once), in the database thread with the rest of the admission; the interaction is then
answered from the event loop (Discord wants the answer within 3 s): UPDATE_MESSAGE (the
question shows the outcome, its buttons gone), or an ephemeral message to the tapper
alone (someone else's question, a stale button), or a bare acknowledgement.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from agentloop.core.caches import BoundedCache
from agentloop.core.redaction import channel_secrets, redact
from tools.confirmations import tap

if TYPE_CHECKING:  # for annotations only
    from conversations.models import Channel
    from tools.models import Confirmation

log = logging.getLogger(__name__)

ANSWER_DEADLINE = 2.5  # seconds: inside Discord's 3 s for an interaction's answer
UPDATE_DEADLINE = 2.0
LABEL_CHARS, CUSTOM_ID_CHARS, CONTENT_CHARS = 80, 100, 2000
# Interaction callback types (Discord's): a message to the tapper, a bare acknowledgement,
# the tapped message updated.
CHANNEL_MESSAGE, DEFERRED_UPDATE, UPDATE_MESSAGE = 4, 6, 7
EPHEMERAL = 64

# The answers decided in the database thread, by interaction id, until the session sends
# them (within the same receive). Bounded: an answer never sent is dropped with the oldest.
_answers: BoundedCache[str, tuple[str, dict[str, Any]]] = BoundedCache(maxsize=1000, max_age=60)


@dataclass(frozen=True)
class Tap:
    """A tap on one of our components (INTERACTION_CREATE, a message component)."""

    interaction_id: str
    token: str
    custom_id: str
    user_id: str
    user_name: str
    chat_id: str


def components(buttons: tuple[tuple[str, str], ...]) -> list[dict[str, Any]]:
    """One action row: "yes" green (style 3), the other red (style 4)."""
    return [{"type": 1, "components": [
        {"type": 2, "style": 3 if data.endswith(":y") else 4, "label": label[:LABEL_CHARS],
         "custom_id": data[:CUSTOM_ID_CHARS]} for label, data in buttons]}]


def tap_of(data: dict[str, Any]) -> Tap | None:
    """A message component's interaction; None for any other interaction."""
    component = data.get("data")
    member = data.get("member")
    user = member.get("user") if isinstance(member, dict) else data.get("user")
    if data.get("type") != 3 or not isinstance(component, dict) or not isinstance(user, dict):
        return None
    if not (data.get("id") and data.get("token") and component.get("custom_id")):
        return None
    return Tap(str(data["id"]), str(data["token"]), str(component["custom_id"]), str(user.get("id") or ""),
               str(user.get("global_name") or user.get("username") or ""), str(data.get("channel_id") or ""))


def decide(channel: Channel, item: Tap) -> str:
    """The tap decided (the database thread); its answer kept for `answer`. The status."""
    reply, _ = tap(channel, item.custom_id, sender_id=item.user_id, sender_name=item.user_name, chat_id=item.chat_id)
    if reply.outcome:
        body: dict[str, Any] = {"type": UPDATE_MESSAGE, "data": {"content": reply.outcome[:CONTENT_CHARS],
                                                                 "components": []}}
    elif reply.toast:
        body = {"type": CHANNEL_MESSAGE, "data": {"content": reply.toast[:CONTENT_CHARS], "flags": EPHEMERAL}}
    else:
        body = {"type": DEFERRED_UPDATE}
    _answers.set(item.interaction_id, (item.token, body))
    return reply.status


def answer_for(interaction_id: str) -> tuple[str, dict[str, Any]] | None:
    """(token, body) of a decided tap, taken once."""
    return _answers.pop(interaction_id)


def question_decided(channel: Channel, confirmation: Confirmation, outcome: str) -> None:
    """The question shows the outcome instead of its buttons (an operator decided, or it
    expired): PATCH of the message. Best effort, bounded."""
    question = confirmation.question
    if question is None or not question.platform_message_id:
        return
    url = f"{str(channel.setting('api_base')).rstrip('/')}/channels/{question.chat_id}/messages/{question.platform_message_id}"
    try:
        answer = httpx.patch(url, json={"content": outcome[:CONTENT_CHARS], "components": []}, timeout=UPDATE_DEADLINE,
                             headers={"Authorization": f"Bot {channel.setting('bot_token')}"})
        failed = f"HTTP {answer.status_code}" if answer.status_code >= 300 else ""
    except httpx.HTTPError as exc:
        failed = f"{type(exc).__name__}: {exc}"
    if failed:
        log.warning("channel %s: the question's update failed: %s", channel.slug,
                    redact(failed, channel_secrets(channel))[:200])
