"""A worker's death told by the database itself (conversations/liveness.py): on
PostgreSQL each worker holds an advisory lock on a session of its own, and the others
take over what a worker held as soon as its lock is free — not when its heartbeat goes
stale (AGENTLOOP_WORKER_STALE_AFTER, 30 s). The dead worker plays one on another host
(AGENTLOOP_HOSTNAME), so the same-host pid check cannot be what notices it. On SQLite
the heartbeat is the only judge (the existing restart and ledger tests run there)."""

import asyncio
import time
from datetime import timedelta

import psycopg
import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from conversations import engine, liveness
from conversations.models import (
    Channel,
    Contact,
    Conversation,
    InboundMessage,
    MessageBuffer,
    Turn,
    TurnState,
    WorkerHeartbeat,
)
from delivery import ledger
from delivery.models import OutboundKind, OutboundMessage, OutboundState
from tests.conftest import is_postgres, wait_until
from tests.support.e2e import SECRET, TOKEN, send

TAKE_OVER_WITHIN = 5.0
POLL_TOKEN = "4343:POLLING"


@pytest.fixture
def on_postgres(db):
    if not is_postgres():
        pytest.skip("advisory locks are PostgreSQL's; SQLite's workers are judged by their heartbeat")


# --- the judgement, in this process ---------------------------------------------------------

def test_an_owner_stamp_says_whether_its_worker_holds_a_lock():
    plain, locked = liveness.new_owner(), liveness.new_owner(lock=True)
    assert not liveness.marks_lock(plain) and liveness.marks_lock(locked)
    assert locked.startswith(plain.rsplit(":", 1)[0].rsplit(":", 1)[0])  # host:pid:start as before
    assert liveness.lock_key(locked) == liveness.lock_key(locked) != liveness.lock_key(liveness.new_owner(lock=True))
    assert not liveness.released([plain, "agent:webhook"])  # never judged by a lock


def test_sqlite_judges_by_heartbeat_only(db):
    if is_postgres():
        pytest.skip("the SQLite side of the judgement")
    now = timezone.now()
    locked = liveness.new_owner(lock=True).replace(settings.AGENTLOOP_HOSTNAME, "elsewhere", 1)
    WorkerHeartbeat.objects.create(owner=locked, hostname="elsewhere", pid=1, seen_at=now)
    assert engine.dead_owners(now) == []  # no lock to read: a fresh heartbeat is alive
    assert engine.dead_owners(now + timedelta(seconds=31)) == [locked]


def held(owner):
    holder = liveness.LockHolder(owner)
    holder.start()
    wait_until(holder.holding, timeout=10, message="the lock taken")
    return holder


def foreign_owner():
    """A lock holder's stamp from another host: no pid of it is judged here."""
    host, pid, started, rest = liveness.new_owner(lock=True).split(":", 3)
    return f"other-host:{pid}:{started}:{rest}"


def test_a_worker_holding_its_lock_is_alive_however_stale_its_heartbeat(on_postgres):
    owner = foreign_owner()
    WorkerHeartbeat.objects.create(owner=owner, hostname="other-host", pid=1,
                                   seen_at=timezone.now() - timedelta(hours=1))
    unlocked = "other-host:2:0:abcdef"
    WorkerHeartbeat.objects.create(owner=unlocked, hostname="other-host", pid=2,
                                   seen_at=timezone.now() - timedelta(hours=1))
    holder = held(owner)
    try:
        assert engine.dead_owners() == [unlocked]  # the stale one without a lock is dead by its heartbeat
        assert not liveness.owner_gone(owner)
    finally:
        holder.stop()
    # The session ended: its lock is free at once, whatever the heartbeat says.
    assert sorted(engine.dead_owners()) == sorted([owner, unlocked])
    assert liveness.owner_gone(owner)


def test_a_lock_connection_killed_by_the_server_is_reopened_and_the_lock_taken_again(on_postgres):
    holder = held(foreign_owner())
    try:
        first = holder.backend_pid
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [first])
        wait_until(lambda: holder.holding() and holder.backend_pid != first, timeout=10,
                   message="the lock taken again on a new session")
        assert holder.key in liveness.held_keys()[1]
    finally:
        holder.stop()
    assert holder.key not in liveness.held_keys()[1]


def test_every_key_is_read_back_as_it_was_taken(on_postgres):
    """pg_locks splits a bigint key in two unsigned halves: negative and large keys too."""
    keys = [-1, -5, 7, 2 ** 62 + 7, -(2 ** 63), 2 ** 63 - 1]
    with psycopg.connect(**liveness.lock_connection_params(), autocommit=True) as other:
        for key in keys:
            other.execute("SELECT pg_advisory_lock(%s::bigint)", [key])
        assert set(keys) <= liveness.held_keys()[1]


def test_right_after_its_own_lock_is_taken_a_worker_takes_no_free_lock_for_a_death(on_postgres):
    """A database restart ends every worker's session at once, and each needs a moment
    to take its lock again: a worker whose own lock is younger than liveness.grace()
    does not take a free lock for a death (nor right after the server's start)."""
    gone, own = foreign_owner(), foreign_owner()
    WorkerHeartbeat.objects.create(owner=gone, hostname="other-host", pid=1,
                                   seen_at=timezone.now() - timedelta(hours=1))
    holder = liveness.LockHolder(own)
    asyncio.run(holder.start_holding())  # as a worker takes its own
    try:
        assert engine.dead_owners() == []  # not yet, however stale its heartbeat
        wait_until(lambda: holder.held_for() >= liveness.grace(), timeout=liveness.grace() + 5,
                   message="the grace over")
        assert engine.dead_owners() == [gone]
    finally:
        holder.stop()


def test_a_lock_held_by_another_session_is_waited_for_not_stolen(on_postgres):
    """A worker whose previous session the server has not dropped yet must not think it
    holds its lock (nor claim anything) until that session is gone."""
    owner = foreign_owner()
    params = liveness.lock_connection_params()
    with psycopg.connect(**params, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s::bigint)", [liveness.lock_key(owner)])
        holder = liveness.LockHolder(owner)
        holder.start()
        try:
            time.sleep(1.0)
            assert not holder.holding()
        finally:
            other.close()  # the old session goes: the lock is free
        try:
            wait_until(holder.holding, timeout=10, message="the lock taken once free")
        finally:
            holder.stop()


# --- real processes ------------------------------------------------------------------------

def channels(make_channel, fake):
    fake.add_token(POLL_TOKEN)
    common = dict(kind="telegram", window_closed=0.3, window_neutral=0.3)
    hooked = {"bot_token": TOKEN, "webhook_secret": SECRET, "api_base": fake.url}
    slow = make_channel("slow", platform_settings=hooked, agent_config={"delay": 30}, **common)
    fast = make_channel("fast", platform_settings=hooked, **common)
    polled = make_channel("polled", platform_settings={
        "bot_token": POLL_TOKEN, "api_base": fake.url, "mode": "polling"},
                          **common)
    return slow, fast, polled


def both_settled():
    """Both workers' lock sessions older than liveness.grace() (see the test above)."""
    def settled():
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'agentloop liveness' "
                           "AND datname = current_database() "
                           "AND backend_start < now() - make_interval(secs => %s)", [liveness.grace() + 0.5])
            return cursor.fetchone()[0] >= 2
    wait_until(settled, timeout=30, message="both workers' locks settled")


def first_times(predicates, since, timeout=30.0):
    """Seconds from `since` until each predicate first held (all watched at once)."""
    times = {}
    while len(times) < len(predicates):
        for name, predicate in predicates.items():
            if name not in times and predicate():
                times[name] = time.monotonic() - since
        assert time.monotonic() - since < timeout, f"not taken over: {set(predicates) - set(times)}"
        time.sleep(0.02)
    return times


def conversation_for(channel, chat):
    contact = Contact.objects.create(channel=channel, platform_id=chat)
    return Conversation.objects.create(channel=channel, contact=contact, chat_id=chat, sender_id=chat)


@pytest.mark.e2e
def test_a_worker_killed_on_another_host_is_taken_over_within_seconds(on_postgres, processes, make_channel,
                                                                     fake_telegram):
    slow, fast, polled = channels(make_channel, fake_telegram)
    pool = {"DATABASE_POOL": "true"}
    web = processes.web(wait=False, **pool)
    dying = processes.worker(AGENTLOOP_HOSTNAME="host-a", **pool)
    owner_a = WorkerHeartbeat.objects.get(pid=dying.pid).owner
    assert owner_a.startswith("host-a:") and liveness.marks_lock(owner_a)
    wait_until(lambda: Channel.objects.get(pk=polled.pk).poll_owner == owner_a, message="A polls")
    send(web, "slow", 101, "¿Me ayudas con esto?")  # a turn A runs for 30 s
    wait_until(lambda: Turn.objects.filter(state=TurnState.RUNNING, owner=owner_a).exists(), message="A's turn")

    survivor = processes.worker(**pool)  # the default AGENTLOOP_WORKER_STALE_AFTER: 30 s
    owner_b = WorkerHeartbeat.objects.get(pid=survivor.pid).owner
    both_settled()
    # A reply A is sending: written and claimed in one go, as A's own claim leaves it
    # (a real send would time out at the platform while we wait for the locks to settle).
    with transaction.atomic():
        row = ledger.enqueue(conversation_for(fast, "102"), "¿Hola?", kind=OutboundKind.REPLY)
        assert ledger.claim_many([row.pk], owner_a)
    send(web, "fast", 103, "¿Y otra cosa?")  # an open buffer when A dies (any flusher flushes it)
    end = time.monotonic() + 1.5  # B looks at A (alive) every second: nothing is taken while A lives
    while time.monotonic() < end:
        assert Turn.objects.get(conversation__chat_id="101").owner == owner_a
        assert OutboundMessage.objects.get(pk=row.pk).owner == owner_a
        assert Channel.objects.get(pk=polled.pk).poll_owner == owner_a
        time.sleep(0.1)

    dying.kill()
    killed = time.monotonic()
    assert timezone.now() - WorkerHeartbeat.objects.get(owner=owner_a).seen_at < timedelta(seconds=10)
    taken = first_times({
        "turn": lambda: Turn.objects.filter(conversation__chat_id="101", owner=owner_b).exists(),
        "reply": lambda: OutboundMessage.objects.filter(pk=row.pk, owner=owner_b).exists(),
        "lease": lambda: Channel.objects.get(pk=polled.pk).poll_owner == owner_b,
    }, killed)
    wait_until(lambda: MessageBuffer.objects.filter(conversation__chat_id="103", state="flushed").exists(),
               timeout=30, message="the buffer flushed")
    buffer = MessageBuffer.objects.get(conversation__chat_id="103")
    late = (buffer.flushed_at - buffer.flush_at).total_seconds()
    print(f"\ntaken over after SIGKILL: turn {taken['turn']:.2f} s, reply {taken['reply']:.2f} s, "
          f"lease {taken['lease']:.2f} s; the open buffer flushed {late:.2f} s past its deadline")
    assert max(taken.values()) <= TAKE_OVER_WITHIN and late <= TAKE_OVER_WITHIN, (taken, late)

    wait_until(lambda: OutboundMessage.objects.filter(pk=row.pk, state=OutboundState.DELIVERED).exists(),
               timeout=15, message="A's reply delivered by B")
    sent = [c.params["text"] for c in fake_telegram.calls("sendMessage") if str(c.params["chat_id"]) == "102"]
    assert sent == [f"{ledger.RECOVERY_PREFIX}¿Hola?"]  # it may have gone out: labelled
    assert "Traceback" not in survivor.output(), survivor.output()
    # B now runs A's 30 s turn again, and a graceful stop would wait out its shutdown grace
    # (10 s of the test's teardown): what this test is about is over.
    survivor.kill()


@pytest.mark.e2e
def test_a_live_worker_is_never_taken_over_however_stale_its_heartbeat_looks(on_postgres, processes, make_channel,
                                                                             fake_telegram):
    slow, fast, polled = channels(make_channel, fake_telegram)
    # Long enough for B to start, settle (liveness.grace() + 0.5 s) and watch for 4 s, with
    # a few seconds to spare (it was 25 s; the test waits for the turn to end).
    slow.agent_config = {"delay": 18}
    slow.save()
    web = processes.web(wait=False)
    alive = processes.worker(AGENTLOOP_HOSTNAME="host-a", DATABASE_POOL="true")
    owner_a = WorkerHeartbeat.objects.get(pid=alive.pid).owner
    wait_until(lambda: Channel.objects.get(pk=polled.pk).poll_owner == owner_a, message="A polls")
    send(web, "slow", 101, "¿Me ayudas con esto?")
    wait_until(lambda: Turn.objects.filter(state=TurnState.RUNNING, owner=owner_a).exists(), message="A's turn")
    # B thinks a heartbeat older than 1 s is stale; A beats every 5 s, and its row is
    # made an hour old besides.
    processes.worker(AGENTLOOP_WORKER_STALE_AFTER=1, DATABASE_POOL="true")
    both_settled()
    watch_until = time.monotonic() + 4
    while time.monotonic() < watch_until:
        WorkerHeartbeat.objects.filter(owner=owner_a).update(seen_at=timezone.now() - timedelta(hours=1))
        turn = Turn.objects.get(conversation__chat_id="101")
        assert (turn.state, turn.owner, turn.attempts) == (TurnState.RUNNING, owner_a, 1)
        assert Channel.objects.get(pk=polled.pk).poll_owner == owner_a
        time.sleep(0.2)
    with override_settings(AGENTLOOP_WORKER_STALE_AFTER=1):
        assert owner_a not in engine.dead_owners()
        assert not liveness.owner_gone(owner_a)
    wait_until(lambda: Turn.objects.get(conversation__chat_id="101").state == TurnState.DONE, timeout=30,
               message="A finishes its own turn")
    fake_telegram.wait_for("sendMessage", timeout=10)
    assert Turn.objects.get(conversation__chat_id="101").attempts == 1
    assert [c.params["text"] for c in fake_telegram.calls("sendMessage")] == ["¿Me ayudas con esto?"]
    assert InboundMessage.objects.count() == 1


@pytest.mark.e2e
def test_a_worker_that_lost_its_lock_claims_nothing_until_it_holds_it_again(on_postgres, processes, make_channel,
                                                                             fake_telegram):
    """The split brain: a worker whose lock session ended is dead to the others, so it
    starts no turn, sends no reply and polls no bot until its lock is back."""
    slow, fast, polled = channels(make_channel, fake_telegram)
    web, worker = processes.web(wait=False), processes.worker()
    owner = WorkerHeartbeat.objects.get(pid=worker.pid).owner
    wait_until(lambda: Channel.objects.get(pk=polled.pk).poll_owner == owner, message="it polls")
    params = liveness.lock_connection_params()
    with psycopg.connect(**params, autocommit=True) as thief:
        # End its lock session and take its key first (a waiting lock is granted before
        # its holder's reconnect can try again).
        thief.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = "
                      "'agentloop liveness' AND datname = current_database() AND pid <> pg_backend_pid()")
        thief.execute("SELECT pg_advisory_lock(%s::bigint)", [liveness.lock_key(owner)])
        wait_until(lambda: "let go of its liveness lock" in worker.output(), timeout=10, message="it let go")
        send(web, "fast", 102, "¿Hola?")
        wait_until(lambda: Turn.objects.filter(conversation__chat_id="102").exists(), message="the buffer flushed")
        time.sleep(2.0)  # what it must not do, it would have done by now (it looks every 50 ms)
        assert Turn.objects.get(conversation__chat_id="102").state == TurnState.READY
        assert not fake_telegram.calls("sendMessage")
        lease = Channel.objects.get(pk=polled.pk).poll_lease_until
    wait_until(lambda: "holds its liveness lock" in worker.output().split("let go of its liveness lock")[-1],
               timeout=15, message="its lock taken again")
    fake_telegram.wait_for("sendMessage", timeout=15)
    assert Turn.objects.get(conversation__chat_id="102").state == TurnState.DONE
    assert [c.params["text"] for c in fake_telegram.calls("sendMessage")] == ["¿Hola?"]
    wait_until(lambda: Channel.objects.get(pk=polled.pk).poll_lease_until > lease, message="its lease renewed")
