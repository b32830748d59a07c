"""Turns for external agents (pull agents, and webhook agents answering later)."""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import exceptions, serializers, status  # type: ignore[import-untyped]  # DRF ships no types
from rest_framework.response import Response  # type: ignore[import-untyped]

from agentloop.core.api import (
    ErrorSerializer,
    StrictBody,
    query_of,
    row_id,
)
from agentloop.core.idempotency import ApiView
from conversations import engine, turns
from conversations.agents import Answer, File
from conversations.api.access import Conflict
from conversations.media import for_agents, outbound
from conversations.models import Turn, TurnState
from delivery import ledger
from delivery.models import OutboundKind

if TYPE_CHECKING:
    from django.db.models import QuerySet
    from rest_framework.request import Request  # type: ignore[import-untyped]

    from conversations.models import AgentKey
    from delivery.attachments import OutboundFile


class TurnSerializer(serializers.Serializer):  # type: ignore[misc]  # DRF's classes are Any here
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
    media = serializers.SerializerMethodField(
        help_text="The burst's files: kind, state (pending, fetching, stored, skipped, failed), type, name, "
                  "size, duration, transcript, problem, and `url`, a signed link to the bytes once stored "
                  "(relative to this server; it expires after AGENTLOOP_MEDIA_URL_TTL seconds).")

    @extend_schema_field(serializers.ListField(child=serializers.DictField()))
    def get_media(self, turn: Turn) -> list[dict[str, Any]]:
        return [for_agents.for_remote(item) for item in for_agents.of_turn(turn)]


class TurnListQuery(serializers.Serializer):  # type: ignore[misc]
    state = serializers.ChoiceField(["ready", "running", "done", "failed", "cancelled"], default="ready")
    limit = serializers.IntegerField(min_value=1, max_value=200, default=50)


# Standard base64 of at least one byte, padded (what b64decode(validate=True) takes): in
# the schema as its pattern, so a client knows before it sends.
BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{4}|[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)$"


class ReplyFileSerializer(StrictBody):
    name = serializers.CharField(max_length=200, help_text="The file name the user sees (`cita.ics`).")
    data = serializers.RegexField(BASE64, help_text="The file's bytes, base64. Its type is read from the bytes.",
                                  error_messages={"invalid": "not base64"})
    caption = serializers.CharField(max_length=1024, required=False, allow_blank=True, default="")

    def validate_data(self, value: str) -> bytes:
        try:
            data = base64.b64decode(value, validate=True)
        except (ValueError, TypeError):
            raise serializers.ValidationError("not base64") from None
        if len(data) > settings.AGENTLOOP_MEDIA_MAX_BYTES:
            raise serializers.ValidationError(f"over the {settings.AGENTLOOP_MEDIA_MAX_BYTES} bytes a file may have")
        return data


class TurnReplySerializer(StrictBody):
    text = serializers.CharField(max_length=20000, trim_whitespace=False)
    files = serializers.ListField(child=ReplyFileSerializer(), required=False, max_length=outbound.MAX_FILES,
                                  help_text="Files sent after the text, each through the delivery ledger.")


class TurnDoneSerializer(StrictBody):
    text = serializers.CharField(max_length=20000, required=False, trim_whitespace=False,
                                 help_text="A last reply, sent before the turn is closed.")


def _turns_for_key(key: AgentKey) -> QuerySet[Turn]:
    return Turn.objects.select_related("conversation__channel").filter(conversation__channel__agent_keys=key)


def _turn_for_key(key: AgentKey, turn_id: int) -> Turn:
    turn = _turns_for_key(key).filter(pk=row_id(turn_id, "turn")).first()
    if turn is None:
        raise exceptions.NotFound(f"no turn {turn_id}")
    return turn


class TurnListView(ApiView):
    @extend_schema(parameters=[TurnListQuery], responses={200: TurnSerializer(many=True)},
                   summary="Turns of your channels (pull agents: the ready ones wait for you)")
    def get(self, request: Request) -> Response:
        query = TurnListQuery(data=query_of(request))
        query.is_valid(raise_exception=True)
        turns = _turns_for_key(request.user).filter(state=query.validated_data["state"]).order_by("created_at")
        return Response(TurnSerializer(turns[: query.validated_data["limit"]], many=True).data)


class TurnClaimView(ApiView):
    @extend_schema(request=None, responses={200: TurnSerializer, 409: ErrorSerializer},
                   summary="Claim a ready turn: it is yours to answer until you mark it done (or it times out)")
    def post(self, request: Request, turn: int) -> Response:
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


class TurnReplyView(ApiView):
    @extend_schema(request=TurnReplySerializer, responses={202: TurnSerializer, 409: ErrorSerializer},
                   summary="Reply in a turn you hold: written into the delivery ledger and sent")
    def post(self, request: Request, turn: int) -> Response:
        found = _turn_for_key(request.user, turn)
        incoming = TurnReplySerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        _reply(request.user, found, incoming.validated_data["text"], incoming.validated_data.get("files", ()))
        return Response(TurnSerializer(found).data, status=status.HTTP_202_ACCEPTED)


def _reply(key: AgentKey, turn: Turn, text: str, files: Iterable[dict[str, Any]] = ()) -> None:
    answer_files = [File(f["name"], f["data"], f.get("caption", "")) for f in files]
    stored: tuple[OutboundFile, ...] = ()
    if answer_files:  # stored before the row, outside its transaction (conversations.media.outbound)
        text, stored = outbound.stored_answer(turn.conversation.channel_id, Answer(text, tuple(answer_files)))
    with transaction.atomic():
        locked = Turn.objects.select_for_update().select_related("conversation__channel").get(pk=turn.pk)
        if not turns.may_answer(locked, key.pk):
            raise Conflict(f"turn {turn.pk} is {locked.state} and not yours to answer")
        ledger.enqueue(locked.conversation, text, kind=OutboundKind.REPLY, turn=locked,
                       reply_target=locked.reply_target, thread_id=locked.thread_id, files=stored)
        Turn.objects.filter(pk=turn.pk).update(reply_text=(locked.reply_text + "\n" + text).strip())


class TurnDoneView(ApiView):
    @extend_schema(request=TurnDoneSerializer, responses={200: TurnSerializer, 409: ErrorSerializer},
                   summary="Close a turn you hold (optionally with a last reply)")
    def post(self, request: Request, turn: int) -> Response:
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
