"""Sending to Slack with the official slack-sdk's AsyncWebClient: chat.postMessage into
the user's thread, with `Authorization: Bearer <bot token>`, one overall deadline per
call. The SDK's own retry handlers are off (`retry_handlers=[]`): a reply posted twice
77 ms apart by an SDK's HTTP retry is exactly what the ledger exists to prevent; the
ledger decides what is sent again, and whether it is labelled.

Outcomes (an answer's HTTP status and its `error`):

| answer | outcome |
|---|---|
| HTTP 429 (Retry-After) | flood: the bot paused for Retry-After, resent plain (it provably did not land) |
| `ratelimited`, `fatal_error`, `internal_error`, `service_unavailable`, `request_timeout`, any 5xx | temporary |
| `channel_not_found`, `not_in_channel`, `is_archived`, `account_inactive`, `user_not_found`, `cannot_dm_bot` | permanent: the chat is marked unreachable |
| `invalid_auth`, `token_revoked`, `token_expired`, `not_authed` | channel blocked: its replies wait, no attempt spent |
| any other `ok: false` or 4xx | permanent ("rejected: …": the same request cannot succeed) |
| HTTP 2xx that is no Slack answer (a proxy's page) | ambiguous |

No whole answer after the request's headers went out (the deadline, a dropped connection):
ambiguous, resent labelled. Never went out (no connection could be had or made, as
aiohttp's tracing reports it): not sent, resent unlabelled, no attempt spent.

Files in replies: uploaded (files.getUploadURLExternal, the bytes, then
files.completeUploadExternal into the thread); see send_files.
"""

import asyncio
import contextvars
import math

import aiohttp
from django.conf import settings
from slack_sdk.errors import SlackApiError, SlackRequestError
from slack_sdk.web.async_client import AsyncWebClient

from agentloop.core.caches import BoundedCache
from agentloop.core.tls import shared_tls_context
from conversations.platforms.slack import streaming
from conversations.platforms.slack.blocks import SECTION_UNITS, escape, place, question_blocks, token_key  # noqa: F401
from delivery import attachments, chunks
from delivery.models import Outcome
from delivery.pacing import Pace
from delivery.transports import Progress, SendResult, Target, Transport

# chat.postMessage truncates a message over 40,000 characters and Slack asks for at most
# 4,000; a section block's text (a question with buttons) takes 3,000.
MAX_UNITS = 4000
FLOOD_DEFAULT = 30.0  # a 429 without Retry-After
TEMPORARY_ERRORS = {"ratelimited", "fatal_error", "internal_error", "service_unavailable", "request_timeout"}
UNREACHABLE = {
    "channel_not_found": "the channel does not exist or the app cannot see it",
    "not_in_channel": "the app is not a member of the channel (invite it)",
    "is_archived": "the channel is archived",
    "account_inactive": "the account was deactivated",
    "user_not_found": "the user does not exist",
    "cannot_dm_bot": "the recipient is a bot",
}
CREDENTIALS_REFUSED = {"invalid_auth", "token_revoked", "token_expired", "not_authed"}
ASSISTANT_SCOPE = "assistant:write"
STATUS_TEXT = "is thinking…"

# Whether a call's headers went out, for the call running in this task (aiohttp's trace).
_progress: contextvars.ContextVar[Progress | None] = contextvars.ContextVar("slack_progress", default=None)


class SlackAnswer(Exception):
    """A typing call refused (raised: the typing loop logs it once per fault)."""


def deadline() -> float:
    return settings.AGENTLOOP_CALLBACK_TIMEOUT


REACTION_DEADLINE = 5.0  # one reactions.add/remove, all told


class ReactionRefused(Exception):
    """A status reaction Slack refused (best effort: logged by the caller)."""


class SlackTransport(Transport):
    supports_typing = True  # where the app is an assistant (detected per token: is_assistant)
    typing_refresh = 20.0
    max_units = MAX_UNITS

    def setting(self, name):
        return self.channel.setting(name)

    def client(self, session: aiohttp.ClientSession, limit: float) -> AsyncWebClient:
        base = self.setting("api_base").rstrip("/") + "/"
        return AsyncWebClient(token=self.setting("bot_token"), base_url=base, session=session,
                              timeout=math.ceil(limit), ssl=shared_tls_context(), retry_handlers=[])

    async def call(self, method: str, params: dict | None = None, session=None, within: float | None = None):
        """One Web API call (`method`: the SDK's, e.g. "chat_postMessage") under one
        overall deadline (`within`, else the callback timeout): its response, or the
        failed SendResult."""
        limit = within or deadline()
        progress = Progress()
        token = _progress.set(progress)
        try:
            return await asyncio.wait_for(getattr(self.client(session or web_session(), limit), method)(**(params or {})),
                                          limit)
        except SlackApiError as exc:
            return self.outcome(exc.response)
        except (TimeoutError, aiohttp.ClientError, SlackRequestError, OSError) as exc:
            host = self.setting("api_base").split("/")[2]
            if not progress.sent:
                return self.failed(Outcome.NOT_SENT, f"{type(exc).__name__} before the request went out to {host}")
            return self.failed(Outcome.AMBIGUOUS, f"{type(exc).__name__}: {host} gave no answer within {limit:g} s")
        finally:
            _progress.reset(token)

    def outcome(self, response) -> SendResult:
        """A refusal's outcome (see the module's table)."""
        status = response.status_code
        data = response.data if isinstance(response.data, dict) else {}
        code = str(data.get("error") or "")
        said = f"HTTP {status}" + (f": {code}" if code else "")
        if status == 429:
            wait = response.headers.get("Retry-After")
            try:
                seconds = float(wait) if wait is not None else FLOOD_DEFAULT
            except ValueError:
                seconds = FLOOD_DEFAULT
            return self.failed(Outcome.FLOOD, f"rate limited, Retry-After {wait}: {said}", seconds)
        if status < 300 and not code:
            # Something answered 200 without a Slack answer (a proxy's page): the request
            # reached a server, and whether Slack acted on it is unknown.
            return self.failed(Outcome.AMBIGUOUS, f"{said} without a Slack answer: it may have been sent")
        if code in CREDENTIALS_REFUSED:
            return self.failed(Outcome.CHANNEL_BLOCKED, f"the bot token was refused (replace it): {said}")
        if code in UNREACHABLE:
            return self.failed(Outcome.PERMANENT, f"{UNREACHABLE[code]} — {said}")
        if code in TEMPORARY_ERRORS or status >= 500 or status == 408:
            return self.failed(Outcome.TEMPORARY, said)
        return self.failed(Outcome.PERMANENT, f"rejected: {said}")

    async def send_text(self, target: Target, text: str) -> SendResult:
        if not self.setting("bot_token"):
            return self.failed(Outcome.TEMPORARY, "refused: the channel has no bot token")
        channel_id, thread = place(target.chat_id, target.thread_id)
        # The ledger sends a long reply chunk by chunk (delivery.chunks); this split only
        # guards a text that reaches the transport whole. Every chunk goes to the thread.
        pieces = chunks.split(text, MAX_UNITS)
        result = SendResult.delivered()
        for index, piece in enumerate(pieces):
            params = {"channel": channel_id, "text": escape(piece), "unfurl_links": False, "unfurl_media": False}
            if thread:
                params["thread_ts"] = thread
            if target.buttons and index == len(pieces) - 1:
                params["blocks"] = question_blocks(piece, target.buttons)
            response = await self.call("chat_postMessage", params)
            if isinstance(response, SendResult):
                return response
            ts = response.get("ts") if isinstance(response.data, dict) else None
            if not ts:
                return self.failed(Outcome.AMBIGUOUS, "chat.postMessage answered ok without a ts: it may have been sent")
            result = SendResult.delivered(ts)
        return result

    async def send_files(self, target: Target, files: list, caption: str) -> SendResult:
        """One file, Slack's way: files.getUploadURLExternal (an upload URL and a file id),
        the bytes POSTed to that URL, then files.completeUploadExternal shares it into
        the chat's thread with `caption` as its comment. The first two show the user
        nothing: if either fails or never answers, nothing has left (not sent, resent
        unlabelled); only the completion can be ambiguous."""
        if not self.setting("bot_token"):
            return self.failed(Outcome.TEMPORARY, "refused: the channel has no bot token")
        item = files[0]
        try:
            data = await asyncio.to_thread(attachments.read, item.file)
        except OSError as exc:
            return self.failed(Outcome.TEMPORARY, f"the file could not be read from storage: {type(exc).__name__}")
        file_id = await self._upload(item, data)
        if isinstance(file_id, SendResult):
            return file_id
        channel_id, thread = place(target.chat_id, target.thread_id)
        params = {"files": [{"id": file_id, "title": item.name}], "channel_id": channel_id,
                  **({"thread_ts": thread} if thread else {}),
                  **({"initial_comment": escape(caption)} if caption.strip() else {})}
        response = await self.call("files_completeUploadExternal", params)
        return response if isinstance(response, SendResult) else SendResult.delivered(file_id)

    async def _upload(self, item, data: bytes) -> str | SendResult:
        """The uploaded file's id, or the failed SendResult (never ambiguous: an upload
        that is not completed shows nothing to anyone)."""
        asked = await self.call("files_getUploadURLExternal", {"filename": item.name, "length": len(data)})
        if isinstance(asked, SendResult):
            return self._not_shared(asked)
        url, file_id = asked.get("upload_url"), asked.get("file_id")
        if not url or not file_id:
            return self.failed(Outcome.NOT_SENT, "files.getUploadURLExternal answered without an upload URL")
        try:
            async with web_session().post(url, data=data, timeout=aiohttp.ClientTimeout(total=deadline())) as answer:
                if answer.status >= 300:
                    return self.failed(Outcome.NOT_SENT, f"the upload answered HTTP {answer.status}; nothing shared")
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return self.failed(Outcome.NOT_SENT, f"the upload failed ({type(exc).__name__}); nothing shared")
        return str(file_id)

    def _not_shared(self, result: SendResult) -> SendResult:
        """A refusal before anything was shared: its own outcome where it says something
        about the chat or the token, else not sent."""
        if result.outcome in (Outcome.FLOOD, Outcome.CHANNEL_BLOCKED, Outcome.PERMANENT):
            return result
        return self.failed(Outcome.NOT_SENT, f"no upload URL, nothing shared: {result.error}")

    def pace(self, chat_id: str) -> Pace | None:
        """The workspace's bot, and about one message a second into one Slack channel."""
        return self.paced(f"slack:{token_key(self.setting('bot_token'))}", place(chat_id, "")[0],
                          float(self.setting("chat_interval") or 0))

    # --- status reactions (conversations/worker/reactions.py); reactions:write ------------
    status_reactions = ("eyes", "white_check_mark")

    async def set_reaction(self, target: Target, message_id: str, emoji: str, previous: str = "") -> None:
        """reactions.remove the one we put there, then reactions.add the new one (Slack
        keeps each name apart). Our own already there, or already gone, is what we want."""
        channel_id = place(target.chat_id, "")[0]
        if previous:
            await self._reaction("reactions_remove", channel_id, message_id, previous, fine="no_reaction")
        if emoji:
            await self._reaction("reactions_add", channel_id, message_id, emoji, fine="already_reacted")

    async def _reaction(self, method, channel_id, ts, name, fine):
        response = await self.call(method, {"channel": channel_id, "timestamp": ts, "name": name},
                                   within=REACTION_DEADLINE)
        if isinstance(response, SendResult) and fine not in response.error:
            raise ReactionRefused(f"{method}: {response.error}")

    # --- streamed replies (streaming.py, docs/streaming.md) -----------------------------

    def preview_for(self, target: Target, turn_id: int, message_id: str = ""):
        """A stream (chat.startStream) in a DM's thread, where the workspace offers it;
        `message_id`: a stream an earlier run of the turn left (its final replaces it)."""
        if not message_id and not streaming.can_stream(self, target):
            return None
        return streaming.SlackStream(self, target, message_id)

    async def edit_text(self, target: Target, message_id: str, text: str) -> SendResult:
        """The final over a streamed message: the stream stopped with it (streaming.finish)."""
        return await streaming.finish(self, target, message_id, text)

    async def delete_message(self, target: Target, message_id: str) -> SendResult:
        """chat.delete; delivered also when the message is gone already."""
        streaming.forget(message_id)
        answer = await self.call("chat_delete", {"channel": place(target.chat_id, "")[0], "ts": message_id})
        if isinstance(answer, SendResult) and "message_not_found" not in answer.error:
            return answer
        return SendResult.delivered(message_id)

    # --- typing: the assistant thread's status ------------------------------------------------

    async def send_typing(self, target: Target) -> None:
        """An AI assistant app shows "is thinking…" in its thread (cleared by our reply);
        any other app has no typing indicator, and nothing is sent."""
        channel_id, thread = place(target.chat_id, target.thread_id)
        if not thread or not self.setting("bot_token") or not await self.is_assistant():
            return
        result = await self.call("assistant_threads_setStatus",
                                 {"channel_id": channel_id, "thread_ts": thread, "status": STATUS_TEXT})
        if isinstance(result, SendResult):
            raise SlackAnswer(result.error)

    async def is_assistant(self) -> bool:
        """Whether the token carries the assistant:write scope, read from auth.test's
        X-OAuth-Scopes header (asked once per token and 10 minutes)."""
        key = token_key(self.setting("bot_token"))
        known = _assistants.get(key)
        if known is None:
            response = await self.call("auth_test")
            if isinstance(response, SendResult):
                raise SlackAnswer(f"auth.test: {response.error}")
            scopes = {s.strip() for s in str(response.headers.get("X-OAuth-Scopes") or "").split(",")}
            known = _assistants.set(key, ASSISTANT_SCOPE in scopes)
        return known


_assistants = BoundedCache(maxsize=1024, max_age=600.0)


# --- the HTTP session ---------------------------------------------------------------------------

async def _headers_sent(session, context, params):
    progress = _progress.get()
    if progress is not None:
        progress.sent = True


def new_session() -> aiohttp.ClientSession:
    trace = aiohttp.TraceConfig()
    trace.on_request_headers_sent.append(_headers_sent)
    return aiohttp.ClientSession(trace_configs=[trace], connector=aiohttp.TCPConnector(ssl=shared_tls_context()))


# One session per event loop (an aiohttp session must not cross loops), shared by every
# Slack channel of the process: connections to the Web API are kept alive between replies.
_sessions = BoundedCache(maxsize=16)


def web_session() -> aiohttp.ClientSession:
    loop = asyncio.get_running_loop()
    held = _sessions.get(id(loop))
    if held is None or held[0] is not loop or held[1].closed:
        held = _sessions.set(id(loop), (loop, new_session()))
    return held[1]


async def close_clients():
    """Close this event loop's session (the worker's shutdown, a safety sweep's end)."""
    held = _sessions.pop(id(asyncio.get_running_loop()))
    if held is not None:
        await held[1].close()


def call_now(channel, method: str, params: dict, within: float):
    """One Web API call from synchronous code (a webhook's thread, a database thread), on
    an event loop and a session of its own: the response or the failed SendResult."""

    async def once():
        async with new_session() as session:
            return await SlackTransport(channel).call(method, params, session, within)

    return asyncio.run(once())
