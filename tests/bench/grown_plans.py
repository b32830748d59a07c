"""The query plans behind tests.bench.grown's figures, on the database of DATABASE_URL
(EXPLAIN on PostgreSQL, EXPLAIN QUERY PLAN on SQLite): the story page's reads, a big
changelist's page, a day of its drill-down and its capped count, and the dashboard's
bounded reads. Printed by the grown benchmark after its figures, on the grown copy.

    DATABASE_URL=sqlite:///var/bench-grown.sqlite3 .venv/bin/python -m tests.bench.grown_plans
"""

import os
from datetime import timedelta


def queries():
    from django.utils import timezone

    from agentloop.core.big_tables import search_window_floor
    from audit.models import AuditEvent, EventKind
    from conversations.models import InboundMessage, Turn
    from delivery.models import OutboundMessage
    from tools.models import ActionClaim

    now = timezone.now()
    day = now.replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=2)
    window = search_window_floor(OutboundMessage.objects.all(), "created_at") or day
    return [
        ("story: a conversation's messages, newest 200",
         InboundMessage.objects.filter(conversation_id=1).order_by("-received_at", "-pk")[:200]),
        ("story: its ledger rows", OutboundMessage.objects.filter(conversation_id=1).order_by("-created_at", "-pk")[:200]),
        ("story: its audit events", AuditEvent.objects.filter(conversation_id=1).order_by("-at", "-pk")[:200]),
        ("story: its claims", ActionClaim.objects.filter(conversation_id=1).order_by("-created_at", "-pk")[:200]),
        ("admin: messages, first page", InboundMessage.objects.order_by("-received_at", "-pk")[:100]),
        ("admin: messages of one day", InboundMessage.objects.filter(
            received_at__gte=day, received_at__lt=day + timedelta(days=1)).order_by("-received_at", "-pk")[:100]),
        ("admin: the capped count of rejected messages", InboundMessage.objects.filter(
            disposition="rejected").order_by().values("pk")[:10_001]),
        ("admin: turns, first page", Turn.objects.order_by("-created_at", "-pk")[:100]),
        ("admin: audit events of a kind", AuditEvent.objects.filter(
            kind=EventKind.DUPLICATE_PREVENTED).order_by("-at", "-pk")[:100]),
        ("admin: where a search's window begins (its 100,000th newest row)",
         OutboundMessage.objects.order_by("-created_at").values_list("created_at", flat=True)[99_999:100_000]),
        ("admin: a search's matches in that window, read once as ids", OutboundMessage.objects.filter(
            created_at__gte=window, text__icontains="5012345").order_by().values_list("pk", flat=True)[:1_001]),
        ("admin: a search's identifier, through the (channel, chat) index", OutboundMessage.objects.filter(
            channel_id__in=[1, 2, 3], chat_id="5012345").order_by().values_list("pk", flat=True)[:100]),
        ("admin: turns of a channel, the page among the table's newest 1,000 turns (SQLite only)", Turn.objects.filter(
            conversation__channel_id=1, pk__in=Turn.objects.order_by("-created_at", "-pk").values("pk")[:1_000])
         .order_by("-created_at", "-pk").values_list("pk", flat=True)[:100]),
        ("admin: ledger rows of a channel, its last date among the newest 1,000 rows (SQLite only)",
         OutboundMessage.objects.filter(channel_id=1, created_at__isnull=False, pk__in=OutboundMessage.objects.order_by(
             "-created_at").values("pk")[:1_000]).order_by("-created_at").values_list("created_at", flat=True)[:1]),
        ("dashboard: the latest events", AuditEvent.objects.order_by("-at", "-pk")[:15]),
        ("dashboard: one day's caught duplicates (counted)", AuditEvent.objects.filter(
            kind=EventKind.DUPLICATE_PREVENTED, at__gte=day, at__lt=day + timedelta(days=1)).values("pk")),
        ("dashboard: pending ledger rows (at most 10,000 read)", OutboundMessage.objects.filter(
            state="pending").values_list("channel_id", "last_outcome")[:10_000]),
        ("dashboard: turns in flight", Turn.objects.filter(state="running").order_by("created_at")[:50]),
    ]


def plans() -> list[tuple[str, list[str]]]:
    from django.db import connection

    found = []
    for label, queryset in queries():
        sql, params = queryset.query.sql_with_params()
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(f"EXPLAIN {sql}", params)
                lines = [row[0] for row in cursor.fetchall()]
            else:
                cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
                lines = [row[-1] for row in cursor.fetchall()]
        found.append((label, lines))
    return found


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentloop.settings")
    import django

    django.setup()
    for label, lines in plans():
        print(f"-- {label}")
        for line in lines:
            print(f"   {line}")


if __name__ == "__main__":
    main()
