from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _


class LiveEvent(models.Model):
    """One live update for the console, kept a few minutes. Deployments without Redis
    write updates here (in the transaction of the change they describe); every web
    process tails the table and pushes them to its own websockets."""

    groups = models.CharField(_("groups"), max_length=300, help_text=_("Space-separated channel-layer group names."))
    payload = models.JSONField(_("payload"))
    at = models.DateTimeField(_("at"), default=timezone.now, db_index=True)

    class Meta:
        verbose_name = _("live event")
        verbose_name_plural = _("live events")


class LiveListener(models.Model):
    """A web process with console websockets open, seen lately: while none is, nothing
    is published at all."""

    name = models.CharField(_("name"), max_length=120, unique=True, help_text=_("host:pid of the web process."))
    seen_at = models.DateTimeField(_("seen at"))

    class Meta:
        verbose_name = _("live listener")
        verbose_name_plural = _("live listeners")


class Metrics(models.Model):
    """No table: the holder of the permission to read `GET /metrics` (`view_metrics`),
    which a role grants like any other (agentloop.console.roles)."""

    class Meta:
        verbose_name = _("metrics")
        verbose_name_plural = _("metrics")
        managed = False
        default_permissions = ()
        permissions = [("view_metrics", "Can read the Prometheus metrics (GET /metrics)")]


class IdempotentRequest(models.Model):
    """One `Idempotency-Key` of one caller (an agent key or an operator), claimed by its
    INSERT before the view runs (the unique pair makes the claim safe across processes),
    then holding the first answer to replay (agentloop/core/idempotency.py)."""

    owner = models.CharField(_("owner"), max_length=100, help_text=_("Whose key: 'conversations.agentkey:12', 'auth.user:3'."))
    key = models.CharField(_("key"), max_length=255)
    fingerprint = models.CharField(_("fingerprint"), max_length=64, help_text=_("SHA-256 of the method, path and body."))
    created_at = models.DateTimeField(_("created at"), default=timezone.now, db_index=True)
    # While the first request runs: a crashed one frees the key after this.
    lease_until = models.DateTimeField(_("lease until"), null=True, blank=True)
    status = models.PositiveSmallIntegerField(_("HTTP status"), null=True, blank=True, help_text=_("Empty while in flight."))
    content = models.BinaryField(_("content"), default=bytes)
    headers = models.JSONField(_("headers"), default=dict)

    class Meta:
        verbose_name = _("idempotent request")
        verbose_name_plural = _("idempotent requests")
        constraints = [models.UniqueConstraint(fields=["owner", "key"], name="idempotency_key_per_owner")]
