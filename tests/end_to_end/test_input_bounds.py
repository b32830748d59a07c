"""Input without end: buffers, merged turns, pending messages, caches and guard-only
action names are all bounded; input the database cannot store is refused alone, with
the refusal audited, and never stalls a bot."""

import asyncio
import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from audit.models import AuditEvent, EventKind
from conversations import flushing, ingest, turns
from conversations.ingest import Arrival, Inbound, admission, admit
from conversations.models import (
    BufferState,
    Channel,
    Disposition,
    InboundMessage,
    MessageBuffer,
    Turn,
    TurnState,
)
from conversations.platforms.telegram import transport as transports
from delivery.models import OutboundKind, OutboundMessage
from tests.conftest import wait_until
from tests.support.e2e import TOKEN
from tools import guard
from tools.models import ActionClaim, ToolPolicy

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
FIXTURES = Path(__file__).parent.parent / "fixtures"
SECRET = "s3cret-token_ABC"


def at(seconds):
    return T0 + timedelta(seconds=seconds)


def msg(mid, text, *, chat="100", sender="100", **kw):
    return Inbound(platform_message_id=str(mid), chat_id=chat, sender_id=sender, text=text,
                   reply_target=str(mid), **kw)


def finish(turn, owner="w1", now=None):
    assert turns.finish(turn.pk, owner, state=TurnState.DONE, reply_text="ok", now=now or at(100))


# --- a buffer never grows without bound ----------------------------------------------------


@pytest.mark.django_db
def test_a_backlog_behind_a_running_turn_becomes_turns_of_at_most_max_messages_in_order(make_channel):
    channel = make_channel("chan", max_messages=10)
    admit(channel, msg("first", "Listo."), now=at(0))
    [running] = flushing.flush_due(now=at(2))
    assert turns.start(running.pk, "w1", at(2))
    for i in range(25):
        admit(channel, msg(i, f"parte {i}"), now=at(3 + i * 0.01))
    assert MessageBuffer.objects.get(state=BufferState.OPEN).message_count == 25

    seen = []
    for expected in (range(0, 10), range(10, 20), range(20, 25)):
        finish(running)
        [running] = flushing.flush_due(now=at(100))
        assert running.merged_input == "\n".join(f"parte {i}" for i in expected)
        assert running.reply_target == str(expected[-1])
        taken = InboundMessage.objects.filter(buffer=running.buffer).order_by("pk")
        assert [m.platform_message_id for m in taken] == [str(i) for i in expected]
        seen += expected
        assert turns.start(running.pk, "w1", at(100))
        waiting = MessageBuffer.objects.filter(state=BufferState.OPEN).first()
        assert (waiting.message_count if waiting else 0) == 25 - len(seen)
    assert seen == list(range(25))  # every message answered once, in order


@pytest.mark.django_db
def test_a_message_arriving_after_a_split_flush_joins_the_waiting_remainder(make_channel):
    channel = make_channel("chan", max_messages=3)
    admit(channel, msg("first", "Listo."), now=at(0))
    [running] = flushing.flush_due(now=at(2))
    assert turns.start(running.pk, "w1", at(2))
    for i in range(5):
        admit(channel, msg(i, f"parte {i}"), now=at(3))
    stale = MessageBuffer.objects.get(state=BufferState.OPEN)
    finish(running)
    [turn] = flushing.flush_due(now=at(100))
    # An admission that read the buffer before this flush loses its compare-and-swap on
    # it and must join the remainder, not trip over the one-open-buffer index.
    late = InboundMessage.objects.create(channel=channel, conversation=turn.conversation, buffer=stale,
                                         platform_message_id="late", text="parte 5")
    buffer = admission._rearm(Arrival(channel, turn.conversation, msg("late", "parte 5"), at(101)), stale, late, None)
    remainder = MessageBuffer.objects.get(state=BufferState.OPEN)
    assert buffer.pk == remainder.pk != stale.pk and remainder.message_count == 3
    assert list(remainder.messages.order_by("pk").values_list("text", flat=True)) == ["parte 3", "parte 4",
                                                                                       "parte 5"]


@pytest.mark.django_db(transaction=True)
def test_admissions_racing_split_flushes_lose_nothing_and_keep_the_order(make_channel):
    """One thread admits a stream of messages while another keeps finishing the running
    turn and flushing (each flush splitting the backlog): every message ends up in exactly
    one turn, in order, no turn holds more than max_messages, nothing raises."""
    from django.db import connection
    from django.utils import timezone as django_timezone

    channel = make_channel("chan", max_messages=5)
    admit(channel, msg("first", "Listo."))
    count, errors, done = 60, [], threading.Event()

    def sender():
        try:
            for i in range(count):
                admit(channel, msg(i, f"m{i}"))
        except Exception as exc:  # noqa: BLE001 — reported by the assertion below
            errors.append(exc)
        finally:
            done.set()
            connection.close()

    def flush_round():
        for turn in Turn.objects.filter(state=TurnState.RUNNING):
            turns.finish(turn.pk, "w1", state=TurnState.DONE, reply_text="ok")
        for turn in flushing.flush_due(now=django_timezone.now() + timedelta(minutes=5)):
            assert turns.start(turn.pk, "w1")

    thread = threading.Thread(target=sender)
    thread.start()
    while not done.is_set():
        flush_round()
    thread.join()
    wait_until(lambda: flush_round() or not MessageBuffer.objects.filter(state=BufferState.OPEN).exists(),
               message="the backlog drained")
    assert errors == []
    inputs = [t.merged_input.split("\n") for t in Turn.objects.order_by("pk")]
    assert all(len(lines) <= 5 for lines in inputs) and len(inputs) >= count // 5
    assert [line for lines in inputs for line in lines] == ["Listo."] + [f"m{i}" for i in range(count)]


@pytest.mark.django_db
def test_a_turn_input_is_cut_to_max_turn_chars_and_the_cut_is_marked(make_channel, settings):
    settings.AGENTLOOP_MAX_TURN_CHARS = 1000
    channel = make_channel("chan")
    text = "".join(f"{i:05d} " for i in range(500))  # 3,000 characters, each position different
    admit(channel, msg(1, text), now=at(0))
    [turn] = flushing.flush_due(now=at(30))
    assert len(turn.merged_input) <= 1000
    mark, kept = turn.merged_input.split("\n", 1)
    assert mark == f"[… {3000 - len(kept)} characters cut]" and text.endswith(kept) and len(kept) > 900
    assert InboundMessage.objects.get().text == text  # the stored message keeps all of it


@pytest.mark.django_db
def test_interrupts_in_a_row_never_grow_a_turn_input_beyond_the_cap(make_channel, settings):
    settings.AGENTLOOP_MAX_TURN_CHARS = 2000
    channel = make_channel("chan", double_texting="interrupt")
    admit(channel, msg(0, "x" * 900), now=at(0))
    [turn] = flushing.flush_due(now=at(10))
    for i in range(1, 8):
        assert turns.start(turn.pk, "w1", at(i * 10))
        admit(channel, msg(i, f"{i}" * 900), now=at(i * 10 + 1))
        assert Turn.objects.get(pk=turn.pk).state == TurnState.CANCELLED
        [turn] = flushing.flush_due(now=at(i * 10 + 9))
        assert len(turn.merged_input) <= 2000
        assert turn.merged_input.endswith("\n" + f"{i}" * 900)  # the newest input is whole
    assert Turn.objects.filter(state=TurnState.CANCELLED).count() == 7


@pytest.mark.django_db
def test_a_pull_channel_nobody_serves_holds_at_most_max_pending_messages(make_channel, settings):
    settings.AGENTLOOP_MAX_PENDING_MESSAGES = 30
    channel = make_channel("pulled", agent="pull", max_messages=10)
    admit(channel, msg("first", "¿Hola?"), now=at(0))
    [waiting_turn] = flushing.flush_due(now=at(5))
    assert waiting_turn.state == TurnState.READY  # nobody ever claims it
    dispositions = [admit(channel, msg(i, f"mensaje {i}"), now=at(6 + i)).disposition for i in range(40)]
    assert dispositions == [Disposition.BUFFERED] * 30 + [Disposition.OVERFLOW] * 10
    assert MessageBuffer.objects.get(state=BufferState.OPEN).message_count == 30
    # Stored and audited, each one; the sender is told once for the episode.
    assert InboundMessage.objects.filter(disposition=Disposition.OVERFLOW, buffer=None).count() == 10
    assert AuditEvent.objects.filter(kind=EventKind.MESSAGE_OVERFLOWED).count() == 10
    [notice] = OutboundMessage.objects.filter(kind=OutboundKind.NOTICE)
    assert notice.text == ingest.OVERFLOW_NOTICE and notice.reply_target == "30"
    assert admit(channel, msg(30, "mensaje 30"), now=at(60)).duplicate  # a retry of a stored one

    # The agent takes the waiting turn: the next turn takes 10, so 20 wait and there is
    # room again; filling it up again is a new episode, with its own notice.
    assert turns.cancel(waiting_turn.pk, "the agent gave up")
    [next_turn] = flushing.flush_due(now=at(61))
    assert next_turn.merged_input.split("\n")[-1] == "mensaje 9"
    dispositions = [admit(channel, msg(100 + i, f"otro {i}"), now=at(62 + i)).disposition for i in range(12)]
    assert dispositions == [Disposition.BUFFERED] * 10 + [Disposition.OVERFLOW] * 2
    assert OutboundMessage.objects.filter(kind=OutboundKind.NOTICE).count() == 2


# --- every in-process cache is bounded ---------------------------------------------------------


@pytest.mark.django_db
def test_thousands_of_unknown_slugs_do_not_grow_the_channel_cache(client, make_channel):
    """Each unknown slug costs a query (nothing remembers it for long), so 2,000 — eight
    times the bound — keep this quick; at 37dc421 all of them stayed cached. (It was
    4,000: any count well past the bound tells a bounded cache from one that keeps all.)"""
    tg = make_channel("tg", kind="telegram", platform_settings={"bot_token": "123:ABC", "webhook_secret": SECRET})
    for i in range(2_000):
        response = client.post(f"/webhooks/telegram/nope-{i}/", data="{}", content_type="application/json")
        assert response.status_code == 404
    assert Channel.objects.cache_size() <= len(Channel.objects._unknown) + 1 <= 257
    # The real channel is still found (and cached) among them.
    assert Channel.objects.active("tg").pk == tg.pk and Channel.objects.cache_size() <= 258


def vm_rss_kb(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def test_unknown_slugs_do_not_grow_the_web_process(processes):
    """The same through the real web server, measured from outside: slugs of 6,000
    characters make each never-forgotten entry weigh ~6 KB, so 1,500 requests tell a
    bounded cache from a growing one (~9 MB at 37dc421) in seconds."""
    web = processes.web()
    padding = "x" * 6_000
    with httpx.Client(base_url=web.url, timeout=10) as http:
        def burst(start, count):
            for i in range(start, start + count):
                assert http.post(f"/webhooks/telegram/{i}-{padding}/", content="{}").status_code == 404

        burst(0, 400)  # warm up: code paths, the connection, the allocator's pools
        before = vm_rss_kb(web.pid)
        burst(400, 1_500)
        growth_mb = (vm_rss_kb(web.pid) - before) / 1024
    print(f"web process RSS growth over 1,500 unknown 6 KB slugs: {growth_mb:.1f} MB")
    assert growth_mb < 5, f"the web process grew {growth_mb:.1f} MB"


@pytest.mark.django_db
def test_the_policy_cache_is_bounded():
    for i in range(1_200):
        guard.policy_for(f"made-up-{i}")
    assert len(guard.policies._policies) <= guard.policies._policies.maxsize == 1024
    assert guard.policy_for("made-up-1199").name == "made-up-1199"


def test_the_bot_cache_is_bounded_and_closes_what_it_lets_go():
    async def main():
        bots = [transports.telegram_bot(f"{i}:TOKEN", "http://127.0.0.1:9") for i in range(300)]
        assert len(transports._bots) == transports.BOT_CACHE_SIZE == 256
        assert transports.telegram_bot("299:TOKEN", "http://127.0.0.1:9") is bots[-1]  # the newest are kept
        await transports.close_bots()
        assert len(transports._bots) == 0

    asyncio.run(main())


# --- guard-only actions are namespaced per key and bounded -----------------------------------------


@pytest.fixture
def shop(make_channel):
    return make_channel("shop", kind="api")


def claim(client, key, action, scope="customer-42", arguments=None):
    return client.post("/api/v1/actions/claim", data=json.dumps(
        {"action": action, "scope": scope, "arguments": arguments or {"order": "A-1"}}),
        content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")


def test_a_hosted_tool_name_cannot_be_claimed_as_a_guard_only_action(client, shop, agent_key):
    key = agent_key(shop)
    response = claim(client, key, "email_send", arguments={"to": "a@b.co", "subject": "s", "body": "b"})
    assert response.status_code == 409
    assert "hosted tool" in response.json()["error"] and "/api/v1/tools/email_send/invoke" in response.json()["error"]
    assert not ActionClaim.objects.exists() and not ToolPolicy.objects.filter(name__contains="email_send").exists()


def test_guard_only_actions_live_in_their_key_namespace(client, shop, agent_key):
    first, second = agent_key(shop, name="one"), agent_key(shop, name="two")
    assert claim(client, first, "refund").status_code == 201
    assert claim(client, second, "refund").status_code == 201  # another key's "refund" is another action
    names = set(ToolPolicy.objects.values_list("name", flat=True))
    assert not {"refund"} & names and len({n for n in names if n.startswith("ext:") and n.endswith(":refund")}) == 2
    assert set(ActionClaim.objects.values_list("action", flat=True)) == {n for n in names if n.endswith(":refund")}
    too_long = claim(client, first, "a" * 49)
    assert too_long.status_code == 400


def test_an_agent_key_may_use_a_bounded_number_of_action_names(client, shop, agent_key, settings):
    assert settings.AGENTLOOP_MAX_ACTIONS_PER_KEY == 100
    key, other = agent_key(shop, name="one"), agent_key(shop, name="two")
    for i in range(100):
        assert claim(client, key, f"invented-{i}").status_code == 201
    response = claim(client, key, "invented-100")
    assert response.status_code == 429 and "100 action names" in response.json()["error"]
    assert claim(client, key, "invented-7", scope="customer-43").status_code == 201  # a known name still works
    assert claim(client, other, "invented-100").status_code == 201  # the bound is per key
    assert ToolPolicy.objects.filter(name__startswith="ext:").count() == 101


# --- input the database cannot store ---------------------------------------------------------


def webhook(client, update, slug="tg"):
    return client.post(f"/webhooks/telegram/{slug}/", data=json.dumps(update), content_type="application/json",
                       HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN=SECRET)


def text_update(update_id, text, *, first_name="Camila", message_id=None):
    return {"update_id": update_id, "message": {
        "message_id": message_id or update_id, "date": 1764417600, "text": text,
        "from": {"id": 52093311, "is_bot": False, "first_name": first_name},
        "chat": {"id": 52093311, "type": "private", "first_name": first_name}}}


@pytest.mark.django_db
@pytest.mark.parametrize("bad, field, what", [
    (text_update(1, "hola\x00mundo"), "text", "NUL"),
    (text_update(1, "hola \ud800"), "text", "unpaired surrogate"),
    (text_update(1, "hola", first_name="Ca\x00mila"), "sender_name", "NUL"),
    (text_update(1, "x" * 20_001), "text", "20001 characters"),
])
def test_an_unstorable_webhook_update_is_refused_alone_with_200_and_audited(client, make_channel, bad, field, what):
    make_channel("tg", kind="telegram", platform_settings={"bot_token": "123:ABC", "webhook_secret": SECRET})
    response = webhook(client, bad)
    assert response.status_code == 200  # Telegram must stop retrying it
    assert response.json()["ok"] is True and field in response.json()["refused"] and what in response.json()["refused"]
    assert not InboundMessage.objects.exists()
    [event] = AuditEvent.objects.filter(kind=EventKind.MESSAGE_REFUSED)
    assert event.channel_slug == "tg" and event.target == "message 52093311:1" and what in event.summary
    good = webhook(client, text_update(2, "hola"))
    assert good.status_code == 200 and good.json() == {"ok": True, "duplicate": False}
    assert InboundMessage.objects.get().text == "hola"


@pytest.fixture
def api_key(make_channel, agent_key):
    return agent_key(make_channel("shop", kind="api"))


def inbound(client, key, **body):
    return client.post("/api/v1/channels/shop/messages", data=json.dumps({"contact": "ana", **body}),
                       content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")


@pytest.mark.django_db
def test_an_unstorable_api_message_is_400_with_a_clear_message(client, api_key):
    response = inbound(client, api_key, message_id="m1", text="hola\x00")
    assert response.status_code == 400 and "Null characters are not allowed" in str(response.json()["fields"])
    response = inbound(client, api_key, message_id="m2", text="hola \ud800")
    assert response.status_code == 400 and "Surrogate characters are not allowed" in str(response.json()["fields"])
    assert not InboundMessage.objects.exists()


@pytest.mark.django_db
def test_message_id_is_accepted_exactly_as_long_as_its_column(client, api_key):
    # Stored twice (platform_message_id, and reply_target for threading): the shorter column.
    limit = min(InboundMessage._meta.get_field(name).max_length for name in ("platform_message_id", "reply_target"))
    longest = "m" * limit
    response = inbound(client, api_key, message_id=longest, text="hola")
    assert response.status_code == 202, response.content
    stored = InboundMessage.objects.get()
    assert stored.platform_message_id == stored.reply_target == longest
    assert Turn._meta.get_field("reply_target").max_length >= limit
    assert OutboundMessage._meta.get_field("reply_target").max_length >= limit
    response = inbound(client, api_key, message_id="m" * (limit + 1), text="hola")
    assert response.status_code == 400
    assert f"no more than {limit} characters" in str(response.json()["fields"]["message_id"])
    assert InboundMessage.objects.count() == 1


@pytest.mark.e2e
def test_long_polling_moves_past_an_unstorable_update(processes, make_channel, fake_telegram):
    channel = make_channel("poll", kind="telegram", platform_settings={
        "bot_token": TOKEN, "api_base": fake_telegram.url, "mode": "polling"})
    first = fake_telegram.push_message(TOKEN, 101, "¿Me confirmas las horas?")
    bad = fake_telegram.push_message(TOKEN, 101, "esto\x00no")
    last = fake_telegram.push_message(TOKEN, 202, "¿Y la de mañana?")
    worker = processes.worker()
    fake_telegram.wait_for("sendMessage", count=2, timeout=20)
    wait_until(lambda: Channel.objects.get(pk=channel.pk).poll_offset == last["update_id"] + 1,
               message="the offset moved past the whole batch")
    assert sorted(InboundMessage.objects.values_list("text", flat=True)) == ["¿Me confirmas las horas?",
                                                                             "¿Y la de mañana?"]
    [event] = AuditEvent.objects.filter(kind=EventKind.MESSAGE_REFUSED)
    assert event.target == f"message 101:{bad['message']['message_id']}" and "NUL" in event.summary
    assert "long polling" in event.summary
    # Later updates keep flowing: the bot is not stuck behind the bad one.
    fake_telegram.push_message(TOKEN, 101, "Gracias.")
    fake_telegram.wait_for("sendMessage", count=3, timeout=20)
    assert first["update_id"] < bad["update_id"] < last["update_id"]
    assert "Traceback" not in worker.output(), worker.output()
