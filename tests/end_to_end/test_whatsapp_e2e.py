"""WhatsApp end to end: the real web server (daphne) receiving signed notifications as
Meta sends them, the real worker sending through httpx to the local fake Graph API.
A burst becomes one turn threaded to its last message (two photos and a question among
them, the photos shown to the model), typing is refreshed through a turn, a worker
killed mid-send resends once labelled, a dead token makes the
channel's replies wait, a `failed` receipt brings a reply back, and the incident of the
demo agent is replayed over WhatsApp."""

import json
import threading
import time

import httpx
import pytest
from django.utils import timezone

from audit.models import AuditEvent, EventKind
from conversations.models import Channel, InboundMessage, MessageBuffer, Turn, TurnState
from delivery import ledger
from delivery.models import OutboundMessage, OutboundState, SendBudget, UnreachableChat
from tests.conftest import wait_until
from tests.fakes import graph_api
from tests.fakes.graph_api import FakeGraphAPI
from tests.support import local_http
from tests.support.whatsapp import APP_SECRET, PHONE, TOKEN, USER, deliver, send, whatsapp_channel

pytestmark = pytest.mark.e2e


@pytest.fixture
def fake_graph():
    with FakeGraphAPI(tokens=[TOKEN], phone_number_ids=[PHONE]) as fake:
        yield fake


def started_worker(processes, **env):
    worker = processes.worker(**env)
    wait_until(lambda: " started" in worker.output(), timeout=30, message="worker started")
    return worker


def delivered(count):
    return lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).count() >= count


def test_a_burst_of_three_is_one_turn_threaded_to_the_last_message(processes, make_channel, fake_graph):
    whatsapp_channel(make_channel, fake_graph)
    web, _ = processes.web(), started_worker(processes)
    texts = ["Hola,", "quería agendar psicología", "¿hay hora el lunes?"]
    wamids = [send(web, text) for text in texts]
    [reply] = fake_graph.wait_for("message", timeout=20)
    turn = Turn.objects.get()
    assert turn.merged_input == "\n".join(texts) and turn.reply_target == wamids[-1]
    assert reply.body["to"] == USER and reply.body["context"] == {"message_id": wamids[-1]}
    assert reply.body["text"]["body"] == "\n".join(texts)  # the echo agent
    wait_until(delivered(1), message="the reply recorded delivered")
    row = OutboundMessage.objects.get()
    assert row.platform_message_id.startswith("wamid.") and row.attempts == 1
    # "typing…" from the window on, shown against the user's messages (the window's
    # indicator finds the latest one itself: the worker's look knows no message ids).
    typing = fake_graph.calls("typing")
    assert typing and {c.body["message_id"] for c in typing} <= set(wamids)
    assert typing[0].at < reply.at


def test_twenty_concurrent_copies_of_a_notification_are_one_message(processes, make_channel, fake_graph):
    whatsapp_channel(make_channel, fake_graph)
    web = processes.web()
    raw = json.dumps(graph_api.webhook_body(PHONE, messages=[graph_api.text_message(USER, "hola")])).encode()
    headers = {"Content-Type": "application/json", "X-Hub-Signature-256": graph_api.signature(APP_SECRET, raw)}
    start, answers = threading.Barrier(20), []

    def post():
        with httpx.Client(timeout=30) as http:
            start.wait()
            answer = http.post(f"{web.url}/webhooks/whatsapp/wa/", content=raw, headers=headers)
            answers.append((answer.status_code, answer.json()["admitted"]))

    threads = [threading.Thread(target=post) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(answers) == [(200, 0)] * 19 + [(200, 1)]
    assert InboundMessage.objects.count() == 1 and MessageBuffer.objects.count() == 1


def test_typing_is_refreshed_through_the_turn_and_stops_with_the_reply(processes, make_channel, fake_graph):
    """Refreshed every AGENTLOOP_TYPING_INTERVAL (1.5 s here; WhatsApp's own 20 s when 0,
    below the indicator's 25 s lapse: tests/unit/test_whatsapp.py) through a 5 s turn:
    shown as the turn starts, never lapsing while the agent works, none after the reply."""
    whatsapp_channel(make_channel, fake_graph, typing_mode="turn", agent_config={"delay": 5})
    web, _ = processes.web(), started_worker(processes, AGENTLOOP_TYPING_INTERVAL="1.5")
    wamid = send(web, "¿Me confirmas la hora?")
    [reply] = fake_graph.wait_for("message", timeout=30)
    time.sleep(1.0)  # absence cannot be polled for: room for a stray indicator to show
    turn = Turn.objects.get()
    typing = fake_graph.calls("typing")
    assert len(typing) >= 3, f"{len(typing)} indicators in a 5 s turn"
    assert all(c.body["message_id"] == wamid for c in typing)
    started, finished = turn.started_at.timestamp(), turn.finished_at.timestamp()
    # Before the first refresh (1.5 s) could have shown it: 1.07 s once on a loaded run.
    assert typing[0].wall - started < 1.4, "shown as the turn starts"
    gaps = [b.at - a.at for a, b in zip(typing, typing[1:])]
    assert all(1.0 <= gap < 2.5 for gap in gaps), f"refreshed every 1.5 s: {gaps}"
    assert finished - typing[-1].wall < 2.5, "still showing when the agent answered"
    assert all(c.at <= reply.at + 0.1 for c in typing), "none after the reply"


def test_a_worker_killed_mid_send_resends_once_labelled(processes, make_channel, fake_graph):
    whatsapp_channel(make_channel, fake_graph)
    web = processes.web()
    hold = fake_graph.hold("message")
    worker = started_worker(processes)
    wamid = send(web, "¿Me confirmas la hora?")
    hold.wait_held(1, timeout=20)  # Meta has the request; no answer yet
    worker.kill()
    hold.release()

    started_worker(processes)  # its boot sweep finds the row mid-send
    wait_until(delivered(1), timeout=20, message="the row delivered after the restart")
    sent = fake_graph.texts(USER)
    assert sent == ["¿Me confirmas la hora?", f"{ledger.RECOVERY_PREFIX}¿Me confirmas la hora?"]
    calls = fake_graph.calls("message")
    assert all(c.body["context"] == {"message_id": wamid} for c in calls)  # the resend threads too
    row = OutboundMessage.objects.get()
    assert row.attempts == 2 and row.needs_marker
    assert AuditEvent.objects.filter(kind=EventKind.REPLY_RECOVERED).count() == 1


def test_flood_is_retried_after_the_back_off_plain(processes, make_channel, fake_graph):
    whatsapp_channel(make_channel, fake_graph)
    web, _ = processes.web(), started_worker(processes)
    fake_graph.fail_next("message", code=130429)
    send(web, "¿Hay hora el martes?")
    row = wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.FAILED).first(), timeout=20,
                     message="the flood recorded")
    assert row.flood_waits == 1 and row.attempts == 0  # refused: nothing reached the chat, nothing spent
    assert (row.next_attempt_at - timezone.now()).total_seconds() == pytest.approx(60, abs=5)
    assert SendBudget.objects.get().next_slot - time.time() == pytest.approx(60, abs=5)  # the number paused
    OutboundMessage.objects.filter(pk=row.pk).update(next_attempt_at=timezone.now())  # …a minute later
    SendBudget.objects.update(next_slot=0)
    wait_until(delivered(1), timeout=20, message="the retry delivered")
    assert fake_graph.texts(USER)[-1] == "¿Hay hora el martes?"
    assert OutboundMessage.objects.get().attempts == 1


def test_outside_the_24_hour_window_is_never_retried(processes, make_channel, fake_graph):
    whatsapp_channel(make_channel, fake_graph)
    web, _ = processes.web(), started_worker(processes)
    fake_graph.fail_next("message", code=131047)
    send(web, "¿Hola?")
    wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.UNREACHABLE).exists(), timeout=20,
               message="the row unreachable")
    send(web, "¿Hola?", wa_id="5491100000009")  # another chat is answered; the first is not retried
    wait_until(delivered(1), timeout=20, message="the other chat's reply")
    assert fake_graph.texts(USER) == ["¿Hola?"] and len(fake_graph.calls("message")) == 2  # tried once
    mark = UnreachableChat.objects.get()
    assert mark.chat_id == USER and "the user must write first" in mark.error


def test_a_dead_token_blocks_the_channel_until_an_operator_replaces_it(processes, make_channel, fake_graph):
    channel = whatsapp_channel(make_channel, fake_graph)
    web, _ = processes.web(), started_worker(processes)
    fake_graph.fail_next("message", code=190, times=1)
    send(web, "¿Hola?")
    wait_until(lambda: Channel.objects.get(pk=channel.pk).send_blocked, timeout=20, message="the channel blocked")
    send(web, "¿Sigues ahí?", wa_id="5491100000009")
    wait_until(lambda: OutboundMessage.objects.count() == 2, timeout=20, message="the second reply written")
    time.sleep(1.5)  # several sweeps: nothing is sent while the channel is blocked
    assert len(fake_graph.calls("message")) == 1
    assert set(OutboundMessage.objects.values_list("attempts", flat=True)) == {0}  # no attempt burnt
    assert AuditEvent.objects.filter(kind=EventKind.CHANNEL_BLOCKED).count() == 1
    channel.refresh_from_db()
    channel.platform_settings["token"] = TOKEN  # the operator saves the channel with a (new) token
    channel.save()
    wait_until(delivered(2), timeout=20, message="both replies delivered once unblocked")


def test_a_failed_receipt_brings_the_reply_back_and_it_is_resent_labelled(processes, make_channel, fake_graph):
    whatsapp_channel(make_channel, fake_graph)
    web, _ = processes.web(), started_worker(processes)
    send(web, "¿Me confirmas la hora?")
    wait_until(delivered(1), timeout=20, message="the reply delivered")
    first = OutboundMessage.objects.get().platform_message_id
    failed = graph_api.webhook_body(PHONE, statuses=[graph_api.status(first, "sent", USER),
                                                     graph_api.status(first, "failed", USER, error_code=131000)])
    assert deliver(web, failed)["failed"] == 1
    row = OutboundMessage.objects.get()
    assert row.state == OutboundState.FAILED and "131000" in row.last_error
    OutboundMessage.objects.filter(pk=row.pk).update(next_attempt_at=timezone.now())  # …30 s later
    wait_until(delivered(1), timeout=20, message="resent")
    assert fake_graph.texts(USER) == ["¿Me confirmas la hora?", f"{ledger.RECOVERY_PREFIX}¿Me confirmas la hora?"]
    row.refresh_from_db()
    assert row.platform_message_id != first
    # Meta's retry of the old receipt: no row carries that id any more, nothing changes.
    assert deliver(web, failed)["unknown"] == 1
    assert OutboundMessage.objects.get().state == OutboundState.DELIVERED


def test_the_incident_replayed_over_whatsapp_with_the_demo_agent(processes, make_channel, fake_graph):
    """A user confirms the psychology sessions, then (the bot quiet) asks to put them in
    the calendar: two legitimate turns, the model obeys both; the guard keeps it at 2 events."""
    from tools.models import CalendarEvent

    whatsapp_channel(make_channel, fake_graph, agent="demo")
    web, _ = processes.web(), started_worker(processes)
    send(web, "Confirmo las horas de psicología: lunes y miércoles a las 10")
    [first] = fake_graph.wait_for("message", timeout=20)
    assert first.body["text"]["body"].count("✅ Agendado: Psicología") == 2
    second_wamid = send(web, "Agéndame las horas en mi calendario")
    second = fake_graph.wait_for("message", count=2, timeout=20)[1]
    assert second.body["text"]["body"].count("ℹ️ Ya estaba agendado: Psicología") == 2
    assert second.body["context"] == {"message_id": second_wamid}
    assert CalendarEvent.objects.count() == 2
    assert Turn.objects.filter(state=TurnState.DONE).count() == 2
    assert AuditEvent.objects.filter(kind=EventKind.DUPLICATE_PREVENTED).count() == 2


def test_the_readme_steps_addchannel_then_the_webhook_handshake_then_a_reply(processes, fake_graph):
    """What the README walks through: addchannel with the four values, Meta's GET to the
    webhook URL with the verify token, then a user's message answered by the agent."""
    from django.core.management import call_command

    from tests.support.whatsapp import VERIFY

    call_command("addchannel", "wa", "--kind", "whatsapp", "--agent", "demo", "--phone-number-id", PHONE,
                 "--token", TOKEN, "--app-secret", APP_SECRET, "--verify-token", VERIFY, "--api-base", fake_graph.url)
    web, _ = processes.web(), started_worker(processes)
    handshake = local_http.get(f"{web.url}/webhooks/whatsapp/wa/", timeout=10, params={
        "hub.mode": "subscribe", "hub.verify_token": VERIFY, "hub.challenge": "847362519"})
    assert handshake.status_code == 200 and handshake.text == "847362519"
    assert local_http.get(f"{web.url}/webhooks/whatsapp/wa/", timeout=10, params={
        "hub.mode": "subscribe", "hub.verify_token": "guess", "hub.challenge": "1"}).status_code == 403
    wamid = send(web, "what can you do?")
    [reply] = fake_graph.wait_for("message", timeout=20)
    assert "I can:" in reply.body["text"]["body"] and reply.body["context"] == {"message_id": wamid}
    assert reply.token == TOKEN and reply.phone_number_id == PHONE


def test_two_photos_and_their_question_are_one_turn_and_the_model_sees_both(
        processes, make_channel, fake_graph, tmp_path):
    """WhatsApp sends each image of a multi-photo message as its own notification: the two
    and the question after them are one turn, each photo fetched once (media id, then its
    URL, with the token) though the first notification is delivered again."""
    import io

    from PIL import Image

    from tests.fakes.openai_api import FakeOpenAI, Reply

    def jpeg(shade):
        out = io.BytesIO()
        Image.new("RGB", (40, 30), (shade, 10, 10)).save(out, "JPEG")
        return out.getvalue()

    with FakeOpenAI() as model:
        model.script(Reply("Suman 42."))
        whatsapp_channel(make_channel, fake_graph, agent="openai", agent_config={
            "base_url": model.url, "model": "fake-model", "api_key_env": "FAKE_OPENAI_API_KEY"})
        web = processes.web(wait=False, AGENTLOOP_MEDIA_ROOT=tmp_path / "files")
        started_worker(processes, AGENTLOOP_MEDIA_ROOT=tmp_path / "files")
        ids = [fake_graph.add_media(jpeg(shade)) for shade in (60, 180)]
        photos = [graph_api.media_message(USER, "image", "las boletas" if i == 0 else "", media_id=media_id)
                  for i, media_id in enumerate(ids)]
        for photo in [*photos, photos[0]]:  # the first delivered again: one file, fetched once
            deliver(web, graph_api.webhook_body(PHONE, messages=[photo]))
        send(web, "¿cuánto suman?")
        [reply] = fake_graph.wait_for("message", timeout=30)
        [request] = model.requests()
    content = request.messages[-1]["content"]
    assert [part["type"] for part in content] == ["text", "image_url", "image_url"]
    assert content[0]["text"] == "[image] las boletas\n[image]\n¿cuánto suman?"
    assert reply.body["text"]["body"] == "Suman 42."
    assert sorted(fake_graph.downloads) == sorted(ids)
    assert Turn.objects.count() == 1
