"""The peer of `python -m tests.bench peer` (tests/bench/peer/bot.mjs, a Vercel Chat SDK
bot) still answers, so the benchmark cannot rot between runs: webhook updates in, one
merged reply out through the local Bot API server, and the benchmark's own load client
and answer counting against it. The benchmark itself is never run by `make test`."""

import shutil
import time

import pytest

from tests.bench.loadgen import percentile
from tests.bench.peer import SECRET, Peer, chats, ensure_node_modules, post_for, post_updates, sent_chats, wait_answered
from tests.bench.sustained import all_answered, lead_in_row, messages_by_chat, minutes, paced, reply_latencies
from tests.support import local_http

TOKEN = "9:PEERTEST"


def update(update_id, chat, text):
    return {"update_id": update_id, "message": {
        "message_id": update_id, "date": int(time.time()), "text": text,
        "from": {"id": chat, "is_bot": False, "first_name": "Ana"},
        "chat": {"id": chat, "type": "private", "first_name": "Ana"}}}


@pytest.fixture
def peer_bot(fake_telegram, tmp_path):
    if not shutil.which("node"):
        pytest.fail("node is missing: install Node.js 20+ (the peer benchmark's bot runs on it)", pytrace=False)
    ensure_node_modules()
    bot = Peer(TOKEN, fake_telegram.url, debounce_ms=1000)
    bot.log = tmp_path / "peer.log"
    bot.start()
    yield bot
    bot.stop()


def post(bot, body, secret=SECRET):
    return local_http.post(bot.hook, json=body, headers={"X-Telegram-Bot-Api-Secret-Token": secret}, timeout=10)


def test_a_burst_is_answered_once_with_the_merged_text(peer_bot, fake_telegram):
    for i, text in enumerate(["hola", "una consulta y", "¿mañana a las 10?"]):
        assert post(peer_bot, update(100 + i, 4242, text)).status_code == 200

    [reply] = fake_telegram.wait_for("sendMessage", token=TOKEN, timeout=15)
    assert reply.params == {"chat_id": "4242", "text": "hola\nuna consulta y\n¿mañana a las 10?"}

    # The next message is a burst of its own: answered alone, the first not again.
    assert post(peer_bot, update(200, 4242, "gracias")).status_code == 200
    first, second = fake_telegram.wait_for("sendMessage", count=2, token=TOKEN, timeout=15)
    assert (first, second.params["text"]) == (reply, "gracias")


def test_a_wrong_secret_is_refused(peer_bot, fake_telegram):
    assert post(peer_bot, update(300, 77, "hola"), secret="wrong").status_code == 401
    assert post(peer_bot, update(301, 77, "¿sigues?")).status_code == 200
    [reply] = fake_telegram.wait_for("sendMessage", token=TOKEN, timeout=15)
    assert reply.params["text"] == "¿sigues?"


def test_the_benchmark_load_client_and_counting_work_against_it(peer_bot, fake_telegram):
    run = post_updates(peer_bot, 5, 0)
    assert (run["errors"], run["statuses"]) == (0, {"200": 5})
    assert 0 < run["p50_ms"] <= run["p99_ms"]
    answered = wait_answered(fake_telegram, TOKEN, chats(5, 0), timeout=15)
    assert answered == {chat: 1 for chat in chats(5, 0)}


def test_a_timed_run_says_which_messages_it_sent(peer_bot, fake_telegram):
    """The steady state's load: POSTs for a while, not a count; what it sent is read back
    from how many each connection sent, and each of those is answered once."""
    run = post_for(peer_bot, 0.3, 1000)
    sent = sent_chats(run, 1000)
    assert run["errors"] == 0 and len(sent) == run["n"] == sum(run["per_client"]) > 0
    assert run["ended"] - run["began"] >= 0.3
    answered = wait_answered(fake_telegram, TOKEN, sent, timeout=30)
    assert set(answered.values()) == {1}, answered


def test_a_paced_run_mixes_returning_chats_and_reads_each_reply_back(peer_bot, fake_telegram):
    """The sustained run's load: messages at a rate, half of them returning to a chat first
    seen a while before (after the bot's 1 s window: a reply of its own); each reply is
    matched to its message and timed from when the message was due. The first 1.5 s, with
    nothing to come back to yet, are a lead-in outside the buckets."""
    rate, seconds = 20.0, 3.0
    run = paced(peer_bot, 7000, rate, seconds, bucket=1.5, return_after=1.5, lead_in=1.5)
    assert run["errors"] == 0 and run["n"] == 90
    assert run["paced"] == {"rate": 20.0, "returning_after": 30, "lead_in": 1.5}
    assert [bucket["due"] for bucket in run["per_bucket"]] == [30, 30] and run["lead_in"]["due"] == 30
    by_chat = messages_by_chat(run, 7000)
    returning = {chat: numbers for chat, numbers in by_chat.items() if len(numbers) == 2}
    # Odd messages 31 .. 89 come back to the chats of messages 0 .. 58: none in the lead-in.
    assert sorted(returning.values()) == [[i, i + 31] for i in range(0, 59, 2)]
    assert len(by_chat) == 90 - 30
    all_answered(fake_telegram, TOKEN, run, 7000, timeout=30)
    latency, missing, doubled = reply_latencies(fake_telegram, TOKEN, run, 7000)
    assert (missing, doubled, len(latency)) == (0, 0, 90)
    assert all(1.0 <= seconds_to_reply < 10 for seconds_to_reply in latency.values()), latency  # the 1 s window
    rows, lead = minutes(run, latency, rate, 1.5), lead_in_row(run, latency)
    assert [row["accepted_rate"] for row in rows] == [20.0, 20.0] and lead["accepted_rate"] == 20.0
    assert all(1.0 <= row["reply_p50"] <= row["reply_p99"] < 10 for row in rows + [lead])
    # Each row reads its own messages' replies: the lead-in 0 .. 29, the buckets 30 .. 59, 60 .. 89.
    assert lead["reply_p99"] == percentile([latency[i] for i in range(30)], 99)
    assert rows[1]["reply_p99"] == percentile([latency[i] for i in range(60, 90)], 99)
