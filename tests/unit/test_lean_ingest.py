"""The Telegram webhook's lean ASGI path (conversations/lean_ingest.py): the same answers
as the Django view for every kind of request, without ever reaching Django's stack, and
group commit (ingest.admit_many) where one bad admission fails alone.

The lean app is driven in-process over ASGI (httpx's ASGITransport) with a Django app
behind it that fails the test if reached; its admitter thread has its own database
connection, hence transactional_db. The real server (daphne) serves the same path in
test_telegram_webhook's concurrency tests and test_web_outage's 503s."""

import asyncio
import json
from contextlib import contextmanager

import httpx
import pytest
from django.db import DatabaseError, IntegrityError, connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentloop.core.middleware import database_unavailable
from audit.models import AuditEvent, EventKind
from conversations import ingest
from conversations.ingest import Inbound, batch
from conversations.lean_ingest import LeanIngest
from conversations.models import BufferState, Channel, Conversation, ConversationState, InboundMessage, MessageBuffer

SECRET = "lean-secret"
HEADER = "X-Telegram-Bot-Api-Secret-Token"


def update(update_id, text="hola", chat=777, first_name="Ana"):
    return {"update_id": update_id, "message": {
        "message_id": update_id, "date": 1764417600, "text": text,
        "from": {"id": chat, "is_bot": False, "first_name": first_name},
        "chat": {"id": chat, "type": "private", "first_name": first_name}}}


async def _django_must_not_answer(scope, receive, send):
    raise AssertionError(f"the lean path handed {scope['method']} {scope['path']} to Django")


@pytest.fixture
def lean(transactional_db):
    app = LeanIngest(_django_must_not_answer)
    yield app
    app.admitter.stop()


@pytest.fixture
def channels(transactional_db):
    Channel.objects.create(slug="tg", kind="telegram", platform_settings={"bot_token": "1:A", "webhook_secret": SECRET})
    Channel.objects.create(slug="nosecret", kind="telegram", platform_settings={"bot_token": "2:A"})
    Channel.objects.create(slug="api-chan", kind="api")
    Channel.objects.forget_cached()


def post_lean(app, requests):
    """POST each (slug, body, headers) to the lean app, all at once; the responses."""
    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return await asyncio.gather(*(http.post(f"/webhooks/telegram/{slug}/", content=body, headers=headers)
                                          for slug, body, headers in requests))

    return asyncio.run(run())


def post_view(slug, body, headers):
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    return Client().post(f"/webhooks/telegram/{slug}/", data=body, content_type="application/json", **extra)


CASES = {
    "unknown channel": ("nope", json.dumps(update(1)), {HEADER: SECRET}),
    "not a telegram channel": ("api-chan", json.dumps(update(1)), {HEADER: SECRET}),
    "channel without a secret": ("nosecret", json.dumps(update(1)), {HEADER: SECRET}),
    "missing secret": ("tg", json.dumps(update(1)), {}),
    "wrong secret": ("tg", json.dumps(update(1)), {HEADER: "nope"}),
    "not JSON": ("tg", "{not json", {HEADER: SECRET}),
    "not an update": ("tg", json.dumps({"hello": 1}), {HEADER: SECRET}),
    "an update we ignore": ("tg", json.dumps({"update_id": 5, "edited_message": update(5)["message"]}),
                            {HEADER: SECRET}),
    "too large": ("tg", json.dumps(update(1, text="x" * 300_000)), {HEADER: SECRET}),
    "unstorable (NUL)": ("tg", json.dumps(update(9, text="a\x00b")), {HEADER: SECRET}),
}


@pytest.mark.parametrize("case", CASES)
def test_the_lean_path_answers_like_the_view(lean, channels, case):
    slug, body, headers = CASES[case]
    [fast] = post_lean(lean, [(slug, body, headers)])
    slow = post_view(slug, body, headers)
    assert (fast.status_code, fast.json()) == (slow.status_code, slow.json())
    assert fast.headers["content-type"] == "application/json"
    assert not InboundMessage.objects.exists()


def test_an_unstorable_update_is_refused_with_200_and_audited(lean, channels):
    [response] = post_lean(lean, [("tg", json.dumps(update(9, text="a\x00b")), {HEADER: SECRET})])
    assert response.status_code == 200 and "NUL" in response.json()["refused"]
    assert AuditEvent.objects.filter(kind=EventKind.MESSAGE_REFUSED, target="message 777:9").exists()


def test_concurrent_updates_are_each_admitted_once_and_a_retry_is_a_duplicate(lean, channels):
    """40 updates at once (batches share a commit), then all of them again."""
    requests = [("tg", json.dumps(update(100 + i, chat=1000 + i % 7)), {HEADER: SECRET}) for i in range(40)]
    first = post_lean(lean, requests)
    assert [(r.status_code, r.json()) for r in first] == [(200, {"ok": True, "duplicate": False})] * 40
    again = post_lean(lean, requests)
    assert [(r.status_code, r.json()) for r in again] == [(200, {"ok": True, "duplicate": True})] * 40
    assert InboundMessage.objects.count() == 40
    # The view sees the same dedup: it is the database's.
    assert post_view(*requests[0]).json() == {"ok": True, "duplicate": True}


def test_other_requests_go_to_django(transactional_db):
    reached = []

    async def django(scope, receive, send):
        reached.append((scope["method"], scope["path"]))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    app = LeanIngest(django)

    async def run():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as http:
            await http.get("/webhooks/telegram/tg/")
            await http.post("/api/v1/channels/x/messages", json={})
            await http.post("/webhooks/telegram/tg/", json={}, headers={"Host": "evil.example"})

    asyncio.run(run())
    app.admitter.stop()
    assert reached == [("GET", "/webhooks/telegram/tg/"), ("POST", "/api/v1/channels/x/messages"),
                       ("POST", "/webhooks/telegram/tg/")]


def _inbound(i, chat="c", message="m"):
    return Inbound(platform_message_id=f"{message}{i}", chat_id=f"{chat}{i}", sender_id=f"{chat}{i}", text="hola")


def test_group_commit_one_bad_admission_fails_alone(transactional_db):
    """A channel deleted after it was cached: its admission breaks a foreign key, which
    both databases check at commit (deferred). The batch's commit fails; the others are
    admitted again one by one, and only the bad one gets its error."""
    good = Channel.objects.create(slug="good", kind="api")
    gone = Channel.objects.create(slug="gone", kind="api")
    Channel.objects.filter(pk=gone.pk).delete()
    results = ingest.admit_many([(good, _inbound(1)), (gone, _inbound(2)), (good, _inbound(3))],
                                lambda exc: False)
    assert isinstance(results[1], Exception)
    assert [r.duplicate for r in (results[0], results[2])] == [False, False]
    assert sorted(InboundMessage.objects.values_list("platform_message_id", flat=True)) == ["m1", "m3"]


def test_group_commit_a_database_fault_fails_the_whole_batch_and_stores_nothing(transactional_db):
    """When the error is the database's (is_fault), no admission of the batch is kept:
    every request of it is answered 503 and retried by its client."""
    good = Channel.objects.create(slug="good", kind="api")
    gone = Channel.objects.create(slug="gone", kind="api")
    Channel.objects.filter(pk=gone.pk).delete()
    with pytest.raises(IntegrityError):
        ingest.admit_many([(good, _inbound(1)), (gone, _inbound(2)), (good, _inbound(3))], lambda exc: True)
    assert not InboundMessage.objects.exists()


@contextmanager
def _message_trigger(name, timing, text, action_postgresql, action_sqlite):
    """A trigger on the messages table, `timing` (BEFORE, AFTER) each INSERT of a message
    whose text is `text`, running the action written for the database at hand; dropped
    after."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"CREATE FUNCTION {name}() RETURNS trigger AS $$ BEGIN "
                           f"IF NEW.text = '{text}' THEN {action_postgresql}; END IF; RETURN NEW; END "
                           f"$$ LANGUAGE plpgsql")
            cursor.execute(f"CREATE TRIGGER {name} {timing} INSERT ON conversations_inboundmessage "
                           f"FOR EACH ROW EXECUTE FUNCTION {name}()")
        else:
            cursor.execute(f"CREATE TRIGGER {name} {timing} INSERT ON conversations_inboundmessage "
                           f"WHEN NEW.text = '{text}' BEGIN {action_sqlite}; END")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER {name}" + (" ON conversations_inboundmessage"
                                                     if connection.vendor == "postgresql" else ""))
            if connection.vendor == "postgresql":
                cursor.execute(f"DROP FUNCTION {name}()")


@pytest.fixture
def boom_trigger(transactional_db):
    """A real database error in the middle of a batch: a trigger that refuses the message
    whose text is "boom" (what a constraint violation does), on either database."""
    with _message_trigger("refuse_boom", "BEFORE", "boom", "RAISE EXCEPTION 'boom refused'",
                          "SELECT RAISE(ABORT, 'boom refused')"):
        yield


def test_group_commit_a_statement_failing_mid_batch_fails_alone(boom_trigger):
    """The batch's admissions share its transaction without savepoints, so a statement
    that fails leaves it unusable: the batch is rolled back and each message admitted
    again on its own. Only the bad one gets its error; each good one is stored once."""
    channel = Channel.objects.create(slug="good", kind="api")
    bad = Inbound(platform_message_id="m2", chat_id="c2", sender_id="c2", text="boom")
    results = ingest.admit_many([(channel, _inbound(1)), (channel, bad), (channel, _inbound(3))], lambda exc: False)
    assert isinstance(results[1], DatabaseError) and "boom refused" in str(results[1])
    assert [r.duplicate for r in (results[0], results[2])] == [False, False]
    assert sorted(InboundMessage.objects.values_list("platform_message_id", flat=True)) == ["m1", "m3"]
    assert Conversation.objects.filter(chat_id="c2").count() <= 1  # its conversation may stay, once


def test_group_commit_takes_no_savepoint_per_admission(transactional_db):
    """On PostgreSQL each savepoint is two round trips, and an admission used to take two
    of them. A batch of new chats now writes each table once for the whole batch (its
    rows as one JSON parameter: contacts, conversations, buffers, messages) after one
    look for the conversations, on both databases (SQLite wrote one INSERT per row after
    one look per message: 5 statements a message, each compiled and bound in Python).
    Nothing else but BEGIN and COMMIT."""
    channel = Channel.objects.create(slug="good", kind="api")
    with CaptureQueriesContext(connection) as queries:
        results = ingest.admit_many([(channel, _inbound(i)) for i in range(5)], lambda exc: False)
    assert all(not r.duplicate for r in results)
    statements = [q["sql"].split()[0].upper() for q in queries.captured_queries]
    assert not [s for s in statements if s in ("SAVEPOINT", "RELEASE", "ROLLBACK")], statements
    # Besides those, only the dashboard's "is anyone watching?" look (cached, at most once).
    admissions = [q["sql"] for q in queries.captured_queries if "conversations_" in q["sql"]]
    assert statements.count("INSERT") == 4
    assert len(admissions) == 5, admissions
    buffers = {m.conversation_id: m.buffer_id for m in InboundMessage.objects.all()}
    assert [r.buffer_id for r in results] == [buffers[r.conversation_id] for r in results]
    assert len(set(buffers.values())) == 5 and Conversation.objects.count() == 5


def test_a_batch_of_people_back_after_their_reply_opens_their_buffers_in_two_statements(transactional_db):
    """The same five people write again once their buffers were flushed (answered, the
    commonest next message): the batch reads their conversations once and writes their
    new buffers and messages a statement each, as it does for new chats (it was two
    statements a message, one by one)."""
    channel = Channel.objects.create(slug="good", kind="api")
    ingest.admit_many([(channel, _inbound(i)) for i in range(5)], lambda exc: False)
    _flush_every_buffer()
    with CaptureQueriesContext(connection) as queries:
        results = ingest.admit_many([(channel, _inbound(i, message=f"again{i}")) for i in range(5)],
                                    lambda exc: False)
    assert [(r.duplicate, r.disposition) for r in results] == [(False, "buffered")] * 5
    admissions = [q["sql"] for q in queries.captured_queries if "conversations_" in q["sql"]]
    looks = ["SELECT"] * (2 if connection.vendor == "postgresql" else 1)  # PostgreSQL locks them, then reads
    assert [q.split()[0].upper() for q in admissions] == [*looks, "INSERT", "INSERT"], admissions
    opened = MessageBuffer.objects.filter(state=BufferState.OPEN)
    assert sorted(r.buffer_id for r in results) == sorted(opened.values_list("pk", flat=True))
    assert {m.buffer_id for m in InboundMessage.objects.filter(platform_message_id__startswith="again")} == \
        {r.buffer_id for r in results}


def test_a_burst_batched_joins_its_open_buffers_in_one_statement(transactional_db):
    """Five people each write again while their buffer is still open (a burst): the
    batch stores the messages in those buffers and re-plans them, a statement each for
    the whole batch (it was two a message: the message, its buffer's compare-and-swap)."""
    channel = Channel.objects.create(slug="good", kind="api")
    first = ingest.admit_many([(channel, _inbound(i)) for i in range(5)], lambda exc: False)
    with CaptureQueriesContext(connection) as queries:
        results = ingest.admit_many([(channel, _inbound(i, message="more")) for i in range(5)], lambda exc: False)
    admissions = [q["sql"] for q in queries.captured_queries if "conversations_" in q["sql"]]
    looks = ["SELECT"] * (2 if connection.vendor == "postgresql" else 1)
    assert [q.split()[0].upper() for q in admissions] == [*looks, "INSERT", "UPDATE"], admissions
    assert [r.buffer_id for r in results] == [r.buffer_id for r in first]
    buffers = MessageBuffer.objects.in_bulk([r.buffer_id for r in results])
    assert {b.message_count for b in buffers.values()} == {2}
    assert [r.flush_at for r in results] == [buffers[r.buffer_id].flush_at for r in results]
    assert all(later.flush_at >= earlier.flush_at for later, earlier in zip(results, first))


@pytest.fixture
def claimed_meanwhile(transactional_db):
    """The flusher's claim of a buffer committed between the admission's read of it and
    its re-plan (the flusher does not lock conversations): a trigger flushes the buffer
    a message whose text is "claimed meanwhile" was just stored in, on either database."""
    flush = ("UPDATE conversations_messagebuffer SET state = 'flushed', flushed_at = CURRENT_TIMESTAMP "
             "WHERE id = NEW.buffer_id")
    with _message_trigger("claim_meanwhile", "AFTER", "claimed meanwhile", flush, flush):
        yield


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "one by one"])
def test_a_message_whose_open_buffer_was_claimed_meanwhile_starts_the_next_one(claimed_meanwhile, batched):
    """The re-plan's compare-and-swap finds the buffer flushed: the message moves to a new
    buffer of its own (its turn was made without it), batched as one by one."""
    channel = Channel.objects.create(slug="good", kind="api")
    first = ingest.admit_many([(channel, _inbound(i)) for i in range(2)], lambda exc: False)
    late = Inbound(platform_message_id="late", chat_id="c0", sender_id="c0", text="claimed meanwhile")
    joining = [(channel, late), (channel, _inbound(1, message="more"))]
    results = (ingest.admit_many(joining, lambda exc: False) if batched
               else [ingest.admit(channel, inbound) for _, inbound in joining])
    moved = InboundMessage.objects.get(platform_message_id="late")
    assert moved.buffer_id == results[0].buffer_id != first[0].buffer_id
    assert MessageBuffer.objects.get(pk=first[0].buffer_id).state == BufferState.FLUSHED
    assert (moved.buffer.state, moved.buffer.message_count) == (BufferState.OPEN, 1)
    assert results[1].buffer_id == first[1].buffer_id  # the other joined its open buffer


def _flush_every_buffer():
    """Every open buffer closed, as the flusher leaves one whose turn was made."""
    MessageBuffer.objects.filter(state=BufferState.OPEN).update(state=BufferState.FLUSHED, flushed_at=timezone.now())


def _outcome(channel):
    """What admissions left in the database for `channel`, without its ids: per message
    (platform id, chat, disposition, kind, its buffer's message count and state)."""
    return sorted((m.platform_message_id, m.conversation.chat_id, m.disposition, m.kind,
                   m.buffer.message_count if m.buffer else None, m.buffer.state if m.buffer else None)
                  for m in InboundMessage.objects.filter(channel=channel).select_related("conversation", "buffer"))


def test_a_batch_admits_like_one_by_one_whatever_its_mix(transactional_db, monkeypatch):
    """The batch's shared work (conversations locked and read, new ones
    created, their first messages stored, each as one statement for the batch) leaves
    exactly what admitting the same messages one by one leaves: a conversation that
    exists with its buffer open, new chats, a chat's second message in the same batch,
    a command opening a chat, a sender seen in another chat, a message admitted before,
    the same message twice in the batch and an unstorable one; and conversations that
    exist with no buffer open (their last one flushed): a person back, twice in the
    batch, with a new language, with a command, an old message retried, and one a
    person holds."""
    def mix(prefix):
        return [
            Inbound(platform_message_id=f"{prefix}-back-2", chat_id="back", sender_id="back", text="me again"),
            Inbound(platform_message_id=f"{prefix}-back-3", chat_id="back", sender_id="back", text="and"),
            Inbound(platform_message_id=f"{prefix}-lang-2", chat_id="lang", sender_id="lang", text="olá",
                    language="pt"),
            Inbound(platform_message_id=f"{prefix}-cmdback", chat_id="cmdback", sender_id="cmdback", text="/help"),
            Inbound(platform_message_id=f"{prefix}-retried-1", chat_id="retried", sender_id="retried", text="first"),
            Inbound(platform_message_id=f"{prefix}-held-2", chat_id="held", sender_id="held", text="hello?"),
            Inbound(platform_message_id=f"{prefix}-old-2", chat_id="old", sender_id="old", text="second"),
            Inbound(platform_message_id=f"{prefix}-new-1", chat_id="new", sender_id="new", text="hi"),
            Inbound(platform_message_id=f"{prefix}-new-2", chat_id="new", sender_id="new", text="again"),
            Inbound(platform_message_id=f"{prefix}-cmd", chat_id="cmd", sender_id="cmd", text="/help"),
            Inbound(platform_message_id=f"{prefix}-grp", chat_id="group", sender_id="old", text="in a group",
                    is_group=True),
            Inbound(platform_message_id=f"{prefix}-old-1", chat_id="old", sender_id="old", text="retried"),
            Inbound(platform_message_id=f"{prefix}-twice", chat_id="twice", sender_id="twice", text="one"),
            Inbound(platform_message_id=f"{prefix}-twice", chat_id="twice", sender_id="twice", text="one"),
            Inbound(platform_message_id=f"{prefix}-bad", chat_id="bad", sender_id="bad", text="nul\x00"),
            Inbound(platform_message_id=f"{prefix}-photo", chat_id="photo", sender_id="photo", media_type="photo"),
        ]

    batched, alone = (Channel.objects.create(slug=slug, kind="api") for slug in ("batched", "alone"))
    for channel, prefix in ((batched, "b"), (alone, "a")):
        for chat in ("back", "lang", "cmdback", "retried", "held"):
            ingest.admit(channel, Inbound(platform_message_id=f"{prefix}-{chat}-1", chat_id=chat, sender_id=chat,
                                          text="first", language="es"))
        Conversation.objects.filter(channel=channel, chat_id="held").update(state=ConversationState.PERSON)
    _flush_every_buffer()
    for channel, prefix in ((batched, "b"), (alone, "a")):
        ingest.admit(channel, Inbound(platform_message_id=f"{prefix}-old-1", chat_id="old", sender_id="old",
                                      text="first"))
    # The batch as a batch: not failed and admitted again one by one, which would
    # leave the same rows whatever the batch's own statements do.
    monkeypatch.setattr(batch, "_admit_alone", lambda *args: pytest.fail("the batch failed"))
    results = ingest.admit_many([(batched, inbound) for inbound in mix("b")], lambda exc: False)
    expected = []
    for inbound in mix("a"):
        try:
            expected.append(ingest.admit(alone, inbound))
        except ingest.Unstorable as exc:
            expected.append(exc)

    def shape(result):
        if isinstance(result, Exception):
            return type(result).__name__
        return (result.duplicate, result.disposition, result.window_kind, result.message_id is not None)

    assert [shape(r) for r in results] == [shape(r) for r in expected]
    assert [(p.removeprefix("b"), *rest) for p, *rest in _outcome(batched)] == \
        [(p.removeprefix("a"), *rest) for p, *rest in _outcome(alone)]
    assert Conversation.objects.filter(channel=batched).count() == Conversation.objects.filter(channel=alone).count()
    assert results[7].buffer_id == results[8].buffer_id  # the second message joined the first's buffer
    assert results[0].buffer_id == results[1].buffer_id  # so did a person's back in a new buffer
    assert set(Conversation.objects.filter(channel=batched, chat_id="lang").values_list("language", flat=True)) == {"pt"}


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="parallel writers are PostgreSQL's")
def test_concurrent_batches_of_the_same_new_chats_create_each_once(transactional_db):
    """Four threads, each with a connection of its own, admit batches over the same 40
    new chats at once (each message in two batches, as a webhook retried meanwhile): each
    conversation and contact is created once, each message stored once, and each chat's
    messages share one open buffer."""
    import threading

    from django.db import connections

    channel = Channel.objects.create(slug="race", kind="api")
    chats = [f"chat{i}" for i in range(40)]
    start = threading.Barrier(4)
    errors = []

    def admit(order):
        try:
            start.wait()
            for at in range(0, len(order), 8):
                batch = [(channel, Inbound(platform_message_id=f"{chat}-{n}", chat_id=chat, sender_id=chat, text="hi"))
                         for chat, n in order[at:at + 8]]
                for result in ingest.admit_many(batch, database_unavailable):
                    if isinstance(result, Exception):
                        errors.append(result)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    messages = [(chat, n) for chat in chats for n in (1, 2)]
    orders = [messages, messages[::-1], messages[1::2] + messages[::2], messages[::2] + messages[1::2]]
    threads = [threading.Thread(target=admit, args=(order,)) for order in orders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert Conversation.objects.filter(channel=channel).count() == 40
    assert channel.contacts.count() == 40
    stored = InboundMessage.objects.filter(channel=channel)
    assert stored.count() == 80
    for chat in chats:
        assert len({m.buffer_id for m in stored if m.conversation.chat_id == chat}) == 1


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="deadlocks are PostgreSQL's; SQLite serialises writers")
def test_group_commit_a_deadlock_mid_batch_is_admitted_again_one_by_one(transactional_db):
    """A batch that loses a deadlock (PostgreSQL rolls its transaction back) is not a
    database outage: its messages are admitted again one by one, none answered 503."""
    with connection.cursor() as cursor:
        # Once only (a sequence is not rolled back): the first try deadlocks, the next one passes.
        cursor.execute("CREATE SEQUENCE deadlock_once")
        cursor.execute("CREATE FUNCTION deadlock_once() RETURNS trigger AS $$ BEGIN "
                       "IF NEW.text = 'deadlock' AND nextval('deadlock_once') = 1 THEN "
                       "RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01'; END IF; RETURN NEW; END "
                       "$$ LANGUAGE plpgsql")
        cursor.execute("CREATE TRIGGER deadlock_once BEFORE INSERT ON conversations_inboundmessage "
                       "FOR EACH ROW EXECUTE FUNCTION deadlock_once()")
    try:
        channel = Channel.objects.create(slug="good", kind="api")
        loser = Inbound(platform_message_id="m2", chat_id="c2", sender_id="c2", text="deadlock")
        results = ingest.admit_many([(channel, _inbound(1)), (channel, loser), (channel, _inbound(3))],
                                    database_unavailable)
        assert [r.duplicate for r in results] == [False, False, False]
        assert sorted(InboundMessage.objects.values_list("platform_message_id", flat=True)) == ["m1", "m2", "m3"]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER deadlock_once ON conversations_inboundmessage")
            cursor.execute("DROP FUNCTION deadlock_once()")
            cursor.execute("DROP SEQUENCE deadlock_once")


def test_a_request_that_waited_past_the_queue_deadline_is_answered_503_unadmitted(lean, channels, monkeypatch):
    """Its sender has given up (and sends it again): admitting it would only keep newer
    requests waiting, as after a failover's outage (tests/end_to_end/test_failover.py)."""
    from conversations import lean_ingest

    request = [("tg", json.dumps(update(7)), {HEADER: SECRET})]
    monkeypatch.setattr(lean_ingest, "QUEUE_DEADLINE", -1.0)  # every request waited "too long"
    [late] = post_lean(lean, request)
    assert late.status_code == 503 and late.headers["Retry-After"] and not InboundMessage.objects.exists()
    monkeypatch.setattr(lean_ingest, "QUEUE_DEADLINE", 3.0)
    [again] = post_lean(lean, request)
    assert (again.status_code, again.json()) == (200, {"ok": True, "duplicate": False})
    assert InboundMessage.objects.count() == 1
