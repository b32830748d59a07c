"""Audit events over the REST API, for monitoring (e.g. alert when duplicates spike)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from drf_spectacular.utils import extend_schema
from rest_framework import serializers  # type: ignore[import-untyped]  # DRF ships no types
from rest_framework.response import Response  # type: ignore[import-untyped]
from rest_framework.views import APIView  # type: ignore[import-untyped]

from agentloop.core.api import StrictQuery, UtcDateTimeField, query_of
from agentloop.core.redaction import redact
from audit.events import recent
from audit.models import AuditEvent, EventKind

if TYPE_CHECKING:
    from rest_framework.request import Request  # type: ignore[import-untyped]


class AuditEventSerializer(serializers.Serializer):  # type: ignore[misc]  # DRF's classes are Any here
    id = serializers.IntegerField()
    kind = serializers.CharField()
    at = serializers.DateTimeField()
    actor = serializers.CharField()
    channel = serializers.CharField(source="channel_slug")
    conversation = serializers.IntegerField(source="conversation_id", allow_null=True)
    target = serializers.CharField()
    summary = serializers.SerializerMethodField()
    extra = serializers.JSONField()

    def get_summary(self, event: AuditEvent) -> str:
        summary: str = redact(event.summary)  # rows written before redaction at write existed
        return summary


_KIND = "|".join(EventKind.values)
KINDS_PATTERN = rf"^(?:{_KIND})(?:,(?:{_KIND}))*$"


class AuditEventsQuery(StrictQuery):
    kind = serializers.RegexField(
        KINDS_PATTERN, required=False, trim_whitespace=False, help_text="One kind or several, comma-separated.",
        error_messages={"invalid": f"unknown kind(s); one kind or several, comma-separated, of: "
                                   f"{', '.join(EventKind.values)}"})
    since = UtcDateTimeField(required=False, help_text="Only events after this instant.")
    limit = serializers.IntegerField(required=False, min_value=1, max_value=500, default=100)


class AuditEventsView(APIView):  # type: ignore[misc]  # DRF's classes are Any here
    @extend_schema(parameters=[AuditEventsQuery], responses={200: AuditEventSerializer(many=True)},
                   summary="Audit events of your channels and your own actions, newest first")
    def get(self, request: Request) -> Response:
        query = AuditEventsQuery(data=query_of(request))
        query.is_valid(raise_exception=True)
        params = query.validated_data
        kinds = [k for k in params.get("kind", "").split(",") if k]
        slugs = request.user.channels.values_list("slug", flat=True)
        events = recent(kinds, channel_slugs=list(slugs), agent_key_id=request.user.pk, since=params.get("since"),
                        limit=params["limit"])
        return Response(AuditEventSerializer(events, many=True).data)
