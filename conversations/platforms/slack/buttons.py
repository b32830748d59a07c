"""Clicks on a question's Block Kit buttons (a `block_actions` payload on the
interactivity URL): decided by tools.confirmations (one compare-and-swap from pending:
a double click, two people, a replayed request apply the action once), then the question
is updated in place with the outcome and without its buttons (chat.update). A click that
decides nothing (someone else's question, a stale button) is answered to the clicker
alone (chat.postEphemeral).

Slack wants the interactivity request answered within 3 s: the decision is one
transaction, and the update is bounded by UPDATE_DEADLINE; if it fails it is logged (the
decision stands, and the next click repeats the update)."""

import logging

from agentloop.core.redaction import redact
from conversations.platforms.slack.inbound import chat_of
from conversations.platforms.slack.transport import SECTION_UNITS, call_now, escape, place
from delivery import chunks
from delivery.transports import SendResult
from tools.confirmations import tap

log = logging.getLogger(__name__)

UPDATE_DEADLINE = 2.0  # seconds; inside Slack's 3 s for the whole request


def clicked(channel, payload: dict) -> str:
    """The first of a payload's actions carrying a question's data: decide it and update
    the question. Returns the decision's status (for the answer and the logs)."""
    user = payload.get("user") if isinstance(payload.get("user"), dict) else {}
    container = payload.get("container") if isinstance(payload.get("container"), dict) else {}
    message = payload.get("message") if isinstance(payload.get("message"), dict) else {}
    channel_id = str((payload.get("channel") or {}).get("id") or container.get("channel_id") or "")
    ts = str(container.get("message_ts") or message.get("ts") or "")
    thread_ts = str(container.get("thread_ts") or message.get("thread_ts") or "")
    action = next((a for a in payload.get("actions") or [] if isinstance(a, dict) and a.get("value")), None)
    if action is None or not channel_id:
        return "ignored"
    chat = chat_of(channel_id, thread_ts, ts, channel.setting("conversations"))
    reply, _ = tap(channel, str(action["value"]), sender_id=str(user.get("id") or ""),
                   sender_name=str(user.get("name") or user.get("username") or ""), chat_id=chat)
    if reply.outcome and ts:
        update(channel, channel_id, ts, reply.outcome)
    elif reply.toast and user.get("id"):
        # Not decided by this click (someone else's question, a stale button): told to the
        # clicker alone, the question left as it is.
        whisper(channel, {"channel": channel_id, "user": str(user["id"]), "text": escape(reply.toast),
                          **({"thread_ts": thread_ts} if thread_ts else {})})
    return reply.status


def whisper(channel, params: dict) -> None:
    """chat.postEphemeral: a message only one person sees. Best effort."""
    result = call_now(channel, "chat_postEphemeral", params, UPDATE_DEADLINE)
    if isinstance(result, SendResult):
        log.info("channel %s: chat.postEphemeral failed: %s", channel.slug, redact(result.error)[:200])


def question_decided(channel, confirmation, outcome: str) -> None:
    """The question shows the outcome instead of its buttons (an operator decided, or it expired)."""
    question = confirmation.question
    if question is None or not question.platform_message_id:
        return
    update(channel, place(question.chat_id, "")[0], question.platform_message_id, outcome)


def update(channel, channel_id: str, ts: str, text: str) -> None:
    """chat.update: the message's text and a single section, no buttons. Best effort."""
    section = escape(chunks.split(text, SECTION_UNITS)[0])
    result = call_now(channel, "chat_update", {
        "channel": channel_id, "ts": ts, "text": escape(text),
        "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": section}}]}, UPDATE_DEADLINE)
    if isinstance(result, SendResult):
        log.warning("channel %s: chat.update of a question failed: %s", channel.slug, redact(result.error)[:200])
