"""The secrets every channel holds, for the masking of error texts (agentloop.core.redaction
reads them through settings.AGENTLOOP_SECRET_SOURCES: it sits layers below)."""

from __future__ import annotations

from agentloop.core.redaction import channel_secrets
from conversations.models import Channel

FIELDS = ("kind", "platform_settings", "agent_config")


def of_every_channel() -> list[str]:
    """Each channel's platform secrets, secrets in its settings' URLs, and its agent's."""
    return [secret for row in Channel.objects.values(*FIELDS) for secret in channel_secrets(row)]
