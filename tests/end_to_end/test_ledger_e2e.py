"""The delivery ledger with real processes: the worker (killed with SIGKILL where a crash
is the point) sending through python-telegram-bot to the local fake Bot API server."""

import socket
from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent, EventKind
from conversations.models import Contact, Conversation, Turn, WorkerHeartbeat
from delivery import ledger
from delivery.models import OutboundKind, OutboundMessage, OutboundState, UnreachableChat
from tests.conftest import wait_until
from tests.support import local_http
from tests.support.e2e import UNPACED, send, telegram_channel

pytestmark = pytest.mark.e2e
PREFIX = "♻️ Recovered reply"


def texts(fake, chat_id=None):
    return [c.params["text"] for c in fake.calls("sendMessage")
            if chat_id is None or str(c.params["chat_id"]) == str(chat_id)]


def conversation_for(channel, chat="101"):
    contact = Contact.objects.create(channel=channel, platform_id=chat)
    return Conversation.objects.create(channel=channel, contact=contact, chat_id=chat, sender_id=chat)


def delivered(count):
    return lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).count() >= count


def test_crash_before_the_send_started_delivers_once_plain(processes, make_channel, fake_telegram):
    """What a worker killed between writing a reply and claiming it leaves: a pending row."""
    channel = telegram_channel(make_channel, fake_telegram)
    row = ledger.enqueue(conversation_for(channel), "Su cita es el lunes.", kind=OutboundKind.REPLY)
    processes.worker()
    fake_telegram.wait_for("sendMessage", timeout=15)
    wait_until(delivered(1), message="the row delivered")
    assert texts(fake_telegram) == ["Su cita es el lunes."]
    row.refresh_from_db()
    assert row.attempts == 1 and not row.needs_marker
    assert not AuditEvent.objects.filter(kind=EventKind.REPLY_RECOVERED).exists()


def test_crash_mid_send_is_resent_labelled_even_when_the_resend_crashes_too(processes, make_channel,
                                                                            fake_telegram):
    telegram_channel(make_channel, fake_telegram)
    web = processes.web()
    hold = fake_telegram.hold("sendMessage")
    worker = processes.worker()
    send(web, "tg", 101, "¿Me confirmas la hora?")
    hold.wait_held(1, timeout=15)  # the platform has the request; no answer yet
    worker.kill()
    hold.release()

    hold = fake_telegram.hold("sendMessage")  # the boot sweep's own resend hangs too…
    worker = processes.worker()
    hold.wait_held(1, timeout=15)
    worker.kill()
    hold.release()

    processes.worker()  # …and the next start labels it again: never an unlabelled copy
    fake_telegram.wait_for("sendMessage", count=3, timeout=15)
    wait_until(delivered(1), message="the row delivered")
    sent = texts(fake_telegram, 101)
    assert sent[0] == "¿Me confirmas la hora?"
    assert sent[1:] == [f"{ledger.RECOVERY_PREFIX}¿Me confirmas la hora?"] * 2
    row = OutboundMessage.objects.get()
    assert row.attempts == 3 and row.needs_marker
    assert AuditEvent.objects.filter(kind=EventKind.REPLY_RECOVERED).count() == 1


def test_boot_sweep_and_runtime_sweep_race_each_row_sent_once(processes, make_channel, fake_telegram):
    # Unpaced: 15 rows into each chat, paced 1 s apart, made this 15 s of waiting for pacing.
    channel = telegram_channel(make_channel, fake_telegram, extra=UNPACED)
    conversations = [conversation_for(channel, str(1000 + i)) for i in range(20)]
    processes.worker()  # its runtime sweep will see the dead owner within a housekeeping round
    WorkerHeartbeat.objects.create(owner="dead:1", hostname=socket.gethostname(), pid=2 ** 22 + 7,
                                   seen_at=timezone.now() - timedelta(minutes=10))
    rows = ledger.enqueue_many([ledger.Reply(conversations[i % 20], f"reply {i}", OutboundKind.REPLY)
                                for i in range(300)])
    OutboundMessage.objects.filter(pk__in=[r.pk for r in rows]).update(
        state=OutboundState.ATTEMPTING, owner="dead:1", attempts=1, chunks_started=1, claimed_at=timezone.now())
    processes.worker()  # its boot sweep takes the same rows

    wait_until(delivered(300), timeout=60, message="all 300 rows delivered")
    sent = texts(fake_telegram)
    assert sorted(sent) == sorted(f"{ledger.RECOVERY_PREFIX}reply {i}" for i in range(300))
    assert set(OutboundMessage.objects.values_list("attempts", flat=True)) == {2}  # one claim each


def test_flood_control_retried_after_the_penalty_plain(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram)
    web, _ = processes.web(wait=False), processes.worker()
    fake_telegram.fail_next("sendMessage", status=429, description="Too Many Requests: retry after 1",
                            retry_after=1)
    send(web, "tg", 101, "¿Hay hora el martes?")
    first, second = fake_telegram.wait_for("sendMessage", count=2, timeout=15)
    assert second.wall - first.wall >= 1.0
    assert second.params["text"] == "¿Hay hora el martes?"  # the 429 refused it: nothing to label
    wait_until(delivered(1), message="the row delivered")
    row = OutboundMessage.objects.get()
    assert row.flood_waits == 1 and row.attempts == 1 and not row.needs_marker


def test_a_blocked_bot_is_never_retried_and_the_chat_marked_unreachable(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram)
    web, _ = processes.web(wait=False), processes.worker()
    fake_telegram.fail_next("sendMessage", status=403, description="Forbidden: bot was blocked by the user")
    send(web, "tg", 101, "¿Hola?")
    wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.UNREACHABLE).exists(),
               message="the row marked unreachable")
    send(web, "tg", 202, "¿Sigues ahí?")  # a later sweep happens; the blocked chat is not retried
    wait_until(delivered(1), message="the other chat's reply")
    assert len(texts(fake_telegram, 101)) == 1
    assert UnreachableChat.objects.get().chat_id == "101"
    assert AuditEvent.objects.filter(kind=EventKind.CHAT_UNREACHABLE).count() == 1


def topic_update(chat_id, thread_id, message_id, text):
    return {
        "update_id": 777_000 + message_id,
        "message": {
            "message_id": message_id, "date": int(timezone.now().timestamp()), "text": text,
            "message_thread_id": thread_id, "is_topic_message": True,
            "from": {"id": 42, "is_bot": False, "first_name": "Camila"},
            "chat": {"id": chat_id, "type": "supergroup", "title": "Clínica", "is_forum": True},
        },
    }


def test_a_long_reply_split_in_order_thread_and_reply_to_kept_on_retry(processes, make_channel, fake_telegram):

    from tests.support.e2e import SECRET

    telegram_channel(make_channel, fake_telegram, extra=UNPACED)  # a group is paced at 20/min: 3 s a chunk
    web, _ = processes.web(wait=False), processes.worker()
    text = " ".join(f"palabra{i}" for i in range(700)) + "?"  # ~6,700 characters: two chunks
    fake_telegram.fail_next("sendMessage", status=500, description="Internal Server Error")
    response = local_http.post(f"{web.url}/webhooks/telegram/tg/", json=topic_update(-100123, 9, 31, text),
                          headers={"X-Telegram-Bot-Api-Secret-Token": SECRET}, timeout=10)
    assert response.status_code == 200
    wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.FAILED).exists(), timeout=15,
               message="the first attempt to fail")
    row = OutboundMessage.objects.get()
    assert (row.next_attempt_at - row.claimed_at).total_seconds() == pytest.approx(30, abs=1)  # 30 s backoff
    OutboundMessage.objects.filter(pk=row.pk).update(next_attempt_at=timezone.now())  # …30 s later
    wait_until(delivered(1), timeout=15, message="the retry delivered")

    retry = fake_telegram.calls("sendMessage")[1:]
    assert len(retry) == 2
    squeeze = lambda t: "".join(t.split())  # noqa: E731 — chunks are cut at spaces
    reply = Turn.objects.get().merged_input  # the echo agent's reply ("Camila: …" in a group)
    assert text in reply
    assert squeeze("".join(c.params["text"] for c in retry)) == squeeze(ledger.RECOVERY_PREFIX + reply)
    assert all(len(c.params["text"]) <= 4096 for c in retry)
    assert all(str(c.params["message_thread_id"]) == "9" and str(c.params["chat_id"]) == "-100123" for c in retry)
    assert retry[0].params["reply_parameters"]["message_id"] == 31
    assert "reply_parameters" not in retry[1].params


def test_with_the_ledger_off_replies_go_out_without_rows(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram)
    web, _ = processes.web(wait=False), processes.worker(AGENTLOOP_DELIVERY_LEDGER="false")
    send(web, "tg", 101, "¿Hola?")
    [reply] = fake_telegram.wait_for("sendMessage", timeout=15)
    assert reply.params["text"] == "¿Hola?"
    assert not OutboundMessage.objects.exists()
