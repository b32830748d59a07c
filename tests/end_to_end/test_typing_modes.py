"""Typing modes (issue 14 §1), through the real web server, real workers and the local
fake Bot API: `instant` shows typing from the first message of a burst, through its
window and its turn, and stops when the reply goes out or the buffer is dropped; `turn`
only while the agent runs; `never` not at all. One loop per conversation however many
messages arrive, a cap on the loops, one worker per window when several run, the web
chat alike. Refreshes every 0.5 s here (AGENTLOOP_TYPING_INTERVAL in tests.conftest)."""

import asyncio
import time

import aiohttp
import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from conversations.ingest import Inbound, admit
from conversations.models import Channel, Turn, TurnState, WorkerHeartbeat
from conversations.worker.typing import open_windows
from tests.conftest import wait_until
from tests.support.e2e import send, telegram_channel

pytestmark = pytest.mark.e2e

REFRESH = 0.5
# A window's refresh waits for a look begun after it fell due (typing.LOOK_EVERY), and the
# machine is shared: the longest pause allowed between two indicators of one loop.
LONGEST_GAP = 1.1
# Two indicators of one loop are never closer than this; two loops would interleave.
SHORTEST_GAP = 0.3


def started_worker(processes, **env):
    """A worker past its start (its heartbeat comes first, before its agents are imported)."""
    worker = processes.worker(**env)
    wait_until(lambda: " started" in worker.output(), timeout=30, message="worker started")
    return worker


def typing_calls(fake, chat_id):
    return [c for c in fake.calls("sendChatAction") if int(c.params["chat_id"]) == chat_id]


def replies(fake, chat_id):
    return [c for c in fake.calls("sendMessage") if int(c.params["chat_id"]) == chat_id]


def gaps(calls):
    return [b.at - a.at for a, b in zip(calls, calls[1:])]


def settle(seconds=1.5):
    """Absence cannot be polled for: give a stray indicator time to show (three refreshes)."""
    time.sleep(seconds)


def assert_none_after(calls, reply):
    """No indicator after the reply; one already on its way when the loop stopped may land
    just after it."""
    late = [c for c in calls if c.at > reply.at]
    assert len(late) <= 1 and all(c.at - reply.at < 0.1 for c in late), \
        f"typing {[round(c.at - reply.at, 3) for c in late]} s after the reply"


def test_instant_shows_typing_from_the_first_message_through_the_turn_until_the_reply(
        processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram, window_open=3.0, agent_config={"delay": 1.0})
    web, _ = processes.web(), started_worker(processes)
    sent = time.monotonic()
    send(web, "tg", 101, "Confirmo las horas de psicología y")
    [reply] = fake_telegram.wait_for("sendMessage", timeout=15)
    settle()

    typing = typing_calls(fake_telegram, 101)
    assert typing[0].at - sent < 0.8, f"first indicator {typing[0].at - sent:.3f} s after the message"
    turn = Turn.objects.get()
    assert turn.state == TurnState.DONE
    in_window = [c for c in typing if c.wall < turn.started_at.timestamp()]
    in_turn = [c for c in typing if turn.started_at.timestamp() <= c.wall <= turn.finished_at.timestamp()]
    assert len(in_window) >= 3, "refreshed while the 3 s window was open"
    assert len(in_turn) >= 1, "and on through the 1 s turn"
    assert max(gaps(typing)) < LONGEST_GAP, f"no gap between window and turn: {gaps(typing)}"
    assert min(gaps(typing)) > SHORTEST_GAP, f"one loop: {gaps(typing)}"
    assert_none_after(typing, reply)


def test_turn_mode_types_only_while_the_agent_runs(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram, typing_mode="turn", window_open=2.0, agent_config={"delay": 1.2})
    web, _ = processes.web(), started_worker(processes)
    send(web, "tg", 101, "Confirmo las horas y")
    [reply] = fake_telegram.wait_for("sendMessage", timeout=15)
    settle()

    typing = typing_calls(fake_telegram, 101)
    turn = Turn.objects.get()
    assert typing, "typing while the agent ran"
    assert all(c.wall >= turn.started_at.timestamp() - 0.05 for c in typing), "none during the window"
    assert len(typing) >= 2, "refreshed during a 1.2 s turn"
    assert_none_after(typing, reply)


def test_turn_mode_shows_nothing_for_an_agent_that_answers_at_once(processes, make_channel, fake_telegram):
    """A turn's own indicator waits typing.TURN_GRACE (0.3 s at Telegram's 4 s refresh):
    an answer sooner needs none, and no call is begun and abandoned for it."""
    telegram_channel(make_channel, fake_telegram, typing_mode="turn", window_open=0.5, agent_config={"delay": 0})
    web, _ = processes.web(), started_worker(processes, AGENTLOOP_TYPING_INTERVAL="0")
    for chat in (101, 102, 103):
        send(web, "tg", chat, "¿Abren mañana?")
    wait_until(lambda: {101, 102, 103} <= {int(c.params["chat_id"]) for c in fake_telegram.calls("sendMessage")},
               timeout=15, message="the three replies")
    settle(1.0)
    assert fake_telegram.calls("sendChatAction") == []


def test_never_shows_no_typing(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram, typing_mode="never", window_open=1.5, agent_config={"delay": 1.0})
    web, _ = processes.web(), started_worker(processes)
    send(web, "tg", 101, "Confirmo las horas y")
    fake_telegram.wait_for("sendMessage", timeout=15)
    settle(1.0)
    assert fake_telegram.calls("sendChatAction") == []


@pytest.mark.parametrize("command", ["/stop", "/reset"])
def test_a_dropped_buffer_stops_typing(processes, make_channel, fake_telegram, command):
    telegram_channel(make_channel, fake_telegram, window_open=6.0)
    web, _ = processes.web(), started_worker(processes)
    send(web, "tg", 101, "Agéndame las horas y")
    wait_until(lambda: len(typing_calls(fake_telegram, 101)) >= 2, message="typing during the window")
    send(web, "tg", 101, command)
    [answer] = fake_telegram.wait_for("sendMessage", timeout=10)
    settle()
    assert not Turn.objects.exists()
    assert_none_after(typing_calls(fake_telegram, 101), answer)


def test_a_rollback_keeps_one_loop_into_the_new_turn_and_stops_after_its_reply(
        processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram, double_texting="rollback", window_closed=1.0,
                     agent_config={"delay": 1.5})
    web, _ = processes.web(), started_worker(processes)
    send(web, "tg", 101, "Confirmo las horas de psicología.")
    first = wait_until(lambda: Turn.objects.filter(state=TurnState.RUNNING).first(), message="turn running")
    send(web, "tg", 101, "Mejor agéndame las horas.")
    [reply] = fake_telegram.wait_for("sendMessage", timeout=15)
    settle()
    first.refresh_from_db()
    assert first.state == TurnState.CANCELLED and reply.params["text"] == "Mejor agéndame las horas."
    typing = typing_calls(fake_telegram, 101)
    assert max(gaps(typing)) < LONGEST_GAP and min(gaps(typing)) > SHORTEST_GAP, gaps(typing)
    assert_none_after(typing, reply)


def test_fifty_messages_into_one_conversation_make_one_typing_loop(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram, window_open=1.5, max_messages=100, max_wait=60.0)
    web, _ = processes.web(), started_worker(processes)
    started = time.monotonic()
    for n in range(50):
        send(web, "tg", 101, f"parte {n} y")
    [reply] = fake_telegram.wait_for("sendMessage", timeout=20)
    settle()

    assert Turn.objects.get().merged_input.count("\n") == 49
    typing = typing_calls(fake_telegram, 101)
    duration = reply.at - started
    assert len(typing) <= duration / REFRESH + 2, f"{len(typing)} indicators in {duration:.1f} s"
    assert min(gaps(typing)) > SHORTEST_GAP, f"one loop: {gaps(typing)}"
    assert_none_after(typing, reply)


def test_the_cap_on_typing_loops_leaves_the_rest_without_typing_and_delays_nothing(
        processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram, window_open=2.5)
    web, _ = processes.web(), started_worker(processes, AGENTLOOP_MAX_TYPING=2)
    chats = range(201, 206)
    for chat in chats:
        send(web, "tg", chat, "hola y")
    fake_telegram.wait_for("sendMessage", count=len(chats), timeout=15)
    first_turn = min(Turn.objects.values_list("started_at", flat=True)).timestamp()
    typed = {int(c.params["chat_id"]) for c in fake_telegram.calls("sendChatAction") if c.wall < first_turn}
    assert len(typed) == 2, f"windows typed: {typed}"
    lateness = [(t.started_at - t.buffer.flush_at).total_seconds() for t in Turn.objects.select_related("buffer")]
    assert max(lateness) < 0.5, lateness


def test_two_workers_type_each_window_once(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram, window_open=3.0)
    web, workers = processes.web(), [started_worker(processes), started_worker(processes)]
    # Both are running before the first buffer opens: each reads who else runs (its
    # part) when it first has windows to type, and again every typing.PARTITION_EVERY.
    assert WorkerHeartbeat.objects.count() == 2
    chats = range(301, 307)
    for chat in chats:
        send(web, "tg", chat, "hola y")
    fake_telegram.wait_for("sendMessage", count=len(chats), timeout=15)
    started = dict(Turn.objects.values_list("conversation__chat_id", "started_at"))
    for chat in chats:
        # The window's indicators; the worker that runs the turn may be the other one,
        # whose loop starts with one indicator of its own.
        window = [c for c in typing_calls(fake_telegram, chat) if c.wall < started[str(chat)].timestamp()]
        assert len(window) >= 3, f"chat {chat} typed through its window"
        assert min(gaps(window)) > SHORTEST_GAP, f"chat {chat} typed by one loop: {gaps(window)}"
    assert all(w.popen.poll() is None for w in workers)


def test_the_look_is_one_statement_however_many_windows_are_open(db, make_channel):
    channel = make_channel("tg", kind="telegram", platform_settings={"bot_token": "1:x"}, window_open=30.0)
    for n in range(40):
        admit(channel, Inbound(platform_message_id=f"m{n}", chat_id=str(n), sender_id=str(n), text="hola y",
                               thread_id="7" if n == 3 else "", reply_target=str(n)))
    with CaptureQueriesContext(connection) as queries:
        windows = open_windows([channel.pk], 0, 1, 1000)
    assert len(queries) == 1 and len(windows) == 40
    assert {w.thread_id for w in windows if w.chat_id == "3"} == {"7"}
    assert {w.reply_target for w in windows if w.chat_id == "3"} == {"3"}  # the last message's id
    halves = [open_windows([channel.pk], part, 2, 1000) for part in (0, 1)]
    assert sorted(w.conversation_id for half in halves for w in half) == sorted(w.conversation_id for w in windows)
    assert len(open_windows([channel.pk], 0, 1, 10)) == 10


def test_webchat_typing_from_the_first_message_until_the_reply(processes):
    """The playground's socket on the real web process: typing events during the window
    and the turn, none after the reply."""
    Channel.objects.create(slug="playground", kind="webchat", window_open=2.0, agent_config={"delay": 1.0})
    user = User.objects.create_superuser("op", "op@example.com", "pw-op-typing-1")
    client = Client()
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    web, _ = processes.web(), started_worker(processes)

    async def talk():
        url = web.url.replace("http://", "ws://") + "/ws/console/playground/playground/"
        events = []
        async with aiohttp.ClientSession() as session, session.ws_connect(
                url, headers={"Origin": "http://localhost", "Cookie": cookie}) as ws:
            hello = await ws.receive_json(timeout=10)
            assert hello["type"] == "hello"
            loop = asyncio.get_running_loop()
            sent = loop.time()
            await ws.send_json({"text": "hola, quiero agendar y"})
            replied = None
            while replied is None or loop.time() < replied + 1.5:
                try:
                    message = await ws.receive_json(timeout=1.0)
                except TimeoutError:
                    assert loop.time() < sent + 20, "no reply"
                    continue
                event = message.get("event") or {}
                events.append((loop.time() - sent, event.get("kind")))
                if event.get("kind") == "reply":
                    replied = loop.time()
        return events

    events = asyncio.run(talk())
    kinds = [kind for _, kind in events]
    merged = kinds.index("turn")  # the window closed: its messages merged into a turn
    reply = kinds.index("reply")
    typing_at = [at for at, kind in events if kind == "typing"]
    assert kinds[:merged].count("typing") >= 2, f"typing during the 2 s window: {events}"
    assert typing_at[0] < 1.0, f"first typing {typing_at[0]:.2f} s after the message"
    assert "typing" in kinds[merged:reply], f"and through the turn: {events}"
    assert "typing" not in kinds[reply + 1:], f"none after the reply: {events}"


def test_typing_failures_are_logged_once_and_never_delay_a_reply(processes, make_channel, fake_telegram):
    fake_telegram.fail_next("sendChatAction", status=500, description="Internal Server Error", times=1000)
    telegram_channel(make_channel, fake_telegram, window_open=2.0)
    web, worker = processes.web(), started_worker(processes)
    for chat in (101, 102):
        send(web, "tg", chat, "hola y")
    fake_telegram.wait_for("sendMessage", count=2, timeout=15)
    # Kept trying through the windows: each chat's indicator tried again after its first
    # call failed. (Not a total: how many refreshes fit a 2 s window depends on the
    # machine's load, and ">= 6 in all" once found 4, two a chat, in the serial phase.)
    tries = [call.params["chat_id"] for call in fake_telegram.calls("sendChatAction")]
    assert min(tries.count(101), tries.count(102)) >= 2, tries
    lines = [line for line in worker.output().splitlines() if "typing indicators of channel tg" in line]
    assert len(lines) == 1, lines
    lateness = [(t.started_at - t.buffer.flush_at).total_seconds() for t in Turn.objects.select_related("buffer")]
    assert max(lateness) < 0.5, lateness


def test_a_typing_call_that_hangs_holds_nothing_up(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram, window_closed=1.0)
    web, _ = processes.web(), started_worker(processes)
    with fake_telegram.hold("sendChatAction") as hold:
        sent = time.monotonic()
        send(web, "tg", 101, "¿Me confirmas la hora?")
        hold.wait_held(1)
        [reply] = fake_telegram.wait_for("sendMessage", timeout=10)
        assert reply.at - sent < 2.0, f"replied {reply.at - sent:.2f} s after a 1 s window"
