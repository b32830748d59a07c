"""A conversation's replies as they are written (an api channel without a callback):
Server-Sent Events. `GET /api/v1/conversations/<id>/stream`.

The stream sends, as they come:

- `event: delta` — a turn's text as the agent writes it (`{"turn", "offset", "text"}`:
  `text` goes at `offset` of that turn's text so far; `offset` 0 after a gap starts it
  over). Best effort and never stored: published by the worker through
  agentloop.core.live (the channel layer with Redis, the `LiveEvent` table without),
  only while a stream listens. `event: cancelled` — the turn's deltas are void (an
  interrupting message, /reset).
- `event: inbound` / `event: reply` — the conversation's items after the cursor, exactly
  as the read API shows them (conversations.api.reading), each with `id:` the cursor
  after it (a reconnecting client passes it as `after`, or as `Last-Event-ID`). The
  reply is the ledger row: the deltas were only its preview.
- `: keep-alive` comments every AGENTLOOP_SSE_HEARTBEAT seconds, and at the end
  `event: end` (`{"next"}`) — after the first reply, or when `wait` runs out.

Bounded: AGENTLOOP_MAX_STREAMS_PER_KEY streams open per agent key (429 beyond, with
Retry-After) and the process's long-poll cap (503 beyond). An open stream holds a
socket and a task, no thread and no database connection between its checks.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.http import HttpResponse, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, serializers  # type: ignore[import-untyped]  # DRF ships no types
from rest_framework.renderers import JSONRenderer  # type: ignore[import-untyped]

from agentloop.core import live
from agentloop.core.api import ErrorSerializer, query_of
from agentloop.core.live_reader import GroupReader
from conversations import timeline
from conversations.api.access import conversation_for_key
from conversations.api.reading import (
    AsyncGetView,
    CursorField,
    LongPolls,
    TimelineItemSerializer,
    _in_db_thread,
    _item,
    _release_request_thread,
)

if TYPE_CHECKING:
    from rest_framework.request import Request  # type: ignore[import-untyped]

    from agentloop.core.live import Event
    from conversations.models import Conversation
    from conversations.timeline import Cursor

PAGE = 50  # items read per check


class ConversationStreamQuery(serializers.Serializer):  # type: ignore[misc]  # DRF's classes are Any here
    after = CursorField(required=False, help_text="An opaque cursor (a `next`, or an event's `id`): items after it. "
                                                  "Omitted: from the conversation's start.")
    wait = serializers.FloatField(min_value=1, max_value=300, default=60,
                                  help_text="The stream ends after this many seconds (an `end` event), or after "
                                            "the first reply.")


class TooManyStreams(exceptions.Throttled):  # type: ignore[misc]
    default_detail = "too many streams open for this agent key; close one or retry after the Retry-After seconds"


class Streams:
    """Open streams per agent key, in this process (AGENTLOOP_MAX_STREAMS_PER_KEY)."""

    open: dict[int, int] = {}

    @classmethod
    def enter(cls, key_id: int) -> Callable[[], None]:
        """A slot for a stream of this key: its `leave`, to call once (more is harmless)."""
        if cls.open.get(key_id, 0) >= settings.AGENTLOOP_MAX_STREAMS_PER_KEY:
            raise TooManyStreams(wait=2)
        LongPolls.enter()  # the process's own cap (503)
        cls.open[key_id] = cls.open.get(key_id, 0) + 1
        held = [True]

        def leave() -> None:
            if held.pop() if held else False:
                LongPolls.leave()
                cls.open[key_id] -= 1
                if not cls.open[key_id]:
                    del cls.open[key_id]

        return leave


class EventStream(StreamingHttpResponse):
    """The response gives its stream's slot back when Django closes it, whether or not
    its events were ever iterated (a client gone before the first)."""

    def __init__(self, events: AsyncIterator[bytes], leave: Callable[[], None]) -> None:
        super().__init__(events, content_type="text/event-stream")
        self.leave = leave
        self["Cache-Control"] = "no-store"
        self["X-Accel-Buffering"] = "no"  # a proxy passes events on as they come

    def close(self) -> None:
        self.leave()
        super().close()


def event(name: str, data: Any, event_id: str = "") -> bytes:  # data: JSON
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {name}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


class Deltas:
    """A turn's text so far as this stream sent it: each preview (the whole text) becomes
    the part the client has not seen."""

    def __init__(self) -> None:
        self.sent: dict[int | None, str] = {}  # by the event's turn id

    def events(self, published: Event) -> list[bytes]:
        turn, kind = published.get("turn"), published.get("kind")
        if kind == "cancelled":
            self.sent.pop(turn, None)
            return [event("cancelled", {"turn": turn})]
        if kind != "delta" or not isinstance(published.get("text"), str):
            return []
        text, before = published["text"], self.sent.get(turn, "")
        offset = len(before) if text.startswith(before) else 0
        self.sent[turn] = text
        return [event("delta", {"turn": turn, "offset": offset, "text": text[offset:]})] if text[offset:] else []


class ConversationStreamView(AsyncGetView):
    """An async view under Daphne (as the long-poll, ConversationMessagesView)."""

    def perform_content_negotiation(self, request: Request, force: bool = False) -> tuple[Any, str]:
        """The events are not DRF's to render; an error answer is JSON, whatever the
        client accepts (`text/event-stream`, usually)."""
        return JSONRenderer(), JSONRenderer.media_type

    @extend_schema(
        parameters=[ConversationStreamQuery],
        responses={(200, "text/event-stream"): OpenApiResponse(
                       OpenApiTypes.STR, description="Server-Sent Events: `delta` (a turn's text as it is written, "
                                                     "best effort), `inbound` and `reply` (timeline items, as `GET "
                                                     "…/messages` shows them, each `id:` a cursor), `cancelled`, "
                                                     "`end` (`{\"next\": cursor}`); `: keep-alive` comments."),
                   400: ErrorSerializer, 401: ErrorSerializer, 403: ErrorSerializer, 404: ErrorSerializer,
                   429: ErrorSerializer, 503: ErrorSerializer},
        summary="Watch a conversation's replies being written (Server-Sent Events)",
        description="For an api channel without a callback URL. The turn's text deltas as the agent writes them, "
                    "then the reply row exactly as the read API shows it; the stream ends after that reply (or "
                    "after `wait` seconds). Deltas are a preview, never stored: the reply row is the answer. "
                    "429 (Retry-After): too many streams open for this key. 503: too many waiting on this server.")
    async def get(self, request: Request, conversation: int) -> HttpResponse | EventStream:
        query, found, cursor = await _in_db_thread(self._open, request, conversation)
        if request.method == "HEAD":  # the headers a stream would have, and no stream
            return HttpResponse(content_type="text/event-stream", headers={"Cache-Control": "no-store"})
        leave = Streams.enter(request.user.pk)
        _release_request_thread()
        return EventStream(self._events(found.pk, cursor, query["wait"], leave), leave)

    def _open(self, request: Request, conversation: int) -> tuple[dict[str, Any], Conversation, Cursor]:
        self.initial(request)  # authentication, permissions, throttling
        incoming = ConversationStreamQuery(data=query_of(request))
        incoming.is_valid(raise_exception=True)
        query = incoming.validated_data
        after = query.get("after") or request.headers.get("Last-Event-ID", "")
        try:
            cursor = timeline.Cursor.decode(after)
        except timeline.BadCursor as exc:
            raise exceptions.ValidationError({"after": [str(exc)]}) from None
        return query, conversation_for_key(request.user, conversation), cursor

    async def _events(self, conversation_id: int, cursor: Cursor, wait: float,
                      leave: Callable[[], None]) -> AsyncIterator[bytes]:
        try:
            async with GroupReader(live.api_stream_group(conversation_id)) as reader:
                async for chunk in self._watch(reader, conversation_id, cursor, wait):
                    yield chunk
        finally:
            leave()

    @staticmethod
    async def _watch(reader: GroupReader, conversation_id: int, cursor: Cursor, wait: float) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        beat_at, deltas = loop.time(), Deltas()
        yield b": stream open\n\n"  # the headers and a first byte now: the client knows it is listening
        pause = LongPolls.FIRST_PAUSE
        while (left := deadline - loop.time()) > 0:
            items, after = await _in_db_thread(timeline.read, conversation_id, cursor, PAGE)
            for item in items:
                shown = TimelineItemSerializer(_item(item)).data
                yield event(shown["kind"], shown, after.encode() if item is items[-1] else "")
            cursor = after
            if any(item["kind"] == "reply" for item in items):
                break
            published = await reader.read(min(pause, left))
            for chunk in (c for p in published for c in deltas.events(p)):
                yield chunk
            # Deltas mean a reply is near: look at the ledger often; quiet: back off.
            pause = LongPolls.FIRST_PAUSE if published else min(pause * 2, LongPolls.LAST_PAUSE)
            if loop.time() - beat_at >= settings.AGENTLOOP_SSE_HEARTBEAT:
                beat_at = loop.time()
                yield b": keep-alive\n\n"
        yield event("end", {"next": cursor.encode()}, cursor.encode())
