"""The one way to write the audit trail: call `record` inside the transaction of the change."""

import json

from django.db import connection
from django.db.models import Q
from django.utils import timezone

from agentloop.core.redaction import redact, redact_payload
from agentloop.core.rows import records, recordset
from audit import console
from audit.models import AuditEvent


def record(kind, *, conversation=None, conversation_id=None, channel_slug="", actor="", target="", summary="",
           **extra):
    """`conversation` (a Conversation) or its id and channel slug when the caller has no row."""
    if conversation is not None:
        conversation_id, channel_slug = conversation.pk, conversation.channel.slug
    event = AuditEvent.objects.create(
        kind=kind,
        actor=actor,
        channel_slug=channel_slug or "",
        conversation_id=conversation_id,
        target=str(target),
        summary=redact(summary)[:300],
        extra=redact_payload(extra),
    )
    console.events_recorded([event])
    return event


def record_many(events):
    """Several events in one statement (each a dict of `record`'s keyword arguments).
    Plain SQL: a mass recovery writes thousands, and the ORM's per-field assembly of a
    bulk INSERT cost more than the INSERT."""
    if not events:
        return 0
    at = connection.ops.adapt_datetimefield_value(timezone.now())
    rows = []
    for event in events:
        event = dict(event)
        summary = redact(event.pop("summary", ""))[:300]
        fields = [event.pop("kind"), at, event.pop("actor", ""), event.pop("channel_slug", "") or "",
                  event.pop("conversation_id", None), str(event.pop("target", "")), summary]
        rows.append([*fields, json.dumps(redact_payload(event), default=str)])
    table = connection.ops.quote_name(AuditEvent._meta.db_table)
    columns = "kind, at, actor, channel_slug, conversation_id, target, summary, extra"
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # The rows as one JSON parameter: one statement, not one per event (a recovery
            # of 500 rows was 500 INSERTs, half of the delivered mark's time).
            names = ("kind", "at", "actor", "slug", "conversation_id", "target", "summary", "extra")
            source = recordset("v", [("kind", "text"), ("actor", "text"), ("slug", "text"),
                                     ("conversation_id", "bigint"), ("target", "text"), ("summary", "text"),
                                     ("extra", "text")])
            cursor.execute(
                f"INSERT INTO {table} ({columns}) SELECT v.kind, %s, v.actor, v.slug, v.conversation_id, v.target, "
                f"v.summary, v.extra::jsonb FROM {source}", [at, records(names, rows)])
        else:
            cursor.executemany(f"INSERT INTO {table} ({columns}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", rows)
    console.events_recorded(AuditEvent(kind=r[0], at=timezone.now(), channel_slug=r[3], conversation_id=r[4],
                                       target=r[5], summary=r[6], extra=events[i]) for i, r in enumerate(rows))
    return len(rows)


def recent(kinds=(), channel_slugs=None, agent_key_id=None, since=None, limit=100):
    """Events for monitoring, newest first; restricted to some channels (and the events
    an agent key caused) when `channel_slugs` is given."""
    events = AuditEvent.objects.all()
    if kinds:
        events = events.filter(kind__in=kinds)
    if since is not None:
        events = events.filter(at__gt=since)
    if channel_slugs is not None:
        visible = Q(channel_slug__in=list(channel_slugs))
        if agent_key_id is not None:
            visible |= Q(extra__agent_key=agent_key_id)
        events = events.filter(visible)
    return list(events.order_by("-at", "-pk")[:limit])
