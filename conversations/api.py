"""REST API for external agents (agent keys; DRF). The action-guard issue adds tools."""

import logging

from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from conversations.api_auth import ErrorSerializer

from conversations import edits
from conversations.ingest import Inbound, Unstorable, admit
from conversations.models import Channel, ChannelKind, EditOutcome, InboundMessage

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
        pk=conversation_id, channel__agent_keys=key).first()
    if conversation is None:
        raise exceptions.NotFound(f"no conversation {conversation_id}")
    return conversation


class InboundMessageSerializer(serializers.Serializer):
    # As long as the column our reply threads to (reply_target), which stores it.
    message_id = serializers.CharField(max_length=InboundMessage._meta.get_field("reply_target").max_length)
    contact = serializers.CharField(max_length=100)
    text = serializers.CharField(allow_blank=True, default="", max_length=20000, trim_whitespace=False)
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
    @extend_schema(request=InboundMessageSerializer, responses={202: AdmissionSerializer})
    def post(self, request, slug):
        channel = channel_for_key(request.user, slug, ChannelKind.API)
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


class MessageEditSerializer(serializers.Serializer):
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
    edited_at = serializers.DateTimeField(
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
        request=MessageEditSerializer,
        responses={200: EditResultSerializer, 400: ErrorSerializer, 401: ErrorSerializer, 403: ErrorSerializer,
                   404: ErrorSerializer, 409: ErrorSerializer},
        summary="Edit a message the user already sent (the corrected text counts)",
        description="The message is the one POSTed with this `message_id`. 404: no such message in the channel. "
                    "400: a malformed body or a text that cannot be stored (same bounds as a new message). "
                    "409: the channel ignores edits (its `edits` setting is `ignore`): the edit is recorded and "
                    "audited as ignored and changes nothing (a retry gets the same answer).")
    def patch(self, request, slug, message_id):
        channel = channel_for_key(request.user, slug, ChannelKind.API)
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


class TurnReplySerializer(serializers.Serializer):
    text = serializers.CharField(max_length=20000, trim_whitespace=False)


class TurnDoneSerializer(serializers.Serializer):
    text = serializers.CharField(max_length=20000, required=False, trim_whitespace=False,
                                 help_text="A last reply, sent before the turn is closed.")


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "conflict"


def _turns_for_key(key):
    from conversations.models import Turn

    return Turn.objects.select_related("conversation__channel").filter(conversation__channel__agent_keys=key)


def _turn_for_key(key, turn_id):
    turn = _turns_for_key(key).filter(pk=turn_id).first()
    if turn is None:
        raise exceptions.NotFound(f"no turn {turn_id}")
    return turn


class TurnListView(APIView):
    @extend_schema(parameters=[TurnListQuery], responses={200: TurnSerializer(many=True)},
                   summary="Turns of your channels (pull agents: the ready ones wait for you)")
    def get(self, request):
        query = TurnListQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        turns = _turns_for_key(request.user).filter(state=query.validated_data["state"]).order_by("created_at")
        return Response(TurnSerializer(turns[: query.validated_data["limit"]], many=True).data)


class TurnClaimView(APIView):
    @extend_schema(request=None, responses={200: TurnSerializer, 409: ErrorSerializer, 404: ErrorSerializer},
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
