"""Pacing (delivery.pacing) on the real database, with injected time: slots spaced by each
key's interval, nothing reserved beyond the horizon, a chat's slot given back when its
bot has none, a flood's pause; and the ledger's paced claim: a row is claimed only once
its slot is near, in each chat's order, and a row claimed while it waits labels nothing
if its worker dies."""

import math
import time

import pytest

from delivery import pacing
from delivery.models import SendBudget
from delivery.pacing import Pace, Slot
from tests.conftest import at_once

T = 1_800_000_000.0  # an epoch second to count from
BOT = Pace.of("bot", 10)  # 0.1 s apart
CHATTY = Pace.of("bot", 10, "ana", 1.0)  # and 1.05 s apart into ana's chat


def slot_of(key):
    found = SendBudget.objects.filter(key=key).first()
    return found.next_slot - T if found else None


def near(x):
    return pytest.approx(x, abs=1e-5)  # epoch seconds as floats: ~0.2 µs apart


@pytest.mark.django_db
def test_slots_are_spaced_by_the_interval_and_none_is_taken_beyond_the_horizon():
    delays = [pacing.reserve(BOT, horizon=0.35, clock=T).delay for _ in range(6)]
    assert delays == [0.0, near(0.1), near(0.2), near(0.3), None, None]
    assert slot_of("bot") == near(0.4)  # the refusals wrote nothing
    assert pacing.reserve(BOT, horizon=0.35, clock=T + 0.3).delay == near(0.1)
    assert pacing.reserve(BOT, horizon=0.35, clock=T + 10).delay == 0.0  # an idle key starts from now


@pytest.mark.django_db
def test_a_chat_not_free_in_time_gives_its_bot_slot_back_and_holds_up_no_other_chat():
    assert pacing.reserve(CHATTY, clock=T) == Slot(0.0)
    assert slot_of("bot") == near(0.1) and slot_of("bot:ana") == near(1.05)
    assert pacing.reserve(CHATTY, horizon=1.0, clock=T) == Slot(None, "chat")
    assert slot_of("bot") == near(0.1)  # given back: ana's wait costs the bot nothing
    other = Pace.of("bot", 10, "beto", 1.0)
    assert pacing.reserve(other, clock=T).delay == near(0.1)  # another chat of the bot goes on
    assert pacing.reserve(CHATTY, clock=T + 1.05).delay == near(0.0)  # ana's chat is free again


@pytest.mark.django_db
def test_the_bot_slot_is_taken_only_within_the_horizon():
    for _ in range(10):
        pacing.reserve(BOT, horizon=math.inf, clock=T)  # the bot is booked for a second
    assert pacing.reserve(CHATTY, horizon=0.5, clock=T) == Slot(None, "bot")
    assert slot_of("bot:ana") is None
    assert pacing.reserve(CHATTY, horizon=1.5, clock=T).delay == near(1.0)
    assert slot_of("bot:ana") == near(2.05)  # booked from its bot slot on


@pytest.mark.django_db
def test_a_reply_in_chunks_books_its_chat_for_all_of_them():
    assert pacing.reserve(CHATTY, clock=T, chunks=3).delay == 0.0
    assert slot_of("bot:ana") == near(3 * 1.05)
    assert pacing.reserve(CHATTY, horizon=3.0, clock=T + 1.05) == Slot(None, "chat")  # no reply between
    assert pacing.chunk_slot(CHATTY, clock=T + 1.05) == near(0.0)  # chunk 2, a chat interval later
    assert slot_of("bot") == near(1.15)
    pacing.reserve(BOT, horizon=math.inf, clock=T + 2.05)  # the bot is busy when chunk 3 is due...
    assert pacing.chunk_slot(CHATTY, clock=T + 2.1) == near(0.05)
    assert slot_of("bot:ana") == near(2.15 + 1.05)  # ...and the chat stays booked past it


@pytest.mark.django_db
def test_a_pause_holds_every_send_of_the_key():
    pacing.pause("bot", 7, clock=T)
    assert pacing.waiting("bot", clock=T + 1) == near(6)
    assert pacing.reserve(BOT, clock=T + 1).delay is None
    assert pacing.reserve(BOT, horizon=math.inf, clock=T + 1).delay == near(6)
    pacing.pause("bot", 1, clock=T)  # a shorter pause never shortens a longer one
    assert pacing.waiting("bot", clock=T + 1) == near(6.1)


@pytest.mark.django_db
def test_unpaced_sends_touch_nothing_and_spent_keys_are_forgotten():
    assert pacing.reserve(Pace.of("free", 0), clock=T) == Slot(0.0)
    assert not SendBudget.objects.exists()
    pacing.reserve(CHATTY, clock=T)
    assert pacing.forget_spent(clock=T + 30) == 0
    assert pacing.forget_spent(clock=T + pacing.FORGET_AFTER + 5) == 2
    assert not SendBudget.objects.exists()


@pytest.mark.django_db
def test_the_database_clock_is_used_when_no_time_is_injected():
    started = time.monotonic()
    assert pacing.reserve(BOT).delay == 0.0
    second = pacing.reserve(BOT).delay
    between = time.monotonic() - started
    # The bot's next slot is 0.1 s after the first, by the database's clock: what is left of
    # it when the second reservation is read (the backfill runs this at idle priority).
    assert max(0.0, 0.1 - between) - 0.02 <= second <= 0.1 + 0.02, (second, between)


@pytest.mark.django_db(transaction=True)
def test_processes_reserving_at_once_get_distinct_slots_one_budget_for_the_bot():
    """Four database sessions (threads with connections of their own, as four workers
    would be) reserve 30 sends each on one bot at the same moment: 120 distinct slots,
    each exactly one interval after the one before — one budget, never a burst. (On
    PostgreSQL the sessions race for the key's row; SQLite takes them one writer at a time.)"""
    def reserve_30():
        return [pacing.reserve(BOT, horizon=math.inf, clock=T).delay for _ in range(30)]

    delays = [delay for mine in at_once(*[reserve_30] * 4) for delay in mine]
    assert sorted(delays) == pytest.approx([k * 0.1 for k in range(120)], abs=1e-4)


def _table():
    return {key: round(slot - T, 6) for key, slot in SendBudget.objects.values_list("key", "next_slot")}


@pytest.mark.django_db
@pytest.mark.parametrize("seed", range(12))
def test_a_batch_reserves_what_as_many_reserves_in_a_row_would(seed):
    """pacing.reserve_many against `reserve` called for each send in turn, from the same
    table: the same answers, the same slots left behind (and no row for a key it made and
    did not take). Random sends over two bots and four chats, replies in chunks, some keys
    already booked or paused, horizons near and endless."""
    import random

    chance = random.Random(seed)
    paces = [Pace.of(bot, rate, chat, interval) for bot, rate in (("b1", 10), ("b2", 4))
             for chat, interval in (("", 0), ("ana", 1.0), ("beto", 0.5), ("caro", 2.0))] + [Pace.of("free", 0)]
    requests = [(chance.choice(paces), chance.choice((1, 1, 1, 3))) for _ in range(chance.randint(2, 24))]
    horizon = chance.choice((0.0, 0.35, 1.0, math.inf))
    booked = {key: chance.uniform(-70, 2) for key in chance.sample(["b1", "b2", "b1:ana", "b2:beto", "b1:caro"], 3)}

    def book():
        SendBudget.objects.all().delete()
        SendBudget.objects.bulk_create([SendBudget(key=key, next_slot=T + slot) for key, slot in booked.items()])

    book()
    one_by_one = [pacing.reserve(pace, horizon, T, chunks) for pace, chunks in requests]
    left_one_by_one = _table()
    book()
    assert pacing.reserve_many(requests, horizon, T) == [
        Slot(None if s.delay is None else near(s.delay), s.full) for s in one_by_one]
    assert _table() == pytest.approx(left_one_by_one, abs=1e-5)


@pytest.mark.django_db
def test_a_batch_takes_four_statements_however_many_sends(django_assert_num_queries):
    requests = [(Pace.of("bot", 30, f"chat{n}", 1.0), 1) for n in range(32)]
    with django_assert_num_queries(4):  # BEGIN, make and lock the keys, write the slots, COMMIT
        slots = pacing.reserve_many(requests, math.inf, T)
    assert [slot.delay for slot in slots] == [near(n / 30) for n in range(32)]


@pytest.mark.django_db(transaction=True)
def test_batches_reserving_at_once_get_distinct_slots_and_never_deadlock_with_single_ones():
    """Four sessions at once: two reserve batches of 30 sends on one bot into ten chats,
    two reserve the same sends one at a time. 120 distinct bot slots, each one interval
    after the one before; each chat's sends at least its interval apart."""
    requests = [(Pace.of("bot", 10, f"c{n % 10}", 0.01), 1) for n in range(30)]

    def batch():
        return [slot.delay for slot in pacing.reserve_many(requests, math.inf, T)]

    def singles():
        return [pacing.reserve(pace, math.inf, T, chunks).delay for pace, chunks in requests]

    sessions = at_once(batch, singles, batch, singles)
    delays = [delay for mine in sessions for delay in mine]
    assert sorted(delays) == pytest.approx([k * 0.1 for k in range(120)], abs=1e-4)
    for chat in {pace.chat for pace, _ in requests}:
        sent = sorted(delay for mine in sessions for (pace, _), delay in zip(requests, mine, strict=True)
                      if pace.chat == chat)
        assert min(b - a for a, b in zip(sent, sent[1:])) >= requests[0][0].chat_interval - 1e-6, (chat, sent)


@pytest.mark.django_db(transaction=True)
def test_sweeps_racing_for_the_same_rows_win_each_once(make_channel, make_conversation):
    """Four sessions claim the same 200 pending rows at the same moment (each worker's
    sweep sees every due row): each row is won by one of them, plain. On PostgreSQL a
    claim whose state test sat in a subquery let two of them win a row, the second
    labelled (found by two workers draining one bot)."""
    from delivery import ledger
    from delivery.models import OutboundKind, OutboundMessage
    from tests.support.e2e import UNPACED

    channel = make_channel("race", kind="telegram", platform_settings={"bot_token": "5:R", **UNPACED})
    ids = [ledger.enqueue(make_conversation(channel, f"c{i}"), "hola", kind=OutboundKind.REPLY).pk
           for i in range(200)]
    def sweep(owner):
        return [row.pk for chunk in (ids[::-1], ids) for row in ledger.claim_many(chunk, owner)]  # two passes

    won = at_once(*[lambda owner=f"w{n}": sweep(owner) for n in range(4)])
    claims = [pk for pks in won for pk in pks]
    assert sorted(claims) == sorted(ids)  # every row once, none twice
    rows = OutboundMessage.objects.filter(pk__in=ids)
    assert set(rows.values_list("attempts", "needs_marker").distinct()) == {(1, False)}


@pytest.mark.django_db
def test_the_dashboard_shows_each_channels_queue_and_its_drain_time(make_channel, make_conversation):
    """A queue waiting its turn is not a failure: pending rows and rows a 429 deferred are
    'queued', failures that back off are 'retrying'; the drain time is the queue at the pace."""
    from agentloop.console import dashboard as console
    from delivery import ledger
    from delivery.models import OutboundKind, OutboundMessage, OutboundState, Outcome
    from delivery.transports import SendResult
    from tests.support.e2e import UNPACED

    paced = make_channel("paced", kind="telegram", platform_settings={"bot_token": "6:P", "messages_per_second": 20})
    free = make_channel("free", kind="telegram", platform_settings={"bot_token": "6:F", **UNPACED})
    for i in range(40):
        ledger.enqueue(make_conversation(paced, f"p{i}"), "hola", kind=OutboundKind.REPLY)
    row = ledger.enqueue(make_conversation(free, "f0"), "hola", kind=OutboundKind.REPLY)
    claimed = ledger.claim_due("w1")
    flooded = next(r for r in claimed if r.channel_id == paced.pk)
    ledger.finish(flooded, "w1", SendResult.failed(Outcome.FLOOD, "Too Many Requests", retry_after=9))
    ledger.finish(next(r for r in claimed if r.pk == row.pk), "w1", SendResult.failed(Outcome.TEMPORARY, "502"))
    sending = sum(1 for r in claimed if r.channel_id == paced.pk) - 1
    assert OutboundMessage.objects.filter(state=OutboundState.ATTEMPTING).count() == sending
    by_channel = {b["channel"]: b for b in console.snapshot()["backlog"]}
    assert by_channel["paced"]["queued"] == 40 - sending and by_channel["paced"]["sending"] == sending
    assert by_channel["paced"]["retrying"] == 0 and by_channel["paced"]["per_second"] == 20.0
    assert by_channel["paced"]["drain_seconds"] == pytest.approx(40 / 20)
    # What is left of the pause: at most its 9 s, less what this process took since (the
    # backfill runs it at idle priority, where 0.6 s once went by).
    assert 6 <= by_channel["paced"]["paused_seconds"] <= 9
    assert (by_channel["free"]["retrying"], by_channel["free"]["per_second"], by_channel["free"]["drain_seconds"],
            by_channel["free"]["paused_seconds"]) == (1, None, None, 0)
    # A channel with pacing off waits out a 429 too (every row of it), and shows it.
    [other] = ledger.claim_many([ledger.enqueue(make_conversation(free, "f1"), "hola", kind=OutboundKind.REPLY).pk],
                                "w1")
    ledger.finish(other, "w1", SendResult.failed(Outcome.FLOOD, "Too Many Requests", retry_after=4))
    by_channel = {b["channel"]: b for b in console.snapshot()["backlog"]}
    assert 1 <= by_channel["free"]["paused_seconds"] <= 4


@pytest.mark.django_db
def test_one_chats_backlog_does_not_hide_the_other_chats_replies(make_channel, make_conversation):
    """A look at the ledger takes at most PER_CHAT rows of one chat while others wait: a
    backlog owed to one chat (paced to a row a second) once filled every look, and every
    other channel's replies stayed pending behind it until it drained. Oldest first still,
    and each chat's rows in order."""
    from delivery import ledger
    from delivery.ledger import claiming
    from delivery.models import OutboundKind
    from tests.support.e2e import UNPACED

    paced = make_channel("busy", kind="telegram", platform_settings={"bot_token": "7:B", "messages_per_second": 20})
    free = make_channel("calm", kind="telegram", platform_settings={"bot_token": "7:C", **UNPACED})
    crowd = make_conversation(paced, "crowd")
    backlog = [ledger.enqueue(crowd, f"#{i}", kind=OutboundKind.REPLY).pk for i in range(60)]
    second = make_conversation(free, "lots")
    second_backlog = [ledger.enqueue(second, f"#{i}", kind=OutboundKind.REPLY).pk for i in range(30)]
    others = [ledger.enqueue(make_conversation(free, f"other{i}"), "hola", kind=OutboundKind.REPLY).pk
              for i in range(3)]

    looked = claiming.claimable_ids(limit=50)
    assert looked[:claiming.PER_CHAT] == backlog[:claiming.PER_CHAT]  # the oldest first, in order
    assert looked[claiming.PER_CHAT:] == second_backlog[:claiming.PER_CHAT] + others  # then behind the crowd
    claimed = {row.pk for row in ledger.claim_due("w1", limit=50)}
    assert set(others) <= claimed and set(second_backlog[:claiming.PER_CHAT]) <= claimed
    assert not claimed & set(backlog[claiming.PER_CHAT:])
