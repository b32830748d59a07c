"""A database grown to a week of traffic (issue 30, "flat as data grows"): 1 million
inbound messages in 200,000 conversations (one of them 5,000 messages long), ~600,000
buffers and turns, 1 million ledger rows, 500,000 guard claims and 2 million audit
events, timestamps spread over the week before it was built, in the states a week
leaves behind (no open buffer, no turn or ledger row still owed: a worker started on it
finds nothing to do but what the benchmark gives it).

Built with set-based INSERTs (`generate_series` on PostgreSQL, a recursive CTE on
SQLite: one statement per table, never the ORM row by row) into a database of its own,
then kept: a file copy for SQLite, a template database (and a `pg_dump -Fc` file for
the next cluster) for PostgreSQL, under var/bench-cache/, keyed by the migrations'
state and this file's text. Run in the process of the database it fills:

    DATABASE_URL=sqlite:///var/x.sqlite3 .venv/bin/python -m tests.bench.prefill [--empty]

`--empty`: the same channels and staff user, none of the traffic (the reference).
`tests/bench/grown.py` calls it and keeps the copies.
"""

import argparse
import os
import sys
import time

CONVERSATIONS = 200_000
MESSAGES = 1_000_000
BLOCK = 200  # one message in every BLOCK is the long conversation's (5,000 of 1 million)
LEDGER_ROWS = 1_000_000
CLAIMS = 500_000
EVENTS = 2_000_000
WEEK = 7 * 24 * 3600.0

BIG = 1  # the long conversation's id
BIG_BUFFERS = MESSAGES // BLOCK // 2  # its messages, two to a buffer
REGULAR = MESSAGES - MESSAGES // BLOCK  # the other conversations' messages, five each
BUFFERS = BIG_BUFFERS + REGULAR // 5 * 3  # theirs: three buffers per five messages (2, 2, 1)
CHANNELS = ("bench-tg", "bench-api", "grown-api")  # conversation c belongs to CHANNELS[c % 3]
STAFF = ("bench-admin", "bench-admin-password")
SECRET = "bench-secret"


class Sql:
    """What differs between the two databases in a set-based INSERT."""

    def __init__(self, connection, end):
        self.pg = connection.vendor == "postgresql"
        self.end = end  # epoch seconds: the newest row's time

    def series(self, count):
        """(the WITH prefix, the FROM item) of the integers 1..count, named s(n)."""
        if self.pg:
            return "", f"generate_series(1, {count}) AS s(n)"
        return f"WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < {count}) ", "s"

    def ago(self, seconds):
        """The instant `seconds` (an SQL expression) before the end, as the column stores it."""
        if self.pg:
            return f"to_timestamp({self.end!r} - ({seconds}))"
        # Django's SQLite text form (UTC, no offset); %f is seconds with milliseconds.
        return f"strftime('%Y-%m-%d %H:%M:%f', {self.end!r} - ({seconds}), 'unixepoch')"

    def json(self, expr):
        return f"({expr})::jsonb" if self.pg else expr

    def boolean(self, expr):
        return f"({expr})" if self.pg else f"(CASE WHEN {expr} THEN 1 ELSE 0 END)"

    def spread(self, position, total):
        """Seconds before the end of row `position` of `total`, spread evenly over the week."""
        return f"{WEEK} * ({total} - ({position})) / {float(total)}"


def insert(cursor, sql, model, count, columns):
    """INSERT `count` rows of `model` in one statement: `columns` maps a column to its SQL
    expression over n (1..count); every other column gets the field's default."""
    from django.db import connection

    prefix, source = sql.series(count)
    names, values, params = [], [], []
    columns = {"id": "n", **columns}  # ids are known: the other tables' expressions point at them
    for field in model._meta.concrete_fields:
        names.append(connection.ops.quote_name(field.column))
        if field.column in columns:
            values.append(str(columns[field.column]))
        elif (default := field.get_default()) is not None or field.null:
            values.append("%s")
            params.append(field.get_db_prep_save(default, connection))
        else:
            raise ValueError(f"{model.__name__}.{field.name}: no default, give it an expression")
    table = connection.ops.quote_name(model._meta.db_table)
    statement = f"{prefix}INSERT INTO {table} ({', '.join(names)}) SELECT {', '.join(values)} FROM {source}"
    began = time.monotonic()
    cursor.execute(statement.replace("%", "%%").replace("%%s", "%s"), params)
    print(f"  {model._meta.db_table}: {count:,} rows in {time.monotonic() - began:.1f} s", flush=True)
    if sql.pg:  # the ids were given: the sequence moves past them (SQLite's AUTOINCREMENT does by itself)
        from django.core.management.color import no_style

        for statement in connection.ops.sequence_reset_sql(no_style(), [model]):
            cursor.execute(statement)


def conversation_of_buffer(b):
    return f"(CASE WHEN {b} <= {BIG_BUFFERS} THEN {BIG} ELSE 2 + ({b} - {BIG_BUFFERS + 1}) / 3 END)"


def buffer_ago(sql, b):
    """A buffer's (and its turn's) time: the long conversation's spread over the week, the
    others' in the order of their messages."""
    return (f"(CASE WHEN {b} <= {BIG_BUFFERS} THEN {sql.spread(b, BIG_BUFFERS)} "
            f"ELSE {sql.spread(f'{b} - {BIG_BUFFERS}', BUFFERS - BIG_BUFFERS)} END)")


def base_rows(channels):
    """What both databases have: the benchmark's channels and a staff user."""
    from django.contrib.auth import get_user_model

    from conversations.models import Channel

    settings = {"bench-tg": dict(kind="telegram", platform_settings={
        "bot_token": "1:BENCH", "webhook_secret": SECRET, "api_base": "http://127.0.0.1:9/"}),
        "bench-api": dict(kind="api", window_closed=1.2), "grown-api": dict(kind="api")}
    made = {slug: Channel.objects.create(slug=slug, **settings[slug]) for slug in channels}
    get_user_model().objects.create_superuser(STAFF[0], "bench@example.invalid", STAFF[1])
    return made


def traffic(cursor, sql, channel_ids):
    from conversations.models import Contact, Conversation

    channel = f"(CASE n % 3 {' '.join(f'WHEN {i} THEN {pk}' for i, pk in enumerate(channel_ids))} END)"
    insert(cursor, sql, Contact, CONVERSATIONS, {
        "channel_id": channel, "platform_id": "CAST(5000000 + n AS TEXT)", "display_name": "'Person ' || n",
        "username": "'person' || n", "created_at": sql.ago(sql.spread("n", CONVERSATIONS))})
    insert(cursor, sql, Conversation, CONVERSATIONS, {
        "channel_id": channel, "contact_id": "n", "chat_id": "CAST(5000000 + n AS TEXT)",
        "sender_id": "CAST(5000000 + n AS TEXT)", "created_at": sql.ago(sql.spread("n", CONVERSATIONS)),
        "last_message_at": sql.ago(sql.spread("n", CONVERSATIONS))})
    buffers(cursor, sql)
    messages(cursor, sql, channel_ids)
    ledger(cursor, sql, channel_ids)
    claims(cursor, sql)
    events(cursor, sql)


def buffers(cursor, sql):
    from conversations.models import MessageBuffer, Turn

    at = sql.ago(buffer_ago(sql, "n"))
    count = f"(CASE WHEN n <= {BIG_BUFFERS} OR (n - {BIG_BUFFERS + 1}) % 3 < 2 THEN 2 ELSE 1 END)"
    reason = "(CASE WHEN n % 50 = 0 THEN 'max_wait' WHEN n % 97 = 0 THEN 'control' ELSE 'window' END)"
    insert(cursor, sql, MessageBuffer, BUFFERS, {
        "conversation_id": conversation_of_buffer("n"), "state": "'flushed'", "first_message_at": at,
        "last_message_at": at, "flush_at": at, "flushed_at": at, "message_count": count,
        "window_kind": "'neutral'", "window_seconds": "2.0", "flush_reason": reason, "planned_reason": reason,
        "flushed_by": "'worker:grown'"})
    state = "(CASE WHEN n % 50 = 1 THEN 'failed' WHEN n % 33 = 2 THEN 'cancelled' ELSE 'done' END)"
    insert(cursor, sql, Turn, BUFFERS, {
        "conversation_id": conversation_of_buffer("n"), "buffer_id": "n", "state": state,
        "merged_input": "'quiero agendar una hora para el martes ' || n", "flush_reason": reason,
        "owner": "'worker:grown'", "reply_text": "'Listo, te agendé para el martes (' || n || ').'",
        "attempts": "1", "created_at": at, "started_at": at,
        "finished_at": sql.ago(f"{buffer_ago(sql, 'n')} - 1.5"), "fired_effect": sql.boolean("n % 10 = 0")})


def messages(cursor, sql, channel_ids):
    from conversations.models import InboundMessage

    # Message n: the first of each block of BLOCK is the long conversation's; the others,
    # numbered r = 0.., go five to a conversation, in buffers of 2, 2 and 1.
    r = f"((n - 1) / {BLOCK} * {BLOCK - 1} + (n - 1) % {BLOCK} - 1)"
    big = f"(n - 1) % {BLOCK} = 0"
    conversation = f"(CASE WHEN {big} THEN {BIG} ELSE 2 + {r} / 5 END)"
    buffer = (f"(CASE WHEN {big} THEN 1 + (n - 1) / {BLOCK} / 2 "
              f"ELSE {BIG_BUFFERS + 1} + {r} / 5 * 3 + {r} % 5 / 2 END)")
    channel = f"(CASE {conversation} % 3 {' '.join(f'WHEN {i} THEN {pk}' for i, pk in enumerate(channel_ids))} END)"
    kind = "(CASE WHEN n % 97 = 0 THEN 'control' WHEN n % 23 = 0 THEN 'media' ELSE 'text' END)"
    disposition = ("(CASE WHEN n % 97 = 0 THEN 'control' WHEN n % 41 = 0 THEN 'rejected' "
                   "WHEN n % 59 = 0 THEN 'held' ELSE 'buffered' END)")
    insert(cursor, sql, InboundMessage, MESSAGES, {
        "channel_id": channel, "conversation_id": conversation, "buffer_id": buffer,
        "platform_message_id": "'g' || n", "kind": kind, "disposition": disposition,
        "text": "'hola, quiero agendar una hora para el martes a las ' || (n % 24) || ' y'",
        "media_type": "(CASE WHEN n % 23 = 0 THEN 'photo' ELSE '' END)", "sender_name": "'Person ' || " + conversation,
        "received_at": sql.ago(sql.spread("n", MESSAGES)), "sent_at": sql.ago(f"{sql.spread('n', MESSAGES)} + 0.4")})


def ledger(cursor, sql, channel_ids):
    from delivery.models import OutboundMessage

    turn = f"((n - 1) % {BUFFERS} + 1)"
    conversation = conversation_of_buffer(turn)
    channel = f"(CASE {conversation} % 3 {' '.join(f'WHEN {i} THEN {pk}' for i, pk in enumerate(channel_ids))} END)"
    state = "(CASE WHEN n % 200 = 7 THEN 'unreachable' WHEN n % 100 = 3 THEN 'abandoned' ELSE 'delivered' END)"
    outcome = ("(CASE WHEN n % 200 = 7 THEN 'permanent' WHEN n % 100 = 3 THEN 'temporary' "
               "WHEN n % 37 = 0 THEN 'flood' ELSE 'delivered' END)")
    at = f"({buffer_ago(sql, turn)} - 2.0)"
    insert(cursor, sql, OutboundMessage, LEDGER_ROWS, {
        "conversation_id": conversation, "channel_id": channel, "turn_id": turn,
        "chat_id": f"CAST(5000000 + {conversation} AS TEXT)",
        "kind": f"(CASE WHEN n > {BUFFERS} THEN 'notice' ELSE 'reply' END)",
        "text": "'Listo, te agendé para el martes (' || n || ').'", "state": state, "last_outcome": outcome,
        "attempts": "(CASE WHEN n % 37 = 0 THEN 2 ELSE 1 END)", "needs_marker": sql.boolean("n % 37 = 0"),
        "owner": "'worker:grown'", "platform_message_id": "CAST(n AS TEXT)", "created_at": sql.ago(at),
        "claimed_at": sql.ago(f"{at} - 0.05"), "next_attempt_at": "NULL",
        "delivered_at": f"(CASE WHEN n % 200 = 7 OR n % 100 = 3 THEN NULL ELSE {sql.ago(f'{at} - 0.3')} END)",
        "last_error": "(CASE WHEN n % 200 = 7 THEN 'Forbidden: bot was blocked by the user' ELSE '' END)"})


TOOLS = ("calendar_create_event", "email_send", "ticket_open", "refund_issue", "crm_update")


def claims(cursor, sql):
    from tools.models import ActionClaim

    conversation = f"(CASE WHEN n % 400 = 0 THEN {BIG} ELSE 2 + n % {CONVERSATIONS - 1_000} END)"
    action = f"(CASE n % 5 {' '.join(f'WHEN {i} THEN {t!r}' for i, t in enumerate(TOOLS))} END)"
    state = "(CASE WHEN n % 50 = 0 THEN 'uncertain' WHEN n % 12 = 0 THEN 'released' ELSE 'done' END)"
    ago = sql.spread("n", CLAIMS)
    insert(cursor, sql, ActionClaim, CLAIMS, {
        "scope": "'contact:' || " + conversation, "action": action, "fingerprint": "'fp' || n",
        "fingerprint_fields": sql.json("'[\"title\", \"start_datetime\"]'"),
        "fingerprint_material": sql.json("'{\"title\": \"martes ' || n || '\"}'"),
        "arguments": sql.json("'{\"title\": \"martes ' || n || '\", \"start_datetime\": \"2026-12-01T10:00\"}'"),
        "state": state, "live": sql.boolean("1 = 0"), "owner": "'worker:grown'", "conversation_id": conversation,
        "channel_slug": "'grown-api'", "created_at": sql.ago(ago), "expires_at": sql.ago(f"{ago} - 600"),
        "lease_until": sql.ago(f"{ago} - 60"), "finished_at": sql.ago(f"{ago} - 1"),
        "result": sql.json("'{\"ok\": true, \"event\": ' || n || '}'"),
        "duplicates_caught": "(CASE WHEN n % 20 = 0 THEN 1 ELSE 0 END)"})


KINDS = ("control_command", "turn_recovered", "message_rejected", "duplicate_prevented", "reply_recovered",
         "turn_failed", "message_edited", "chat_unreachable", "reply_abandoned", "limit_reached")


def events(cursor, sql):
    from audit.models import AuditEvent

    conversation = f"(CASE WHEN n % 200 = 0 THEN {BIG} ELSE 2 + n % {CONVERSATIONS - 1_000} END)"
    kind = f"(CASE n % 10 {' '.join(f'WHEN {i} THEN {k!r}' for i, k in enumerate(KINDS))} END)"
    action = f"(CASE n % 5 {' '.join(f'WHEN {i} THEN {t!r}' for i, t in enumerate(TOOLS))} END)"
    extra = (f"(CASE WHEN n % 10 = 3 THEN '{{\"tool\": \"' || {action} || '\", \"status\": \"done\", "
             f"\"original_claim\": ' || (n % {CLAIMS} + 1) || ', \"age_seconds\": 3.5}}' ELSE '{{}}' END)")
    insert(cursor, sql, AuditEvent, EVENTS, {
        "kind": kind, "at": sql.ago(sql.spread("n", EVENTS)), "actor": "'worker:grown'",
        "channel_slug": "'grown-api'", "conversation_id": conversation,
        "target": f"'turn ' || (n % {BUFFERS} + 1)", "summary": "'what happened to turn ' || n",
        "extra": sql.json(extra)})


def build(empty):
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction

    began = time.monotonic()
    call_command("migrate", verbosity=0)
    channels = base_rows(CHANNELS)
    if not empty:
        sql = Sql(connection, time.time())
        with transaction.atomic(), connection.cursor() as cursor:
            traffic(cursor, sql, [channels[slug].pk for slug in CHANNELS])
        with connection.cursor() as cursor:  # statistics and visibility, as a week of autovacuum leaves them
            cursor.execute("VACUUM ANALYZE" if sql.pg else "ANALYZE")
    print(f"prefill: {'empty' if empty else 'grown'} database ready in {time.monotonic() - began:.0f} s", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--empty", action="store_true", help="only the channels and the staff user")
    options = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentloop.settings")
    os.environ.setdefault("AGENTLOOP_LOCAL_SECRET_KEY", "true")
    sys.exit(build(options.empty))
