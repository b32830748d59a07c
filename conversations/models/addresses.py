"""Where a platform wants a chat's replies sent, as its last message said
(conversations/addresses.py keeps and reads it)."""

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _


class PlatformAddress(models.Model):
    """A chat's platform address: what the platform's last inbound message of the chat
    gave for replying to it (Teams: its conversation reference — the serviceUrl, the
    conversation id, the tenant). One row per (channel, chat), written when it changes,
    never per message; it goes with the chat's data (erasure, retention)."""

    # No index of its own: the unique (channel, chat_id) starts with it.
    channel = models.ForeignKey("Channel", verbose_name=_("channel"), on_delete=models.CASCADE,
                                related_name="addresses", db_index=False)
    chat_id = models.CharField(_("chat ID"), max_length=100)
    address = models.JSONField(_("address"), default=dict,
                               help_text=_("What the platform needs to reach the chat (string values)."))
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    updated_at = models.DateTimeField(_("updated at"), default=timezone.now)

    class Meta:
        verbose_name = _("platform address")
        verbose_name_plural = _("platform addresses")
        constraints = [models.UniqueConstraint(fields=["channel", "chat_id"], name="one_address_per_chat")]

    def __str__(self) -> str:
        return f"{self.chat_id}: {self.address}"
