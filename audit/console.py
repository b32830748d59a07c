"""What the operator console shows of the audit trail: every new event, live, and the
dashboard's figures about caught duplicates."""

from django.db.models import Count
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import TruncDate

from agentloop.core import live
from agentloop.core.redaction import redact
from audit.models import AuditEvent, EventKind


def event_payload(event) -> dict:
    return {"kind": "audit", "event": event.kind, "label": EventKind(event.kind).label, "id": event.pk,
            "conversation": event.conversation_id, "channel": event.channel_slug, "target": event.target,
            "summary": redact(event.summary), "tool": (event.extra or {}).get("tool", ""),
            "at": event.at.isoformat() if event.at else None}


# A mass recovery records thousands of events at once; the console is shown the first.
LIVE_BATCH = 50


def events_recorded(events):
    """Published inside the transaction that wrote them (`events` may be lazy: nothing
    is built while nobody watches)."""
    if live.anyone_listening():
        live.publish_many([(_groups(e.conversation_id), event_payload(e))
                           for e, _ in zip(events, range(LIVE_BATCH))])


def _groups(conversation_id):
    if conversation_id is None:
        return (live.DASHBOARD,)
    return (live.DASHBOARD, live.conversation_group(conversation_id))


def recent(limit=15, kinds=()):
    events = AuditEvent.objects.order_by("-at", "-pk")
    if kinds:
        events = events.filter(kind__in=kinds)
    return [event_payload(e) for e in events[:limit]]


def _duplicates(since):
    return AuditEvent.objects.filter(kind=EventKind.DUPLICATE_PREVENTED, at__gte=since)


def duplicates_by_day(since):
    rows = (_duplicates(since).annotate(day=TruncDate("at")).values_list("day")
            .annotate(n=Count("pk")).values_list("day", "n").order_by("day"))
    return {day.isoformat(): n for day, n in rows}


def duplicates_by_tool(since):
    rows = (_duplicates(since).annotate(tool=KeyTextTransform("tool", "extra")).values_list("tool")
            .annotate(n=Count("pk")).values_list("tool", "n"))
    return {tool or "?": n for tool, n in rows}
