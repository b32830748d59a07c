"""A person takes a conversation over (conversations.handoff), through the real web
server and worker and the fake Telegram Bot API: the agent is silent whatever arrives,
the person's reply goes through the ledger once (labelled after a crash mid-send), and
the agent's next turn after the give-back sees what happened."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent, EventKind
from conversations import engine
from conversations.models import (
    BufferState,
    Conversation,
    ConversationState,
    Disposition,
    InboundMessage,
    MessageBuffer,
    Turn,
    TurnState,
)
from delivery.ledger import RECOVERY_PREFIX
from delivery.models import OutboundMessage
from tests.conftest import wait_until
from tests.support import local_http
from tests.support.e2e import UNPACED, send, telegram_channel

pytestmark = pytest.mark.e2e


def texts(fake, chat_id=101):
    return [c.params["text"] for c in fake.calls("sendMessage") if int(c.params["chat_id"]) == chat_id]


def call(web, key, conversation_id, action, body=None):
    return local_http.post(f"{web.url}/api/v1/conversations/{conversation_id}/{action}", json=body,
                           headers={"Authorization": f"Bearer {key}"}, timeout=10)


def conversation(chat="101"):
    return wait_until(lambda: Conversation.objects.filter(chat_id=chat).first(), message="conversation")


def test_takeover_with_a_buffer_open_then_twenty_messages_then_give_back(
        processes, make_channel, fake_telegram, agent_key):
    channel = telegram_channel(make_channel, fake_telegram, extra=UNPACED)
    key = agent_key(channel, name="helpdesk")
    web, _ = processes.web(wait=False), processes.worker()
    send(web, "tg", 101, "Necesito hablar con una persona y")  # a 4 s window: the buffer is open
    chat = conversation()
    taken = call(web, key, chat.pk, "takeover")
    assert taken.status_code == 200 and taken.json()["state"] == "person" and taken.json()["changed"] is True
    assert call(web, key, chat.pk, "takeover").json()["changed"] is False  # idempotent
    assert MessageBuffer.objects.get().state == BufferState.DROPPED
    taken_at = time.time()

    for n in range(20):
        send(web, "tg", 101, f"¿hola? {n}")
    send(web, "tg", 101, "/stop")  # no command's answer either: the person holds the chat
    time.sleep(5.5)  # past every window the agent would have used
    assert texts(fake_telegram) == []
    # Nothing strange on the user's side either: no typing while a person holds the chat
    # (a refresh already on its way at the takeover may land within the first second).
    assert not [c for c in fake_telegram.calls("sendChatAction") if c.wall > taken_at + 1.0]
    assert not Turn.objects.exists()
    assert InboundMessage.objects.filter(disposition=Disposition.HELD).count() == 22

    answered = call(web, key, chat.pk, "reply", {"text": "Hola, soy Marta. ¿En qué te ayudo?", "key": "m-1"})
    assert answered.status_code == 202, answered.text
    again = call(web, key, chat.pk, "reply", {"text": "Hola, soy Marta. ¿En qué te ayudo?", "key": "m-1"})
    assert again.json() == {**answered.json(), "created": False}
    fake_telegram.wait_for("sendMessage", timeout=10)
    time.sleep(1.0)
    assert texts(fake_telegram) == ["Hola, soy Marta. ¿En qué te ayudo?"]

    released = call(web, key, chat.pk, "release")
    assert released.json()["state"] == "agent" and released.json()["changed"] is True
    assert call(web, key, chat.pk, "release").json()["changed"] is False
    send(web, "tg", 101, "Gracias, ya está.")
    fake_telegram.wait_for("sendMessage", count=2, timeout=15)
    turn = Turn.objects.exclude(owner__startswith="person:").get()
    history = engine.conversation_history(chat, turn)
    assert {"role": "assistant", "content": "Hola, soy Marta. ¿En qué te ayudo?"} in history
    person_turn = Turn.objects.get(owner__startswith="person:")
    assert "¿hola? 19" in person_turn.merged_input and "Necesito hablar" in person_turn.merged_input
    [note] = [m for m in history if m["role"] == "system"]
    assert "replied 1 time" in note["content"]
    kinds = set(AuditEvent.objects.values_list("kind", flat=True))
    assert {EventKind.CONVERSATION_TAKEN_OVER, EventKind.PERSON_REPLIED, EventKind.CONVERSATION_GIVEN_BACK} <= kinds


def test_takeover_cancels_a_running_turn_that_fired_no_effect(processes, make_channel, fake_telegram, agent_key):
    channel = telegram_channel(make_channel, fake_telegram, agent_config={"delay": 3.0})
    key = agent_key(channel)
    web, _ = processes.web(wait=False), processes.worker()
    send(web, "tg", 101, "¿Me ayudas?")
    turn = wait_until(lambda: Turn.objects.filter(state=TurnState.RUNNING).first(), message="turn running")
    assert call(web, key, turn.conversation_id, "takeover").status_code == 200
    turn.refresh_from_db()
    assert turn.state == TurnState.CANCELLED and "took the conversation over" in turn.outcome
    send(web, "tg", 101, "¿sigues ahí?")
    time.sleep(4.0)
    assert texts(fake_telegram) == []


def test_a_turn_that_fired_an_effect_finishes_and_nothing_after(processes, make_channel, fake_telegram, agent_key):
    channel = telegram_channel(make_channel, fake_telegram, agent_config={"delay": 2.0, "mark_effect": True})
    key = agent_key(channel)
    web, _ = processes.web(wait=False), processes.worker()
    send(web, "tg", 101, "Agéndame el lunes.")
    turn = wait_until(lambda: Turn.objects.filter(state=TurnState.RUNNING, fired_effect=True).first(),
                      message="turn running with its effect fired")
    assert call(web, key, turn.conversation_id, "takeover").json()["state"] == "person"
    fake_telegram.wait_for("sendMessage", timeout=10)
    turn.refresh_from_db()
    assert turn.state == TurnState.DONE
    for n in range(3):
        send(web, "tg", 101, f"otra cosa {n}.")
    time.sleep(3.0)
    assert texts(fake_telegram) == ["Agéndame el lunes."]


def test_the_persons_reply_survives_a_kill_mid_send_labelled(processes, make_channel, fake_telegram, agent_key):
    channel = telegram_channel(make_channel, fake_telegram)
    key = agent_key(channel)
    web = processes.web()
    send(web, "tg", 101, "Hola, ¿hay una persona?")
    chat = conversation()
    assert call(web, key, chat.pk, "takeover").status_code == 200
    assert call(web, key, chat.pk, "reply", {"text": "Te escribe una persona."}).status_code == 202
    doomed = processes.worker(wait=False, AGENTLOOP_FAILPOINT="ledger.after_send")
    wait_until(lambda: doomed.popen.poll() is not None, timeout=30, message="worker killed mid-send")
    processes.worker()
    wait_until(lambda: len(texts(fake_telegram)) == 2, timeout=30, message="the person's reply resent once")
    time.sleep(1.0)
    assert texts(fake_telegram) == ["Te escribe una persona.", RECOVERY_PREFIX + "Te escribe una persona."]
    assert OutboundMessage.objects.filter(conversation=chat).count() == 1


def test_the_api_refuses_strangers_and_other_channels(processes, make_channel, fake_telegram, agent_key):
    channel = telegram_channel(make_channel, fake_telegram)
    other = make_channel("other")
    foreign_key = agent_key(other, name="other")
    key = agent_key(channel)
    web = processes.web()
    send(web, "tg", 101, "Hola.")
    chat = conversation()
    assert local_http.post(f"{web.url}/api/v1/conversations/{chat.pk}/takeover", timeout=10).status_code in (401, 403)
    assert call(web, foreign_key, chat.pk, "takeover").status_code == 404
    assert call(web, foreign_key, chat.pk, "reply", {"text": "x"}).status_code == 404
    assert call(web, key, chat.pk, "reply", {"text": "x"}).status_code == 409  # not held: take it over first
    chat.refresh_from_db()
    assert chat.state == ConversationState.AGENT


def test_a_quiet_person_gives_the_conversation_back_after_the_idle_time(
        processes, make_channel, fake_telegram, agent_key):
    channel = telegram_channel(make_channel, fake_telegram, handoff_idle_minutes=5)
    key = agent_key(channel)
    web, _ = processes.web(wait=False), processes.worker()
    send(web, "tg", 101, "Hola.")
    fake_telegram.wait_for("sendMessage", timeout=15)
    chat = conversation()
    call(web, key, chat.pk, "takeover")
    # Time injected: the person's last sign of life six minutes ago.
    Conversation.objects.filter(pk=chat.pk).update(person_active_at=timezone.now() - timedelta(minutes=6))
    wait_until(lambda: Conversation.objects.get(pk=chat.pk).state == ConversationState.AGENT, timeout=15,
               message="given back by the worker's housekeeping")
    send(web, "tg", 101, "¿Hay alguien?")
    fake_telegram.wait_for("sendMessage", count=2, timeout=15)
    assert AuditEvent.objects.filter(kind=EventKind.CONVERSATION_GIVEN_BACK, actor="idle").exists()


def test_the_agent_hands_the_chat_to_a_person_with_the_handoff_tool(processes, make_channel, fake_telegram):
    from tests.fakes.openai_api import FakeOpenAI, Reply, ToolCalls

    with FakeOpenAI() as fake_openai:
        fake_openai.script(ToolCalls([("handoff", {"reason": "asks for a person"})]),
                           Reply("Te paso con una persona, te escribirá en breve."))
        telegram_channel(make_channel, fake_telegram, extra=UNPACED, agent="openai", agent_config={
            "base_url": fake_openai.url, "model": "fake-model", "api_key_env": "FAKE_OPENAI_API_KEY"})
        web, _ = processes.web(wait=False), processes.worker(FAKE_OPENAI_API_KEY="sk-test")
        send(web, "tg", 101, "Quiero hablar con una persona.")
        fake_telegram.wait_for("sendMessage", timeout=15)
        chat = conversation()
        assert chat.state == ConversationState.PERSON and chat.held_by == "agent"
        for n in range(5):
            send(web, "tg", 101, f"¿hola? {n}")
        time.sleep(3.0)
        assert texts(fake_telegram) == ["Te paso con una persona, te escribirá en breve."]
        assert len(fake_openai.requests()) == 2  # the model was not asked again
        assert AuditEvent.objects.filter(kind=EventKind.CONVERSATION_TAKEN_OVER, actor="agent").exists()
