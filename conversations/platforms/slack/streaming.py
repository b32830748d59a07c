"""Slack's streamed replies (docs/streaming.md, docs/slack.md): chat.startStream,
chat.appendStream and chat.stopStream. The streamed message *is* the final one.

- **Where**: a DM's thread (the assistant's threads, or a DM conversation per thread):
  a stream needs a thread, and outside DMs Slack asks for the recipient user and team,
  which a reply's target does not carry. Elsewhere no preview: the whole reply at once.
  Whether the workspace offers streaming is learned from the first chat.startStream
  (any refusal but a 429: none for this token for 10 minutes).
- **While the agent writes** the stream is started with the first words and appended to
  at most once a second (delivery.previews), each append the words since the last. What
  was appended is remembered in this process per message (`appended`), and forgotten
  while an append is in flight: an append that may have landed unseen leaves it unknown.
- **The final** is the ledger's (delivery.ledger.sending.send_over_preview calls
  SlackTransport.edit_text): chat.stopStream with the rest of the text when what was
  appended is known and the final begins with it; otherwise (a re-run or a recovery
  after a crash, an append whose outcome is unknown, buttons) the stream is stopped
  and the message replaced by the whole final (chat.update). A failed or unknown final
  edit has the ledger delete the message (chat.delete) before it sends the final
  fresh: never a second unlabelled copy.
- **A 429** on a stream call stops this turn's appends; the final still goes once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from agentloop.core.caches import BoundedCache
from conversations.platforms.slack.blocks import escape, place, question_blocks, token_key
from delivery import chunks
from delivery.models import Outcome
from delivery.previews import CURSOR, Preview, PreviewResult
from delivery.transports import SendResult

if TYPE_CHECKING:
    from delivery.transports import Target

PREVIEW_DEADLINE = 5.0  # seconds for one stream call: a preview never waits long
NOT_STREAMING = "message_not_in_streaming_state"
MAX_PREVIEW_UNITS = 4000  # a streamed message shows at most one message's worth

# ts -> the text appended to that stream so far (before escaping), in this process.
_appended = BoundedCache(maxsize=4096, max_age=3600.0)
# Tokens whose workspace refused chat.startStream lately (token_key -> True).
_unavailable = BoundedCache(maxsize=1024, max_age=600.0)


class StreamSender(Protocol):
    """What streaming needs of the transport it streams through (SlackTransport: this
    module is below it, so it names the transport by what it does)."""

    def setting(self, name: str) -> Any: ...

    async def call(self, method: str, params: dict[str, Any] | None = None, session: Any = None,
                   within: float | None = None) -> Any: ...

    async def delete_message(self, target: Target, message_id: str) -> SendResult: ...


def appended(ts: str) -> str | None:
    """What was appended to stream `ts`, if known here."""
    return _appended.get(ts)


def forget(ts: str) -> None:
    _appended.pop(ts)


def can_stream(transport: StreamSender, target: Target) -> bool:

    channel_id, thread = place(target.chat_id, target.thread_id)
    token = transport.setting("bot_token")
    return bool(token and thread and channel_id.startswith("D") and _unavailable.get(token_key(token)) is None)


class SlackStream(Preview):
    """One turn's streamed message in a DM's thread."""

    is_message = True

    def __init__(self, transport: StreamSender, target: Target, message_id: str = ""):

        self.transport, self.target = transport, target
        self.channel_id, self.thread = place(target.chat_id, target.thread_id)
        self.ts = message_id
        # A stream an earlier run of the turn left (the worker was killed): what it shows
        # is unknown here, so nothing is appended to it; the final replaces its text.
        self.reused = bool(message_id)
        self.sent = ""

    async def show(self, text: str) -> PreviewResult:
        if self.reused:
            return PreviewResult(False, stop=True)
        text = text.removesuffix(CURSOR)
        if chunks.units(text) > MAX_PREVIEW_UNITS:
            text = chunks.split(text, MAX_PREVIEW_UNITS)[0]  # the final, chunked by the ledger, says the rest
        if not text.startswith(self.sent) or text == self.sent:
            return PreviewResult(False)
        delta = text[len(self.sent):]
        if not self.ts:
            return await self._start(delta)
        forget(self.ts)  # in flight: unknown until it is answered
        answer = await self._call("chat_appendStream", {"channel": self.channel_id, "ts": self.ts,
                                                        "markdown_text": _escape(delta)})
        if isinstance(answer, SendResult):
            if answer.outcome in (Outcome.NOT_SENT, Outcome.FLOOD):
                _appended.set(self.ts, self.sent)  # never left, or refused unread: still known
            if answer.outcome == Outcome.NOT_SENT:
                return PreviewResult(False)
            # A 429: appends stop here (the final pays nothing). Anything else may have
            # landed, or not: what the stream shows is unknown, appends stop.
            return PreviewResult(False, flood=answer.outcome == Outcome.FLOOD, stop=True)
        self.sent = text
        _appended.set(self.ts, text)
        return PreviewResult(True, message_id=self.ts)

    async def _start(self, delta: str) -> PreviewResult:

        answer = await self._call("chat_startStream", {"channel": self.channel_id, "thread_ts": self.thread,
                                                       "markdown_text": _escape(delta)})
        if isinstance(answer, SendResult):
            if answer.outcome == Outcome.FLOOD:
                return PreviewResult(False, flood=True)
            if answer.outcome in (Outcome.PERMANENT, Outcome.CHANNEL_BLOCKED):
                # No streaming here (an older workspace, a missing feature or scope): not
                # asked again for a while; the reply goes whole.
                _unavailable.set(token_key(self.transport.setting("bot_token")), True)
            # Not sent: nothing is in the chat. Otherwise a stream may have started unseen:
            # no second one (the final goes as a message of its own).
            return PreviewResult(False, stop=answer.outcome != Outcome.NOT_SENT)
        ts = answer.get("ts") if isinstance(answer.data, dict) else None
        if not ts:
            return PreviewResult(False, stop=True)
        self.ts, self.sent = str(ts), delta
        _appended.set(self.ts, delta)
        return PreviewResult(True, message_id=self.ts)

    async def _call(self, method: str, params: dict):
        return await self.transport.call(method, params, within=PREVIEW_DEADLINE)

    async def discard(self) -> None:
        if self.ts:
            forget(self.ts)
            await self.transport.delete_message(self.target, self.ts)


async def finish(transport: StreamSender, target: Target, ts: str, text: str) -> SendResult:
    """The ledger's final over stream `ts` (SlackTransport.edit_text): stopped with the
    rest of `text` when what it shows is known to begin it, else stopped and replaced
    by `text` whole."""

    channel_id, _ = place(target.chat_id, target.thread_id)
    known = appended(ts)
    stop: dict = {"channel": channel_id, "ts": ts}
    whole = known is None or not text.startswith(known) or bool(target.buttons)
    if not whole and text[len(known or ""):]:
        stop["markdown_text"] = _escape(text[len(known or ""):])
    stopped = await transport.call("chat_stopStream", stop)
    if isinstance(stopped, SendResult) and not _already_stopped(stopped):
        return stopped  # a 429, never sent, refused credentials: the row waits; else the ledger removes it
    if not whole and not isinstance(stopped, SendResult):
        forget(ts)
        return SendResult.delivered(ts)
    params = {"channel": channel_id, "ts": ts, "text": _escape(text)}
    if target.buttons:
        params["blocks"] = question_blocks(text, target.buttons)
    updated = await transport.call("chat_update", params)
    if isinstance(updated, SendResult):
        return updated
    forget(ts)
    return SendResult.delivered(ts)


def _already_stopped(result: SendResult) -> bool:
    """A refusal that says the stream is over already (Slack's timeout, or our own stop
    that landed before a crash): the message can still be replaced."""
    return result.outcome == Outcome.PERMANENT and NOT_STREAMING in result.error


def _escape(text: str) -> str:

    return escape(text)

