"""REST API for external agents (agent keys; DRF): messages into api channels, turns,
conversation reads. The tools behind the action guard are in tools/api.py."""

import logging
import re

from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from agentloop.core.api import (
    NO_NUL,
    NOT_BLANK,
    ErrorSerializer,
    StrictBody,
    UtcDateTimeField,
    query_of,
    row_id,
)
from conversations import edits
from conversations.ingest import Inbound, Unstorable, admit
from conversations.models import Channel, Disposition, EditOutcome, InboundMessage
from conversations.platforms.api import KIND as API_KIND
from conversations.timeline import MAX_CURSOR_CHARS
from delivery.models import OutboundKind, OutboundState

log = logging.getLogger(__name__)


def channel_for_key(key, slug, kind=None):
    channel = get_object_or_404(Channel, slug=slug, is_active=True)
    if not key.channels.filter(pk=channel.pk).exists():
        raise exceptions.PermissionDenied(f"this agent key has no access to channel '{slug}'")
    if kind and channel.kind != kind:
        raise exceptions.ValidationError({"channel": f"'{slug}' is a {channel.kind} channel, not {kind}"})
    return channel


def conversation_for_key(key, conversation_id):
    """The conversation, if it is in one of the key's channels; 404 otherwise (another
    agent's conversations do not exist as far as this key is concerned)."""
    from conversations.models import Conversation

    conversation = Conversation.objects.select_related("channel", "contact").filter(
        pk=row_id(conversation_id, "conversation"), channel__agent_keys=key).first()
    if conversation is None:
        raise exceptions.NotFound(f"no conversation {conversation_id}")
    return conversation


# A message id is stored twice (platform_message_id, and reply_target for threading): as
# long as the shorter column.
MESSAGE_ID_CHARS = min(InboundMessage._meta.get_field(name).max_length
                       for name in ("platform_message_id", "reply_target"))


class InboundMessageSerializer(StrictBody):
    # The schema's own words for the rule `validate` enforces.
    schema_extra = {"anyOf": [{"required": ["text"], "properties": {"text": {"pattern": NOT_BLANK}}},
                              {"required": ["media_type"]}]}

    message_id = serializers.CharField(max_length=MESSAGE_ID_CHARS)
    contact = serializers.CharField(max_length=100)
    text = serializers.CharField(allow_blank=True, default="", max_length=20000, trim_whitespace=False,
                                 help_text="Required, and not blank, unless the message has a `media_type`.")
    chat = serializers.CharField(max_length=100, required=False)
    sender_name = serializers.CharField(max_length=200, required=False, default="")
    media_type = serializers.CharField(max_length=30, required=False, default="")
    is_group = serializers.BooleanField(required=False, default=False)

    def validate(self, data):
        if not data["text"].strip() and not data["media_type"]:
            raise serializers.ValidationError({"text": "a message needs text or a media_type"})
        return data


class AdmissionSerializer(serializers.Serializer):
    duplicate = serializers.BooleanField()
    conversation = serializers.IntegerField(allow_null=True)
    message = serializers.IntegerField(allow_null=True)
    disposition = serializers.CharField()
    flush_at = serializers.DateTimeField(allow_null=True)
    flush_in = serializers.FloatField(allow_null=True, help_text="Seconds until the buffer flushes.")
    flush_reason = serializers.CharField(help_text="Planned: window, max_wait, max_messages, media.")
    window = serializers.CharField(help_text="Which window the message got: closed, greeting, open, neutral.")


class ChannelMessagesView(APIView):
    @extend_schema(request=InboundMessageSerializer,
                   responses={202: AdmissionSerializer, 403: ErrorSerializer},
                   summary="Send a user's message into an api channel (buffered into the next turn)",
                   description="403: the key has no access to the channel. 404: no active channel by that slug. "
                               "400: an invalid body, or the channel is not an `api` channel.")
    def post(self, request, slug):
        channel = channel_for_key(request.user, slug, API_KIND)
        incoming = InboundMessageSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        data = incoming.validated_data
        try:
            admission = admit(channel, Inbound(
                platform_message_id=data["message_id"], chat_id=data.get("chat") or data["contact"],
                sender_id=data["contact"], text=data["text"], sender_name=data["sender_name"],
                media_type=data["media_type"], is_group=data["is_group"], reply_target=data["message_id"],
            ))
        except Unstorable as exc:
            raise exceptions.ParseError(f"message refused: {exc}") from None
        flush_in = None
        if admission.flush_at is not None:
            flush_in = round(max(0.0, (admission.flush_at - timezone.now()).total_seconds()), 3)
        body = {
            "duplicate": admission.duplicate, "conversation": admission.conversation_id,
            "message": admission.message_id, "disposition": admission.disposition or "duplicate",
            "flush_at": admission.flush_at, "flush_in": flush_in,
            "flush_reason": admission.planned_reason, "window": admission.window_kind,
        }
        return Response(AdmissionSerializer(body).data, status=status.HTTP_202_ACCEPTED)


class MessageEditSerializer(StrictBody):
    # `text` is required although the method is PATCH (an edit replaces the whole text):
    # never partial, for DRF and for the schema (drf-spectacular marks a PATCH body's
    # serializer partial, which would show every field optional).
    @property
    def partial(self):
        return False

    @partial.setter
    def partial(self, value):
        pass

    text = serializers.CharField(allow_blank=True, max_length=20000, trim_whitespace=False,
                                 help_text="The corrected text (as long as a new message may be).")
    edited_at = UtcDateTimeField(
        required=False, help_text="When the user edited it. An edit is applied once per (message, edited_at): "
                                  "send it to make a retry safe. Default: the time the request arrives.")


class EditResultSerializer(serializers.Serializer):
    message = serializers.IntegerField(help_text="The edited message's row id.")
    conversation = serializers.IntegerField()
    duplicate = serializers.BooleanField(help_text="This edit (same edited_at) was applied before: nothing changed now.")
    outcome = serializers.ChoiceField(
        [o for o in EditOutcome.values if o != EditOutcome.IGNORED],
        help_text="buffered: corrected in the open buffer, its window re-armed; rerun: the turn holding it was "
                  "cancelled (interrupt strategy, no effect fired) and runs again with the corrected text; noted: "
                  "the agent's next turn gets a note of the edit; unchanged: same text; not_applied: the message "
                  "never reached a turn (a control command, rejected, dropped).")
    detail = serializers.CharField()
    turn = serializers.IntegerField(allow_null=True, help_text="The turn cancelled (rerun) or too late for (noted).")
    buffer = serializers.IntegerField(allow_null=True)
    flush_at = serializers.DateTimeField(allow_null=True, help_text="When the corrected buffer flushes.")


class MessageEditView(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("message_id", {"type": "string", "maxLength": MESSAGE_ID_CHARS,
                                                    "pattern": NO_NUL}, OpenApiParameter.PATH,
                                     description="The `message_id` the message was POSTed with.")],
        request=MessageEditSerializer,
        responses={200: EditResultSerializer, 400: ErrorSerializer, 401: ErrorSerializer, 403: ErrorSerializer,
                   404: ErrorSerializer, 409: ErrorSerializer},
        summary="Edit a message the user already sent (the corrected text counts)",
        description="The message is the one POSTed with this `message_id`. 404: no such message in the channel. "
                    "400: a malformed body or a text that cannot be stored (same bounds as a new message). "
                    "409: the channel ignores edits (its `edits` setting is `ignore`): the edit is recorded and "
                    "audited as ignored and changes nothing (a retry gets the same answer).")
    def patch(self, request, slug, message_id):
        channel = channel_for_key(request.user, slug, API_KIND)
        if len(message_id) > MESSAGE_ID_CHARS or "\x00" in message_id:
            raise exceptions.NotFound(f"no message '{message_id[:MESSAGE_ID_CHARS]}' in channel '{slug}'")
        incoming = MessageEditSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        data = incoming.validated_data
        try:
            result = edits.apply(channel, edits.Edit(platform_message_id=message_id, text=data["text"],
                                                     edited_at=data.get("edited_at") or timezone.now(),
                                                     source="api"))
        except Unstorable as exc:
            raise exceptions.ParseError(f"edit refused: {exc}") from None
        if result.outcome == edits.UNKNOWN:
            raise exceptions.NotFound(f"no message '{message_id}' in channel '{slug}'")
        if result.outcome == EditOutcome.IGNORED:
            raise Conflict(f"channel '{slug}' ignores edits (edits: ignore): the edit was recorded and changed nothing")
        return Response(EditResultSerializer({
            "message": result.message_id, "conversation": result.conversation_id, "duplicate": result.duplicate,
            "outcome": result.outcome, "detail": result.detail, "turn": result.turn_id, "buffer": result.buffer_id,
            "flush_at": result.flush_at}).data)


# --- turns for external agents (pull agents, and webhook agents answering later) ----------


class TurnSerializer(serializers.Serializer):
    id = serializers.IntegerField(source="pk")
    state = serializers.CharField()
    channel = serializers.CharField(source="conversation.channel.slug")
    conversation = serializers.IntegerField(source="conversation_id")
    contact = serializers.CharField(source="conversation.sender_id")
    chat = serializers.CharField(source="conversation.chat_id")
    text = serializers.CharField(source="merged_input", help_text="The merged input of the burst.")
    flush_reason = serializers.CharField()
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    history = serializers.ListField(child=serializers.DictField(), required=False,
                                    help_text="The conversation so far (chat messages), on claim.")


class TurnListQuery(serializers.Serializer):
    state = serializers.ChoiceField(["ready", "running", "done", "failed", "cancelled"], default="ready")
    limit = serializers.IntegerField(min_value=1, max_value=200, default=50)


class TurnReplySerializer(StrictBody):
    text = serializers.CharField(max_length=20000, trim_whitespace=False)


class TurnDoneSerializer(StrictBody):
    text = serializers.CharField(max_length=20000, required=False, trim_whitespace=False,
                                 help_text="A last reply, sent before the turn is closed.")


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "conflict"


def _turns_for_key(key):
    from conversations.models import Turn

    return Turn.objects.select_related("conversation__channel").filter(conversation__channel__agent_keys=key)


def _turn_for_key(key, turn_id):
    turn = _turns_for_key(key).filter(pk=row_id(turn_id, "turn")).first()
    if turn is None:
        raise exceptions.NotFound(f"no turn {turn_id}")
    return turn


class TurnListView(APIView):
    @extend_schema(parameters=[TurnListQuery], responses={200: TurnSerializer(many=True)},
                   summary="Turns of your channels (pull agents: the ready ones wait for you)")
    def get(self, request):
        query = TurnListQuery(data=query_of(request))
        query.is_valid(raise_exception=True)
        turns = _turns_for_key(request.user).filter(state=query.validated_data["state"]).order_by("created_at")
        return Response(TurnSerializer(turns[: query.validated_data["limit"]], many=True).data)


class TurnClaimView(APIView):
    @extend_schema(request=None, responses={200: TurnSerializer, 409: ErrorSerializer},
                   summary="Claim a ready turn: it is yours to answer until you mark it done (or it times out)")
    def post(self, request, turn):
        from conversations import engine, turns

        found = _turn_for_key(request.user, turn)
        if found.conversation.channel.agent != turns.PULL_AGENT:
            return Response({"error": f"turn {found.pk} belongs to a '{found.conversation.channel.agent}' channel; "
                                      "only turns of pull channels can be claimed"},
                            status=status.HTTP_409_CONFLICT)
        if not turns.claim_external(found.pk, request.user.pk):
            return Response({"error": f"turn {found.pk} is {found.state}, or another turn of its conversation "
                                      "is running"}, status=status.HTTP_409_CONFLICT)
        found.refresh_from_db()
        body = TurnSerializer(found).data
        body["history"] = engine.conversation_history(found.conversation, found)
        return Response(body)


class TurnReplyView(APIView):
    @extend_schema(request=TurnReplySerializer, responses={202: TurnSerializer, 409: ErrorSerializer},
                   summary="Reply in a turn you hold: written into the delivery ledger and sent")
    def post(self, request, turn):
        found = _turn_for_key(request.user, turn)
        incoming = TurnReplySerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        _reply(request.user, found, incoming.validated_data["text"])
        return Response(TurnSerializer(found).data, status=status.HTTP_202_ACCEPTED)


def _reply(key, turn, text):
    from django.db import transaction

    from conversations import turns
    from conversations.models import Turn
    from delivery import ledger
    from delivery.models import OutboundKind

    with transaction.atomic():
        locked = Turn.objects.select_for_update().select_related("conversation__channel").get(pk=turn.pk)
        if not turns.may_answer(locked, key.pk):
            raise Conflict(f"turn {turn.pk} is {locked.state} and not yours to answer")
        ledger.enqueue(locked.conversation, text, kind=OutboundKind.REPLY, turn=locked,
                       reply_target=locked.reply_target, thread_id=locked.thread_id)
        Turn.objects.filter(pk=turn.pk).update(reply_text=(locked.reply_text + "\n" + text).strip())


class TurnDoneView(APIView):
    @extend_schema(request=TurnDoneSerializer, responses={200: TurnSerializer, 409: ErrorSerializer},
                   summary="Close a turn you hold (optionally with a last reply)")
    def post(self, request, turn):
        from conversations import turns
        from conversations.models import TurnState

        found = _turn_for_key(request.user, turn)
        incoming = TurnDoneSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        if not turns.may_answer(found, request.user.pk):
            if found.state == TurnState.DONE:
                return Response(TurnSerializer(found).data)  # a retried "done" changes nothing
            return Response({"error": f"turn {found.pk} is {found.state} and not yours to close"},
                            status=status.HTTP_409_CONFLICT)
        if incoming.validated_data.get("text"):
            _reply(request.user, found, incoming.validated_data["text"])
        found.refresh_from_db()
        if not turns.finish_many([(found.pk, TurnState.DONE, found.reply_text, "answered by an external agent")],
                                 found.owner):
            return Response({"error": f"turn {found.pk} changed meanwhile"}, status=status.HTTP_409_CONFLICT)
        found.refresh_from_db()
        return Response(TurnSerializer(found).data)


# --- reading a conversation (an api channel without a callback: the app reads its replies) ---


@extend_schema_field({"type": "string", "format": "cursor"})
class CursorField(serializers.Field):
    """An opaque cursor: the `next` of an earlier answer, passed back as it was given. Its
    format, `cursor`, is ours, and the schema says no more of it: its spelling (base64url,
    at most MAX_CURSOR_CHARS) is not a promise, and any other string is refused (400)."""

    SPELLING = re.compile(r"[A-Za-z0-9_-]*")

    def to_internal_value(self, data):
        if not isinstance(data, str) or len(data) > MAX_CURSOR_CHARS or not self.SPELLING.fullmatch(data):
            raise serializers.ValidationError("not a cursor this API returned")
        return data


class ConversationMessagesQuery(serializers.Serializer):
    after = CursorField(
        required=False,
        help_text="An opaque cursor: the `next` of an earlier answer. Omitted or empty: from the conversation's start.")
    limit = serializers.IntegerField(min_value=1, max_value=200, default=50, help_text="Items per page.")
    wait = serializers.FloatField(
        min_value=0, max_value=30, default=0,
        help_text="Long-poll: when nothing is after the cursor, wait up to this many seconds for a new item "
                  "(answered as soon as one exists; an empty page with the same cursor when the wait ends).")


class TimelineItemSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(["inbound", "reply"], help_text="inbound: the user's message; reply: an outbound row "
                                                                   "of the delivery ledger.")
    id = serializers.IntegerField(help_text="The row id (unique per kind).")
    text = serializers.CharField(allow_blank=True)
    time = serializers.DateTimeField(help_text="When it was received (inbound) or written down (reply).")
    message_id = serializers.CharField(allow_null=True, help_text="inbound: the `message_id` it was POSTed with.")
    disposition = serializers.ChoiceField(Disposition.values, allow_null=True,
                                          help_text="inbound: what became of it.")
    media_type = serializers.CharField(allow_null=True, allow_blank=True, help_text="inbound: its media type, if any.")
    reply_kind = serializers.ChoiceField(OutboundKind.values, allow_null=True,
                                         help_text="reply: an agent reply, a control command's answer or a notice.")
    state = serializers.ChoiceField(OutboundState.values, allow_null=True,
                                    help_text="reply: its ledger state when read (an api channel without a callback "
                                              "URL is `delivered` once the worker has recorded it).")
    recovered = serializers.BooleanField(allow_null=True, help_text="reply: its last send was labelled a possible "
                                                                    "duplicate (♻️ Recovered reply).")
    attempts = serializers.IntegerField(allow_null=True, help_text="reply: sends started.")
    delivered_at = serializers.DateTimeField(allow_null=True)


class TimelinePageSerializer(serializers.Serializer):
    conversation = serializers.IntegerField()
    items = TimelineItemSerializer(many=True, help_text="Oldest first. A row committed late (rare) comes in a later "
                                                        "page than rows newer than it; none twice, none skipped.")
    next = serializers.CharField(help_text="The cursor to pass as `after` next time; the same one when the page is "
                                           "empty, so a client keeps polling from where it is.")


class TooManyWaiting(exceptions.APIException):
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
    def enter(cls):
        from django.conf import settings

        if cls.waiting >= settings.AGENTLOOP_MAX_LONG_POLLS:
            raise TooManyWaiting()
        cls.waiting += 1

    @classmethod
    def leave(cls):
        cls.waiting -= 1


def _in_db_thread(fn, *args, **kwargs):
    """Run a database step in the loop's shared thread pool, its connection closed (or
    returned to the pool) afterwards as CONN_MAX_AGE / DATABASE_POOL say: a waiting
    long-poll holds neither a thread nor a connection between its checks."""
    from channels.db import database_sync_to_async

    return database_sync_to_async(fn, thread_sensitive=False)(*args, **kwargs)


def _release_request_thread():
    """Django's middleware steps ran in a thread of this request's own (asgiref gives
    each request context a one-thread executor, shut down when the request ends): it
    would sit idle for the whole wait, a thread per waiting client. Shut it down now;
    the response's middleware steps start a fresh one. (An executor a caller supplied
    to the context is theirs: left alone.)"""
    from asgiref.sync import SyncToAsync

    # asgiref internals (3.13): another version without them keeps the idle thread, and
    # tests/test_api_read.py's thread count says so.
    contexts, executors = (getattr(SyncToAsync, "thread_sensitive_context", None),
                           getattr(SyncToAsync, "context_to_thread_executor", None))
    context = contexts.get(None) if contexts is not None else None
    if context is None or executors is None or getattr(context, "_executor", None) is not None:
        return
    executor = executors.pop(context, None)
    if executor is not None:
        executor.shutdown(wait=False)


class ConversationMessagesView(APIView):
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
    async def get(self, request, conversation):
        query, found, items, cursor = await _in_db_thread(self._first_read, request, conversation)
        if not items and query["wait"] > 0:
            items, cursor = await self._wait(found.pk, cursor, query["limit"], query["wait"])
        return Response(TimelinePageSerializer({
            "conversation": found.pk, "items": [_item(i) for i in items], "next": cursor.encode()}).data)

    def _first_read(self, request, conversation):
        from conversations import timeline

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
    async def _wait(conversation_id, cursor, limit, wait):
        import asyncio

        from conversations import timeline

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

    async def dispatch(self, request, *args, **kwargs):
        """APIView.dispatch for an async `get`: DRF's request handling is synchronous, so
        its database parts (authentication) run inside `_first_read`; other methods go
        through DRF as usual, in the thread pool."""
        if request.method not in ("GET", "HEAD"):
            response = await _in_db_thread(super().dispatch, request, *args, **kwargs)
            return response.render()
        self.args, self.kwargs = args, kwargs
        request = self.initialize_request(request, *args, **kwargs)
        self.request, self.headers = request, self.default_response_headers
        try:
            response = await self.get(request, *args, **kwargs)
        except Exception as exc:
            response = self.handle_exception(exc)
        self.response = self.finalize_response(request, response, *args, **kwargs)
        return self.response.render()  # here, not in a thread Django would take for it


def _item(item):
    blank = {"message_id": None, "disposition": None, "media_type": None, "reply_kind": None, "state": None,
             "recovered": None, "attempts": None, "delivered_at": None}
    return {**blank, **{k: v for k, v in item.items() if k != "position"}}
