"""Taps on a question's buttons (`callback_query` updates), from the webhook and from
long polling alike: routed here, decided by tools.confirmations, answered and shown in
the chat through the Bot API."""

import logging

from telegram.error import BadRequest

from agentloop.core.redaction import redact
from conversations.platforms.telegram.transport import call_telegram_now
from tools.confirmations import tap

log = logging.getLogger(__name__)

# Each Bot API call a tap makes (answer, edit) is bounded by this many seconds.
BOT_CALL_DEADLINE = 5.0
TOAST_LIMIT = 200  # answerCallbackQuery's text


def is_callback(data) -> bool:
    """The one test of whether an update is a tap (the webhook and the poller both ask it)."""
    return isinstance(data, dict) and "callback_query" in data


def handle_callback(channel, update: dict) -> dict:
    """A `callback_query` update (webhook or long polling): decide, answer the tap, edit
    the question. Returns the webhook's JSON answer. Database errors propagate (the
    update is re-delivered: the compare-and-swap makes that harmless); Bot API failures
    are logged (the tap's outcome is already decided and the next tap repeats the edit)."""
    query = update.get("callback_query")
    if not isinstance(query, dict) or not query.get("id"):
        return {"ok": True, "ignored": True}
    sender = query.get("from") if isinstance(query.get("from"), dict) else {}
    message = query.get("message") if isinstance(query.get("message"), dict) else {}
    chat = message.get("chat") if isinstance(message.get("chat"), dict) else {}
    name = " ".join(str(sender.get(k) or "") for k in ("first_name", "last_name")).strip()
    reply, _ = tap(channel, str(query.get("data") or ""), sender_id=str(sender.get("id", "")), sender_name=name,
                   chat_id=str(chat.get("id", "")))
    calls = [("answer_callback_query", {"callback_query_id": str(query["id"]), "text": reply.toast[:TOAST_LIMIT]})]
    if reply.outcome and chat.get("id") is not None and message.get("message_id") is not None:
        # Without reply_markup: the buttons go, the outcome stays readable in the chat.
        calls.append(("edit_message_text", {"chat_id": chat["id"], "message_id": message["message_id"],
                                            "text": reply.outcome}))
    bot_calls(channel, calls)
    return {"ok": True, "callback": reply.status}


def question_decided(channel, confirmation, outcome: str) -> None:
    """The question's message shows the outcome instead of its buttons (editMessageText)."""
    question = confirmation.question
    if question is None or not question.platform_message_id:
        return
    bot_calls(channel, [("edit_message_text", {"chat_id": question.chat_id,
                                               "message_id": int(question.platform_message_id),
                                               "text": outcome})])


def bot_calls(channel, calls):
    """The answer and the edit, one connection for both. Failures are logged, never
    raised: the decision is made and stays; the next tap repeats both."""
    for (method, _), result in zip(calls, call_telegram_now(channel, BOT_CALL_DEADLINE, *calls)):
        if isinstance(result, BadRequest):
            # "message is not modified" (an earlier tap edited it already), "query is too
            # old" (a re-delivered callback): the chat already shows the right thing.
            log.info("channel %s: %s refused: %s", channel.slug, method, redact(str(result))[:200])
        elif isinstance(result, Exception):
            log.warning("channel %s: %s failed: %s", channel.slug, method,
                        redact(f"{type(result).__name__}: {result}")[:200])
