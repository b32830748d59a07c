"""REST API for external agents (agent keys; DRF). The action-guard issue adds tools."""

import logging

from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from conversations.ingest import Inbound, admit
from conversations.models import Channel, ChannelKind

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
    message_id = serializers.CharField(max_length=100)
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
        admission = admit(channel, Inbound(
            platform_message_id=data["message_id"], chat_id=data.get("chat") or data["contact"],
            sender_id=data["contact"], text=data["text"], sender_name=data["sender_name"],
            media_type=data["media_type"], is_group=data["is_group"], reply_target=data["message_id"],
        ))
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
