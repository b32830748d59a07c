"""Claiming: the compare-and-swap that moves due rows to `attempting` under one owner
(and, for paced channels, gives each its send slot)."""

from __future__ import annotations

import itertools
import os
import secrets
import time
from collections.abc import Collection, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import Case, CharField, DateTimeField, Exists, ExpressionWrapper, F, OuterRef, Q, Value, When
from django.db.models.functions import Cast, Concat
from django.db.models.lookups import GreaterThan
from django.utils import timezone

from agentloop.core.rows import Rare, postgresql
from delivery import pacing, sql
from delivery.ledger.outcomes import release
from delivery.ledger.recoveries import settle_stale
from delivery.ledger.replies import FRESHNESS, MAX_RESENDS, attempt_timeout, enabled
from delivery.models import OutboundKind, OutboundMessage, OutboundState, SendBudget, channel_model
from delivery.questions import buttons_for_rows
from delivery.transports import transport_for

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from delivery.pacing import Pace

# A claim candidate: (row id, channel id, chat id, chunks left to send).
Candidate = tuple[int, int, str, int]

_tokens = itertools.count()
_token_prefix = secrets.token_hex(6)


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """One claim's terms: who claims, at what time, the owners known dead (their
    `attempting` rows are orphans), whether it is a worker's boot sweep (a last resend
    kept for the next start is due), the pacing's clock (None: the database's) and the
    stamp the claim puts on its rows."""

    owner: str
    now: datetime
    dead_owners: Collection[str] = ()
    boot: bool = False
    clock: float | None = None
    token: str = ""  # the claim's stamp, chosen by the caller to find its rows again; else fresh


def _within_budget() -> Q:
    """Attempts are sends that may have left: a flood or a send that never left gives its
    attempt back (`_defer`), so only those count."""
    return Q(attempts__lte=F("extra_resends") + MAX_RESENDS)


def _claimable(now: datetime, dead_owners: Collection[str], boot: bool) -> Q:
    due = Q(state=OutboundState.PENDING)
    if enabled():
        due |= Q(state=OutboundState.FAILED, next_attempt_at__lte=now)
        if boot:
            due |= Q(state=OutboundState.FAILED, next_attempt_at__isnull=True)
        orphaned = Q(state=OutboundState.ATTEMPTING, claimed_at__lt=now - attempt_timeout())
        if dead_owners:
            orphaned |= Q(state=OutboundState.ATTEMPTING, owner__in=list(dead_owners))
        due |= orphaned
    return due & _within_budget() & _fresh(now) & _sendable() & _not_flooded(now)


def _fresh(now: datetime) -> Q:
    """Within its channel's freshness (`Channel.recovery_freshness`, 24 h by default) of
    its creation, or of an operator's retry. A correlated subquery on the channel, like
    `_sendable`, so the claim's UPDATE keeps its state test in its own WHERE."""
    return Q(_within_freshness(now, "created_at")) | Q(_within_freshness(now, "retried_at"))


def _within_freshness(now: datetime, stamp: str) -> Exists:
    reaches = ExpressionWrapper(OuterRef(stamp) + F("recovery_freshness"), output_field=DateTimeField())
    Channel: Any = channel_model()  # conversations' (its manager is not typed down here)
    return Exists(Channel.objects.filter(GreaterThan(reaches, now), pk=OuterRef("channel_id")))


def _not_flooded(now: datetime) -> Q:
    """Not a row of an unpaced channel a platform refused with a 429 less than its
    Retry-After ago (pacing.flood_key, written by outcomes._defer on this host's clock, as
    `now` is): another chat's reply sent 0.09 s after Twilio's `Retry-After: 2` was seen.
    A paced channel waits on its bot's slot instead (pacing.reserve). A correlated subquery,
    like `_fresh`: the claim's UPDATE keeps its state test in its own WHERE."""
    key = Concat(Value(pacing.FLOOD_PREFIX), Cast(OuterRef("channel_id"), CharField()))
    return Q(~Exists(SendBudget.objects.filter(key=key, next_slot__gt=now.timestamp())))


def _sendable() -> Q:
    """Only rows whose channel can send now: an inactive channel's rows wait, and so do
    those of a channel its platform says cannot send (Channel.send_blocked: a setting
    missing, credentials the platform refused).

    A subquery, not a join: with a join Django writes the claim as `UPDATE … WHERE id IN
    (SELECT … )`, and PostgreSQL, re-checking a row another claim just moved, re-checks
    only that outer `id IN` — so two sweeps racing for the same pending rows both won
    them, the second labelled (a duplicate, found by two workers draining one paced
    bot). Here the state test stays in the UPDATE's own WHERE, which the re-check reads."""
    Channel: Any = channel_model()
    return Q(channel_id__in=Channel.objects.filter(is_active=True, send_blocked="").values("id"))


def claimable_ids(dead_owners: Collection[str] = (), limit: int = 500, now: datetime | None = None, boot: bool = False,
                  older_than: datetime | None = None) -> list[int]:
    return [pk for pk, *_ in _candidates(dead_owners, limit, now or timezone.now(), boot, older_than)]


# A chat's rows one look takes at most while other chats' rows wait behind them. One chat
# sends in order, and a paced one a row a second or so: more of its rows in a look only
# crowd out every other chat's (a backlog of 1,200 replies owed to one chat kept every
# other channel's replies pending, 0 attempts, for as long as it took to drain: found by
# `python -m tests.bench platforms`).
PER_CHAT = 20
# Looks past crowded chats a sweep takes at most (each one more query, only when a chat
# filled a whole look).
CROWDED_LOOKS = 3


def _candidates(dead_owners: Collection[str], limit: int, now: datetime, boot: bool,
                older_than: datetime | None = None) -> list[Candidate]:
    """Claimable rows, oldest first, as (id, channel id, chat id, chunks left to send), at
    most PER_CHAT of one chat while others wait. Open rows are few among the ledger's
    millions: said so (rows.Rare), or SQLite, with statistics on the file, walked the
    whole ledger in creation order (340 ms a look)."""
    rows = OutboundMessage.objects.filter(Rare(Q(state__in=OutboundMessage.OPEN)), _claimable(now, dead_owners, boot))
    if older_than is not None:
        rows = rows.filter(created_at__lte=older_than)
    found: list[tuple[datetime, Candidate]] = []
    crowded: set[tuple[int, str]] = set()
    for _ in range(CROWDED_LOOKS):
        wanted = limit - len(found)
        others = rows.exclude(_any_chat(crowded)) if crowded else rows
        look = _dated_candidates(others.order_by("created_at", "pk")[:wanted])
        kept, full = _capped(look)
        found += kept
        crowded |= full
        if not full or len(look) < wanted:  # no chat crowded this look, or no row is left behind it
            break
    found.sort(key=lambda dated: (dated[0], dated[1][0]))
    return [candidate for _, candidate in found]


def _capped(look: list[tuple[datetime, Candidate]]) -> tuple[list[tuple[datetime, Candidate]], set[tuple[int, str]]]:
    """A look's rows with at most PER_CHAT of each chat, and the chats that had more."""
    counts: dict[tuple[int, str], int] = {}
    kept = []
    for dated in look:
        chat = (dated[1][1], dated[1][2])
        counts[chat] = counts.get(chat, 0) + 1
        if counts[chat] <= PER_CHAT:
            kept.append(dated)
    return kept, {chat for chat, count in counts.items() if count > PER_CHAT}


def _any_chat(chats: set[tuple[int, str]]) -> Q:
    """Rows of any of `chats`, (channel id, chat id) pairs."""
    rows = Q()
    for channel_id, chat_id in sorted(chats):
        rows |= Q(channel_id=channel_id, chat_id=chat_id)
    return rows


def _dated_candidates(rows: QuerySet[OutboundMessage]) -> list[tuple[datetime, Candidate]]:
    """Rows as claim candidates, each with when it was written (looks are merged by it)."""
    found = rows.values_list("created_at", "pk", "channel_id", "chat_id", "chunks", "chunks_delivered")
    return [(created, (pk, channel, chat, max(1, len(parts or ()) - delivered)))
            for created, pk, channel, chat, parts, delivered in found]


def _as_candidates(rows: QuerySet[OutboundMessage]) -> list[Candidate]:
    """Rows as claim candidates: (id, channel id, chat id, chunks left to send)."""
    return [candidate for _, candidate in _dated_candidates(rows)]


def _claim(ids: Iterable[int], request: ClaimRequest) -> str:
    """The compare-and-swap: move the still-claimable rows among `ids` to `attempting`
    under the request's owner, stamped with a fresh token (returned). `needs_marker` is computed from
    the row before it (SQL evaluates SET expressions on the old row): the chunk the send
    resumes at is labelled if its send had started before; the claim starts it. (A paced
    row may wait up to the pacing horizon for its slot: a worker that dies meanwhile
    leaves it labelled, as nobody can tell whether it went.)"""
    token = request.token or new_token()
    OutboundMessage.transition(
        list(ids), [OutboundState.PENDING, OutboundState.FAILED, OutboundState.ATTEMPTING], OutboundState.ATTEMPTING,
        where=_claimable(request.now, request.dead_owners, request.boot), owner=request.owner, claim_token=token,
        claimed_at=request.now,
        needs_marker=Case(When(_started_before(), then=Value(True)), default=Value(False)),
        chunks_started=F("chunks_delivered") + 1, attempts=F("attempts") + 1,
    )
    return token


def new_token() -> str:
    """A claim's stamp, unique to this process and call. A caller that may lose the
    answer of its claim (the connection dies after the commit) picks the stamp first, so
    it can tell the rows it won from rows the same owner claimed elsewhere (its sweep)."""
    return f"{_token_prefix}-{os.getpid()}-{next(_tokens)}"


def _started_before() -> Q:
    """The chunk a claim resumes at had started before: its send may have landed. (A row
    an older build claimed counting attempts only was marked started by migration 0006.)"""
    return Q(chunks_started__gt=F("chunks_delivered"))


def claim_many(ids: Collection[int], owner: str, now: datetime | None = None, token: str = "") -> list[OutboundMessage]:
    """Claim these rows for `owner` (those still claimable, and of paced channels those
    whose slot is near), stamped with `token` (default: a fresh one); returns what was won."""
    if not ids:
        return []
    clock = None if now is None else now.timestamp()  # injected time paces by it too
    now = now or timezone.now()
    candidates = _as_candidates(OutboundMessage.objects.filter(pk__in=list(ids)).order_by("created_at", "pk"))
    return _claim_candidates(candidates, ClaimRequest(owner, now, clock=clock, token=token))


def _claim_candidates(candidates: Sequence[Candidate], request: ClaimRequest) -> list[OutboundMessage]:
    """Claim candidates (oldest first): rows of unpaced channels at once; of a paced bot,
    as many of its oldest rows as its budget has room for within the horizon
    (delivery.pacing), each then given its slot — claimed first, so workers sweeping
    side by side never reserve slots for the same row. A row whose slot is not near
    after all (its chat not free in time, or another worker took the bot's room) is
    released as it was, and its chat's later rows with it. The slot rides on the row
    (`pace_delay` from the reservation, `send_at` on the monotonic clock); `send` waits
    for it."""
    channels = _channels({channel for _, channel, _, _ in candidates})
    plain: list[int] = []
    paced: dict[str, list[int]] = {}
    chunks_left: dict[int, tuple[Pace, int]] = {}
    for pk, channel_id, chat_id, left in candidates:
        channel = channels.get(channel_id)
        pace = transport_for(channel).pace(chat_id) if channel is not None else None
        if pace is None:
            plain.append(pk)
        else:
            paced.setdefault(pace.bot, []).append(pk)
            chunks_left[pk] = (pace, left)
    chosen = [pk for bot, ids in paced.items()
              for pk in ids[:pacing.room(chunks_left[ids[0]][0], pacing.HORIZON, request.clock)]]
    rows = _won(plain, request, channels)
    for row in rows:
        row.pace, row.pace_delay, row.send_at = None, 0.0, 0.0
    won = _won(chosen, request, channels)
    rows += _slotted(sorted(won, key=lambda row: (row.created_at, row.pk)), chunks_left, request)
    rows.sort(key=lambda row: (row.created_at, row.pk))
    return rows


def _slotted(rows: list[OutboundMessage], chunks_left: dict[int, tuple[Pace, int]],
             request: ClaimRequest) -> list[OutboundMessage]:
    """Reserve each claimed paced row's slot, in order, in one transaction
    (pacing.reserve_many); release those that get none (a chat not free in time keeps its
    later rows waiting too, as a bot without room does)."""
    slots = pacing.reserve_many([chunks_left[row.pk] for row in rows], pacing.HORIZON, request.clock)
    slotted: list[OutboundMessage] = []
    unslotted: list[OutboundMessage] = []
    for row, slot in zip(rows, slots, strict=True):
        if slot.delay is None:
            unslotted.append(row)
            continue
        row.pace, row.pace_delay, row.send_at = chunks_left[row.pk][0], slot.delay, time.monotonic() + slot.delay
        slotted.append(row)
    release(unslotted, request.owner)
    return slotted


def _won(ids: list[int], request: ClaimRequest, channels: dict[int, Any]) -> list[OutboundMessage]:
    if not ids:
        return []
    token = _claim(ids, request)
    rows = list(OutboundMessage.objects.filter(pk__in=list(ids), claim_token=token))
    for row in rows:
        row.channel = channels[row.channel_id]
    rows = settle_stale(rows, request.owner)
    _attach_buttons(rows)
    return rows


def _channels(ids: Collection[int]) -> dict[int, Any]:
    """The rows' channels (bots), loaded once per channel rather than joined per row."""
    Channel: Any = channel_model()
    return Channel.objects.in_bulk(ids) if ids else {}


def _attach_buttons(rows: list[OutboundMessage]) -> None:
    """A question asking the user to confirm an action (a notice row of
    tools.confirmations) goes out with its answer buttons while its proposal is open:
    one query per batch that has notices, none for a batch of replies."""
    notices = [row for row in rows if row.kind == OutboundKind.NOTICE]
    if notices:
        found = buttons_for_rows([row.pk for row in notices])
        for row in notices:
            row.buttons = found.get(row.pk, ())


def claim_written(rows: list[OutboundMessage], owner: str, now: datetime | None = None,
                  token: str = "") -> list[OutboundMessage]:
    """Claim rows this process has just written (their objects in hand), stamped with
    `token` (default: a fresh one): the same
    compare-and-swap as a sweep's claim of a pending row, in SQL written once, which
    returns the ids it won — the turn's completion path, where hundreds of replies are
    claimed at once. Rows of paced channels take the paced claim (`claim_many`): a few dozen a second.
    (The statement, and why it is SQL: `delivery.sql.claim_pending`.)"""
    if not rows:
        return []
    paced = [row for row in rows if transport_for(row.channel).pace(row.chat_id) is not None]
    if paced:
        return _claim_written_paced(rows, paced, owner, now, token)
    now = now or timezone.now()
    token = token or new_token()
    ids = [row.pk for row in rows]
    # On SQLite in a transaction of its own: a transaction queues for the one write lock
    # (agentloop.core.sqlite), an autocommitted statement polls for it, and lost it to a
    # web process committing back to back (12 % of the worker's samples, its completions
    # waiting). PostgreSQL's UPDATE queues on the rows alone.
    with nullcontext() if postgresql() else transaction.atomic():
        # Rows written just now: younger than any channel's freshness (a minute at least),
        # so the deployment's bound is the statement's, not each channel's.
        won = sql.claim_pending(ids, owner, token, now, max_resends=MAX_RESENDS, fresh_after=now - FRESHNESS,
                                flood_prefix=pacing.FLOOD_PREFIX)
    claimed = [row for row in rows if row.pk in won]
    for row in claimed:  # as the UPDATE left them
        row.state, row.owner, row.claim_token, row.claimed_at = OutboundState.ATTEMPTING, owner, token, now
        row.needs_marker = row.chunks_started > row.chunks_delivered
        row.attempts += 1
        row.chunks_started = row.chunks_delivered + 1
    return claimed


def _claim_written_paced(rows: list[OutboundMessage], paced: list[OutboundMessage], owner: str,
                         now: datetime | None, token: str) -> list[OutboundMessage]:
    """`claim_written` where some rows are paced: those go through the paced claim (a few
    dozen a second at most) and take the claimed state onto the objects in hand."""
    token = token or new_token()  # one stamp for both halves
    ids = {row.pk for row in paced}
    claimed = claim_written([row for row in rows if row.pk not in ids], owner, now, token)  # (None: now)
    won = {row.pk: row for row in claim_many(list(ids), owner, now=now, token=token)}
    for row in paced:
        fresh = won.get(row.pk)
        if fresh is not None:
            for name in ("state", "owner", "claim_token", "claimed_at", "needs_marker", "attempts",
                         "chunks_started", "pace", "pace_delay", "send_at"):
                setattr(row, name, getattr(fresh, name))
            claimed.append(row)
    return claimed


def claim_due(owner: str, dead_owners: Collection[str] = (), limit: int = 500, now: datetime | None = None,
              boot: bool = False) -> list[OutboundMessage]:
    """Claim what is due, oldest first. Injected time (`now`) is the pacing's clock too;
    without it, the database's."""
    clock = None if now is None else now.timestamp()
    now = now or timezone.now()
    if not boot and not maybe_claimable(dead_owners, now):
        return []
    return _claim_candidates(_candidates(dead_owners, limit, now, boot), ClaimRequest(owner, now, dead_owners, boot, clock))


def maybe_claimable(dead_owners: Collection[str], now: datetime) -> bool:
    """Whether any row could be claimable now: a superset of `_claimable` (its state and
    timer conditions, one index probe each, no budget, freshness or channel checks), so
    False means the full query would find nothing (`delivery.sql.maybe_due`: why SQL)."""
    return sql.maybe_due(now, timers=enabled(), orphaned_before=now - attempt_timeout(), dead_owners=dead_owners)


def holds_rows(owner: str) -> bool:
    """Whether `owner` still holds rows mid-send (its heartbeat must outlive them)."""
    return OutboundMessage.objects.filter(owner=owner, state=OutboundState.ATTEMPTING).exists()
