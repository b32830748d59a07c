"""The admin and the dashboard on tables that grow by the million (issue 30;
agentloop.core.big_tables): counts bounded, the date drill-down probed, the indexes the
story page and the changelists need present and usable, the dashboard's figures
bounded. What they cost at 1 million rows is `python -m tests.bench grown`'s."""

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from agentloop.console import dashboard
from agentloop.core import big_tables
from audit import console as audit_console
from audit.models import AuditEvent, EventKind
from conversations import handoff
from conversations.models import InboundMessage
from delivery import console as delivery_console
from delivery import ledger
from delivery.models import OutboundKind, OutboundMessage, OutboundState
from tools import console as tools_console
from tools.models import ActionClaim

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(client):
    client.force_login(User.objects.create_superuser("olga", "olga@example.com", "pw-olga-1"))
    return client


def events(count, at=None, **fields):
    at = at or timezone.now()
    return AuditEvent.objects.bulk_create([AuditEvent(kind=EventKind.CONTROL_COMMAND, at=at - timedelta(seconds=i),
                                                      **fields) for i in range(count)])


def test_a_changelist_counts_exactly_up_to_the_cap(operator, monkeypatch):
    monkeypatch.setattr(big_tables, "COUNT_CAP", 5)
    events(4)
    response = operator.get(reverse("admin:audit_auditevent_changelist"))
    cl = response.context["cl"]
    assert (cl.result_count, cl.paginator.capped, cl.full_result_count) == (4, False, None)  # no whole-table count
    assert "4 audit events" in response.content.decode()


def test_past_the_cap_the_count_says_so(operator, monkeypatch):
    monkeypatch.setattr(big_tables, "COUNT_CAP", 5)
    events(7)
    response = operator.get(reverse("admin:audit_auditevent_changelist"))
    paginator, page = response.context["cl"].paginator, response.content.decode()
    assert paginator.capped
    if connection.vendor == "postgresql":  # the planner's estimate when it is past the cap, else the cap
        assert ("about " in page) == paginator.estimated
        assert paginator.count == (big_tables.planner_estimate(AuditEvent.objects.all()) if paginator.estimated
                                   else 5)
    else:
        assert (paginator.count, paginator.estimated) == (5, False)
        assert "more than 5 audit events" in page


def test_the_estimate_is_postgresqls_own(db):
    events(3)
    estimate = big_tables.planner_estimate(AuditEvent.objects.filter(kind=EventKind.CONTROL_COMMAND))
    if connection.vendor == "postgresql":
        assert isinstance(estimate, int) and estimate >= 0
    else:
        assert estimate is None


@pytest.mark.parametrize("kind", ["year", "month", "day"])
@pytest.mark.parametrize("sample", [1000, 1])  # the bounds found among the table's edge rows, or past them
def test_the_probed_date_drill_down_finds_what_djangos_distinct_finds(db, kind, sample, monkeypatch):
    monkeypatch.setattr(big_tables, "BOUND_SAMPLE", sample)
    now = timezone.now()
    for days in (0, 1, 3, 40, 400):
        events(2, at=now - timedelta(days=days), actor="old" if days >= 40 else "new")
    probed = big_tables._probed(type(AuditEvent.objects.all()))
    for rows in (AuditEvent.objects.all(), AuditEvent.objects.filter(actor="old"),
                 AuditEvent.objects.filter(actor="new")):
        plain = AuditEvent.objects.filter(pk__in=rows.values("pk"))
        rows.__class__ = probed
        assert rows.datetimes("at", kind) == list(plain.datetimes("at", kind))
        assert rows.datetimes("at", kind, order="DESC") == list(plain.datetimes("at", kind, order="DESC"))
    rows = AuditEvent.objects.filter(pk=0)
    rows.__class__ = probed
    assert rows.datetimes("at", kind) == []


@pytest.mark.parametrize("edge", [1000, 4, 1])
def test_a_page_found_near_the_tables_edge_is_the_page_the_whole_list_has(db, edge, monkeypatch):
    """Pages of lists sorted by their date, looked for among the table's first `edge`
    rows in their order: the same ids as the plain query, whether those rows hold the
    page (most rows match), do not (few match: the plain query), or the order is
    another one."""
    monkeypatch.setattr(big_tables, "PAGE_EDGE", edge)
    now = timezone.now()
    for i in range(12):
        AuditEvent.objects.create(kind=EventKind.CONTROL_COMMAND, at=now - timedelta(minutes=i // 2),
                                  actor="rare" if i in (3, 10) else "common")  # pairs of equal times
    for rows in (AuditEvent.objects.order_by("-at", "-pk"), AuditEvent.objects.filter(actor="common").order_by("-at", "-pk"),
                 AuditEvent.objects.filter(actor="rare").order_by("-at", "-pk"),
                 AuditEvent.objects.filter(actor="common").order_by("at", "pk"),
                 AuditEvent.objects.filter(actor="common").order_by("actor", "-pk")):
        paginator = big_tables.EstimatedCountPaginator(rows, 3)
        paginator.edge_field = "at"
        for number in range(1, min(paginator.num_pages, 2) + 1):
            expected = list(rows.values_list("pk", flat=True)[(number - 1) * 3:number * 3])
            assert [event.pk for event in paginator.page(number)] == expected, (rows.query, number)


def test_a_list_behind_the_tables_edge_is_found_in_the_bigger_sample(db, monkeypatch):
    """A quiet list (its rows not among the table's newest PAGE_EDGE, BOUND_SAMPLE) is
    looked for among EDGE_GROWTH times more before it is read whole: its page and its last
    date are found there, and no statement reads the list without the sample (SQLite; the
    answers on both databases)."""
    monkeypatch.setattr(big_tables, "PAGE_EDGE", 2)
    monkeypatch.setattr(big_tables, "BOUND_SAMPLE", 2)
    now = timezone.now()
    for i in range(12):  # newest first: the quiet actor's rows are the 4th to 7th newest
        AuditEvent.objects.create(kind=EventKind.CONTROL_COMMAND, at=now - timedelta(minutes=i),
                                  actor="quiet" if 3 <= i <= 6 else "busy")
    rows = AuditEvent.objects.filter(actor="quiet").order_by("-at", "-pk")
    paginator = big_tables.EstimatedCountPaginator(rows, 2)
    paginator.edge_field = "at"
    with CaptureQueriesContext(connection) as captured:
        page = [event.pk for event in paginator.page(1)]
        last = big_tables._bound(rows, "at", "-")
    assert page == list(rows.values_list("pk", flat=True)[:2])
    assert last == rows.values_list("at", flat=True).first()
    if connection.vendor == "sqlite":  # PostgreSQL's planner walks the date's index itself (big_tables._bound)
        ordered_reads = [q["sql"] for q in captured if "ORDER BY" in q["sql"] and "LIMIT" in q["sql"]]
        assert ordered_reads and all("IN (SELECT" in sql for sql in ordered_reads), ordered_reads


def test_the_drill_down_pages_answer(operator):
    now = timezone.now()
    events(2, at=now)
    url = reverse("admin:audit_auditevent_changelist")
    for query in ("", f"?at__year={now.year}", f"?at__year={now.year}&at__month={now.month}",
                  f"?at__year={now.year}&at__month={now.month}&at__day={now.day}"):
        response = operator.get(url + query)
        assert response.status_code == 200 and response.context["cl"].result_count == 2, query


def test_periods_refuses_what_it_cannot_probe():
    with pytest.raises(ValueError, match="hour"):
        big_tables.periods(timezone.now(), timezone.now(), "hour")
    first = datetime(2026, 11, 30, 23, 0, tzinfo=UTC)
    assert [s.month for s, _ in big_tables.periods(first, first + timedelta(days=40), "month")] == [11, 12, 1]


def plan(queryset, put_aside=()) -> str:
    """The plan of a queryset, with the table scan ruled out on PostgreSQL (these tables
    are tiny here: what is checked is that the index can serve the query).

    `put_aside`: indexes dropped in the test's transaction (rolled back after it) first. On
    a tiny table, walking an index on the order alone and filtering costs what the index
    on filter and order costs, and which one the planner takes then turns on the table's
    statistics of the moment (they change as autovacuum visits the tables other tests of
    the same database filled): a coin toss, not what is checked."""
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            for index in put_aside:
                # A unique constraint's index goes with its constraint.
                cursor.execute("SELECT conrelid::regclass::text FROM pg_constraint WHERE conname = %s", [index])
                owner = cursor.fetchone()
                cursor.execute(f"ALTER TABLE {owner[0]} DROP CONSTRAINT {index}" if owner else f"DROP INDEX {index}")
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute(f"EXPLAIN {sql}", params)
        else:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
        return " ".join(str(row) for row in cursor.fetchall())


@pytest.mark.parametrize("index, query, put_aside", [
    ("inbound_story_idx", lambda: InboundMessage.objects.filter(conversation_id=1).order_by("-received_at")[:200],
     ["inbound_received_idx"]),
    ("outbound_story_idx", lambda: OutboundMessage.objects.filter(conversation_id=1).order_by("-created_at")[:200],
     ["outbound_created_idx"]),
    ("audit_conversation_idx", lambda: AuditEvent.objects.filter(conversation_id=1).order_by("-at")[:200],
     ["audit_at_idx"]),
    ("audit_at_idx", lambda: AuditEvent.objects.order_by("-at")[:15], []),
    ("audit_channel_at_idx", lambda: AuditEvent.objects.filter(channel_slug="tg").order_by("-at")[:100],
     ["audit_at_idx"]),
    ("audit_target_idx", lambda: AuditEvent.objects.filter(target="turn 12").values("pk")[:100], []),
    ("claim_conversation_idx", lambda: ActionClaim.objects.filter(conversation_id=1).order_by("-created_at")[:200],
     ["claim_created_idx"]),
    ("claim_created_idx", lambda: ActionClaim.objects.order_by("-created_at")[:100], []),
    # The worker's housekeeping, every few seconds: held conversations only, not every one.
    # Its other plan: the channels with an idle time, then their conversations through the
    # unique (channel, chat, sender) index — as cheap on a tiny table, never on a big one.
    ("conversation_held_idx", handoff.held_with_idle_time, ["conversation_unique_chat_sender"]),
])
def test_the_story_and_changelist_queries_have_their_index(db, index, query, put_aside):
    assert index in plan(query(), put_aside)


def test_a_chats_replies_are_found_by_their_index_not_by_walking_the_ledger(make_channel, make_conversation):
    """The ledger's changelist filtered to one chat, newest first. Its other plan is the
    primary key walked backwards, filtering: on a tiny table the two cost the same (and a
    fresh-clone run took the other), so the table holds 2,000 rows over 400 chats here,
    analysed, as a ledger does — in the test's transaction, rolled back after it."""
    channel = make_channel("tg", kind="telegram")
    conversation = make_conversation(channel, "101")
    OutboundMessage.objects.bulk_create(
        OutboundMessage(conversation=conversation, channel=channel, chat_id=str(100 + i % 400), text="…")
        for i in range(2000))
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {OutboundMessage._meta.db_table}")
    query = OutboundMessage.objects.filter(channel_id=channel.pk, chat_id="101").order_by("-pk")[:100]
    assert "outbound_chat_idx" in plan(query)


def test_the_dashboard_counts_ledger_states_up_to_a_cap(make_channel, make_conversation, monkeypatch):
    monkeypatch.setattr(delivery_console, "STATE_COUNT_CAP", 2)
    conversation = make_conversation(make_channel("tg"), "101")
    for text in ("a", "b", "c"):
        ledger.enqueue(conversation, text, kind=OutboundKind.REPLY)
    states = {s["state"]: s for s in delivery_console.replies_by_state()}
    assert (states[OutboundState.PENDING]["count"], states[OutboundState.PENDING]["more"]) == (2, True)
    assert (states[OutboundState.DELIVERED]["count"], states[OutboundState.DELIVERED]["more"]) == (0, False)


def test_duplicates_per_day_are_counted_day_by_day(db):
    now = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    for days, count in ((0, 2), (1, 1), (5, 3)):
        AuditEvent.objects.bulk_create([AuditEvent(kind=EventKind.DUPLICATE_PREVENTED, at=now - timedelta(days=days),
                                                   extra={"tool": "email_send"}) for _ in range(count)])
    events(4, at=now)  # other kinds do not count
    assert audit_console.duplicates_by_day(now - timedelta(days=13), now) == {
        "2026-12-03": 2, "2026-12-02": 1, "2026-11-28": 3}
    assert audit_console.duplicates_by_day(now - timedelta(hours=30), now) == {"2026-12-03": 2, "2026-12-02": 1}


def test_duplicates_per_tool_read_the_latest_sample(db, monkeypatch):
    now = timezone.now()
    AuditEvent.objects.bulk_create([AuditEvent(kind=EventKind.DUPLICATE_PREVENTED, at=now - timedelta(minutes=i),
                                               extra={"tool": "email_send" if i < 3 else "calendar_create_event"})
                                    for i in range(5)])
    assert audit_console.duplicates_by_tool(now - timedelta(days=1)) == {"email_send": 3, "calendar_create_event": 2}
    monkeypatch.setattr(audit_console, "TOOL_SAMPLE", 3)
    assert audit_console.duplicates_by_tool() == {"email_send": 3}


def test_the_guard_telemetry_window_holds_the_latest_claims(db, monkeypatch):
    now = timezone.now()
    week = now - timedelta(days=7)
    ActionClaim.objects.bulk_create([ActionClaim(scope="contact:1", action="email_send", fingerprint=f"f{i}",
                                                 live=False, created_at=now - timedelta(hours=i), expires_at=now,
                                                 lease_until=now) for i in range(5)])
    assert tools_console.window_of_latest(week, 10) == week
    assert tools_console.window_of_latest(week, 3) == now - timedelta(hours=2)
    monkeypatch.setattr(dashboard, "TELEMETRY_CLAIMS", 3)
    [row] = [r for r in dashboard.guard_telemetry(now) if r["tool"] == "email_send"]
    assert row["claims"] == 3


def test_a_page_is_its_ids_then_their_rows_in_the_same_order(operator):
    made = events(150)  # newest first, one second apart
    url = reverse("admin:audit_auditevent_changelist")
    first = list(operator.get(url).context["cl"].result_list)
    second = list(operator.get(url + "?p=2").context["cl"].result_list)
    assert [e.pk for e in first + second] == [e.pk for e in made]


def test_the_24_hour_charts_shrink_to_the_latest_rows_of_a_busy_day(make_channel, make_conversation, monkeypatch):
    from conversations.models import Turn

    channel = make_channel("tg")
    conversation = make_conversation(channel, "101")
    now = timezone.now()
    # The newest first: two turns flushed by their window, then two by max wait; the
    # replies likewise, two delivered then two ambiguous; and one of each a day old.
    for i, reason in enumerate(["window", "window", "max_wait", "max_wait"]):
        Turn.objects.create(conversation=conversation, merged_input="x", flush_reason=reason,
                            created_at=now - timedelta(hours=i + 1))
    Turn.objects.create(conversation=conversation, merged_input="x", flush_reason="media",
                        created_at=now - timedelta(hours=30))
    OutboundMessage.objects.bulk_create([
        OutboundMessage(conversation=conversation, channel=channel, chat_id="101", text="…", last_outcome=outcome,
                        created_at=now - timedelta(hours=i + 1))
        for i, outcome in enumerate(["delivered", "delivered", "ambiguous", "ambiguous"])])
    charts = dashboard.snapshot(now)["charts"]
    assert charts["flush_reasons"] == {"window": 2, "max_wait": 2}
    assert charts["delivery_outcomes"] == {"delivered": 2, "ambiguous": 2}
    assert charts["since"]["flush_reasons"] == charts["since"]["day"] == (now - timedelta(hours=24)).isoformat()

    monkeypatch.setattr(dashboard, "CHART_ROWS", 3)
    charts = dashboard.snapshot(now)["charts"]
    assert charts["flush_reasons"] == {"window": 2, "max_wait": 1}
    assert charts["delivery_outcomes"] == {"delivered": 2, "ambiguous": 1}
    assert charts["since"]["flush_reasons"] == (now - timedelta(hours=3)).isoformat()
    assert charts["since"]["delivery_outcomes"] == (now - timedelta(hours=3)).isoformat()
    assert charts["since"]["latest"] == 3


def test_a_page_keeps_the_changelists_annotations(operator, make_channel, make_conversation):
    from conversations.models import Turn

    conversation = make_conversation(make_channel("tg"), "101")
    Turn.objects.create(conversation=conversation, merged_input="hola", flush_reason="window", state="done")
    [row] = operator.get(reverse("admin:conversations_conversation_changelist")).context["cl"].result_list
    assert row.last_turn == "done"


def messages_by_the_hour(channel, conversation, texts):
    """One message an hour back from now, the newest first: m0, m1, …"""
    now = timezone.now()
    return InboundMessage.objects.bulk_create(
        InboundMessage(channel=channel, conversation=conversation, platform_message_id=f"m{i}", text=text,
                       received_at=now - timedelta(hours=i)) for i, text in enumerate(texts))


def listed(response):
    return [row.platform_message_id for row in response.context["cl"].result_list]


def notes(response):
    return [str(note) for note in response.context["messages"]]


def test_text_is_searched_in_the_newest_rows_and_an_identifier_in_all(operator, make_channel, make_conversation,
                                                                      monkeypatch):
    monkeypatch.setattr(big_tables, "SEARCH_WINDOW", 5)
    channel = make_channel("tg", kind="telegram")
    messages_by_the_hour(channel, make_conversation(channel, "101"),
                         ["hola", "mango", "hola", "hola", "hola", "hola", "mango", "hola"])
    changelist = reverse("admin:conversations_inboundmessage_changelist")

    word = operator.get(changelist, {"q": "mango"})
    assert listed(word) == ["m1"]  # m6 is older than the five newest
    assert any("newest 5 rows" in note and "Pick a date" in note for note in notes(word))
    assert listed(operator.get(changelist, {"q": "m6"})) == ["m6"]  # its platform id, through the index
    # No row of the window has both words (Django's search: every word, in any field); one word names m6.
    assert listed(operator.get(changelist, {"q": "mango m6"})) == ["m6"]

    monkeypatch.setattr(big_tables, "SEARCH_WINDOW", 50)  # a list all recent: the whole of it, no note
    whole = operator.get(changelist, {"q": "mango"})
    assert listed(whole) == ["m1", "m6"] and notes(whole) == []


def test_a_filtered_list_is_searched_in_its_own_newest_rows(operator, make_channel, make_conversation, monkeypatch):
    monkeypatch.setattr(big_tables, "SEARCH_WINDOW", 3)
    busy, quiet = make_channel("busy", kind="telegram"), make_channel("quiet", kind="telegram")
    messages_by_the_hour(busy, make_conversation(busy, "101"), ["hola"] * 6)
    InboundMessage.objects.filter(platform_message_id__in=["m1", "m4"]).update(channel=quiet, text="mango")
    changelist = reverse("admin:conversations_inboundmessage_changelist")
    assert listed(operator.get(changelist, {"q": "mango"})) == ["m1"]  # m4 is not among the 3 newest
    # The quiet channel has two rows: its list is all recent, m4 with it.
    assert listed(operator.get(changelist, {"q": "mango", "channel__id__exact": quiet.pk})) == ["m1", "m4"]


def test_ledger_rows_events_and_claims_are_named_by_id_chat_target_and_scope(operator, make_channel, make_conversation,
                                                               monkeypatch):
    monkeypatch.setattr(big_tables, "SEARCH_WINDOW", 2)
    channel = make_channel("tg", kind="telegram")
    conversation = make_conversation(channel, "101")
    now = timezone.now()
    rows = OutboundMessage.objects.bulk_create(
        OutboundMessage(conversation=conversation, channel=channel, chat_id=str(500 + i), text="hola",
                        created_at=now - timedelta(hours=i)) for i in range(5))
    ledger_list = reverse("admin:delivery_outboundmessage_changelist")
    by_chat = operator.get(ledger_list, {"q": "504"})
    assert [row.pk for row in by_chat.context["cl"].result_list] == [rows[4].pk]
    by_id = operator.get(ledger_list, {"q": str(rows[3].pk)})
    assert rows[3].pk in [row.pk for row in by_id.context["cl"].result_list]

    made = events(5, target="turn 7")
    AuditEvent.objects.filter(pk=made[-1].pk).update(target="turn 12")  # the oldest
    found = operator.get(reverse("admin:audit_auditevent_changelist"), {"q": "turn 12"})
    assert [event.pk for event in found.context["cl"].result_list] == [made[-1].pk]

    claims = ActionClaim.objects.bulk_create(
        ActionClaim(action="email_send", scope=f"contact:{i}", fingerprint=f"f{i}", created_at=now - timedelta(hours=i),
                    live=False, expires_at=now, lease_until=now) for i in range(5))
    found = operator.get(reverse("admin:tools_actionclaim_changelist"), {"q": "contact:4"})
    assert [claim.pk for claim in found.context["cl"].result_list] == [claims[4].pk]


@pytest.mark.parametrize("index, query, put_aside", [
    # The unique constraint's index (SQLite names the one it builds inside CREATE TABLE its own way).
    ("inbound_message_admitted_once" if connection.vendor == "postgresql" else "sqlite_autoindex_conversations_inbound",
     lambda: InboundMessage.objects.filter(big_tables.per_channel(InboundMessage, platform_message_id="m6")), []),
    ("outbound_chat_idx", lambda: OutboundMessage.objects.filter(big_tables.per_channel(OutboundMessage, chat_id="5")),
     []),
    # Its other plan on a tiny table: the claims' default order (newest first) walked and filtered.
    ("claim_lookup_idx", lambda: ActionClaim.objects.filter(scope="contact:4"), ["claim_created_idx"]),
    # Put aside as above: a bitmap scan of the story's index and a sort once won the toss (on
    # a test database copied from a template that pg_dump had carried to the backfill's cluster).
    ("inbound_received_idx",
     lambda: InboundMessage.objects.order_by("-received_at").values_list("received_at", flat=True)[99_999:100_000],
     ["inbound_story_idx"]),
])
def test_a_search_reads_the_tables_through_their_indexes(make_channel, index, query, put_aside):
    make_channel("tg", kind="telegram")  # the channels `per_channel` seeks by
    assert index in plan(query(), put_aside)


@pytest.mark.parametrize("read", [1000, 0])
def test_the_matches_read_as_ids_or_kept_as_a_condition_list_the_same_rows(operator, make_channel,
                                                                           make_conversation, monkeypatch, read):
    """A rare term's matches are read once as ids (MATCHES_READ); a common one's stay a
    condition, joined to the rows an identifier names: the same list either way."""
    monkeypatch.setattr(big_tables, "SEARCH_WINDOW", 4)
    monkeypatch.setattr(big_tables, "MATCHES_READ", read)
    channel = make_channel("tg", kind="telegram")
    messages_by_the_hour(channel, make_conversation(channel, "101"),
                         ["see m6", "hola", "see m6 too", "hola", "hola", "hola", "hola"])
    changelist = reverse("admin:conversations_inboundmessage_changelist")
    response = operator.get(changelist, {"q": "m6"})
    assert listed(response) == ["m0", "m2", "m6"] and response.context["cl"].result_count == 3
