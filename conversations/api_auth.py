"""API authentication and error format, kept apart from the views (DRF imports these
from settings before its views module is ready)."""

from django.core.exceptions import RequestDataTooBig
from django.utils import timezone
from rest_framework import authentication, exceptions, serializers
from rest_framework.response import Response

from conversations.models import AgentKey


class AgentKeyAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer <key>`; the key is compared by its SHA-256."""

    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode(errors="replace").split()
        if not header or header[0] != self.keyword:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <key>'.")
        key = AgentKey.objects.for_key(header[1])
        if key is None:
            raise exceptions.AuthenticationFailed("Unknown or revoked agent key.")
        now = timezone.now()
        if key.last_used_at is None or (now - key.last_used_at).total_seconds() > 60:
            AgentKey.objects.filter(pk=key.pk).update(last_used_at=now)  # coarse: not a write per request
        return key, key

    def authenticate_header(self, request):
        return self.keyword


class ErrorSerializer(serializers.Serializer):
    """The shape of every API error."""

    error = serializers.CharField()
    fields = serializers.DictField(required=False, help_text="Per-field messages of an invalid request.")


def json_exception_handler(exc, context):
    """Every API error is JSON with a clear message."""
    from rest_framework.views import (
        exception_handler,  # not at import time: DRF loads us from settings
    )

    if isinstance(exc, RequestDataTooBig):
        return Response({"error": "request body too large"}, status=413)
    response = exception_handler(exc, context)
    if response is not None and isinstance(response.data, dict) and "detail" in response.data:
        response.data = {"error": str(response.data["detail"])}
    elif response is not None:
        response.data = {"error": "invalid request", "fields": response.data}
    return response
