"""Reading a conversation (an api channel without a callback: the app reads its replies),
long-polled."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import SyncToAsync
from channels.db import database_sync_to_async
from django.conf import settings
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import exceptions, serializers, status  # type: ignore[import-untyped]  # DRF ships no types
from rest_framework.response import Response  # type: ignore[import-untyped]
from rest_framework.views import APIView  # type: ignore[import-untyped]

from agentloop.core.api import (
    ErrorSerializer,
    query_of,
)
from conversations import timeline
from conversations.api.access import conversation_for_key
from conversations.models import Disposition
from conversations.timeline import MAX_CURSOR_CHARS
from delivery.models import OutboundKind, OutboundState

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponseBase
    from rest_framework.request import Request  # type: ignore[import-untyped]

    from conversations.models import Conversation
    from conversations.timeline import Cursor, Item

T = TypeVar("T")


@extend_schema_field({"type": "string", "format": "cursor"})
class CursorField(serializers.Field):  # type: ignore[misc]  # DRF's classes are Any here
    """An opaque cursor: the `next` of an earlier answer, passed back as it was given. Its
    format, `cursor`, is ours, and the schema says no more of it: its spelling (base64url,
    at most MAX_CURSOR_CHARS) is not a promise, and any other string is refused (400)."""

    SPELLING = re.compile(r"[A-Za-z0-9_-]*")

    def to_internal_value(self, data: object) -> str:
        if not isinstance(data, str) or len(data) > MAX_CURSOR_CHARS or not self.SPELLING.fullmatch(data):
            raise serializers.ValidationError("not a cursor this API returned")
        return data


class ConversationMessagesQuery(serializers.Serializer):  # type: ignore[misc]  # DRF's classes are Any here
    after = CursorField(
        required=False,
        help_text="An opaque cursor: the `next` of an earlier answer. Omitted or empty: from the conversation's start.")
    limit = serializers.IntegerField(min_value=1, max_value=200, default=50, help_text="Items per page.")
    wait = serializers.FloatField(
        min_value=0, max_value=30, default=0,
        help_text="Long-poll: when nothing is after the cursor, wait up to this many seconds for a new item "
                  "(answered as soon as one exists; an empty page with the same cursor when the wait ends).")


class TimelineItemSerializer(serializers.Serializer):  # type: ignore[misc]
    kind = serializers.ChoiceField(["inbound", "reply"], help_text="inbound: the user's message; reply: an outbound row "
                                                                   "of the delivery ledger.")
    id = serializers.IntegerField(help_text="The row id (unique per kind).")
    text = serializers.CharField(allow_blank=True)
    time = serializers.DateTimeField(help_text="When it was received (inbound) or written down (reply).")
    message_id = serializers.CharField(allow_null=True, help_text="inbound: the `message_id` it was POSTed with.")
    disposition = serializers.ChoiceField(Disposition.values, allow_null=True,
                                          help_text="inbound: what became of it.")
    media_type = serializers.CharField(allow_null=True, allow_blank=True, help_text="inbound: its media type, if any.")
    deleted_at = serializers.DateTimeField(allow_null=True, help_text="inbound: when the user deleted it on their "
                                                                      "side (its text is kept out of later prompts).")
    reply_kind = serializers.ChoiceField(OutboundKind.values, allow_null=True,
                                         help_text="reply: an agent reply, a control command's answer or a notice.")
    state = serializers.ChoiceField(OutboundState.values, allow_null=True,
                                    help_text="reply: its ledger state when read (an api channel without a callback "
                                              "URL is `delivered` once the worker has recorded it).")
    recovered = serializers.BooleanField(allow_null=True, help_text="reply: its last send was labelled a possible "
                                                                    "duplicate (♻️ Recovered reply).")
    attempts = serializers.IntegerField(allow_null=True, help_text="reply: sends started.")
    delivered_at = serializers.DateTimeField(allow_null=True)


class TimelinePageSerializer(serializers.Serializer):  # type: ignore[misc]
    conversation = serializers.IntegerField()
    items = TimelineItemSerializer(many=True, help_text="Oldest first. A row committed late (rare) comes in a later "
                                                        "page than rows newer than it; none twice, none skipped.")
    next = serializers.CharField(help_text="The cursor to pass as `after` next time; the same one when the page is "
                                           "empty, so a client keeps polling from where it is.")


class TooManyWaiting(exceptions.APIException):  # type: ignore[misc]
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "too many long-polls waiting on this server; retry after the Retry-After seconds"
    wait = 2  # seconds, sent as Retry-After by DRF's exception handler


class LongPolls:
    """The long-polls waiting in this process (one event loop), bounded by
    AGENTLOOP_MAX_LONG_POLLS: a waiting request holds a socket and a small task, no
    thread and no database connection."""

    FIRST_PAUSE = 0.05  # seconds between checks, doubling up to LAST_PAUSE
    LAST_PAUSE = 0.5
    waiting = 0

    @classmethod
    def enter(cls) -> None:
        if cls.waiting >= settings.AGENTLOOP_MAX_LONG_POLLS:
            raise TooManyWaiting()
        cls.waiting += 1

    @classmethod
    def leave(cls) -> None:
        cls.waiting -= 1


def _in_db_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> Awaitable[T]:
    """Run a database step in the loop's shared thread pool, its connection closed (or
    returned to the pool) afterwards as CONN_MAX_AGE / DATABASE_POOL say: a waiting
    long-poll holds neither a thread nor a connection between its checks."""
    step: Awaitable[T] = database_sync_to_async(fn, thread_sensitive=False)(*args, **kwargs)  # channels: untyped
    return step


def _release_request_thread() -> None:
    """Django's middleware steps ran in a thread of this request's own (asgiref gives
    each request context a one-thread executor, shut down when the request ends): it
    would sit idle for the whole wait, a thread per waiting client. Shut it down now;
    the response's middleware steps start a fresh one. (An executor a caller supplied
    to the context is theirs: left alone.)"""
    # asgiref internals (3.13): another version without them keeps the idle thread, and
    # tests/end_to_end/test_api_read.py's thread count says so.
    contexts, executors = (getattr(SyncToAsync, "thread_sensitive_context", None),
                           getattr(SyncToAsync, "context_to_thread_executor", None))
    context = contexts.get(None) if contexts is not None else None
    if context is None or executors is None or getattr(context, "_executor", None) is not None:
        return
    executor = executors.pop(context, None)
    if executor is not None:
        executor.shutdown(wait=False)


class AsyncGetView(APIView):  # type: ignore[misc]  # DRF's classes are Any here
    """APIView.dispatch for an async `get`: DRF's request handling is synchronous, so the
    view's `get` runs its database parts (authentication) in a thread itself; other
    methods go through DRF as usual, in the thread pool. Shared by the long poll and the
    event stream."""

    async def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if request.method not in ("GET", "HEAD"):
            response = await _in_db_thread(super().dispatch, request, *args, **kwargs)
            rendered: HttpResponseBase = response.render()
            return rendered
        self.args, self.kwargs = args, kwargs
        request = self.initialize_request(request, *args, **kwargs)
        self.request, self.headers = request, self.default_response_headers
        try:
            response = await self.get(request, *args, **kwargs)
        except Exception as exc:
            response = self.handle_exception(exc)
        self.response = self.finalize_response(request, response, *args, **kwargs)
        # Rendered here, not in a thread Django would take for it; a stream is iterated by Django.
        final: HttpResponseBase = self.response.render() if hasattr(self.response, "render") else self.response
        return final


class ConversationMessagesView(AsyncGetView):
    """An async view under Daphne: the long-poll sleeps on the event loop between cheap
    checks (two indexed queries each, 50 ms doubling to 500 ms: about 65 checks in a
    30 s wait), each check a short step in the shared thread pool."""

    @extend_schema(
        parameters=[ConversationMessagesQuery],
        responses={200: TimelinePageSerializer, 400: ErrorSerializer, 401: ErrorSerializer, 403: ErrorSerializer,
                   404: ErrorSerializer, 429: ErrorSerializer, 503: ErrorSerializer},
        summary="Read a conversation: inbound messages and replies in order, paginated, with long-poll",
        description="The conversation id is the `conversation` of the answer to "
                    "`POST /api/v1/channels/{slug}/messages`. Replies carry their delivery-ledger state. "
                    "Page with `after` = the previous answer's `next` (opaque). With `wait`, an empty page waits "
                    "for the next item. 404: no such conversation in the key's channels (a conversation of "
                    "another channel is not found either). 400: a bad cursor, `limit` outside 1–200, `wait` "
                    "outside 0–30. 503 (with Retry-After): too many long-polls waiting on this server.")
    async def get(self, request: Request, conversation: int) -> Response:
        query, found, items, cursor = await _in_db_thread(self._first_read, request, conversation)
        if not items and query["wait"] > 0:
            items, cursor = await self._wait(found.pk, cursor, query["limit"], query["wait"])
        return Response(TimelinePageSerializer({
            "conversation": found.pk, "items": [_item(i) for i in items], "next": cursor.encode()}).data)

    def _first_read(self, request: Request,
                    conversation: int) -> tuple[dict[str, Any], Conversation, list[Item], Cursor]:
        self.initial(request)  # authentication, permissions, throttling: database work, here
        incoming = ConversationMessagesQuery(data=query_of(request))
        incoming.is_valid(raise_exception=True)
        query = incoming.validated_data
        try:
            cursor = timeline.Cursor.decode(query.get("after", ""))
        except timeline.BadCursor as exc:
            raise exceptions.ValidationError({"after": [str(exc)]}) from None
        found = conversation_for_key(request.user, conversation)
        items, cursor = timeline.read(found.pk, cursor, query["limit"])
        return query, found, items, cursor

    @staticmethod
    async def _wait(conversation_id: int, cursor: Cursor, limit: int, wait: float) -> tuple[list[Item], Cursor]:
        LongPolls.enter()
        _release_request_thread()
        try:
            loop = asyncio.get_running_loop()
            deadline, pause = loop.time() + wait, LongPolls.FIRST_PAUSE
            while (left := deadline - loop.time()) > 0:
                await asyncio.sleep(min(pause, left))
                pause = min(pause * 2, LongPolls.LAST_PAUSE)
                items, after = await _in_db_thread(timeline.read, conversation_id, cursor, limit)
                if items:
                    return items, after
            return [], cursor
        finally:
            LongPolls.leave()



def _item(item: Item) -> Item:
    blank = {"message_id": None, "disposition": None, "media_type": None, "deleted_at": None, "reply_kind": None,
             "state": None,
             "recovered": None, "attempts": None, "delivered_at": None}
    return {**blank, **{k: v for k, v in item.items() if k != "position"}}
