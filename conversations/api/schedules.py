"""Scheduled messages from the API (a helpdesk, a booking system): one goes out by
itself into a conversation of the key's channels (conversations.schedules)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status  # type: ignore[import-untyped]  # DRF ships no types
from rest_framework.response import Response  # type: ignore[import-untyped]

from agentloop.core.api import ErrorSerializer, StrictBody, UtcDateTimeField
from agentloop.core.idempotency import ApiView
from conversations import schedules
from conversations.api.access import conversation_for_key
from delivery import templates
from delivery.models import ScheduledMessage, ScheduleSource

if TYPE_CHECKING:
    from rest_framework.request import Request  # type: ignore[import-untyped]


class NewScheduleSerializer(StrictBody):
    text = serializers.CharField(max_length=4000)
    due_at = UtcDateTimeField(help_text="When it goes out (RFC 3339). In the past: at once.")
    repeat_every_seconds = serializers.IntegerField(
        min_value=60, max_value=366 * 86400, required=False, allow_null=True, default=None,
        help_text="Sent again this many seconds after each tick; empty: once.")
    cancel_on_reply = serializers.BooleanField(
        default=False, help_text="Not sent if the user writes after it was scheduled (a follow-up).")
    # Patterns, so that the schema says what a valid value is (delivery.templates checks the same).
    template_name = serializers.RegexField(
        r"^[a-z0-9_]{0,512}$", max_length=512, required=False, default="", allow_blank=True,
        help_text="WhatsApp: the approved template a tick outside the 24-hour window goes out as. Empty: the "
                  "channel's (none: it waits for the user to write).")
    template_language = serializers.RegexField(
        r"^([a-z]{2,3}(_[A-Z]{2})?)?$", max_length=16, required=False, default="", allow_blank=True,
        help_text="Its language code (es, en_US, pt_BR). Empty: the channel's.")
    template_fill = serializers.ChoiceField(
        choices=templates.FILLS, required=False, default="", allow_blank=True,
        help_text="How the text fills its body: text (the text is {{1}}) or lines (one parameter per line). "
                  "Empty: the channel's.")


class ScheduleSerializer(serializers.Serializer):  # type: ignore[misc]  # DRF's classes are Any here
    id = serializers.IntegerField(source="pk")
    conversation = serializers.IntegerField(source="conversation_id")
    text = serializers.CharField()
    due_at = serializers.DateTimeField()
    repeat_every_seconds = serializers.SerializerMethodField()
    cancel_on_reply = serializers.BooleanField()
    state = serializers.CharField(help_text="scheduled, sent or cancelled.")
    reason = serializers.CharField(help_text="Why a due message waits, or why it was cancelled.")
    ticks_sent = serializers.IntegerField()
    template_name = serializers.CharField()
    template_language = serializers.CharField()
    template_fill = serializers.CharField()

    def get_repeat_every_seconds(self, row: ScheduledMessage) -> int | None:
        return int(row.repeat_every.total_seconds()) if row.repeat_every else None


class ConversationSchedulesView(ApiView):
    @extend_schema(
        request=NewScheduleSerializer,
        responses={201: ScheduleSerializer, 400: ErrorSerializer, 401: ErrorSerializer, 404: ErrorSerializer},
        summary="Schedule a message into a conversation: it goes out by itself through the delivery ledger",
        description="Sent once per tick however many workers run (docs/schedules.md). On WhatsApp, a tick "
                    "outside the 24-hour window goes out as the approved template this schedule or its "
                    "channel names, filled with the text; without one it waits for the user to write, and "
                    "says so in `reason`. "
                    "404: no such conversation in the key's channels.")
    def post(self, request: Request, conversation: int) -> Response:
        found = conversation_for_key(request.user, conversation)
        incoming = NewScheduleSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        data = incoming.validated_data
        seconds = data.get("repeat_every_seconds")
        row = schedules.schedule(found, data["text"], data["due_at"], cancel_on_reply=data["cancel_on_reply"],
                                 repeat_every=timedelta(seconds=seconds) if seconds else None,
                                 source=ScheduleSource.API, template_name=data["template_name"],
                                 template_language=data["template_language"], template_fill=data["template_fill"])
        return Response(ScheduleSerializer(row).data, status=status.HTTP_201_CREATED)
