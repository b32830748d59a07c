"""The delivery ledger: every reply at least once, every possible duplicate labelled.

A reply is written down (a pending row) in the transaction of the work that produced
it, before anything is sent. Whoever sends it first *claims* it: one compare-and-swap
moves it to `attempting`, stamps the owner and a claim token, counts the attempt — and,
in the same statement, decides from the row's state *before* the claim whether this
send must carry the recovery prefix: a row never claimed goes out plain; a row claimed
before may have arrived already, so it goes out labelled `♻️ Recovered reply`. A
labelled duplicate therefore always means one model run delivered twice, never two.

Outcomes (see `transports`): delivered; flood → retried when the penalty ends;
temporary or ambiguous → resent after 30 s, then 2 min, and the last budgeted resend is
kept for the next worker start (an outage longer than the timers never strands a
reply); permanent → the chat is marked unreachable and never retried; channel blocked
(the platform refused the channel's credentials) → the row waits, its attempt given
back, until an operator saves the channel again. Bounded: 3
resends (floods aside) and 24 h, then abandoned. Delivered and finished rows are pruned
after 7 days.

A row is claimable when it is pending, when it failed and its timer is due (or, at a
worker's start, its last resend waits for that start), or when it is attempting under
an owner that died (or held it longer than any send takes) — and only for channels
that can send now (active, and not blocked: Channel.send_blocked). The boot sweep
holds what it claims in `attempting` for the whole send, so no runtime sweep can take
it too.
"""

import asyncio
import itertools
import logging
import os
import secrets
import time
from dataclasses import dataclass
from datetime import timedelta

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from agentloop.core.redaction import redact
from agentloop.core.rows import create_many, in_params, in_sql, placeholders, postgresql, records, recordset, table
from audit.events import record, record_many
from audit.failpoints import failpoint
from audit.models import EventKind
from delivery import chunks, console, faults, pacing
from delivery.hooks import buttons_for_rows, channel_model, close_clients, transport_for
from delivery.models import OutboundKind, OutboundMessage, OutboundState, Outcome, UnreachableChat
from delivery.retry_after import clamp_retry_after
from delivery.transports import SendResult, Target

log = logging.getLogger(__name__)

RECOVERY_PREFIX = "♻️ Recovered reply — this may repeat a message you already received.\n\n"
PREFIX_UNITS = chunks.units(RECOVERY_PREFIX)
MAX_RESENDS = 3
BACKOFF = (timedelta(seconds=30), timedelta(minutes=2))  # resends 1 and 2; resend 3 waits for a start
FRESHNESS = timedelta(hours=24)
NOT_SENT_MAX_WAIT = 60.0
PACED_RETRY = 0.25  # seconds the safety sweep waits when what is due has no send slot yet
LATE_RESLOTS = 2  # fresh slots a late paced send may take before it goes anyway  # seconds: a send that never left is tried again at most this late
PRUNE_AFTER = timedelta(days=7)

_tokens = itertools.count()
_token_prefix = secrets.token_hex(6)


def enabled() -> bool:
    return settings.AGENTLOOP_DELIVERY_LEDGER


def attempt_timeout() -> timedelta:
    """An `attempting` row held longer than any send can take is orphaned, whoever holds it."""
    return timedelta(seconds=settings.AGENTLOOP_DELIVERY_ATTEMPT_TIMEOUT)


@dataclass(frozen=True)
class Reply:
    conversation: object
    text: str
    kind: str
    turn: object = None
    reply_target: str = ""
    thread_id: str = ""


def _row(reply: Reply) -> OutboundMessage:
    conversation = reply.conversation
    return OutboundMessage(conversation=conversation, channel=conversation.channel,
                           chat_id=conversation.chat_id, turn=reply.turn, kind=reply.kind, text=reply.text,
                           chunks=split_for(conversation.channel, reply.text),
                           reply_target=reply.reply_target, thread_id=reply.thread_id)


def split_for(channel, text) -> list:
    """The chunks a reply is sent in on this channel's platform, [] when it fits in one.
    Each leaves room for the recovery prefix, which any chunk may have to carry."""
    limit = transport_for(channel).max_units
    if limit is None or chunks.units(text) <= limit - PREFIX_UNITS:
        return []
    return chunks.split(text, limit - PREFIX_UNITS)


def parts(row) -> list:
    return row.chunks or split_for(row.channel, row.text) or [row.text]


def enqueue(conversation, text, *, kind, turn=None, reply_target="", thread_id=""):
    """Write one reply down; call inside the transaction of the work that produced it."""
    return enqueue_many([Reply(conversation, text, kind, turn, reply_target, thread_id)])[0]


def enqueue_many(replies):
    """Write replies down as pending rows (one INSERT)."""
    return create_many(OutboundMessage, [_row(r) for r in replies])


def unrecorded(replies):
    """The ledger switched off: rows kept in memory only (a crash loses them)."""
    return [_row(r) for r in replies]


# --- claiming ------------------------------------------------------------------------------


def _within_budget():
    """Attempts are sends that may have left: a flood or a send that never left gives its
    attempt back (`_defer`), so only those count."""
    return Q(attempts__lte=F("extra_resends") + MAX_RESENDS)


def _claimable(now, dead_owners, boot):
    due = Q(state=OutboundState.PENDING)
    if enabled():
        due |= Q(state=OutboundState.FAILED, next_attempt_at__lte=now)
        if boot:
            due |= Q(state=OutboundState.FAILED, next_attempt_at__isnull=True)
        orphaned = Q(state=OutboundState.ATTEMPTING, claimed_at__lt=now - attempt_timeout())
        if dead_owners:
            orphaned |= Q(state=OutboundState.ATTEMPTING, owner__in=list(dead_owners))
        due |= orphaned
    return due & _within_budget() & _fresh(now) & _sendable()


def _fresh(now):
    """24 h from its creation, or from an operator's retry."""
    return Q(created_at__gt=now - FRESHNESS) | Q(retried_at__gt=now - FRESHNESS)


def _sendable():
    """Only rows whose channel can send now: an inactive channel's rows wait, and so do
    those of a channel its platform says cannot send (Channel.send_blocked: a setting
    missing, credentials the platform refused).

    A subquery, not a join: with a join Django writes the claim as `UPDATE … WHERE id IN
    (SELECT … )`, and PostgreSQL, re-checking a row another claim just moved, re-checks
    only that outer `id IN` — so two sweeps racing for the same pending rows both won
    them, the second labelled (a duplicate, found by two workers draining one paced
    bot). Here the state test stays in the UPDATE's own WHERE, which the re-check reads."""
    Channel = channel_model()
    return Q(channel_id__in=Channel.objects.filter(is_active=True, send_blocked="").values("id"))


def claimable_ids(dead_owners=(), limit=500, now=None, boot=False, older_than=None):
    return [pk for pk, *_ in _candidates(dead_owners, limit, now or timezone.now(), boot, older_than)]


def _candidates(dead_owners, limit, now, boot, older_than=None):
    """Claimable rows, oldest first, as (id, channel id, chat id, chunks left to send)."""
    rows = OutboundMessage.objects.filter(_claimable(now, dead_owners, boot))
    if older_than is not None:
        rows = rows.filter(created_at__lte=older_than)
    return _as_candidates(rows.order_by("created_at", "pk")[:limit])


def _as_candidates(rows):
    """Rows as claim candidates: (id, channel id, chat id, chunks left to send)."""
    found = rows.values_list("pk", "channel_id", "chat_id", "chunks", "chunks_delivered")
    return [(pk, channel, chat, max(1, len(parts or ()) - delivered)) for pk, channel, chat, parts, delivered in found]


def _claim(ids, owner, now, dead_owners=(), boot=False) -> str:
    """The compare-and-swap: move the still-claimable rows among `ids` to `attempting`
    under `owner`, stamped with a fresh token (returned). `needs_marker` is computed from
    the row before it (SQL evaluates SET expressions on the old row): the chunk the send
    resumes at is labelled if its send had started before; the claim starts it. (A paced
    row may wait up to the pacing horizon for its slot: a worker that dies meanwhile
    leaves it labelled, as nobody can tell whether it went.)"""
    token = _new_token()
    OutboundMessage.transition(
        list(ids), [OutboundState.PENDING, OutboundState.FAILED, OutboundState.ATTEMPTING], OutboundState.ATTEMPTING,
        where=_claimable(now, dead_owners, boot), owner=owner, claim_token=token, claimed_at=now,
        needs_marker=Case(When(_started_before(), then=Value(True)), default=Value(False)),
        chunks_started=F("chunks_delivered") + 1, attempts=F("attempts") + 1,
    )
    return token


def _new_token() -> str:
    """A claim's stamp, unique to this process and call."""
    return f"{_token_prefix}-{os.getpid()}-{next(_tokens)}"


def _started_before():
    """The chunk a claim resumes at had started before: its send may have landed. (A row
    an older build claimed counting attempts only was marked started by migration 0006.)"""
    return Q(chunks_started__gt=F("chunks_delivered"))


def claim_many(ids, owner, dead_owners=(), now=None, boot=False):
    """Claim these rows for `owner` (those still claimable, and of paced channels those
    whose slot is near); returns what was won."""
    if not ids:
        return []
    clock = None if now is None else now.timestamp()  # injected time paces by it too
    now = now or timezone.now()
    candidates = _as_candidates(OutboundMessage.objects.filter(pk__in=list(ids)).order_by("created_at", "pk"))
    return _claim_candidates(candidates, owner, dead_owners, now, boot, clock)


def _claim_candidates(candidates, owner, dead_owners, now, boot, clock=None):
    """Claim candidates (oldest first): rows of unpaced channels at once; of a paced bot,
    as many of its oldest rows as its budget has room for within the horizon
    (delivery.pacing), each then given its slot — claimed first, so workers sweeping
    side by side never reserve slots for the same row. A row whose slot is not near
    after all (its chat not free in time, or another worker took the bot's room) is
    released as it was, and its chat's later rows with it. The slot rides on the row
    (`pace_delay` from the reservation, `send_at` on the monotonic clock); `send` waits
    for it."""
    channels = _channels({channel for _, channel, _, _ in candidates})
    plain, paced, chunks_left = [], {}, {}
    for pk, channel_id, chat_id, left in candidates:
        channel = channels.get(channel_id)
        pace = transport_for(channel).pace(chat_id) if channel is not None else None
        if pace is None:
            plain.append(pk)
        else:
            paced.setdefault(pace.bot, []).append(pk)
            chunks_left[pk] = (pace, left)
    chosen = [pk for bot, ids in paced.items()
              for pk in ids[:pacing.room(chunks_left[ids[0]][0], pacing.HORIZON, clock)]]
    rows = _won(plain, owner, now, dead_owners, boot, channels=channels)
    for row in rows:
        row.pace, row.pace_delay, row.send_at = None, 0.0, 0.0
    won = _won(chosen, owner, now, dead_owners, boot, channels=channels)
    rows += _slotted(sorted(won, key=lambda row: (row.created_at, row.pk)), chunks_left, owner, clock)
    rows.sort(key=lambda row: (row.created_at, row.pk))
    return rows


def _slotted(rows, chunks_left, owner, clock):
    """Reserve each claimed paced row's slot, in order; release those that get none."""
    full_bots, waiting_chats, slotted, unslotted = set(), set(), [], []
    for row in rows:
        pace, left = chunks_left[row.pk]
        slot = pacing.Slot(None)
        if pace.bot not in full_bots and (row.channel_id, row.chat_id) not in waiting_chats:
            slot = pacing.reserve(pace, pacing.HORIZON, clock, chunks=left)
        if slot.delay is None:
            (full_bots.add(pace.bot) if slot.full == "bot" else waiting_chats.add((row.channel_id, row.chat_id)))
            unslotted.append(row)
            continue
        row.pace, row.pace_delay, row.send_at = pace, slot.delay, time.monotonic() + slot.delay
        slotted.append(row)
    release(unslotted, owner)
    return slotted


def _won(ids, owner, now, dead_owners, boot, channels):
    if not ids:
        return []
    token = _claim(ids, owner, now, dead_owners, boot)
    rows = list(OutboundMessage.objects.filter(pk__in=list(ids), claim_token=token))
    for row in rows:
        row.channel = channels[row.channel_id]
    _attach_buttons(rows)
    return rows


def _channels(ids) -> dict:
    """The rows' channels (bots), loaded once per channel rather than joined per row."""
    return channel_model().objects.in_bulk(ids) if ids else {}


def _attach_buttons(rows):
    """A question asking the user to confirm an action (a notice row of
    tools.confirmations) goes out with its answer buttons while its proposal is open:
    one query per batch that has notices, none for a batch of replies."""
    notices = [row for row in rows if row.kind == OutboundKind.NOTICE]
    if notices:
        found = buttons_for_rows([row.pk for row in notices])
        for row in notices:
            row.buttons = found.get(row.pk, ())


def claim_written(rows, owner, now=None):
    """Claim rows this process has just written (their objects in hand): the same
    compare-and-swap as a sweep's claim of a pending row, in SQL written once, which
    returns the ids it won — the turn's completion path, where hundreds of replies are
    claimed at once. Through the ORM (`_claim`'s Q of every claimable state, its
    channel join and CASE) the statement's compile was half of the worker's database
    thread while 1,000 turns ended together (py-spy, tests.bench flush on PostgreSQL).
    Rows of paced channels take the paced claim (`claim_many`): a few dozen a second."""
    if not rows:
        return []
    paced = [row for row in rows if transport_for(row.channel).pace(row.chat_id) is not None]
    if paced:
        return _claim_written_paced(rows, paced, owner, now)
    now = now or timezone.now()
    token = _new_token()
    ids = [row.pk for row in rows]
    OutboundMessage.check_transition([OutboundState.PENDING], [OutboundState.ATTEMPTING])  # the SQL below
    returning = connection.features.can_return_rows_from_bulk_insert  # PostgreSQL, SQLite >= 3.35
    at = connection.ops.adapt_datetimefield_value(now)
    fresh = connection.ops.adapt_datetimefield_value(now - FRESHNESS)
    with connection.cursor() as cursor:
        cursor.execute(_claim_written_sql(len(ids), returning),
                       [OutboundState.ATTEMPTING, owner, token, at, *in_params(ids), OutboundState.PENDING,
                        MAX_RESENDS, fresh, fresh])
        won = {row[0] for row in cursor.fetchall()} if returning else set(
            OutboundMessage.objects.filter(pk__in=ids, claim_token=token).values_list("pk", flat=True))
    claimed = [row for row in rows if row.pk in won]
    for row in claimed:  # as the UPDATE left them
        row.state, row.owner, row.claim_token, row.claimed_at = OutboundState.ATTEMPTING, owner, token, now
        row.needs_marker = row.chunks_started > row.chunks_delivered
        row.attempts += 1
        row.chunks_started = row.chunks_delivered + 1
    return claimed


def _claim_written_paced(rows, paced, owner, now):
    """`claim_written` where some rows are paced: those go through the paced claim (a few
    dozen a second at most) and take the claimed state onto the objects in hand."""
    ids = {row.pk for row in paced}
    claimed = claim_written([row for row in rows if row.pk not in ids], owner, now)  # (None: now)
    won = {row.pk: row for row in claim_many(list(ids), owner, now=now)}
    for row in paced:
        fresh = won.get(row.pk)
        if fresh is not None:
            for name in ("state", "owner", "claim_token", "claimed_at", "needs_marker", "attempts",
                         "chunks_started", "pace", "pace_delay", "send_at"):
                setattr(row, name, getattr(fresh, name))
            claimed.append(row)
    return claimed


def _claim_written_sql(n, returning):
    """`_claim` of pending rows (`_claimable`: PENDING, within its budget, fresh, its
    channel able to send; `_started_before` for the label), as SQL. SET expressions
    read the row as it was, on both databases."""
    Channel = channel_model()
    return (f"UPDATE {table(OutboundMessage)} SET state = %s, owner = %s, claim_token = %s, claimed_at = %s, "
            f"needs_marker = (chunks_started > chunks_delivered), "
            f"chunks_started = chunks_delivered + 1, attempts = attempts + 1 "
            f"WHERE {in_sql('id', n)} AND state = %s AND attempts <= extra_resends + %s "
            f"AND (created_at > %s OR retried_at > %s) "
            f"AND channel_id IN (SELECT id FROM {table(Channel)} WHERE is_active AND send_blocked = '')"
            + (" RETURNING id" if returning else ""))


def claim_due(owner, dead_owners=(), limit=500, now=None, boot=False):
    """Claim what is due, oldest first. Injected time (`now`) is the pacing's clock too;
    without it, the database's."""
    clock = None if now is None else now.timestamp()
    now = now or timezone.now()
    if not boot and not maybe_claimable(dead_owners, now):
        return []
    return _claim_candidates(_candidates(dead_owners, limit, now, boot), owner, dead_owners, now, boot, clock)


def maybe_claimable(dead_owners, now) -> bool:
    """Whether any row could be claimable now: a superset of `_claimable` (its state and
    timer conditions, one index probe each, no budget, freshness or channel checks), so
    False means the full query would find nothing. Each worker sweeps every poll
    interval (20 times a second): the ORM compiled the full query each time, 1.4 ms of
    CPU for an empty answer, taken from the web process on the same cores."""
    outbound = table(OutboundMessage)
    timestamp = OutboundMessage._meta.get_field("claimed_at")
    probes = [(f"SELECT 1 FROM {outbound} WHERE state = %s", [OutboundState.PENDING])]
    if enabled():
        probes += [
            (f"SELECT 1 FROM {outbound} WHERE state = %s AND next_attempt_at <= %s",
             [OutboundState.FAILED, timestamp.get_db_prep_value(now, connection)]),
            (f"SELECT 1 FROM {outbound} WHERE state = %s AND claimed_at < %s",
             [OutboundState.ATTEMPTING, timestamp.get_db_prep_value(now - attempt_timeout(), connection)]),
        ]
        if dead_owners:
            owners = list(dead_owners)
            probes.append((f"SELECT 1 FROM {outbound} WHERE state = %s AND {in_sql('owner', len(owners), None)}",
                           [OutboundState.ATTEMPTING, *in_params(owners)]))
    with connection.cursor() as cursor:
        for sql, params in probes:  # one at a time: each its own index, and the first found ends it
            cursor.execute(f"{sql} LIMIT 1", params)
            if cursor.fetchone() is not None:
                return True
    return False


def holds_rows(owner) -> bool:
    """Whether `owner` still holds rows mid-send (its heartbeat must outlive them)."""
    return OutboundMessage.objects.filter(owner=owner, state=OutboundState.ATTEMPTING).exists()


# --- sending -----------------------------------------------------------------------------------


def text_to_send(row) -> str:
    """The chunk this attempt resumes at, labelled if its send may have happened before."""
    text = parts(row)[row.chunks_delivered]
    return RECOVERY_PREFIX + text if row.needs_marker else text


async def send(row, db=None) -> SendResult:
    """Send a claimed row's chunks in order, from the first not known delivered. Around
    each chunk but the attempt's first (started by the claim) and the last (recorded by
    `finish_many`), its start and its delivery are written down (through `db`, an async
    runner of a database function, `sync_to_async` by default), so a crash between
    chunks knows which were delivered and whether the next had started.

    A paced row (`row.pace`, set by the claim) waits for its reserved slot first; its
    later chunks wait a chat interval after the chunk before, and a bot slot each."""
    failpoint("ledger.after_claim")
    db = db or _in_a_thread
    pieces, first = parts(row), row.chunks_delivered
    row.resumed_at = first  # the chunk the label, if any, rides on (`_defer`)
    pace, sent_at = getattr(row, "pace", None), None
    result = SendResult.delivered(row.platform_message_id)
    for index in range(first, len(pieces)):
        if pace is not None and not await _slot_reached(db, row, pace, sent_at):
            result = SendResult.failed(Outcome.NOT_SENT, f"chunk {index + 1} not sent: no send slot could be reserved")
            break
        if index > first and not await _note(db, row, chunks_started=index + 1):
            result = SendResult.failed(Outcome.NOT_SENT, f"chunk {index + 1} not started: its start not recorded")
            break
        target = Target(row.chat_id, row.reply_target if index == 0 else "", row.thread_id,
                        conversation_id=row.conversation_id,
                        buttons=getattr(row, "buttons", ()) if index == len(pieces) - 1 else ())
        label = RECOVERY_PREFIX if index == first and row.needs_marker else ""
        sent_at = time.monotonic()
        result = await transport_for(row.channel).send_text(target, label + pieces[index])
        failpoint("ledger.after_chunk_send")
        if not result.ok or index == len(pieces) - 1:
            break
        if not await _note(db, row, chunks_delivered=index + 1):
            result = SendResult.failed(Outcome.AMBIGUOUS, f"chunk {index + 1} sent; its delivery not recorded")
            break
        failpoint("ledger.after_chunk")
    failpoint("ledger.after_send")
    if not result.ok:
        faults.failed(row.channel, result)
    else:
        faults.recovered(row.channel)
    return result


async def _slot_reached(db, row, pace, sent_at) -> bool:
    """Wait for the chunk's slot; False if it could not be reserved (the database away):
    the chunk has not left, so the attempt stops there, resent unlabelled (reported once
    per channel with the send's outcome, and by the database thread once per fault)."""
    try:
        await _wait_for_slot(db, row, pace, sent_at)
    except Exception:
        return False
    return True


async def _wait_for_slot(db, row, pace, sent_at):
    """Sleep until this chunk's slot: the attempt's first waits out the delay its claim
    reserved; a later one a chat interval after the chunk before (`sent_at`, monotonic),
    then a bot slot of its own. A send that wakes well past its slot (the event loop or
    the database was busy) takes a fresh slot instead of going at once: the platform
    counts arrivals, and overdue sends going out together are the burst pacing exists to
    prevent. Twice at most; then it goes."""
    if sent_at is None:
        due = getattr(row, "send_at", 0.0)
    else:
        await asyncio.sleep(max(sent_at + pace.chat_interval - time.monotonic(), 0.0))
        due = time.monotonic() + await db(pacing.chunk_slot, pace)
    for _ in range(LATE_RESLOTS):
        await asyncio.sleep(max(due - time.monotonic(), 0.0))
        if time.monotonic() - due <= pacing.LATE_TOLERANCE:
            return
        due = time.monotonic() + await db(pacing.bot_slot, pace)
    await asyncio.sleep(max(due - time.monotonic(), 0.0))


async def _in_a_thread(fn, *args):
    return await sync_to_async(fn)(*args)


async def _note(db, row, **progress) -> bool:
    """Record a chunk's progress on the claim we hold; False if it could not be (the
    database away, or the claim lost): the attempt stops there. With the ledger off
    (a row kept in memory only) there is nothing to record."""
    if row.pk is None:
        return True
    try:
        noted = await db(note_progress, row.pk, row.claim_token, progress)
    except Exception as exc:
        log.warning("could not record the progress of ledger row %s: %s", row.pk, type(exc).__name__)
        return False
    if noted:
        for name, value in progress.items():
            setattr(row, name, value)
    return bool(noted)


def note_progress(pk, claim_token, progress) -> int:
    return OutboundMessage.transition(pk, OutboundState.ATTEMPTING, OutboundState.ATTEMPTING,
                                      where={"claim_token": claim_token}, **progress)


# --- outcomes ----------------------------------------------------------------------------------


def finish_many(outcomes, owner, now=None):
    """Record send outcomes. Deliveries — nearly all of them — are one UPDATE for the
    whole batch (each row's platform id chosen by CASE); the rest one by one.

    Rows are isolated: each write runs in a savepoint of the caller's transaction, so one
    row that cannot be recorded never undoes the others' (a rolled-back "delivered" mark
    would be resent, labelled). A row that fails stays `attempting` and is recovered as
    an orphan. Only the database going away is raised (the caller retries the batch)."""
    now = now or timezone.now()
    outcomes = [(row, result) for row, result in outcomes if row.pk is not None]
    delivered = [(row, result) for row, result in outcomes if result.ok]
    if delivered:
        _record_deliveries(delivered, owner, now)
    failures = [row.pk for row, result in outcomes if not result.ok and not _isolated(finish, row, owner, result, now)]
    if failures:
        log.error("could not record the outcome of ledger rows %s; they will be recovered as orphans", failures)
    console.sends_recorded(outcomes)


def _record_deliveries(delivered, owner, now):
    def batch():
        won = _mark_delivered([(row.pk, result.platform_message_id) for row, result in delivered], owner, now)
        _after_delivery([row for row, _ in delivered if row.pk in won], now)

    if len(delivered) > 1 and _isolated(batch):
        return
    failures = [row.pk for row, result in delivered if not _isolated(_record_delivery, row, result, owner, now)]
    if failures:
        log.error("could not record the delivery of ledger rows %s; they will be recovered as orphans", failures)


def _record_delivery(row, result, owner, now):
    won = _mark_delivered([(row.pk, result.platform_message_id)], owner, now)
    _after_delivery([row] if row.pk in won else [], now)


def _isolated(write, *args) -> bool:
    """Run one write in a savepoint; False (rolled back to the savepoint) if it failed
    for any reason but the database going away."""
    try:
        with transaction.atomic():
            write(*args)
        return True
    except (OperationalError, InterfaceError):
        raise
    except (DatabaseError, ArithmeticError, ValueError, TypeError):
        log.exception("recording a ledger outcome failed")
        return False


def _mark_delivered(platform_ids, owner, now) -> set:
    """One UPDATE for a batch, each row's platform id chosen by a simple CASE, only where
    our claim still holds; returns the ids it moved. Written as SQL: the ORM's
    Case(When(...)) for hundreds of rows cost more to compile than to run."""
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
    delivered = [OutboundState.DELIVERED, connection.ops.adapt_datetimefield_value(now), Outcome.DELIVERED]
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


def _after_delivery(rows, now):
    record_many([dict(kind=EventKind.REPLY_RECOVERED, conversation_id=row.conversation_id,
                      channel_slug=row.channel.slug, actor=row.owner, target=f"ledger row {row.pk}",
                      summary=f"resent with the recovery prefix (attempt {row.attempts})",
                      attempts=row.attempts)
                 for row in rows if row.needs_marker])
    chats = {(row.channel_id, row.chat_id) for row in rows}
    if chats and UnreachableChat.objects.filter(channel_id__in={c for c, _ in chats}).exists():
        for channel_id, chat_id in chats:  # it was reached again: not unreachable any more
            UnreachableChat.objects.filter(channel_id=channel_id, chat_id=chat_id).delete()


def resends_used(row) -> int:
    """Resends spent so far: attempts after the first (a deferred send gave its own back)."""
    return max(0, row.attempts - 1)


def finish(row, owner, result: SendResult, now=None):
    """Record one attempt's outcome (a compare-and-swap on the claim we hold)."""
    now = now or timezone.now()
    if result.ok:
        return finish_many([(row, result)], owner, now)
    def mine(new_state, **fields):
        return OutboundMessage.transition(row.pk, OutboundState.ATTEMPTING, new_state,
                                          where={"owner": owner, "claim_token": row.claim_token}, **fields)

    error = redact(result.error)[:300]
    if not enabled():
        # No ledger: one try, then the reply is given up (and said so in the log).
        mine(OutboundState.ABANDONED, last_outcome=result.outcome, last_error=error, next_attempt_at=None)
        return None
    if result.outcome in (Outcome.FLOOD, Outcome.NOT_SENT):
        return _defer(row, owner, result, error, now)
    if result.outcome == Outcome.CHANNEL_BLOCKED:
        return wait_for_channel(row, owner, error, now)
    if result.outcome == Outcome.PERMANENT:
        with transaction.atomic():
            if mine(OutboundState.UNREACHABLE, last_outcome=result.outcome, last_error=error,
                    next_attempt_at=None):
                mark_unreachable(row, error, now)
        return OutboundState.UNREACHABLE
    # Temporary or ambiguous: a resend, on the budget.
    next_resend = resends_used(row) + 1
    budget = MAX_RESENDS + row.extra_resends
    if next_resend > budget:
        with transaction.atomic():
            if mine(OutboundState.ABANDONED, last_outcome=result.outcome, last_error=error,
                    next_attempt_at=None):
                _audit_abandoned(row, f"{budget} resends spent; last error: {error}")
        return OutboundState.ABANDONED
    # The last budgeted resend is kept for the next worker start.
    when = None if next_resend == budget else now + BACKOFF[min(next_resend, len(BACKOFF)) - 1]
    mine(OutboundState.FAILED, next_attempt_at=when, last_outcome=result.outcome, last_error=error)
    return OutboundState.FAILED


def _defer(row, owner, result, error, now):
    """The send provably did not leave (a flood refused it; no connection could be had or
    made): the row waits and goes out again as it would have — unlabelled unless the chunk
    it stopped at carried the label — and the attempt is given back. A flood pauses the
    whole bot (every row of it) for the penalty; a send that never left waits 1 s, then
    2, 4… up to a minute (the 24-hour freshness still bounds it)."""
    if result.outcome == Outcome.FLOOD:
        wait = clamp_retry_after(result.retry_after)
        pace = transport_for(row.channel).pace(row.chat_id)
        if pace is not None:  # on this host's clock (`now`, injectable): a second's skew is nothing here
            pacing.pause(pace.bot, wait, clock=now.timestamp())
    else:
        wait = min(2.0 ** row.flood_waits, NOT_SENT_MAX_WAIT)
    _give_back(row, owner, OutboundState.FAILED, flood_waits=F("flood_waits") + 1,
               next_attempt_at=now + timedelta(seconds=wait), last_outcome=result.outcome, last_error=error)
    return OutboundState.FAILED


def _give_back(row, owner, state, **fields) -> int:
    """Undo our claim of a row whose send did not leave: the attempt it counted returned,
    and the chunk it stopped at left as it was before (labelled next time only if it
    carried the label this time — its earlier send may have landed)."""
    carried_label = row.needs_marker and row.chunks_delivered == getattr(row, "resumed_at", row.chunks_delivered)
    fields.setdefault("next_attempt_at", timezone.now())
    return OutboundMessage.transition(
        row.pk, OutboundState.ATTEMPTING, state, where={"owner": owner, "claim_token": row.claim_token},
        owner="", claim_token="", claimed_at=None, attempts=F("attempts") - 1, needs_marker=False,
        chunks_started=F("chunks_delivered") + (1 if carried_label else 0), **fields)


def _waiting_state(row):
    """Where a claimed row waits when its attempt is given back: pending if it was never
    tried before, else failed (a timer makes it due)."""
    return OutboundState.PENDING if row.attempts <= 1 else OutboundState.FAILED


def wait_for_channel(row, owner, error, now):
    """The platform refused the channel's credentials: nothing was sent, so the row goes
    back to waiting as it was before the claim (its attempt given back: a dead token must
    not spend the resend budget), and the channel's replies wait until an operator saves
    it again (Channel.save recomputes send_blocked). Audited once per block."""
    Channel = channel_model()
    before = _waiting_state(row)
    with transaction.atomic():
        _give_back(row, owner, before, next_attempt_at=now, last_outcome=Outcome.CHANNEL_BLOCKED, last_error=error)
        if Channel.objects.filter(pk=row.channel_id, send_blocked="").update(send_blocked=error or "refused"):
            Channel.objects.forget_cached()
            record(EventKind.CHANNEL_BLOCKED, channel_slug=row.channel.slug, actor=row.owner or owner,
                   target=f"channel {row.channel.slug}",
                   summary=f"replies wait until the channel is saved again: {error}"[:300], ledger_row=row.pk)
    return before


def mark_unreachable(row, error, now):
    mark, created = UnreachableChat.objects.get_or_create(
        channel_id=row.channel_id, chat_id=row.chat_id, defaults={"error": error, "since": now,
                                                                   "last_failure_at": now})
    if not created:
        UnreachableChat.objects.filter(pk=mark.pk).update(error=error, last_failure_at=now,
                                                          failures=F("failures") + 1)
        return
    record(EventKind.CHAT_UNREACHABLE, conversation_id=row.conversation_id, channel_slug=row.channel.slug,
           actor=row.owner, target=f"chat {row.chat_id}", summary=f"never retried: {error}"[:300],
           ledger_row=row.pk)


def _audit_abandoned(row, why):
    record(EventKind.REPLY_ABANDONED, conversation_id=row.conversation_id, channel_slug=row.channel.slug,
           actor=row.owner or "ledger", target=f"ledger row {row.pk}", summary=why[:300], ledger_row=row.pk)


# --- sweeps -----------------------------------------------------------------------------------


def abandon_stale(now=None, dead_owners=()) -> int:
    """Open rows past their freshness, or past their resend budget with nobody sending
    them, are abandoned."""
    now = now or timezone.now()
    idle = Q(state__in=[OutboundState.PENDING, OutboundState.FAILED]) | Q(
        state=OutboundState.ATTEMPTING, claimed_at__lt=now - attempt_timeout())
    if dead_owners:
        idle |= Q(state=OutboundState.ATTEMPTING, owner__in=list(dead_owners))
    stale = Q(state__in=OutboundMessage.OPEN) & ~_fresh(now)
    spent = ~_within_budget()
    abandoned = 0
    for row in OutboundMessage.objects.select_related("channel").filter(idle & (stale | spent))[:500]:
        with transaction.atomic():
            if OutboundMessage.transition(row.pk, row.state, OutboundState.ABANDONED,
                                          where={"attempts": row.attempts}, next_attempt_at=None):
                why = "resend budget spent" if row.attempts > row.extra_resends + MAX_RESENDS \
                    else "older than 24 h"
                _audit_abandoned(row, f"{why}; last error: {row.last_error or '—'}")
                abandoned += 1
    return abandoned


def prune(now=None) -> int:
    """Finished rows are deleted after 7 days (django-q2 schedule, daily)."""
    now = now or timezone.now()
    finished = [OutboundState.DELIVERED, OutboundState.ABANDONED, OutboundState.UNREACHABLE]
    deleted, _ = OutboundMessage.objects.filter(state__in=finished, created_at__lte=now - PRUNE_AFTER).delete()
    return deleted


def retry_now(ids, by="operator") -> int:
    """An operator's "retry now": failed, abandoned or unreachable rows get one more
    resend, due at once (they will carry the recovery prefix)."""
    now = timezone.now()
    moved = 0
    for row in OutboundMessage.objects.filter(pk__in=list(ids), state__in=[
            OutboundState.FAILED, OutboundState.ABANDONED, OutboundState.UNREACHABLE]):
        grant = max(0, resends_used(row) + 1 - MAX_RESENDS - row.extra_resends)
        moved += OutboundMessage.transition(
            row.pk, row.state, OutboundState.FAILED, next_attempt_at=now, extra_resends=F("extra_resends") + grant,
            retried_at=now, last_error=f"retry requested by {by}"[:300])
    return moved


def abandon(ids, by="operator") -> int:
    rows = OutboundMessage.objects.select_related("channel").filter(
        pk__in=list(ids), state__in=[OutboundState.PENDING, OutboundState.FAILED])
    abandoned = 0
    for row in rows:
        with transaction.atomic():
            if OutboundMessage.transition(row.pk, row.state, OutboundState.ABANDONED, next_attempt_at=None):
                _audit_abandoned(row, f"abandoned by {by}")
                abandoned += 1
    return abandoned


def channel_health(channel_id) -> dict:
    """For the admin's channel page: the last error and the unreachable chats."""
    last = (OutboundMessage.objects.filter(channel_id=channel_id).exclude(last_error="")
            .order_by("-claimed_at").values("last_error", "claimed_at").first())
    unreachable = list(UnreachableChat.objects.filter(channel_id=channel_id).order_by("-last_failure_at")
                       .values_list("chat_id", "error", "since")[:50])
    return {"last_error": last, "unreachable": unreachable}


def release(rows, owner) -> int:
    """Give back claimed rows this owner did not send: as they were before the claim
    (the attempt it counted is returned, so an unsent row goes out plain if it never
    went out before)."""
    return sum(_give_back(row, owner, _waiting_state(row)) for row in rows)


def safety_sweep(budget=None, batch=1):
    """django-q2's safety net (every minute): abandon stale rows, and deliver what is due
    when no worker loop is doing it — the claims make racing a live worker harmless.

    It claims a small batch at a time (one row by default: a row claimed is a row being
    sent, so a sweep killed at django-q2's task timeout — or by anything — never leaves
    a delivered row `attempting` nor spends an attempt of a row it did not send),
    records each outcome right after its send, stops claiming when its time budget is
    spent, and gives back whatever it claimed and did not send. A due row whose chat or
    bot has no send slot yet (pacing) is waited for, within the budget."""
    abandoned = abandon_stale()
    pacing.forget_spent()
    owner = f"tasks:{os.uname().nodename}:{os.getpid()}"
    deadline = time.monotonic() + (settings.AGENTLOOP_SAFETY_SWEEP_BUDGET if budget is None else budget)
    loop = asyncio.new_event_loop()
    sent = 0
    try:
        while time.monotonic() < deadline:
            now = timezone.now()
            # Leave fresh rows to the worker loop, which sends them within milliseconds.
            due = claimable_ids(limit=batch, now=now, older_than=now - timedelta(seconds=30))
            rows = claim_many(due, owner)
            if not rows and not due:
                break
            if not rows:  # due, but paced: its chat or bot has no slot yet
                time.sleep(min(PACED_RETRY, max(deadline - time.monotonic(), 0)))
                continue
            sent += _send_each(loop, rows, owner, deadline)
    finally:
        loop.run_until_complete(close_clients())
        loop.close()
    return {"abandoned": abandoned, "sent": sent}


def _send_each(loop, rows, owner, deadline) -> int:
    for done, row in enumerate(rows):
        if time.monotonic() >= deadline:
            release(rows[done:], owner)
            return done
        result = loop.run_until_complete(send(row))
        finish_many([(row, result)], owner)
    return len(rows)
