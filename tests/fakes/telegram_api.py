"""A local fake of Telegram's Bot API that speaks the real HTTP protocol.

Tests drive it with the real python-telegram-bot client, so the whole HTTP
path (serialisation, status codes, error envelopes, timeouts) is exercised::

    with FakeBotAPI() as fake:
        bot = telegram.Bot("123:abc", base_url=f"{fake.url}/bot")
        ...                                # run the code under test
        [call] = fake.wait_for("sendMessage")
        assert call.params["text"] == "hello"

Other processes (e.g. a Django server started by a test) can drive it through
the HTTP endpoints under ``/_control/``, and
``python -m tests.fakes.telegram_api --port N`` runs it in the foreground.

Standard library only, so it works anywhere the tests run.
"""

from __future__ import annotations

import argparse
import bisect
import copy
import email.parser
import email.policy
import hashlib
import json
import re
import signal
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from tests.fakes.server import FakeServer, TrackedHandler

BOT_USERNAME = "agentloop_test_bot"
BOT_FIRST_NAME = "AgentLoop Test Bot"

# The emoji a bot may react with (the Bot API's ReactionTypeEmoji): any other is REACTION_INVALID.
REACTION_EMOJI = frozenset(
    "👍 👎 ❤ 🔥 🥰 👏 😁 🤔 🤯 😱 🤬 😢 🎉 🤩 🤮 💩 🙏 👌 🕊 🤡 🥱 🥴 😍 🐳 ❤‍🔥 🌚 🌭 💯 🤣 ⚡ 🍌 🏆 💔 🤨 😐 🍓 🍾 "
    "💋 🖕 😈 😴 😭 🤓 👻 👨‍💻 👀 🎃 🙈 😇 😨 🤝 ✍ 🤗 🫡 🎅 🎄 ☃ 💅 🤪 🗿 🆒 💘 🙉 🦄 😘 💊 🙊 😎 👾 🤷‍♂ 🤷 "
    "🤷‍♀ 😡".split()
)

WEBHOOK_CONFLICT = (
    "Conflict: can't use getUpdates method while webhook is active; "
    "use deleteWebhook to delete the webhook first"
)

# Parameters the Bot API documents as strings. Form bodies carry no types, so
# without this list a message text of "123" or "true" would be decoded into a
# number or a boolean when we try json.loads on every value.
_STRING_PARAMS = frozenset(
    {
        "text",
        "caption",
        "parse_mode",
        "url",
        "secret_token",
        "ip_address",
        "action",
        "title",
        "description",
        "short_description",
        "name",
        "query",
        "emoji",
        "message_effect_id",
        "business_connection_id",
        "callback_query_id",
        "inline_query_id",
        "shipping_query_id",
        "pre_checkout_query_id",
        "inline_message_id",
        "file_id",
        "language_code",
    }
)

_BOT_PATH = re.compile(r"^/bot(?P<token>[^/]+)/(?P<method>[A-Za-z0-9_]+)/?$")
_FILE_PATH = re.compile(r"^/file/bot(?P<token>[^/]+)/(?P<path>.+)$")
# Telegram's own limit: a bot may download files of up to 20 MB (getFile refuses larger).
MAX_DOWNLOAD_BYTES = 20 * 1024 * 1024

# A handler receives (token, params) and returns the "result" of the envelope.
Handler = Callable[[str, dict[str, Any]], Any]


@dataclass(frozen=True)
class Limits:
    """Telegram's documented send limits (core.telegram.org/bots/faq): about 30 messages a
    second from one bot, one a second into one chat, 20 a minute into one group. Beyond
    them the fake answers 429 with `retry_after` (whole seconds, as Telegram does) for the
    time until the window frees, counting each window over the last second (minute)."""

    per_bot: int = 30
    per_chat: int = 1
    per_group_minute: int = 20


PHOTO_MAX_BYTES = 10 * 1024 * 1024  # sendPhoto's upload limit
DOCUMENT_MAX_BYTES = 50 * 1024 * 1024  # sendDocument's
# The methods that put a message into a chat (sendChatAction does not count).
_PACED_METHODS = frozenset({"sendmessage", "sendphoto", "senddocument", "sendvoice", "sendaudio",
                            "sendvideo", "sendmediagroup", "sendsticker", "sendanimation"})


@dataclass(frozen=True)
class Call:
    """One Bot API request as the fake received it."""

    token: str
    method: str
    params: dict[str, Any]
    at: float  # time.monotonic(), for measuring intervals between calls
    wall: float  # time.time(), for comparing with Telegram "date" fields


class BotAPIError(Exception):
    """An error answer, raised by method handlers (also custom ones)."""

    def __init__(self, status: int, description: str, parameters: dict | None = None):
        super().__init__(description)
        self.status = status
        self.description = description
        self.parameters = parameters

    def envelope(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "ok": False,
            "error_code": self.status,
            "description": self.description,
        }
        if self.parameters:
            body["parameters"] = self.parameters
        return body


@dataclass
class _Rule:
    """A scripted misbehaviour for the next `times` calls of a method."""

    method: str
    token: str | None
    times: int
    error: BotAPIError | None = None  # None means: drop the connection

    def matches(self, token: str, method: str) -> bool:
        return _same_method(self.method, method) and self.token in (None, token)


class Hold:
    """Blocks calls of one method (after they are recorded) until released."""

    def __init__(self, fake: FakeBotAPI, method: str, token: str | None):
        self._fake = fake
        self.method = method
        self.token = token
        self.released = False
        self.held = 0  # requests currently blocked by this hold

    def matches(self, token: str, method: str) -> bool:
        return _same_method(self.method, method) and self.token in (None, token)

    def release(self) -> None:
        """Let every blocked request (and all later ones) through."""
        self._fake._release_hold(self)

    def wait_held(self, count: int = 1, timeout: float = 5.0) -> int:
        """Wait until at least `count` requests are blocked; returns how many."""
        with self._fake._cond:
            if not self._fake._cond.wait_for(lambda: self.held >= count, timeout):
                raise AssertionError(
                    f"expected {count} held {self.method!r} request(s) within "
                    f"{timeout}s, {self.held} held"
                )
            return self.held

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class FakeBotAPI(FakeServer):
    """An in-process Telegram Bot API server on 127.0.0.1.

    Clients use ``telegram.Bot(token, base_url=f"{fake.url}/bot")``.
    """

    def __init__(
        self,
        port: int = 0,
        *,
        host: str = "127.0.0.1",
        tokens: tuple[str, ...] | list[str] = (),
        require_known_tokens: bool = False,
        limits: Limits | None = None,
    ):
        super().__init__((host, port), _RequestHandler)

        # Telegram's send limits, kept when given (None: unlimited, as a test asks).
        self.limits = limits
        self.floods = 0  # 429s answered for the limits
        self.flood_times: list[float] = []  # when (time.monotonic()), for telling where they came
        self._windows: dict[tuple, list[float]] = {}  # (token[, chat]) -> accepted sends' times

        self.require_known_tokens = require_known_tokens
        self._known_tokens: set[str] = set(tokens)
        self._forget_offsets = False

        self._calls: list[Call] = []
        self._history: dict[str, list[dict]] = {}  # every update ever pushed, by update_id
        self._confirmed: dict[str, int] = {}  # lowest update_id not yet confirmed
        self._next_update_id: dict[str, int] = {}
        self._next_message_id: dict[tuple[str, int], int] = {}
        self._webhooks: dict[str, dict[str, Any]] = {}
        self._rules: list[_Rule] = []
        self._delays: dict[str, float] = {}
        self._holds: list[Hold] = []
        self._handlers: dict[str, tuple[str, Handler]] = {}
        # Messages the bot sent, as the chat shows them now (edits apply), by (token, chat, id).
        self._sent: dict[tuple[str, int, int], dict[str, Any]] = {}
        # Callback queries pushed or made here, and whether each was answered already.
        self._callback_queries: dict[str, bool] = {}
        self._next_callback_id = 7_000_000
        # Files a bot may download: file_id -> {"token", "data", "unique", "path", "trickle"}.
        self._files: dict[str, dict[str, Any]] = {}
        # Drafts as each private chat shows them now, by (token, chat, draft_id); and the
        # messages the bot deleted, as they were, in order.
        self._drafts: dict[tuple[str, int, int], str] = {}
        self.deleted: list[dict[str, Any]] = []
        self.downloads: list[str] = []  # file_ids downloaded, in order
        # The bot's reactions as each message shows them now: (token, chat, message_id) -> emoji.
        self.reactions: dict[tuple[str, int, int], list[str]] = {}
        # Each bot's allowed_updates (its last getUpdates or setWebhook that named them):
        # Telegram sends message_reaction only to a bot that named it.
        self._allowed: dict[str, list[str]] = {}
        # Each bot's username (name_bot; BOT_USERNAME for the others), and the groups where
        # one bot's messages reach the others (relay).
        self._usernames: dict[str, str] = {}
        self._relays: dict[int, tuple[str, ...]] = {}
        for method, handler in {
            "getMe": self._api_get_me,
            "sendMessage": self._api_send_message,
            "sendChatAction": self._api_send_chat_action,
            "setWebhook": self._api_set_webhook,
            "deleteWebhook": self._api_delete_webhook,
            "getWebhookInfo": self._api_get_webhook_info,
            "getUpdates": self._api_get_updates,
            "answerCallbackQuery": self._api_answer_callback_query,
            "editMessageText": self._api_edit_message_text,
            "editMessageReplyMarkup": self._api_edit_message_reply_markup,
            "getFile": self._api_get_file,
            "sendPhoto": self._api_send_photo,
            "sendDocument": self._api_send_document,
            "sendMediaGroup": self._api_send_media_group,
            "sendMessageDraft": self._api_send_message_draft,
            "deleteMessage": self._api_delete_message,
            "setMessageReaction": self._api_set_message_reaction,
        }.items():
            self.set_handler(method, handler)

    # ----------------------------------------------------------------- lifecycle

    @property
    def url(self) -> str:
        """API root; the bot endpoint is f"{url}/bot<token>/<method>"."""
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    # ------------------------------------------------------------------ settings

    @property
    def forget_offsets(self) -> bool:
        """When true, getUpdates re-serves already confirmed updates.

        Simulates the platform re-delivering after a reconnect. Confirmations
        are still tracked, so switching it off restores normal behaviour.
        """
        return self._forget_offsets

    @forget_offsets.setter
    def forget_offsets(self, value: bool) -> None:
        with self._cond:
            self._forget_offsets = bool(value)
            self._cond.notify_all()  # waiting long polls may now have updates

    def add_token(self, token: str) -> None:
        """Register a token as valid (matters when require_known_tokens is on)."""
        with self._cond:
            self._known_tokens.add(token)

    def set_handler(self, method: str, handler: Handler) -> None:
        """Add or replace a method. handler(token, params) returns the result
        or raises BotAPIError."""
        with self._cond:
            self._handlers[method.lower()] = (method, handler)

    def webhook(self, token: str) -> dict[str, Any] | None:
        """The webhook set for a token ({"url", "secret_token", ...}) or None."""
        with self._cond:
            hook = self._webhooks.get(token)
            return dict(hook) if hook else None

    # ---------------------------------------------------------------- recording

    def calls(self, method: str | None = None, token: str | None = None) -> list[Call]:
        with self._cond:
            return self._matching_calls(method, token)

    def clear(self) -> None:
        """Forget recorded calls (scripted behaviour and updates stay)."""
        with self._cond:
            self._calls.clear()

    def reset(self) -> None:
        """Forget calls, updates, webhooks and all scripted behaviour."""
        with self._cond:
            for hold in self._holds:
                hold.released = True
            for store in (
                self._calls,
                self._history,
                self._confirmed,
                self._next_update_id,
                self._next_message_id,
                self._webhooks,
                self._rules,
                self._delays,
                self._holds,
                self._sent,
                self._callback_queries,
                self._windows,
                self._drafts,
                self.deleted,
                self.flood_times,
            ):
                store.clear()
            self._forget_offsets = False
            self.floods = 0
            self._cond.notify_all()

    def wait_for(
        self, method: str, count: int = 1, timeout: float = 5.0, token: str | None = None
    ) -> list[Call]:
        """Block until at least `count` calls of `method` were recorded; return them."""
        with self._cond:
            enough = self._cond.wait_for(
                lambda: len(self._matching_calls(method, token)) >= count, timeout
            )
            found = self._matching_calls(method, token)
            if not enough:
                recorded = [call.method for call in self._calls]
                raise AssertionError(
                    f"expected {count} call(s) of {method!r}"
                    f"{f' for token {token!r}' if token else ''} within {timeout}s, "
                    f"got {len(found)}; recorded methods: {recorded}"
                )
            return found

    def _matching_calls(self, method: str | None, token: str | None) -> list[Call]:
        return [
            call
            for call in self._calls
            if (method is None or _same_method(call.method, method))
            and (token is None or call.token == token)
        ]

    def _record(self, token: str, method: str, params: dict[str, Any]) -> None:
        with self._cond:
            self._calls.append(Call(token, method, params, time.monotonic(), time.time()))
            self._cond.notify_all()

    # ------------------------------------------------------------------ updates

    def push_update(self, token: str, update: dict[str, Any]) -> dict[str, Any]:
        """Queue an Update for getUpdates; assigns update_id if missing."""
        update = copy.deepcopy(update)
        with self._cond:
            next_id = self._next_update_id.get(token, 1)
            update.setdefault("update_id", next_id)
            self._next_update_id[token] = max(next_id, update["update_id"] + 1)
            history = self._history.setdefault(token, [])
            bisect.insort(history, update, key=lambda u: u["update_id"])
            self._cond.notify_all()
        return copy.deepcopy(update)

    def push_message(
        self,
        token: str,
        chat_id: int,
        text: str,
        *,
        user_id: int | None = None,
        first_name: str = "Ana",
        message_id: int | None = None,
        chat_type: str = "private",
        message_thread_id: int | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """Queue an incoming text message as a real Update; returns the update.

        `extra` is merged into the message (e.g. entities, reply_to_message).
        """
        chat_id = int(chat_id)
        if chat_type == "private":
            chat: dict[str, Any] = {"id": chat_id, "type": "private", "first_name": first_name}
        else:
            chat = {"id": chat_id, "type": chat_type, "title": "Test chat"}
        sender_id = user_id if user_id is not None else (chat_id if chat_id > 0 else 1001)
        message: dict[str, Any] = {
            "message_id": self._take_message_id(token, chat_id, message_id),
            "date": int(time.time()),
            "chat": chat,
            "from": {"id": sender_id, "is_bot": False, "first_name": first_name},
            "text": text,
        }
        if message_thread_id is not None:
            chat["is_forum"] = True
            message["message_thread_id"] = message_thread_id
            message["is_topic_message"] = True
        if text.startswith("/"):
            # Telegram marks commands with an entity; CommandHandler relies on it.
            command = text.split()[0]
            message["entities"] = [{"type": "bot_command", "offset": 0, "length": len(command)}]
        message.update(extra)
        return self.push_update(token, {"message": message})

    def name_bot(self, token: str, username: str) -> None:
        """The bot behind `token` is @username (getMe, its messages' `from`)."""
        with self._cond:
            self._usernames[token] = username

    def relay(self, chat_id: int, tokens: tuple[str, ...] | list[str]) -> None:
        """Bots in one group: what one of `tokens` sends to `chat_id` reaches the others as
        an update (for getUpdates), from that bot, with Telegram's mention entities for
        the @usernames in its text."""
        with self._cond:
            self._relays[int(chat_id)] = tuple(tokens)

    def _relayed(self, token: str, message: dict[str, Any]) -> None:
        """Deliver a bot's message in a relayed group to the group's other bots."""
        bots = self._relays.get(int(message["chat"]["id"]), ())
        if token not in bots:
            return
        others = [t for t in bots if t != token]
        copied = {**copy.deepcopy(message), "chat": {**message["chat"], "title": "Test chat"}}
        copied.pop("reply_markup", None)
        entities = _mention_entities(copied["text"])
        if entities:
            copied["entities"] = entities
        for other in others:
            self.push_update(other, {"message": copied})

    def _pending(self, token: str) -> list[dict]:
        history = self._history.get(token, [])
        if self._forget_offsets:
            return list(history)
        floor = self._confirmed.get(token, 0)
        return [u for u in history if u["update_id"] >= floor and self._allows(token, u)]

    def _allows(self, token: str, update: dict) -> bool:
        """Telegram's default allowed_updates leave message_reaction out: sent only when asked for."""
        return "message_reaction" not in update or "message_reaction" in self._allowed.get(token, ())

    def _confirm(self, token: str, offset: int) -> None:
        """Apply getUpdates' offset: updates below it are confirmed and dropped."""
        if offset > 0:
            self._confirmed[token] = max(self._confirmed.get(token, 0), offset)
        elif offset < 0:
            # A negative offset keeps only the last -offset pending updates.
            pending = self._pending(token)
            if len(pending) > -offset:
                self._confirmed[token] = pending[offset]["update_id"]

    def _confirm_all(self, token: str) -> None:
        self._confirmed[token] = self._next_update_id.get(token, 1)

    # ------------------------------------------------------- scripted behaviour

    def fail_next(
        self,
        method: str,
        *,
        status: int,
        description: str,
        retry_after: int | float | str | None = None,
        times: int = 1,
        token: str | None = None,
    ) -> None:
        """Answer the next `times` calls of `method` with this error. A string
        `retry_after` is written into the JSON as is (``"1e400"``, ``"\"soon\""``): a
        misbehaving server's answer, which json.dumps could never produce."""
        if isinstance(retry_after, str):
            retry_after = RawJSON(retry_after)
        parameters = {"retry_after": retry_after} if retry_after is not None else None
        error = BotAPIError(int(status), description, parameters)
        with self._cond:
            self._rules.append(_Rule(method, token, int(times), error))

    def drop_connection_next(
        self, method: str, *, times: int = 1, token: str | None = None
    ) -> None:
        """Close the socket without answering the next `times` calls of `method`
        (a network failure after the request was sent)."""
        with self._cond:
            self._rules.append(_Rule(method, token, int(times), None))

    def delay(self, method: str, seconds: float) -> None:
        """Make `method` sleep before answering; 0 removes the delay."""
        with self._cond:
            if seconds and seconds > 0:
                self._delays[method.lower()] = float(seconds)
            else:
                self._delays.pop(method.lower(), None)

    def hold(self, method: str, token: str | None = None) -> Hold:
        """Block calls of `method` until the returned handle is released."""
        hold = Hold(self, method, token)
        with self._cond:
            self._holds.append(hold)
        return hold

    def _release_hold(self, hold: Hold) -> None:
        with self._cond:
            hold.released = True
            if hold in self._holds:
                self._holds.remove(hold)
            self._cond.notify_all()

    def _take_rule(self, token: str, method: str) -> _Rule | None:
        with self._cond:
            for rule in self._rules:
                if rule.matches(token, method):
                    rule.times -= 1
                    if rule.times <= 0:
                        self._rules.remove(rule)
                    return rule
        return None

    def _wait_while_held(self, token: str, method: str) -> None:
        with self._cond:
            hold = next((h for h in self._holds if h.matches(token, method)), None)
            if hold is None:
                return
            hold.held += 1
            self._cond.notify_all()  # wakes wait_held
            self._cond.wait_for(lambda: hold.released or self._stopping.is_set())
            hold.held -= 1

    def _sleep_if_delayed(self, method: str) -> None:
        with self._cond:
            seconds = self._delays.get(method.lower(), 0.0)
        if seconds:
            self._stopping.wait(seconds)  # cut short when the server stops

    # ------------------------------------------------------- request processing

    def _serve_bot_call(
        self, token: str, method: str, params: dict[str, Any]
    ) -> tuple[int, dict[str, Any]] | None:
        """Answer one Bot API call as (status, envelope); None = drop the connection."""
        with self._cond:
            known = self._handlers.get(method.lower())
            # Telegram method names are case-insensitive; record the canonical one.
            method = known[0] if known else method
            unauthorized = self.require_known_tokens and token not in self._known_tokens
        self._record(token, method, params)
        if unauthorized:
            return 401, BotAPIError(401, "Unauthorized").envelope()
        self._wait_while_held(token, method)
        self._sleep_if_delayed(method)
        rule = self._take_rule(token, method)
        if rule is not None:
            return None if rule.error is None else (rule.error.status, rule.error.envelope())
        flooded = self._over_limits(token, method, params)
        if flooded is not None:
            return flooded.status, flooded.envelope()
        if known is None:
            return 404, BotAPIError(404, "Not Found: method not found").envelope()
        try:
            return 200, {"ok": True, "result": known[1](token, params)}
        except BotAPIError as error:
            return error.status, error.envelope()

    def _over_limits(self, token: str, method: str, params: dict[str, Any]) -> BotAPIError | None:
        """A 429 if this send would break the limits; otherwise the send is counted."""
        if self.limits is None or method.lower() not in _PACED_METHODS:
            return None
        try:
            chat = int(params.get("chat_id"))
        except (TypeError, ValueError):
            return None  # the method's own check answers 400
        group = chat < 0
        windows = [((token,), 1.0, self.limits.per_bot),
                   ((token, chat), 60.0 if group else 1.0,
                    self.limits.per_group_minute if group else self.limits.per_chat)]
        now = time.monotonic()
        with self._cond:
            wait = 0.0
            for key, span, most in windows:
                times = self._windows.setdefault(key, [])
                del times[:bisect.bisect_right(times, now - span)]
                if len(times) >= most:
                    wait = max(wait, times[len(times) - most] + span - now)
            if wait > 0:
                self.floods += 1
                self.flood_times.append(now)
                seconds = max(1, int(-(-wait // 1)))
                return BotAPIError(429, f"Too Many Requests: retry after {seconds}", {"retry_after": seconds})
            for key, _, _ in windows:
                self._windows[key].append(now)
        return None

    # ------------------------------------------------------------- Bot methods

    def bot_user(self, token: str) -> dict[str, Any]:
        """The User object of the bot behind `token`."""
        prefix = token.split(":", 1)[0]
        bot_id = int(prefix) if prefix.isdigit() else (zlib.crc32(token.encode()) or 1)
        return {
            "id": bot_id,
            "is_bot": True,
            "first_name": BOT_FIRST_NAME,
            "username": self._usernames.get(token, BOT_USERNAME),
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
            "can_connect_to_business": False,
            "has_main_web_app": False,
        }

    def _api_get_me(self, token: str, params: dict[str, Any]) -> dict[str, Any]:
        return self.bot_user(token)

    def _api_send_chat_action(self, token: str, params: dict[str, Any]) -> bool:
        _chat_id(params)
        if not params.get("action"):
            raise BotAPIError(400, "Bad Request: action is empty")
        return True

    def _api_send_message(self, token: str, params: dict[str, Any]) -> dict[str, Any]:
        chat_id = _chat_id(params)
        text = params.get("text")
        if text is None or str(text) == "":
            raise BotAPIError(400, "Bad Request: message text is empty")
        if len(str(text).encode("utf-16-le")) // 2 > 4096:  # Telegram counts UTF-16 code units
            raise BotAPIError(400, "Bad Request: message is too long")
        chat = {"id": chat_id, "type": "private" if chat_id > 0 else "supergroup"}
        bot = self.bot_user(token)
        message: dict[str, Any] = {
            "message_id": self._take_message_id(token, chat_id),
            "from": bot,
            "date": int(time.time()),
            "chat": chat,
            "text": str(text),
        }
        if params.get("message_thread_id") is not None:
            message["message_thread_id"] = int(params["message_thread_id"])
        reply_to = _reply_target(params)
        if reply_to is not None:
            message["reply_to_message"] = {"message_id": reply_to, "date": message["date"], "chat": chat}
        markup = params.get("reply_markup")
        if markup is not None:
            markup = _check_reply_markup(markup)
        if isinstance(markup, dict) and "inline_keyboard" in markup:
            message["reply_markup"] = markup  # Telegram echoes inline keyboards only
        with self._cond:
            self._sent[(token, chat_id, message["message_id"])] = copy.deepcopy(message)
        self._relayed(token, message)
        return message

    # ------------------------------------------------------------ uploads

    def _api_send_photo(self, token: str, params: dict[str, Any]) -> dict[str, Any]:
        return self._send_upload(token, params, "photo", PHOTO_MAX_BYTES)

    def _api_send_document(self, token: str, params: dict[str, Any]) -> dict[str, Any]:
        return self._send_upload(token, params, "document", DOCUMENT_MAX_BYTES)

    def _send_upload(self, token: str, params: dict[str, Any], field: str, limit: int) -> dict[str, Any]:
        """sendPhoto / sendDocument with the file uploaded (multipart), as Telegram keeps
        them: a photo up to 10 MB, a document up to 50 MB, a caption up to 1024 characters."""
        chat_id = _chat_id(params)
        upload = _uploaded(params.get(field), field, limit)
        message = self._new_message(token, chat_id, params)
        message[field] = _as_shown(field, upload)
        caption = _caption(params.get("caption"))
        if caption:
            message["caption"] = caption
        with self._cond:
            self._sent[(token, chat_id, message["message_id"])] = copy.deepcopy(message)
        return message

    def _api_send_media_group(self, token: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """An album: 2-10 InputMedia, each naming its uploaded part (attach://<name>)."""
        chat_id = _chat_id(params)
        media = params.get("media")
        if isinstance(media, str):
            try:
                media = json.loads(media)
            except ValueError:
                raise BotAPIError(400, "Bad Request: can't parse media JSON object") from None
        if not isinstance(media, list) or not 2 <= len(media) <= 10:
            raise BotAPIError(400, "Bad Request: media must include 2-10 items")
        sent = []
        group = f"{int(time.time() * 1000)}{len(self._sent)}"
        for item in media:
            if not isinstance(item, dict) or item.get("type") not in ("photo", "document"):
                raise BotAPIError(400, "Bad Request: unsupported media type in the group")
            ref = str(item.get("media", ""))
            part = params.get(ref.removeprefix("attach://")) if ref.startswith("attach://") else None
            upload = _uploaded(part, item["type"], PHOTO_MAX_BYTES if item["type"] == "photo" else DOCUMENT_MAX_BYTES)
            message = self._new_message(token, chat_id, params if not sent else {})
            message[item["type"]], message["media_group_id"] = _as_shown(item["type"], upload), group
            caption = _caption(item.get("caption"))
            if caption:
                message["caption"] = caption
            sent.append(message)
        with self._cond:
            for message in sent:
                self._sent[(token, chat_id, message["message_id"])] = copy.deepcopy(message)
        return sent

    def _new_message(self, token: str, chat_id: int, params: dict[str, Any]) -> dict[str, Any]:
        chat = {"id": chat_id, "type": "private" if chat_id > 0 else "supergroup"}
        message: dict[str, Any] = {"message_id": self._take_message_id(token, chat_id), "from": self.bot_user(token),
                                   "date": int(time.time()), "chat": chat}
        if params.get("message_thread_id") is not None:
            message["message_thread_id"] = int(params["message_thread_id"])
        reply_to = _reply_target(params)
        if reply_to is not None:
            message["reply_to_message"] = {"message_id": reply_to, "date": message["date"], "chat": chat}
        return message

    # ------------------------------------------------------ buttons and their taps

    def sent_message(self, token: str, chat_id: int, message_id: int) -> dict[str, Any] | None:
        """A message the bot sent, as the chat shows it now (after any edits)."""
        with self._cond:
            found = self._sent.get((token, int(chat_id), int(message_id)))
            return copy.deepcopy(found) if found else None

    def sent_messages(self, token: str | None = None, chat_id: int | None = None) -> list[dict[str, Any]]:
        """The bot's messages as the chats show them now, in the order they were sent."""
        with self._cond:
            found = [m for (t, chat, _), m in self._sent.items()
                     if token in (None, t) and chat_id in (None, chat)]
        return copy.deepcopy(found)  # a dict keeps the order of sending; an edit keeps its place

    def callback_query(
        self,
        token: str,
        message: dict[str, Any],
        data: str,
        *,
        user_id: int | None = None,
        first_name: str = "Ana",
        query_id: str | None = None,
    ) -> dict[str, Any]:
        """A tap on a button of `message` (a message the bot sent, as returned by
        sendMessage) as the Update Telegram delivers: the query's id is registered, so
        answerCallbackQuery accepts it once. Returned, not queued: POST it to a webhook,
        or push_update it for getUpdates."""
        chat = message["chat"]
        with self._cond:
            if query_id is None:
                query_id = str(self._next_callback_id)
                self._next_callback_id += 1
            self._callback_queries.setdefault(query_id, False)
            update_id = self._next_update_id.get(token, 1)
            self._next_update_id[token] = update_id + 1
        sender = user_id if user_id is not None else chat["id"]
        return {
            "update_id": update_id,
            "callback_query": {
                "id": query_id,
                "from": {"id": sender, "is_bot": False, "first_name": first_name},
                "message": copy.deepcopy(message),
                "chat_instance": str(zlib.crc32(f"{token}:{chat['id']}".encode())),
                "data": data,
            },
        }

    def _api_answer_callback_query(self, token: str, params: dict[str, Any]) -> bool:
        query_id = params.get("callback_query_id")
        if query_id is None or str(query_id) == "":
            raise BotAPIError(400, "Bad Request: parameter \"callback_query_id\" is required")
        text = params.get("text")
        if text is not None and len(str(text)) > 200:
            raise BotAPIError(400, "Bad Request: MESSAGE_TOO_LONG")
        with self._cond:
            answered = self._callback_queries.get(str(query_id))
            if answered is None or answered:  # unknown, or answered before: Telegram refuses both alike
                raise BotAPIError(
                    400, "Bad Request: query is too old and response timeout expired or query ID is invalid"
                )
            self._callback_queries[str(query_id)] = True
        return True

    def _edited(self, token: str, params: dict[str, Any]) -> tuple[tuple[str, int, int], dict[str, Any]]:
        if params.get("inline_message_id"):
            raise BotAPIError(400, "Bad Request: inline messages are not modelled by this fake")
        chat_id = _chat_id(params)
        if params.get("message_id") in (None, ""):
            raise BotAPIError(400, "Bad Request: message identifier is not specified")
        key = (token, chat_id, _as_int(params.get("message_id"), 0))
        with self._cond:
            message = self._sent.get(key)
        if message is None:
            raise BotAPIError(400, "Bad Request: message to edit not found")
        return key, message

    def _store_edit(self, key, message, text, markup) -> dict[str, Any]:
        if markup is not None:
            markup = _check_reply_markup(markup)
        edited = copy.deepcopy(message)
        edited["text"] = text
        edited.pop("reply_markup", None)
        if isinstance(markup, dict) and markup.get("inline_keyboard"):
            edited["reply_markup"] = markup
        if edited["text"] == message["text"] and edited.get("reply_markup") == message.get("reply_markup"):
            raise BotAPIError(
                400,
                "Bad Request: message is not modified: specified new message content and reply markup are "
                "exactly the same as a current content and reply markup of the message",
            )
        edited["edit_date"] = int(time.time())
        with self._cond:
            self._sent[key] = edited
        return copy.deepcopy(edited)

    def _api_edit_message_text(self, token: str, params: dict[str, Any]) -> dict[str, Any]:
        key, message = self._edited(token, params)
        text = params.get("text")
        if text is None or str(text) == "":
            raise BotAPIError(400, "Bad Request: message text is empty")
        if len(str(text).encode("utf-16-le")) // 2 > 4096:
            raise BotAPIError(400, "Bad Request: MESSAGE_TOO_LONG")
        return self._store_edit(key, message, str(text), params.get("reply_markup"))

    def _api_edit_message_reply_markup(self, token: str, params: dict[str, Any]) -> dict[str, Any]:
        key, message = self._edited(token, params)
        return self._store_edit(key, message, message["text"], params.get("reply_markup"))

    # ------------------------------------------------------ streamed replies

    def _api_send_message_draft(self, token: str, params: dict[str, Any]) -> bool:
        """Bot API 9.3+: an ephemeral draft in a private chat (never a message)."""
        chat_id = _chat_id(params)
        if chat_id < 0:
            raise BotAPIError(400, "Bad Request: drafts can be sent only to private chats")
        draft_id = _as_int(params.get("draft_id"), 0)
        if not draft_id:
            raise BotAPIError(400, "Bad Request: draft_id must be non-zero")
        text = str(params.get("text") or "")
        if len(text.encode("utf-16-le")) // 2 > 4096:
            raise BotAPIError(400, "Bad Request: text is too long")
        with self._cond:
            self._drafts[(token, chat_id, draft_id)] = text
        return True

    def drafts(self, chat_id: int | None = None) -> list[str]:
        """The drafts' texts as shown now (one per draft id)."""
        with self._cond:
            return [text for (_, chat, _), text in self._drafts.items() if chat_id in (None, chat)]

    def _api_delete_message(self, token: str, params: dict[str, Any]) -> bool:
        chat_id = _chat_id(params)
        key = (token, chat_id, _as_int(params.get("message_id"), 0))
        with self._cond:
            message = self._sent.pop(key, None)
            if message is None:
                raise BotAPIError(400, "Bad Request: message to delete not found")
            self.deleted.append(message)
        return True

    def _api_set_message_reaction(self, token: str, params: dict[str, Any]) -> bool:
        """The bot's reaction on a message: a list of ReactionType, at most one for a bot
        (REACTIONS_TOO_MANY), each emoji one of Telegram's reactions (REACTION_INVALID:
        ✅, say, is not one); an empty list takes it away. A message the bot deleted is
        not found (the fake does not know messages POSTed to a webhook around it)."""
        chat_id = _chat_id(params)
        message_id = _as_int(params.get("message_id"), 0)
        reaction = params.get("reaction") or []
        if isinstance(reaction, str):
            reaction = json.loads(reaction)
        if not isinstance(reaction, list):
            raise BotAPIError(400, "Bad Request: can't parse reaction types json object")
        if len(reaction) > 1:
            raise BotAPIError(400, "Bad Request: REACTIONS_TOO_MANY")
        emoji = []
        for item in reaction:
            if not isinstance(item, dict) or item.get("type") != "emoji" or item.get("emoji") not in REACTION_EMOJI:
                raise BotAPIError(400, "Bad Request: REACTION_INVALID")
            emoji.append(item["emoji"])
        with self._cond:
            if message_id <= 0 or any(m["chat"]["id"] == chat_id and m["message_id"] == message_id
                                      for m in self.deleted):
                raise BotAPIError(400, "Bad Request: message to react not found")
            self.reactions[(token, chat_id, message_id)] = emoji
        return True

    def message_reaction(self, token: str, chat_id: int, message_id: int, emoji: str = "", *,
                         old: tuple[str, ...] = (), user_id: int | None = None, first_name: str = "Ana",
                         update_id: int | None = None) -> dict[str, Any]:
        """A person's reaction on a message (`emoji` "": taken back) as the Update Telegram
        delivers (message_reaction; only to a bot that asked for it in allowed_updates).
        Returned, not queued: POST it to a webhook, or push_update it for getUpdates."""
        with self._cond:
            if update_id is None:
                update_id = self._next_update_id.get(token, 1)
                self._next_update_id[token] = update_id + 1
        chat_id = int(chat_id)
        sender = user_id if user_id is not None else chat_id
        return {"update_id": update_id, "message_reaction": {
            "chat": {"id": chat_id, "type": "private" if chat_id > 0 else "supergroup"},
            "message_id": int(message_id), "user": {"id": sender, "is_bot": False, "first_name": first_name},
            "date": int(time.time()),
            "old_reaction": [{"type": "emoji", "emoji": e} for e in old],
            "new_reaction": [{"type": "emoji", "emoji": emoji}] if emoji else []}}

    def _api_set_webhook(self, token: str, params: dict[str, Any]) -> bool:
        url = params.get("url") or ""
        with self._cond:
            if not url:  # the real API treats an empty url as deleteWebhook
                self._webhooks.pop(token, None)
            else:
                self._webhooks[token] = {
                    "url": str(url),
                    "secret_token": params.get("secret_token"),
                    "allowed_updates": params.get("allowed_updates"),
                    "max_connections": params.get("max_connections"),
                }
                self._remember_allowed(token, params)
            if params.get("drop_pending_updates"):
                self._confirm_all(token)
            self._cond.notify_all()
        return True

    def _remember_allowed(self, token: str, params: dict[str, Any]) -> None:
        """Called holding the lock. Not given: the previous setting stays (Telegram's rule)."""
        allowed = params.get("allowed_updates")
        if isinstance(allowed, str):
            allowed = json.loads(allowed)
        if isinstance(allowed, list):
            self._allowed[token] = [str(kind) for kind in allowed]

    def _api_delete_webhook(self, token: str, params: dict[str, Any]) -> bool:
        with self._cond:
            self._webhooks.pop(token, None)
            if params.get("drop_pending_updates"):
                self._confirm_all(token)
        return True

    def _api_get_webhook_info(self, token: str, params: dict[str, Any]) -> dict[str, Any]:
        with self._cond:
            hook = self._webhooks.get(token) or {}
            info: dict[str, Any] = {
                "url": hook.get("url", ""),
                "has_custom_certificate": False,
                "pending_update_count": len(self._pending(token)),
            }
            for key in ("max_connections", "allowed_updates"):
                if hook.get(key) is not None:
                    info[key] = hook[key]
            return info

    def _api_get_updates(self, token: str, params: dict[str, Any]) -> list[dict]:
        offset = _as_int(params.get("offset"), 0)
        limit = min(max(_as_int(params.get("limit"), 100), 1), 100)
        timeout = max(_as_float(params.get("timeout"), 0.0), 0.0)
        deadline = time.monotonic() + timeout
        with self._cond:
            if token in self._webhooks:
                raise BotAPIError(409, WEBHOOK_CONFLICT)
            self._remember_allowed(token, params)
            self._confirm(token, offset)
            # Long polling: hold the request until an update arrives or time runs out.
            while not (pending := self._pending(token)) and not self._stopping.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            return pending[:limit]

    def _take_message_id(self, token: str, chat_id: int, wanted: int | None = None) -> int:
        """Next message_id in a chat; bot and user messages share one sequence (every bot
        of a relayed group too: the chat's ids are the same for all its members)."""
        with self._cond:
            key = ("relay", chat_id) if token in self._relays.get(chat_id, ()) else (token, chat_id)
            next_id = self._next_message_id.get(key, 1)
            message_id = wanted if wanted is not None else next_id
            self._next_message_id[key] = max(next_id, message_id + 1)
            return message_id

    # ------------------------------------------------------------------ files

    def add_file(self, token: str, data: bytes, *, unique_id: str | None = None, trickle: float = 0.0,
                 size: int | None = None) -> dict[str, Any]:
        """A file the bot may fetch (getFile, then GET /file/bot<token>/<file_path>);
        returns the fields a message carries for it. `trickle`: seconds between the
        download's 1 KB pieces. `size`: the file_size getFile reports (a liar, if given)."""
        with self._cond:
            file_id = f"AgAC{len(self._files) + 1:06d}{abs(hash(data)) % 10**8:08d}"
            unique = unique_id or f"AQAD{hashlib.sha1(data).hexdigest()[:12]}"
            self._files[file_id] = {"token": token, "data": data, "unique": unique, "trickle": trickle,
                                    "path": f"documents/file_{len(self._files)}", "size": size}
        return {"file_id": file_id, "file_unique_id": unique, "file_size": len(data) if size is None else size}

    def _api_get_file(self, token: str, params: dict[str, Any]) -> dict[str, Any]:
        file = self._files.get(str(params.get("file_id", "")))
        if file is None or file["token"] != token:
            raise BotAPIError(400, "Bad Request: wrong file_id or the file is temporarily unavailable")
        size = len(file["data"]) if file["size"] is None else file["size"]
        if len(file["data"]) > MAX_DOWNLOAD_BYTES:
            raise BotAPIError(400, "Bad Request: file is too big")
        return {"file_id": params["file_id"], "file_unique_id": file["unique"], "file_size": size,
                "file_path": file["path"]}

    def file_at(self, token: str, path: str) -> tuple[str, dict[str, Any]] | None:
        with self._cond:
            return next(((file_id, f) for file_id, f in self._files.items()
                         if f["token"] == token and f["path"] == path), None)

    # ----------------------------------------------------------- control plane

    def _serve_control(
        self, verb: str, path: str, query: str, body: bytes
    ) -> tuple[int, dict[str, Any]]:
        """/_control/ endpoints, so other processes can script the fake."""
        route = path[len("/_control/") :].strip("/")
        try:
            data = json.loads(body) if body.strip() else {}
            if not isinstance(data, dict):
                raise ValueError("the JSON body must be an object")
            result = self._control_route(verb, route, dict(parse_qsl(query)), data)
        except LookupError:
            return 404, BotAPIError(404, f"Not Found: no control endpoint {verb} {path}").envelope()
        except (TypeError, ValueError) as error:
            return 400, BotAPIError(400, f"Bad Request: {error}").envelope()
        return 200, {"ok": True, "result": result}

    def _control_route(self, verb: str, route: str, query: dict[str, str], data: dict) -> Any:
        if verb == "GET" and route == "calls":
            calls = self.calls(query.get("method") or None, query.get("token") or None)
            return [asdict(call) for call in calls]
        if verb != "POST":
            raise LookupError(route)
        if route.startswith("updates/"):
            token = unquote(route[len("updates/") :])
            if "chat_id" in data:
                return self.push_message(token, **data)
            return self.push_update(token, data)
        if route == "settings":
            if "forget_offsets" in data:
                self.forget_offsets = bool(data["forget_offsets"])
            if "require_known_tokens" in data:
                self.require_known_tokens = bool(data["require_known_tokens"])
            for token in data.get("tokens", []):
                self.add_token(token)
            return True
        actions: dict[str, Callable[..., Any]] = {
            "fail": self.fail_next,
            "drop": self.drop_connection_next,
            "delay": self.delay,
            "clear": self.clear,
            "reset": self.reset,
        }
        if route not in actions:
            raise LookupError(route)
        actions[route](**data)
        return True

class _RequestHandler(TrackedHandler):
    """Turns HTTP requests into FakeBotAPI calls; holds no state of its own."""

    server: FakeBotAPI

    def do_GET(self) -> None:
        self._dispatch()

    do_POST = do_GET


    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        body = self._read_body()
        if url.path.startswith("/_control/"):
            self._send_json(*self.server._serve_control(self.command, url.path, url.query, body))
            return
        download = _FILE_PATH.match(url.path)
        if download is not None:
            self._send_file(unquote(download["token"]), unquote(download["path"]))
            return
        match = _BOT_PATH.match(url.path)
        if match is None:
            self._send_json(404, BotAPIError(404, "Not Found").envelope())
            return
        try:
            params = _parse_params(url.query, self.headers.get("Content-Type", ""), body)
        except ValueError as error:
            self._send_json(400, BotAPIError(400, f"Bad Request: {error}").envelope())
            return
        outcome = self.server._serve_bot_call(unquote(match["token"]), match["method"], params)
        if outcome is None:
            self.close_connection = True  # answer nothing; the socket closes after this
            return
        self._send_json(*outcome)

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _read_chunked(self) -> bytes:
        chunks = []
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                # Skip trailers up to the blank line that ends the body.
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            chunks.append(self.rfile.read(size))
            self.rfile.readline()  # the CRLF after each chunk

    def _send_file(self, token: str, path: str) -> None:
        found = self.server.file_at(token, path)
        if found is None:
            self._send_json(404, BotAPIError(404, "Not Found").envelope())
            return
        file_id, file = found
        with self.server._cond:
            self.server.downloads.append(file_id)
        data = file["data"]
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if not file["trickle"]:
                self.wfile.write(data)
                return
            for start in range(0, len(data), 1024):
                self.wfile.write(data[start:start + 1024])
                self.wfile.flush()
                time.sleep(file["trickle"])
        except OSError:
            self.close_connection = True  # the client gave up

    def _send_json(self, status: int, payload: dict[str, Any]) -> None:
        data = _dumps(payload).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True  # the client gave up waiting; nothing to do


# ----------------------------------------------------------------- helpers


class RawJSON:
    """A JSON literal sent exactly as written."""

    def __init__(self, text: str):
        self.text = text


def _dumps(payload: Any) -> str:
    raws: list[str] = []

    def placeholder(value: Any) -> str:
        if not isinstance(value, RawJSON):
            raise TypeError(f"not JSON serializable: {value!r}")
        raws.append(value.text)
        return f"\x00raw{len(raws) - 1}\x00"

    text = json.dumps(payload, default=placeholder)
    for index, raw in enumerate(raws):
        text = text.replace(json.dumps(f"\x00raw{index}\x00"), raw)
    return text


def _same_method(a: str, b: str) -> bool:
    return a.lower() == b.lower()


def _decode_value(name: str, raw: str) -> Any:
    """python-telegram-bot JSON-encodes every non-string value in form bodies."""
    if name in _STRING_PARAMS:
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _parse_params(query: str, content_type: str, body: bytes) -> dict[str, Any]:
    params = {name: _decode_value(name, value) for name, value in parse_qsl(query, keep_blank_values=True)}
    kind = content_type.split(";")[0].strip().lower()
    if not body.strip():
        return params
    if kind == "application/json":
        data = json.loads(body)
        if not isinstance(data, dict):
            raise ValueError("the JSON body must be an object")
        params.update(data)
    elif kind == "multipart/form-data":
        params.update(_parse_multipart(content_type, body))
    else:
        text = body.decode("utf-8", "replace")
        params.update(
            (name, _decode_value(name, value))
            for name, value in parse_qsl(text, keep_blank_values=True)
        )
    return params


def _parse_multipart(content_type: str, body: bytes) -> dict[str, Any]:
    """Best-effort multipart parsing; files are summarised, not kept."""
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    params: dict[str, Any] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not name:
            continue
        payload = part.get_payload(decode=True) or b""
        filename = part.get_filename()
        if filename is not None:
            params[name] = {
                "filename": filename,
                "content_type": part.get_content_type(),
                "size": len(payload),
                "sha256": hashlib.sha256(payload).hexdigest(),
            }
        else:
            params[name] = _decode_value(name, payload.decode("utf-8", "replace"))
    return params


_BUTTON_ACTIONS = ("callback_data", "url", "switch_inline_query", "switch_inline_query_current_chat",
                   "web_app", "login_url", "callback_game", "pay", "copy_text", "switch_inline_query_chosen_chat")


def _uploaded(part: Any, field: str, limit: int) -> dict[str, Any]:
    """An uploaded file's summary (what the chat shows of it), as Telegram refuses a bad one."""
    if not isinstance(part, dict) or "sha256" not in part:
        raise BotAPIError(400, f"Bad Request: there is no {field} in the request")
    if part["size"] == 0:
        raise BotAPIError(400, "Bad Request: file must be non-empty")
    if part["size"] > limit:
        raise BotAPIError(413, "Request Entity Too Large")
    return {"file_name": part["filename"], "mime_type": part["content_type"], "file_size": part["size"],
            "sha256": part["sha256"], "file_id": f"BQAC{part['sha256'][:24]}"}


def _as_shown(field: str, upload: dict[str, Any]) -> Any:
    """A Message's field for an uploaded file: a photo is its sizes (PhotoSize, one here),
    a document a Document. Our own `sha256` rides along (clients ignore unknown fields)."""
    if field == "photo":
        return [{"file_id": upload["file_id"], "file_unique_id": upload["file_id"][-16:], "width": 64,
                 "height": 64, "file_size": upload["file_size"], "sha256": upload["sha256"]}]
    return {**upload, "file_unique_id": upload["file_id"][-16:]}


def _caption(value: Any) -> str:
    caption = "" if value is None else str(value)
    if len(caption.encode("utf-16-le")) // 2 > 1024:
        raise BotAPIError(400, "Bad Request: message caption is too long")
    return caption


def _check_reply_markup(markup: Any) -> Any:
    """Validate a reply_markup as Telegram does for the parts we model: an inline keyboard
    is rows of buttons, each with a text and exactly one action, callback_data 1-64 bytes."""
    if isinstance(markup, str):
        try:
            markup = json.loads(markup)
        except ValueError:
            raise BotAPIError(400, "Bad Request: can't parse reply keyboard markup JSON object") from None
    if not isinstance(markup, dict):
        raise BotAPIError(400, "Bad Request: can't parse reply keyboard markup JSON object")
    if "inline_keyboard" not in markup:
        return markup  # reply keyboards, force_reply, remove_keyboard: accepted as they are
    rows = markup["inline_keyboard"]
    if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
        raise BotAPIError(400, "Bad Request: field \"inline_keyboard\" of the InlineKeyboardMarkup should be an Array of Arrays")
    for row in rows:
        for button in row:
            if not isinstance(button, dict) or not str(button.get("text") or ""):
                raise BotAPIError(400, "Bad Request: text buttons are unallowed in the inline keyboard")
            actions = [name for name in _BUTTON_ACTIONS if name in button]
            if len(actions) != 1:
                raise BotAPIError(400, "Bad Request: BUTTON_TYPE_INVALID")
            if "callback_data" in button:
                data = str(button["callback_data"]).encode()
                if not 1 <= len(data) <= 64:
                    raise BotAPIError(400, "Bad Request: BUTTON_DATA_INVALID")
    return markup


def _chat_id(params: dict[str, Any]) -> int:
    value = params.get("chat_id")
    if value is None or value == "":
        raise BotAPIError(400, "Bad Request: chat_id is empty")
    try:
        return int(value)
    except (TypeError, ValueError):
        # "@username" chats are not modelled; Telegram says this for unknown ones.
        raise BotAPIError(400, "Bad Request: chat not found") from None


def _reply_target(params: dict[str, Any]) -> int | None:
    reply = params.get("reply_parameters")
    if isinstance(reply, dict) and reply.get("message_id") is not None:
        return int(reply["message_id"])
    if params.get("reply_to_message_id") is not None:
        return int(params["reply_to_message_id"])
    return None


def _as_int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _as_float(value: Any, default: float) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _mention_entities(text: str) -> list[dict[str, Any]]:
    """Telegram's `mention` entities of the @usernames in a text (offsets in UTF-16 code units)."""
    found = []
    for match in re.finditer(r"@[A-Za-z0-9_]{5,32}", text):
        offset = len(text[:match.start()].encode("utf-16-le")) // 2
        found.append({"type": "mention", "offset": offset, "length": len(match.group().encode("utf-16-le")) // 2})
    return found


# ---------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a fake Telegram Bot API server.")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--token", action="append", default=[], help="known token (repeatable)")
    parser.add_argument("--require-known-tokens", action="store_true")
    parser.add_argument("--limits", action="store_true", help="keep Telegram's documented send limits")
    args = parser.parse_args(argv)

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())

    with FakeBotAPI(
        args.port,
        host=args.host,
        tokens=args.token,
        require_known_tokens=args.require_known_tokens,
        limits=Limits() if args.limits else None,
    ) as fake:
        # One line, flushed: whoever started us reads it to learn the port.
        print(fake.url, flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

