"""Pacing: sends kept below each platform's documented limits, one budget per bot shared
by every worker process and host.

Telegram takes about 30 messages a second from one bot, one a second into one chat and
20 a minute into one group; beyond that it answers 429 and, if we keep going, longer
and longer penalties. A burst of intake (a thousand new chats replied to at once) must
become a paced drain from the ledger, not a storm of 429s.

Each limit is a key in `SendBudget` holding the next free slot (the generic cell rate
algorithm's "theoretical arrival time"): reserving a send moves the slot on by the
key's interval, in one upsert, so processes that reserve at the same moment get
distinct slots. A send takes its bot's earliest slot, and its chat's only if the chat
is free by then; a chat that is not gives the bot's slot back, so a busy chat never
pushes the rest of the bot's chats back.
A reservation further ahead than the caller's horizon is not taken (nothing written):
the ledger claims a row only once its slot is near, so a row never sits `attempting`
for long while it waits its turn (see `delivery.ledger.claim_due`).

On PostgreSQL the slots are on the database's clock (`statement_timestamp()`); what a
reservation returns is a delay, slept on the local clock. On SQLite (one machine) the
local clock is the database's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import transaction

from delivery import sql

# Sends to one chat arrive with the network's jitter between them: a chat's interval is
# widened by this much, so two sends spaced exactly 1 s apart never land 0.99 s apart.
CHAT_JITTER = 0.05
# How far ahead the ledger reserves: a claimed row waits at most this long for its slot.
HORIZON = 1.0
FORGET_AFTER = 60.0  # a key whose slot is this far in the past holds nothing: deleted
# A send this late for its slot takes a fresh one (delivery.ledger): overdue sends going
# out together are a burst the platform counts.
LATE_TOLERANCE = 0.05


@dataclass(frozen=True)
class Pace:
    """The limits one send falls under: its bot's and its chat's (0: none)."""

    bot: str  # the bot's budget key: one per credential, whichever channels share it
    bot_interval: float
    chat: str = ""
    chat_interval: float = 0.0

    @classmethod
    def of(cls, bot: str, per_second: float, chat: str = "", chat_interval: float = 0.0) -> Pace:
        """`per_second`: the bot's rate (0: unpaced); `chat_interval`: seconds between two
        sends into the chat (0: unpaced)."""
        return cls(bot, 1.0 / per_second if per_second else 0.0,
                   f"{bot}:{chat}" if chat_interval else "", chat_interval + CHAT_JITTER if chat_interval else 0.0)

    @property
    def paced(self) -> bool:
        return bool(self.bot_interval or self.chat_interval)


@dataclass(frozen=True)
class Slot:
    """A reservation's answer: `delay` seconds to wait before sending, or None when the
    earliest slot lies beyond the horizon (`full` names the key that is: "bot", "chat")."""

    delay: float | None
    full: str = ""


def reserve(pace: Pace, horizon: float = HORIZON, clock: float | None = None, chunks: int = 1) -> Slot:
    """Reserve a send under `pace`: the bot's earliest slot, if it lies within `horizon`
    seconds (math.inf: whatever it takes), and only if the chat is free by then. The chat
    is booked for all of a reply's `chunks` at once (`chunks` intervals from the slot), so
    no other reply lands between them; each later chunk takes its own bot slot
    (`chunk_slot`). A chat that is not free in time gives the bot's slot back (one
    transaction; the bot's row is always locked first, so reservations never deadlock).
    `clock`: epoch seconds to count from (injected time in tests); None: the database's."""
    if not pace.paced:
        return Slot(0.0)
    with transaction.atomic():
        delay = 0.0
        if pace.bot_interval:
            taken = _take(pace.bot, pace.bot_interval, 0.0, horizon, clock)
            if taken is None:
                return Slot(None, "bot")
            delay = taken
        if pace.chat_interval and _take(pace.chat, pace.chat_interval * chunks, delay, delay, clock) is None:
            transaction.set_rollback(True)
            return Slot(None, "chat")
    return Slot(max(delay, 0.0))


def reserve_many(requests: Sequence[tuple[Pace, int]], horizon: float = HORIZON,
                 clock: float | None = None) -> list[Slot]:
    """`reserve` for each (pace, chunks), in order: what as many calls in a row would
    answer and leave in the table (tests/unit/test_pacing.py checks it), in one
    transaction of four statements whatever their number, where `reserve` takes four each
    (a batch of 32 turns' replies was 128 statements and about 60 round trips on
    PostgreSQL). Every key the sends fall under is locked first, in key order: a bot's
    key sorts before its chats', the order `reserve` locks them in, so two batches, or a
    batch and a single reservation, never deadlock. The rule is then applied in Python."""
    if len(requests) < 2:
        return [reserve(pace, horizon, clock, chunks) for pace, chunks in requests]
    keys = {key for pace, _ in requests
            for key, interval in ((pace.bot, pace.bot_interval), (pace.chat, pace.chat_interval)) if interval}
    if not keys:
        return [Slot(0.0) for _ in requests]
    with transaction.atomic():
        now, slots, made = sql.lock_slots(keys, clock)
        before = dict(slots)
        answers = [_reserve_in(slots, now, pace, chunks, horizon) for pace, chunks in requests]
        moved = {key: slot for key, slot in slots.items() if slot != before[key]}
        sql.set_slots(moved, made - moved.keys())
    return answers


def _reserve_in(slots: dict[str, float], now: float, pace: Pace, chunks: int, horizon: float) -> Slot:
    """`reserve`'s rule on slots in hand (`delivery.sql.take_slot`'s upsert, twice): the
    bot's slot if within the horizon, then the chat's only if free by then; a chat not
    free leaves the bot's slot as it was."""
    if not pace.paced:
        return Slot(0.0)
    delay, bot_next = 0.0, None
    if pace.bot_interval:
        slot = max(slots[pace.bot], now)
        if slot > now + horizon:
            return Slot(None, "bot")
        delay, bot_next = slot - now, slot + pace.bot_interval
    if pace.chat_interval:
        if slots[pace.chat] > now + delay:
            return Slot(None, "chat")
        slots[pace.chat] = now + delay + pace.chat_interval * chunks
    if bot_next is not None:
        slots[pace.bot] = bot_next
    return Slot(max(delay, 0.0))


def room(pace: Pace, horizon: float = HORIZON, clock: float | None = None) -> int:
    """How many sends the bot's budget has room for within `horizon` (a chat-only pace:
    no bound), so a sweep claims no more of its rows than it can send soon."""
    if not pace.bot_interval:
        return 1 << 30
    return max(0, math.floor((horizon - waiting(pace.bot, clock)) / pace.bot_interval) + 1)


def bot_slot(pace: Pace, clock: float | None = None) -> float:
    """A fresh bot slot however far (a send that woke too late for its own). Its delay."""
    if not pace.bot_interval:
        return 0.0
    return max(_take_however_far(pace.bot, pace.bot_interval, clock), 0.0)


def chunk_slot(pace: Pace, clock: float | None = None) -> float:
    """The next chunk of a reply under way (its chat booked with the first, and a chat
    interval already waited since the chunk before): a bot slot however far, and the
    chat's booking kept at least one interval past it. Returns its delay."""
    if not pace.paced:
        return 0.0
    with transaction.atomic():
        delay = max(_take_however_far(pace.bot, pace.bot_interval, clock), 0.0) if pace.bot_interval else 0.0
        if pace.chat_interval:
            _extend(pace.chat, delay + pace.chat_interval, clock)
    return delay


FLOOD_PREFIX = "flood:"


def flood_key(channel_id: int) -> str:
    """The key an unpaced channel waits on after a 429: its Retry-After is the account's,
    not one message's (a paced channel's wait is its bot's key, every row of the bot)."""
    return f"{FLOOD_PREFIX}{channel_id}"


def flood_pause_key(pace: Pace | None, channel_id: int) -> str:
    """The key a 429 pauses, that every send of the channel waits on: a paced channel's
    bot (every channel sharing its credential), an unpaced one's own flood key."""
    return pace.bot if pace is not None else flood_key(channel_id)


def pause(key: str, seconds: float, clock: float | None = None) -> None:
    """Nothing under `key` goes out for `seconds` (a 429's retry_after pauses the whole bot,
    not only the refused row)."""
    _extend(key, seconds, clock)


def _extend(key: str, seconds: float, clock: float | None) -> None:
    """`key` is taken for at least `seconds` from now."""
    sql.extend_slot(key, seconds, clock)


def waiting(key: str, clock: float | None = None) -> float:
    """Seconds until `key`'s next free slot (0 when free now)."""
    found = sql.slot_wait(key, clock)
    return max(found, 0.0) if found is not None else 0.0


def forget_spent(clock: float | None = None) -> int:
    """Delete keys whose slot is long past (one per chat ever replied to would pile up)."""
    return sql.forget_slots(FORGET_AFTER, clock)


def _take(key: str, interval: float, after: float, horizon: float, clock: float | None) -> float | None:
    """Take the key's slot (moved on by `interval`) if it is within `horizon` of now
    (`delivery.sql.take_slot`); its delay from now, or None."""
    return sql.take_slot(key, interval, after, horizon if math.isfinite(horizon) else 1e12, clock)


def _take_however_far(key: str, interval: float, clock: float | None) -> float:
    """The key's next slot, taken wherever it lies (no horizon: one is always found)."""
    delay = _take(key, interval, 0.0, math.inf, clock)
    assert delay is not None, "a slot within an endless horizon"
    return delay
