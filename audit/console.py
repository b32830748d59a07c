"""What the operator console shows of the audit trail: every new event, live, and the
dashboard's figures about caught duplicates."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from django.db import connections
from django.db.models.fields.json import KeyTextTransform
from django.utils import timezone

from agentloop.core import live
from agentloop.core.people import display_name
from agentloop.core.redaction import redact
from audit.models import AuditEvent, EventKind

if TYPE_CHECKING:
    from django.db.models import QuerySet


def event_payload(event: AuditEvent) -> live.Event:
    """What a page is shown of an event: plain JSON (the kind's label a str in the
    language active where it is built, never a lazy text)."""
    return {"kind": "audit", "event": event.kind, "label": str(EventKind(event.kind).label), "id": event.pk,
            "conversation": event.conversation_id, "channel": event.channel_slug, "target": event.target,
            "summary": redact(event.summary), "tool": (event.extra or {}).get("tool", ""),
            # Who acted, as the console names a person (olga, not console:olga).
            "actor": display_name(event.actor),
            "at": event.at.isoformat() if event.at else None}


# A mass recovery records thousands of events at once; the console is shown the first.
LIVE_BATCH = 50


def events_recorded(events: Iterable[AuditEvent]) -> None:
    """Published inside the transaction that wrote them (`events` may be lazy: nothing
    is built while nobody watches)."""
    if live.anyone_listening():
        live.publish_many([(_groups(e.conversation_id), event_payload(e))
                           for e, _ in zip(events, range(LIVE_BATCH))])


def _groups(conversation_id: int | None) -> tuple[str, ...]:
    if conversation_id is None:
        return (live.DASHBOARD,)
    return (live.DASHBOARD, live.conversation_group(conversation_id))


def recent(limit: int = 15, kinds: Collection[str] = ()) -> list[live.Event]:
    events = AuditEvent.objects.order_by("-at", "-pk")
    if kinds:
        events = events.filter(kind__in=kinds)
    return [event_payload(e) for e in events[:limit]]


def _duplicates(since: datetime | None = None) -> QuerySet[AuditEvent]:
    events = AuditEvent.objects.filter(kind=EventKind.DUPLICATE_PREVENTED)
    return events if since is None else events.filter(at__gte=since)


def duplicates_by_day(since: datetime, now: datetime | None = None) -> dict[str, int]:
    """Caught duplicates per day (UTC) from `since`'s day to today's: one range count per
    day on the (kind, at) index, not the day of every event computed and grouped (on
    SQLite a Python function per row: 200,000 events took seconds, issue 30)."""
    now = now or timezone.now()
    day = since.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    counts: dict[str, int] = {}
    while day <= now:
        n = _duplicates(max(day, since)).filter(at__lt=day + timedelta(days=1)).count()
        if n:
            counts[day.date().isoformat()] = n
        day += timedelta(days=1)
    return counts


# Duplicates per tool read the tool out of each event's JSON: over the latest this many.
TOOL_SAMPLE = 10_000


def duplicates_by_tool(since: datetime | None = None) -> dict[str, int]:
    """Caught duplicates per tool among the latest TOOL_SAMPLE since then (all of them
    below that; past it the shares, not the totals, are what the dashboard shows)."""
    # Grouped over the latest as a subquery in FROM, read once along the date's index:
    # as `pk IN (the latest)` PostgreSQL read each event twice (72 ms against 24 ms on
    # tests.bench.grown's database), and counted in Python the 10,000 rows cost more
    # to fetch than to read (issue 30).
    latest = (_duplicates(since).order_by("-at").annotate(tool=KeyTextTransform("tool", "extra"))
              .values_list("tool")[:TOOL_SAMPLE])
    sql, params = latest.query.sql_with_params()
    with connections[latest.db].cursor() as cursor:
        cursor.execute(f"SELECT tool, COUNT(*) FROM ({sql}) latest GROUP BY tool", params)
        rows = cursor.fetchall()
    counts: dict[str, int] = {}
    for tool, n in rows:  # a missing tool and an empty one are both "?"
        counts[tool or "?"] = counts.get(tool or "?", 0) + n
    return counts
