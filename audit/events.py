"""The one way to write the audit trail: call `record` inside the transaction of the change."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from agentloop.core import pruning
from agentloop.core.redaction import redact, redact_payload
from audit import console, sql
from audit.models import AuditEvent


class _Channel(Protocol):
    @property
    def slug(self) -> str: ...


class Conversation(Protocol):
    """What `record` reads of a conversation (conversations' model: a layer above)."""

    @property
    def pk(self) -> int: ...

    @property
    def channel(self) -> _Channel: ...


def record(kind: str, *, conversation: Conversation | None = None, conversation_id: int | None = None,
           channel_slug: str | None = "", actor: str = "", target: object = "", summary: str = "",
           **extra: Any) -> AuditEvent:
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


def record_many(events: Sequence[dict[str, Any]]) -> int:
    """Several events in one statement (each a dict of `record`'s keyword arguments;
    `audit.sql.insert_events` says why it is SQL)."""
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
    sql.insert_events(at, rows)
    console.events_recorded(AuditEvent(kind=r[0], at=timezone.now(), channel_slug=r[3], conversation_id=r[4],
                                       target=r[5], summary=r[6], extra=events[i]) for i, r in enumerate(rows))
    return len(rows)


def recent(kinds: Collection[str] = (), channel_slugs: Iterable[str] | None = None, agent_key_id: int | None = None,
           since: datetime | None = None, limit: int = 100) -> list[AuditEvent]:
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


def prune(now: datetime, budget: pruning.Budget) -> int:
    """Events older than AGENTLOOP_RETAIN_AUDIT_DAYS (365), in batches
    (agentloop.core.pruning); run by the retention sweep."""
    cutoff = now - timedelta(days=settings.AGENTLOOP_RETAIN_AUDIT_DAYS)
    return pruning.delete_old(AuditEvent, "at", cutoff, AuditEvent.objects.filter(at__lt=cutoff), budget)
