"""delivery's hand-written SQL, in one place: the few statements on the timed path where
the ORM's compile cost more than the database did, or where it has no way to say them
(a conditional upsert). Each says beside it why it is hand-written.

One style: tables through `table(Model)` (quoted as the backend quotes), columns by
their bare names (lower-case, needing no quotes on either database), every value a
parameter but a state that is a statement's one selective condition (`rows.state_literal`).
Callers (`delivery.ledger`, `delivery.pacing`) keep the rules; here are only the
statements.
"""

import time
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from django.db import connection

from agentloop.core.rows import in_params, in_sql, placeholders, postgresql, records, recordset, state_literal, table
from delivery.models import OutboundMessage, OutboundState, Outcome, SendBudget, channel_model

# --- the ledger ---------------------------------------------------------------------------


def claim_pending(ids: Sequence[int], owner: str, token: str, now: datetime, *, max_resends: int,
                  fresh_after: datetime, flood_prefix: str) -> set[int]:
    """The ledger's claim of pending rows this process has just written
    (`ledger.claim_written`); returns the ids it won. Through the ORM (`_claim`'s Q of
    every claimable state, its channel join and CASE) the statement's compile was half of
    the worker's database thread while 1,000 turns ended together (py-spy, tests.bench
    flush on PostgreSQL). `flood_prefix`: pacing's key of a channel's pause after a 429
    (`pacing.flood_key`), before its channel's id."""
    OutboundMessage.check_transition([OutboundState.PENDING], [OutboundState.ATTEMPTING])  # the SQL below
    returning = connection.features.can_return_rows_from_bulk_insert  # PostgreSQL, SQLite >= 3.35
    at = connection.ops.adapt_datetimefield_value(now)
    fresh = connection.ops.adapt_datetimefield_value(fresh_after)
    with connection.cursor() as cursor:
        cursor.execute(_claim_pending_sql(len(ids), returning),
                       [OutboundState.ATTEMPTING, owner, token, at, *in_params(ids), OutboundState.PENDING,
                        max_resends, fresh, fresh, flood_prefix, now.timestamp()])
        if returning:
            return {row[0] for row in cursor.fetchall()}
    return set(OutboundMessage.objects.filter(pk__in=ids, claim_token=token).values_list("pk", flat=True))


def _claim_pending_sql(n: int, returning: bool) -> str:
    """`ledger.claiming._claim` of pending rows (`_claimable`: PENDING, within its budget,
    fresh, its channel able to send and not pausing for a 429; `_started_before` for the
    label), as SQL. SET expressions read the row as it was, on both databases."""
    Channel = channel_model()
    return (f"UPDATE {table(OutboundMessage)} SET state = %s, owner = %s, claim_token = %s, claimed_at = %s, "
            f"needs_marker = (chunks_started > chunks_delivered), "
            f"chunks_started = chunks_delivered + 1, attempts = attempts + 1 "
            f"WHERE {in_sql('id', n)} AND state = %s AND attempts <= extra_resends + %s "
            f"AND (created_at > %s OR retried_at > %s) "
            f"AND channel_id IN (SELECT id FROM {table(Channel)} WHERE is_active AND send_blocked = '') "
            f"AND NOT EXISTS (SELECT 1 FROM {table(SendBudget)} WHERE key = %s || CAST(channel_id AS TEXT) "
            f"AND next_slot > %s)"
            + (" RETURNING id" if returning else ""))


def maybe_due(now: datetime, *, timers: bool, orphaned_before: datetime, dead_owners: Collection[str] = ()) -> bool:
    """Whether any row could be claimable now (`ledger.maybe_claimable`): pending rows;
    with `timers` (the ledger on) failed rows due, rows attempting since before
    `orphaned_before`, and those of dead owners — one index probe each, one at a time,
    the first found ends it. Each worker sweeps every poll interval (20 times a second):
    the ORM compiled the full query each time, 1.4 ms of CPU for an empty answer, taken
    from the web process on the same cores."""
    outbound = table(OutboundMessage)
    timestamp = OutboundMessage._meta.get_field("claimed_at")
    # Each probe's state in the text, not a parameter (rows.state_literal says why): the
    # state is each probe's selective condition, and nearly every row is delivered.
    pending, failed, attempting = (state_literal(state) for state in (
        OutboundState.PENDING, OutboundState.FAILED, OutboundState.ATTEMPTING))
    probes: list[tuple[str, list[Any]]] = [(f"SELECT 1 FROM {outbound} WHERE state = {pending}", [])]
    if timers:
        probes += [
            (f"SELECT 1 FROM {outbound} WHERE state = {failed} AND next_attempt_at <= %s",
             [timestamp.get_db_prep_value(now, connection)]),
            (f"SELECT 1 FROM {outbound} WHERE state = {attempting} AND claimed_at < %s",
             [timestamp.get_db_prep_value(orphaned_before, connection)]),
        ]
        if dead_owners:
            owners = list(dead_owners)
            probes.append((f"SELECT 1 FROM {outbound} WHERE state = {attempting} AND "
                           f"{in_sql('owner', len(owners), None)}", in_params(owners)))
    with connection.cursor() as cursor:
        for sql, params in probes:  # one at a time: each its own index, and the first found ends it
            cursor.execute(f"{sql} LIMIT 1", params)
            if cursor.fetchone() is not None:
                return True
    return False


def mark_delivered(platform_ids: Sequence[tuple[int, str]], owner: str, now: datetime) -> set[int]:
    """One UPDATE for a batch of (id, platform message id) pairs, each row's platform id
    chosen by a simple CASE, only where `owner`'s claim still holds; returns the ids it
    moved. Written as SQL: the ORM's Case(When(...)) for hundreds of rows cost more to
    compile than to run."""
    ids = [pk for pk, _ in platform_ids]
    returning = connection.features.can_return_rows_from_bulk_insert  # PostgreSQL, SQLite >= 3.35
    if not returning:
        ids = list(OutboundMessage.objects.filter(pk__in=ids, state=OutboundState.ATTEMPTING, owner=owner)
                   .values_list("pk", flat=True))
        platform_ids = [pair for pair in platform_ids if pair[0] in set(ids)]
    if not platform_ids:
        return set()
    OutboundMessage.check_transition([OutboundState.ATTEMPTING], [OutboundState.DELIVERED])  # the SQL below
    outbound = table(OutboundMessage)
    delivered: list[Any] = [OutboundState.DELIVERED, connection.ops.adapt_datetimefield_value(now), Outcome.DELIVERED]
    if postgresql():  # the pairs as one JSON parameter: one statement text for any batch (agentloop.core.rows.recordset)
        sql = (f"UPDATE {outbound} AS o SET state = %s, delivered_at = %s, last_outcome = %s, next_attempt_at = NULL, "
               f"platform_message_id = v.platform_id "
               f"FROM {recordset('v', [('id', 'bigint'), ('platform_id', 'text')])} "
               f"WHERE o.id = v.id AND o.state = %s AND o.owner = %s RETURNING o.id")
        params = [*delivered, records(("id", "platform_id"), platform_ids), OutboundState.ATTEMPTING, owner]
    else:
        cases = " ".join(["WHEN %s THEN %s"] * len(platform_ids))
        sql = (f"UPDATE {outbound} SET state = %s, delivered_at = %s, last_outcome = %s, next_attempt_at = NULL, "
               f"platform_message_id = CASE id {cases} ELSE platform_message_id END "
               f"WHERE id IN ({placeholders(len(platform_ids))}) AND state = %s AND owner = %s"
               + (" RETURNING id" if returning else ""))
        params = [*delivered, *[v for pair in platform_ids for v in pair], *[pk for pk, _ in platform_ids],
                  OutboundState.ATTEMPTING, owner]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {pk for (pk,) in cursor.fetchall()} if returning else set(ids)


# --- pacing: the send budget --------------------------------------------------------------


def extend_slot(key: str, seconds: float, clock: float | None) -> None:
    """`key`'s next slot at least `seconds` from now (an upsert)."""
    now = _now_sql(clock)
    greatest = "greatest" if postgresql() else "max"
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table(SendBudget)} AS b (key, next_slot) VALUES (%s, {now[0]} + %s) "
            f"ON CONFLICT (key) DO UPDATE SET next_slot = {greatest}(b.next_slot, {now[0]} + %s)",
            [key, *now[1], seconds, *now[1], seconds])


def slot_wait(key: str, clock: float | None) -> float | None:
    """Seconds from now to `key`'s next slot (negative when past), None without a row."""
    now = _now_sql(clock)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT next_slot - {now[0]} FROM {table(SendBudget)} WHERE key = %s", [*now[1], key])
        found = cursor.fetchone()
    return None if found is None else float(found[0])


def forget_slots(older_than: float, clock: float | None) -> int:
    """Delete the keys whose slot is more than `older_than` seconds past."""
    now = _now_sql(clock)
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table(SendBudget)} WHERE next_slot < {now[0]} - %s", [*now[1], older_than])
        deleted: int = cursor.rowcount
        return deleted


def take_slot(key: str, interval: float, after: float, horizon: float, clock: float | None) -> float | None:
    """The upsert: the key's slot is max(its next slot, now + after); taken (moved on by
    `interval`) only if it is within `horizon` of now. Returns its delay from now, or None.
    Written as SQL: the ORM has no conditional upsert, and this is one round trip."""
    now = _now_sql(clock)
    greatest = "greatest" if postgresql() else "max"
    slot = f"{greatest}(b.next_slot, {now[0]} + %s)"
    sql = (f"INSERT INTO {table(SendBudget)} AS b (key, next_slot) VALUES (%s, {now[0]} + %s + %s) "
           f"ON CONFLICT (key) DO UPDATE SET next_slot = {slot} + %s "
           f"WHERE {slot} <= {now[0]} + %s "
           f"RETURNING next_slot - %s - {now[0]}")
    n = now[1]
    params: list[str | float] = [key, *n, after, interval, *n, after, interval, *n, after, *n, horizon, interval, *n]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchone()
    return None if found is None else float(found[0])


def _now_sql(clock: float | None) -> tuple[str, list[float]]:
    """The SQL for "now" in epoch seconds and its parameters: the database's clock on
    PostgreSQL (shared by every host), this host's on SQLite or when injected."""
    if clock is None and postgresql():
        return "extract(epoch FROM statement_timestamp())::float8", []
    return "%s", [time.time() if clock is None else float(clock)]


def lock_slots(keys: Collection[str], clock: float | None) -> tuple[float, dict[str, float], set[str]]:
    """Inside a transaction: each key's row, made where missing (at 0, long past: as free
    as no row) and locked, one key after another in key order, in one statement. Returns
    now (epoch seconds: the database's clock unless injected), {key: its next slot}, and
    the keys made here (`delivery.pacing.reserve_many`). The no-op update is what locks
    a row that exists; made and locked in one ordered pass, a bot's key comes before its
    chats' as in `take_slot`'s pair (an INSERT of the missing keys, then a SELECT … FOR
    UPDATE, held a new chat key while waiting for its bot: a deadlock with a single
    reservation, found on PostgreSQL). Written as SQL: the ORM has no such upsert."""
    now = _now_sql(clock)
    with connection.cursor() as cursor:
        # SQLite reads `ON` after a bare SELECT as a join's: hence `WHERE true`.
        cursor.execute(f"INSERT INTO {table(SendBudget)} AS b (key, next_slot) "
                       f"SELECT k.key, 0 FROM {recordset('k', [('key', 'text')])} WHERE true ORDER BY k.key "
                       f"ON CONFLICT (key) DO UPDATE SET next_slot = b.next_slot RETURNING key, next_slot, {now[0]}",
                       [records(["key"], [[key] for key in sorted(keys)]), *now[1]])
        found = cursor.fetchall()
    slots = {key: float(next_slot) for key, next_slot, _ in found}
    # A slot is an epoch second (or an injected clock's): 0 only in a row made just now.
    made = {key for key, slot in slots.items() if slot == 0}
    return (float(found[0][2]) if found else time.time()), slots, made


def set_slots(slots: dict[str, float], forget: Collection[str]) -> None:
    """The keys' next slots written (rows `lock_slots` locked), and `forget`'s rows, made
    there and not taken, deleted: one statement each, whatever their number. Written as
    SQL: the ORM's bulk_update is a CASE per row, its statement's text as long as the batch."""
    with connection.cursor() as cursor:
        if slots:
            moved = recordset("v", [("key", "text"), ("next_slot", "float8")])
            cursor.execute(f"UPDATE {table(SendBudget)} AS b SET next_slot = v.next_slot FROM {moved} "
                           f"WHERE b.key = v.key", [records(["key", "next_slot"], slots.items())])
        if forget:
            cursor.execute(f"DELETE FROM {table(SendBudget)} WHERE {in_sql('key', len(forget), cast=None)}",
                           in_params(sorted(forget)))
