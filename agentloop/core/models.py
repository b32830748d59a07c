from django.db import models
from django.utils import timezone


class LiveEvent(models.Model):
    """One live update for the console, kept a few minutes. Deployments without Redis
    write updates here (in the transaction of the change they describe); every web
    process tails the table and pushes them to its own websockets."""

    groups = models.CharField(max_length=300, help_text="Space-separated channel-layer group names.")
    payload = models.JSONField()
    at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        verbose_name = "live event"


class LiveListener(models.Model):
    """A web process with console websockets open, seen lately: while none is, nothing
    is published at all."""

    name = models.CharField(max_length=120, unique=True, help_text="host:pid of the web process.")
    seen_at = models.DateTimeField()


class Metrics(models.Model):
    """No table: the holder of the permission to read `GET /metrics` (`view_metrics`),
    which a role grants like any other (agentloop.console.roles)."""

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [("view_metrics", "Can read the Prometheus metrics (GET /metrics)")]


class IdempotentRequest(models.Model):
    """One `Idempotency-Key` of one caller (an agent key or an operator), claimed by its
    INSERT before the view runs (the unique pair makes the claim safe across processes),
    then holding the first answer to replay (agentloop/core/idempotency.py)."""

    owner = models.CharField(max_length=100, help_text="Whose key: 'conversations.agentkey:12', 'auth.user:3'.")
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64, help_text="SHA-256 of the method, path and body.")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    # While the first request runs: a crashed one frees the key after this.
    lease_until = models.DateTimeField(null=True, blank=True)
    status = models.PositiveSmallIntegerField(null=True, blank=True, help_text="Empty while in flight.")
    content = models.BinaryField(default=bytes)
    headers = models.JSONField(default=dict)

    class Meta:
        verbose_name = "idempotent request"
        constraints = [models.UniqueConstraint(fields=["owner", "key"], name="idempotency_key_per_owner")]
