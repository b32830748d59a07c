"""Agent keys: how an external agent authenticates to the REST API."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable

from django.db import models
from django.utils.translation import gettext_lazy as _

from conversations.models.channels import Channel


class AgentKeyManager(models.Manager["AgentKey"]):
    def for_key(self, raw_key: str) -> AgentKey | None:
        """The live key matching `raw_key`, or None. Keys are stored as SHA-256 only."""
        if not raw_key:
            return None
        digest = hashlib.sha256(raw_key.encode()).hexdigest()
        return self.filter(key_hash=digest, revoked_at__isnull=True).first()

    def issue(self, name: str, channels: Iterable[Channel] = (), key: AgentKey | None = None) -> tuple[AgentKey, str]:
        """A new key and its secret (to show once). `key`: an unsaved instance to save as it.
        Callers outside tests go through conversations.agent_keys.issue (audited)."""
        raw = "al_" + secrets.token_urlsafe(32)
        key = key if key is not None else self.model()
        key.name, key.prefix, key.key_hash = name, raw[:8], hashlib.sha256(raw.encode()).hexdigest()
        key.save(force_insert=True)
        key.channels.set(channels)
        return key, raw


class AgentKey(models.Model):
    """An external agent's credential; it sees only the channels it is granted."""

    name = models.CharField(_("name"), max_length=100)
    prefix = models.CharField(_("prefix"), max_length=12, editable=False)
    key_hash = models.CharField(_("key hash"), max_length=64, unique=True, editable=False)
    channels = models.ManyToManyField(Channel, verbose_name=_("channels"), blank=True, related_name="agent_keys")
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    revoked_at = models.DateTimeField(_("revoked at"), null=True, blank=True)
    last_used_at = models.DateTimeField(_("last used at"), null=True, blank=True)

    objects = AgentKeyManager()

    class Meta:
        verbose_name = _("agent key")
        verbose_name_plural = _("agent keys")

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    # DRF treats request.user as authenticated when this is true.
    is_authenticated = True
