"""API authentication: an agent's key (its error format and strict request fields are
every app's: agentloop/core/api.py). Kept apart from the views: DRF imports it from
settings before its views module is ready."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.utils import timezone
from rest_framework import authentication, exceptions  # type: ignore[import-untyped]  # DRF ships no types

from conversations.models import AgentKey

if TYPE_CHECKING:
    from rest_framework.request import Request  # type: ignore[import-untyped]


class AgentKeyAuthentication(authentication.BaseAuthentication):  # type: ignore[misc]  # DRF's classes are Any here
    """`Authorization: Bearer <key>`; the key is compared by its SHA-256."""

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[AgentKey, AgentKey] | None:
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

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
