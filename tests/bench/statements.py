"""Database statements and round trips per message, per turn and per reply — the
figures docs/scaling.md builds on. Each step is the product's own function, run here
against a real database, as the process that runs it in production calls it.

    DATABASE_URL=postgres://…/scratch .venv/bin/python -m tests.bench.statements
    .venv/bin/python -m tests.bench.statements          # SQLite (var/statements.sqlite3)
    … -m tests.bench.statements -v                      # and each statement's SQL

The database is flushed first: give it one of its own. Statements are what Django
executes (django.test.utils.CaptureQueriesContext: BEGIN, COMMIT and savepoints
included). Round trips, on PostgreSQL only, are counted from libpq's own trace of the
connection: each simple Query (BEGIN, COMMIT, SAVEPOINT…) and each Sync of the extended
protocol is one wait for the server.
"""

import os
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parents[2]
BATCH = 32


def setup(scratch="statements"):
    """Django on DATABASE_URL, else on a fresh SQLite file var/<scratch>.sqlite3; migrated
    and emptied (tests.bench.batch_values uses it too)."""
    if not os.environ.get("DATABASE_URL"):
        db = BASE_DIR / "var" / f"{scratch}.sqlite3"
        db.parent.mkdir(exist_ok=True)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        os.environ["DATABASE_URL"] = f"sqlite:///{db}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentloop.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.setdefault("AGENTLOOP_LIVENESS", "heartbeat")  # no lock thread in this process
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)


class Count:
    """Statements (and, on PostgreSQL, round trips) of the block, per `per` items."""

    def __init__(self, label, per=1):
        self.label, self.per = label, per

    def __enter__(self):
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        connection.ensure_connection()
        self.trace = None
        if connection.vendor == "postgresql":
            from psycopg import pq

            self.trace = tempfile.TemporaryFile("w+")
            pgconn = connection.connection.pgconn
            pgconn.trace(self.trace.fileno())
            pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        self.capture = CaptureQueriesContext(connection)
        self.capture.__enter__()
        return self

    def __exit__(self, *exc):
        from django.db import connection

        self.capture.__exit__(*exc)
        trips = None
        if self.trace is not None:
            connection.connection.pgconn.untrace()
            self.trace.seek(0)
            trips = round_trips(self.trace)
        statements = len(self.capture.captured_queries)
        if VERBOSE:
            for query in self.capture.captured_queries:
                print(f"      {query['sql'][:150]}")
        per = self.per
        trip_text = f"{trips / per:6.2f}" if trips is not None else "     —"
        print(f"  {self.label:<58} {statements / per:6.2f} {trip_text}")
        RESULTS.append((self.label, statements / per, trips / per if trips is not None else None))


def round_trips(trace):
    """The waits for the server in libpq's trace (its lines): each simple Query and each
    Sync the client (F) sent. A Sync line is "F<tab>4<tab>Sync" and its newline: read with
    the newline, no Sync was counted (stops 45-68's trips were BEGIN and COMMIT only)."""
    trips = 0
    for line in trace:
        fields = line.rstrip("\n").split("\t")
        trips += fields[:1] == ["F"] and fields[2:3] in (["Query"], ["Sync"])
    return trips


RESULTS = []
VERBOSE = "-v" in sys.argv


def update(chat_id, text, message_id):
    return {"update_id": 10_000 + message_id, "message": {
        "message_id": message_id, "date": 1_700_000_000, "text": text,
        "from": {"id": chat_id, "is_bot": False, "first_name": "Ana"},
        "chat": {"id": chat_id, "type": "private", "first_name": "Ana"}}}


def measure():
    import json

    from django.db import transaction
    from django.test import Client
    from django.utils import timezone

    from conversations import engine, flushing, ingest, liveness, platforms, turns
    from conversations.models import Channel, MessageBuffer, Turn
    from conversations.platforms.inbound import Request
    from conversations.platforms.telegram.webhook import SECRET_HEADER
    from conversations.worker.supervisor import Worker
    from delivery import ledger
    from delivery.transports import SendResult

    Channel.objects.create(slug="tg", kind="telegram", platform_settings={
        "bot_token": "1:x", "webhook_secret": "s"}, window_closed=0.1,
                           window_neutral=0.1, window_open=0.1, window_greeting=0.1)
    ids = iter(range(1, 1_000_000))

    hook = platforms.get("telegram").webhook()

    def prepare(body):
        """What the lean path admits in its batch: (channel, message)."""
        received = hook.prepare("tg", Request("POST", {SECRET_HEADER.lower(): "s"}, body))
        return received.channel, received.alone()

    def prepared(chat, text="¿Tienes hora?"):
        return prepare(json.dumps(update(chat, text, next(ids))).encode())

    hook.prepare("tg", Request("POST", {SECRET_HEADER.lower(): "s"}, b"{}"))  # the channel cache warmed, as in a running server
    print(f"{'':<60} {'stmts':>6} {'trips':>6}\n per message (webhook admission)")
    with Count("lean path, new conversation, batch of 1"):
        ingest.admit_many([prepared(1)], lambda exc: False)
    with Count("lean path, same conversation, open buffer, batch of 1"):
        ingest.admit_many([prepared(1)], lambda exc: False)
    with Count(f"lean path, new conversations, batch of {BATCH} (group commit)", per=BATCH):
        ingest.admit_many([prepared(100 + i) for i in range(BATCH)], lambda exc: False)
    with Count(f"lean path, open buffers, batch of {BATCH} (group commit)", per=BATCH):
        ingest.admit_many([prepared(100 + i) for i in range(BATCH)], lambda exc: False)
    # Other people, their buffers flushed (answered), write again.
    ingest.admit_many([prepared(300 + i) for i in range(BATCH)], lambda exc: False)
    MessageBuffer.objects.filter(conversation__chat_id__in=[str(300 + i) for i in range(BATCH)]).update(
        state="flushed", flushed_at=timezone.now())
    with Count(f"lean path, people back, batch of {BATCH} (group commit)", per=BATCH):
        ingest.admit_many([prepared(300 + i) for i in range(BATCH)], lambda exc: False)
    with Count("lean path, a duplicate (webhook retry)"):
        again = update(1, "¿Tienes hora?", 1)
        ingest.admit_many([prepare(json.dumps(again).encode())], lambda exc: False)
    client = Client()
    for label, chat in (("full path (Django view), new conversation", 500),
                        ("full path (Django view), open buffer", 500)):
        body = json.dumps(update(chat, "¿Tienes hora?", next(ids)))
        with Count(label):
            response = client.post("/webhooks/telegram/tg/", body, content_type="application/json",
                                   HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN="s", HTTP_HOST="127.0.0.1")
        assert response.status_code == 200, response.content

    print(" per turn (worker)")
    owner = liveness.new_owner()
    later = timezone.now() + timedelta(seconds=5)
    one = list(MessageBuffer.objects.filter(conversation__chat_id="1").values_list("pk", flat=True))
    many = list(MessageBuffer.objects.filter(conversation__chat_id__in=[str(100 + i) for i in range(BATCH)])
                .values_list("pk", flat=True))
    with Count("flush: due buffers looked up (one query for any number)"):
        flushing.due_buffer_ids(later)
    with Count("flush one buffer into a turn born running"):
        [first] = flushing.flush_many(one, later, owner=owner, start=1)
    with Count(f"flush {BATCH} buffers at once, turns born ready", per=BATCH):
        flushing.flush_many(many, later, owner=owner)
    with Count(f"claim {BATCH} ready turns (ready_candidates + start_many)", per=BATCH):
        started = turns.start_many(turns.ready_candidates(BATCH), owner)
    conversation = first.conversation
    with Count("run: the history the agent is given"):
        engine.conversation_history(conversation, first)
    worker = Worker(owner=owner, poll=False)
    worker.liveness = liveness.NoLock()
    with Count("complete one turn: end + reply row + its claim"):
        [row] = worker.turns.complete_turns([(first, "done", "Son las 10.", "")])
    with Count(f"complete {BATCH} turns in one batch", per=BATCH):
        rows = worker.turns.complete_turns([(t, "done", "Son las 10.", "") for t in started])

    print(" per reply (ledger)")
    with Count("send: a one-chunk reply writes nothing while it is sent"):
        pass
    with Count("record one delivery (finish_many)"):
        with transaction.atomic():
            ledger.finish_many([(row, SendResult.delivered("7"))], owner)
    with Count(f"record {BATCH} deliveries in one batch", per=BATCH):
        with transaction.atomic():
            ledger.finish_many([(r, SendResult.delivered("7")) for r in rows if r is not None], owner)
    # One row per chat, a minute on, 30 of them: a chat's rows are paced (one send a
    # second on Telegram) and so is the bot (30 a second), whose budget the deliveries
    # above spent.
    enqueued = ledger.enqueue_many([ledger.Reply(turn.conversation, "hola", kind="reply") for turn in started[:30]])
    with Count("sweep: claim 30 pending rows written elsewhere (claim_due)", per=30):
        swept = ledger.claim_due(owner, limit=BATCH, now=later + timedelta(minutes=1))
    assert len(swept) == len(enqueued), (len(swept), len(enqueued))

    print(" per worker, whatever the load")
    engine.beat(owner)
    with Count("heartbeat (every 5 s)"):
        engine.beat(owner)
    with Count("dead workers looked for (every 1 s with advisory locks)"):
        engine.dead_owners()
    with Count("flusher's look when nothing is due (every AGENTLOOP_POLL_INTERVAL)"):
        flushing.look(timezone.now())
    with Count("turn claimer's look when nothing is ready"):
        turns.start_many(turns.ready_candidates(10), owner)
    with Count("ledger sweep's look when nothing is due"):
        ledger.claim_due(owner)
    assert Turn.objects.filter(state="done").count() == BATCH + 1


def main():
    setup()
    from django.db import connection

    print(f"database: {connection.vendor} {connection.settings_dict['NAME']}")
    measure()
    return 0


if __name__ == "__main__":
    sys.exit(main())
