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
