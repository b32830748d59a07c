"""Endpoints for operators' tools (a staff login, not an agent key): the erasure of one
person (conversations.erasure)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from drf_spectacular.utils import extend_schema
from rest_framework import authentication, permissions, serializers  # type: ignore[import-untyped]  # DRF ships no types
from rest_framework.response import Response  # type: ignore[import-untyped]

from agentloop.core.api import ErrorSerializer, StrictBody
from agentloop.core.idempotency import ApiView
from conversations import erasure

if TYPE_CHECKING:
    from rest_framework.request import Request  # type: ignore[import-untyped]
    from rest_framework.views import APIView  # type: ignore[import-untyped]


class CanErase(permissions.BasePermission):  # type: ignore[misc]  # DRF's classes are Any here
    """Active staff allowed to delete contacts (the Operators group)."""

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        return bool(user and user.is_active and user.is_staff and user.has_perm("conversations.delete_contact"))


class ForgetContactSerializer(StrictBody):
    channel = serializers.SlugField(max_length=50, help_text="The channel's slug.")
    contact = serializers.CharField(max_length=100, help_text="The person's platform id in that channel.")


class ErasureCountsSerializer(serializers.Serializer):  # type: ignore[misc]  # DRF's classes are Any here
    """What was erased: a count per kind of data (messages, files, turns, …)."""

    counts = serializers.DictField(child=serializers.IntegerField(), read_only=True)


class ForgetContactView(ApiView):
    authentication_classes = [authentication.SessionAuthentication, authentication.BasicAuthentication]
    permission_classes = [CanErase]

    @extend_schema(request=ForgetContactSerializer, responses={200: ErasureCountsSerializer, 403: ErrorSerializer,
                                                               404: ErrorSerializer, 409: ErrorSerializer},
        summary="Erase one person's data (operators: a staff login with delete_contact)")
    def post(self, request: Request) -> Response:
        body = ForgetContactSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            counts = erasure.forget(body.validated_data["channel"], body.validated_data["contact"],
                                    by=f"api:{request.user.get_username()}", wait=10.0)
        except erasure.NotFound:
            return Response({"error": "no such contact in that channel"}, status=404)
        except erasure.Busy as exc:
            return Response({"error": str(exc)}, status=409)
        return Response({"counts": counts})
