"""The flusher's claim and the agent's history are hand-written SQL (agentloop/core/rows.py):
what they build must be what the ORM would have loaded — aware datetimes, decoded JSON,
booleans — on SQLite and on PostgreSQL alike. Time is injected."""

from datetime import UTC, datetime, timedelta, timezone

import pytest

from conversations import engine, flushing
from conversations.ingest import Inbound, admit
from conversations.models import Channel, ContextNote, Conversation, MessageBuffer, Turn, TurnState

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
pytestmark = pytest.mark.django_db


def test_a_claimed_buffer_is_the_one_the_orm_would_load(make_channel):
    channel = make_channel("rows", agent_config={"delay": 0.5, "nested": {"a": [1, 2]}})
    admit(channel, Inbound(platform_message_id="1", chat_id="-5", sender_id="7", text="hola", sender_name="Ana",
                           reply_target="1", is_group=True), now=T0)
    admit(channel, Inbound(platform_message_id="2", chat_id="-5", sender_id="7", text="¿vienes?", sender_name="Ana",
                           reply_target="2", is_group=True), now=T0 + timedelta(seconds=1))
    buffer_id = MessageBuffer.objects.get().pk

    [turn] = flushing.flush_many([buffer_id], T0 + timedelta(minutes=5), owner="host:1:1:ab", start=1)

    loaded = MessageBuffer.objects.select_related("conversation__channel").get(pk=buffer_id)
    built = turn.buffer
    assert built.state == loaded.state == "flushed"
    for name in ("flush_at", "first_message_at", "last_message_at", "flushed_at", "flushed_by", "flush_reason",
                 "window_seconds", "message_count"):
        assert getattr(built, name) == getattr(loaded, name), name
    assert built.flushed_at.tzinfo is not None and built.flush_at.tzinfo is not None
    for model in (Conversation, Channel):
        mine = built.conversation if model is Conversation else built.conversation.channel
        theirs = loaded.conversation if model is Conversation else loaded.conversation.channel
        for field in model._meta.concrete_fields:
            assert getattr(mine, field.attname) == getattr(theirs, field.attname), f"{model.__name__}.{field.name}"
    assert built.conversation.channel.agent_config == {"delay": 0.5, "nested": {"a": [1, 2]}}
    assert built.conversation.is_group is True
    assert turn.merged_input == "Ana: hola\nAna: ¿vienes?"
    assert (turn.reply_target, turn.state, turn.owner) == ("2", TurnState.RUNNING, "host:1:1:ab")
    assert Turn.objects.get(pk=turn.pk).merged_input == turn.merged_input


def test_a_buffer_no_longer_due_or_already_flushed_is_not_claimed(make_channel):
    channel = make_channel("rows-late")
    admit(channel, Inbound(platform_message_id="1", chat_id="9", sender_id="9", text="hola y"), now=T0)
    buffer = MessageBuffer.objects.get()
    assert flushing.flush_many([buffer.pk], buffer.flush_at - timedelta(milliseconds=1)) == []
    assert len(flushing.flush_many([buffer.pk], buffer.flush_at)) == 1
    assert flushing.flush_many([buffer.pk], buffer.flush_at + timedelta(seconds=1)) == []
    assert Turn.objects.count() == 1


def test_a_flush_starts_only_the_turns_first_in_line_and_on_postgresql_waits_on_the_server_three_times(
        make_channel):
    """flush_many(start=…) starts a new turn at once only where its conversation has no
    turn ready or running, and within the room it was given. On PostgreSQL the claim, the
    read of what it won and that check are one statement: a batch is BEGIN, claim, the
    messages, the turns' INSERT, COMMIT."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    channel = make_channel("rows-start")
    for chat in ("1", "2", "3"):
        admit(channel, Inbound(platform_message_id=f"a{chat}", chat_id=chat, sender_id=chat, text="hola y"), now=T0)
    first = {b.conversation.chat_id: b.pk for b in MessageBuffer.objects.select_related("conversation")}
    [waiting] = flushing.flush_many([first["1"]], T0 + timedelta(minutes=1))  # chat 1: a turn ready already
    assert waiting.state == TurnState.READY
    admit(channel, Inbound(platform_message_id="b1", chat_id="1", sender_id="1", text="otra y"), now=T0)
    due = list(MessageBuffer.objects.filter(state="open").values_list("pk", flat=True))

    with CaptureQueriesContext(connection) as queries:
        made = flushing.flush_many(due, T0 + timedelta(minutes=1), owner="host:1:1:ab", start=1)
    states = {turn.conversation.chat_id: turn.state for turn in made}
    assert states["1"] == TurnState.READY  # behind the ready one
    assert sorted(states.values()) == [TurnState.READY, TurnState.READY, TurnState.RUNNING]  # room for one
    assert Turn.objects.filter(state=TurnState.RUNNING).count() == 1
    if connection.vendor == "postgresql":
        statements = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]  # the test's
        assert len(statements) == 3 and statements[0].startswith("WITH b AS (UPDATE")  # claim + read + busy


def test_the_flushers_look_is_the_due_buffers_and_the_next_deadline_in_one_statement(make_channel):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    channel = make_channel("rows-look")
    assert flushing.look(T0) == ([], None)
    for chat, at in (("1", T0), ("2", T0 + timedelta(seconds=2)), ("3", T0 + timedelta(seconds=30))):
        admit(channel, Inbound(platform_message_id=chat, chat_id=chat, sender_id=chat, text="hola y"), now=at)
    deadlines = dict(MessageBuffer.objects.values_list("conversation__chat_id", "flush_at"))
    by_id = dict(MessageBuffer.objects.values_list("pk", "conversation__chat_id"))
    now = deadlines["2"]  # the second just due
    with CaptureQueriesContext(connection) as queries:
        due, deadline = flushing.look(now)
    assert len(queries.captured_queries) == 1
    assert sorted(by_id[pk] for pk in due) == ["1", "2"] and due == flushing.due_buffer_ids(now)
    assert deadline == deadlines["3"] == flushing.next_deadline(now) and deadline.tzinfo is not None
    assert flushing.look(deadlines["3"] + timedelta(seconds=1))[1] is None


def test_history_since_the_reset_in_order_with_notes(make_channel):
    channel = make_channel("rows-history")
    conversation = None
    finished = []
    for i in range(3):
        admit(channel, Inbound(platform_message_id=str(i), chat_id="3", sender_id="3", text=f"¿pregunta {i}?"),
              now=T0 + timedelta(minutes=10 * i))
        buffer = MessageBuffer.objects.get(state="open")
        [turn] = flushing.flush_many([buffer.pk], buffer.flush_at)
        Turn.objects.filter(pk=turn.pk).update(state=TurnState.DONE, reply_text=f"respuesta {i}")
        finished.append(turn)
        conversation = turn.conversation
    ContextNote.objects.create(conversation=conversation, text="approved", created_at=finished[1].created_at
                               + timedelta(seconds=1))
    admit(channel, Inbound(platform_message_id="last", chat_id="3", sender_id="3", text="¿y ahora?"),
          now=T0 + timedelta(hours=1))
    buffer = MessageBuffer.objects.get(state="open")
    [current] = flushing.flush_many([buffer.pk], buffer.flush_at)

    assert engine.conversation_history(conversation, current) == [
        {"role": "user", "content": "¿pregunta 0?"}, {"role": "assistant", "content": "respuesta 0"},
        {"role": "user", "content": "¿pregunta 1?"}, {"role": "assistant", "content": "respuesta 1"},
        {"role": "system", "content": "approved"},
        {"role": "user", "content": "¿pregunta 2?"}, {"role": "assistant", "content": "respuesta 2"},
    ]
    assert engine.conversation_history(conversation, current, limit=1) == [
        {"role": "system", "content": "approved"},
        {"role": "user", "content": "¿pregunta 2?"}, {"role": "assistant", "content": "respuesta 2"},
    ]
    Conversation.objects.filter(pk=conversation.pk).update(context_reset_at=finished[2].created_at)
    conversation.refresh_from_db()
    assert engine.conversation_history(conversation, current) == [
        {"role": "user", "content": "¿pregunta 2?"}, {"role": "assistant", "content": "respuesta 2"},
    ]


def test_an_id_list_is_one_array_parameter_on_postgresql_and_selects_the_same_rows(make_channel, make_conversation):
    """`__in` with a list of ids on an integer column, and rows.in_sql: on PostgreSQL one
    array parameter (the statement's text the same for 3 ids or 500), elsewhere Django's
    IN list; the same rows either way, NULLs ignored, an empty list matching nothing, a
    subquery left as Django writes it."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from agentloop.core import rows

    channel = make_channel("ids")
    ids = [make_conversation(channel, str(n)).pk for n in range(5)]
    wanted = [ids[0], ids[3], None, 10 ** 12]

    with CaptureQueriesContext(connection) as queries:
        assert sorted(Conversation.objects.filter(pk__in=wanted).values_list("pk", flat=True)) == [ids[0], ids[3]]
        assert list(Conversation.objects.filter(pk__in=[]).values_list("pk", flat=True)) == []
        assert Conversation.objects.filter(pk__in=Conversation.objects.filter(chat_id="4").values("pk")).get().pk \
            == ids[4]
    listed, subquery = queries.captured_queries[0]["sql"], queries.captured_queries[-1]["sql"]
    if connection.vendor == "postgresql":
        assert "= ANY(" in listed and "::bigint[]" in listed and " IN (" not in listed
    else:
        assert " IN (" in listed and "ANY" not in listed
    assert " IN (SELECT" in subquery

    many = ids * 120  # 600 values: a statement over 4 KB as an IN list
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {rows.table(Conversation)} WHERE {rows.in_sql('id', len(many))}",
                       rows.in_params(many))
        assert cursor.fetchone()[0] == 5
        cursor.execute(f"SELECT count(*) FROM {rows.table(Conversation)} "
                       f"WHERE {rows.in_sql('chat_id', 2, None)}", rows.in_params(["1", "2"]))
        assert cursor.fetchone()[0] == 2
    if connection.vendor == "postgresql":
        assert len(rows.in_sql("id", 600)) < 40


def test_rows_created_many_at_once_are_the_rows_the_orm_would_have_written(make_channel, make_conversation):
    """rows.create_many (one JSON parameter, read by json_to_recordset on PostgreSQL and
    json_each on SQLite) gives every instance its id, in order, and stores each value as
    the ORM would: text with quotes and accents, text that reads as a number, NULLs, aware
    datetimes, booleans, a JSON field. With a conflict target, rows already there return
    nothing (insert_many)."""
    from django.db import connection

    from agentloop.core import rows
    from delivery.models import OutboundKind, OutboundMessage

    channel = make_channel("many")
    conversation = make_conversation(channel, "ana")
    made = rows.create_many(OutboundMessage, [
        OutboundMessage(channel=channel, conversation=conversation, chat_id=f"00{i}", kind=OutboundKind.REPLY,
                        needs_marker=bool(i % 2),
                        text=f'«{i}» "quoted" \\ {i}', chunks=["a", {"b": i}] if i % 2 else [],
                        next_attempt_at=T0 + timedelta(seconds=i) if i % 3 else None)
        for i in range(7)])
    assert [m.pk for m in made] == sorted(m.pk for m in made) and all(m.pk for m in made)
    for i, mine in enumerate(made):
        stored = OutboundMessage.objects.get(pk=mine.pk)
        assert stored.text == f'«{i}» "quoted" \\ {i}'
        assert stored.chat_id == f"00{i}" and stored.needs_marker is bool(i % 2)
        assert stored.chunks == (["a", {"b": i}] if i % 2 else [])
        assert stored.next_attempt_at == (T0 + timedelta(seconds=i) if i % 3 else None)
        assert stored.created_at == mine.created_at and stored.created_at.tzinfo is not None
    from conversations.models import Contact

    first = rows.insert_many(Contact, [Contact(channel=channel, platform_id="p1", display_name="Ana")],
                             ("channel_id", "platform_id"), ("id", "platform_id"))
    again = rows.insert_many(Contact, [Contact(channel=channel, platform_id="p1", display_name="Otra"),
                                       Contact(channel=channel, platform_id="p2", display_name="Eva")],
                             ("channel_id", "platform_id"), ("id", "platform_id"))
    assert [platform_id for _, platform_id in first] == ["p1"] and [p for _, p in again] == ["p2"]
    assert Contact.objects.get(platform_id="p1").display_name == "Ana"
    if connection.vendor == "postgresql":
        assert rows.in_params([3, 1, 2]) == ["{3,1,2}"]


def test_the_values_a_batch_inserts_are_djangos_with_and_without_the_shortcut(make_channel, make_conversation):
    """insert_many hands a plain value of a plain field to the database as it is, skipping
    Django's get_db_prep_save; every other value takes Django's way. Both give what
    Django's own chain gives, field by field and as the batch's JSON: a str of a text field, an int of an integer
    field and of a row's key, a bool, a float, None, and values that must be converted
    (a str-valued choice, a bool given to an integer field, a datetime, JSON)."""
    from django.db import connection

    from agentloop.core import rows
    from conversations.models import FlushReason
    from delivery.models import OutboundKind, OutboundMessage

    channel = make_channel("plain")
    conversation = make_conversation(channel, "ana")
    instances = [
        OutboundMessage(channel=channel, conversation=conversation, chat_id="5", kind=OutboundKind.REPLY,
                        needs_marker=True, text="hola", chunks=["a", {"b": 1}], attempts=2,
                        next_attempt_at=T0, created_at=T0),
        OutboundMessage(channel_id=channel.pk, conversation_id=conversation.pk, turn_id=None, chat_id="6", kind="notice",
                        needs_marker=False, text="", chunks=[], attempts=True, next_attempt_at=None,
                        created_at=T0.astimezone(timezone(timedelta(hours=-3)))),
        Turn(conversation=conversation, created_at=T0, flush_reason=FlushReason.WINDOW, merged_input="x",
             has_media=False, attempts=0),
    ]
    for instance in instances:
        _, fields = rows._insert_sql(type(instance), (), ("id",), True)
        shortcut = [prepare(instance) for prepare in rows._preparers(tuple(fields))]
        django = [f.get_db_prep_save(f.pre_save(instance, True), connection) for f in fields]
        for field, mine, theirs in zip(fields, shortcut, django, strict=True):
            # As the batch's JSON carries them (PostgreSQL's Django wraps an int: Int4(2) == 2).
            assert rows._json_value(mine) == rows._json_value(theirs), field.name
        names = [field.column for field in fields]
        assert rows.records(names, [shortcut]) == rows.records(names, [django])  # the JSON the statement reads
    assert rows._preparers(tuple(fields)) is rows._preparers(tuple(fields))  # made once per field list
    made = rows.create_many(OutboundMessage, instances[:2])
    assert OutboundMessage.objects.get(pk=made[1].pk).attempts == 1  # the bool, converted by Django


def test_aware_gives_the_orms_datetime_and_refuses_text_that_is_no_date_time():
    from agentloop.core import rows

    assert rows.aware(None) is None
    assert rows.aware(datetime(2026, 11, 29, 12, 0)) == T0  # SQLite's naive UTC
    assert rows.aware("2026-11-29 12:00:00") == T0  # an aggregate's stored text
    assert rows.aware(T0 + timedelta(hours=1)) == T0 + timedelta(hours=1)
    with pytest.raises(ValueError, match="not a date-time"):  # was: AttributeError on None
        rows.aware("soon")
