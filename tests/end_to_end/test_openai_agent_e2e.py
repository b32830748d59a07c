"""The openai agent end to end: the product's real processes, python-telegram-bot talking
to the local fake Bot API, the official openai SDK talking to the local fake
OpenAI-compatible server, both with scripted answers."""

import json

import pytest

from audit.models import AuditEvent, EventKind
from conversations.models import BufferState, MessageBuffer, Turn, TurnState
from tests.conftest import wait_until
from tests.fakes.openai_api import Delay, FakeOpenAI, Reply, ToolCalls
from tests.support.e2e import send, telegram_channel
from tools.models import CalendarEvent

pytestmark = pytest.mark.e2e
KEY_ENV = {"FAKE_OPENAI_API_KEY": "sk-test-agentloop"}
PSICO = [{"title": "Psicología", "start_datetime": "2026-12-01T10:00"},
         {"title": "Psicología", "start_datetime": "2026-12-08T10:00"}]


@pytest.fixture
def fake_openai():
    with FakeOpenAI() as fake:
        yield fake


def openai_channel(make_channel, fake_telegram, fake_openai, **config):
    return telegram_channel(make_channel, fake_telegram, agent="openai", agent_config={
        "base_url": fake_openai.url, "model": "fake-model", "api_key_env": "FAKE_OPENAI_API_KEY", **config})


def replies(fake, chat_id=101):
    return [c for c in fake.calls("sendMessage") if int(c.params["chat_id"]) == chat_id]


def tool_results(request):
    return [json.loads(m["content"]) for m in request.messages if m["role"] == "tool"]


def test_the_incident_two_events_two_duplicates_prevented(processes, make_channel, fake_telegram, fake_openai):
    openai_channel(make_channel, fake_telegram, fake_openai)
    fake_openai.script(
        Delay(0.6, then=ToolCalls([("calendar_create_event", PSICO[0]), ("calendar_create_event", PSICO[1])])),
        Reply("Listo, agendé tus dos horas de psicología."),
        # The second turn: the same two events again, now with an end time.
        Delay(0.6, then=ToolCalls([("calendar_create_event", {**PSICO[0], "end_datetime": "2026-12-01T11:00"}),
                                   ("calendar_create_event", {**PSICO[1], "end_datetime": "2026-12-08T11:00"})])),
        Reply("Tus horas ya estaban en tu calendario."),
    )
    web, _ = processes.web(wait=False), processes.worker(**KEY_ENV)
    send(web, "tg", 101, "Confirmo las horas de psicología.")
    [first] = fake_telegram.wait_for("sendMessage", timeout=20)
    send(web, "tg", 101, "Agéndame las horas en mi calendario.")
    second = fake_telegram.wait_for("sendMessage", count=2, timeout=20)[1]

    assert first.params["text"] == "Listo, agendé tus dos horas de psicología."
    assert second.params["text"] == "Tus horas ya estaban en tu calendario."
    assert CalendarEvent.objects.count() == 2
    assert AuditEvent.objects.filter(kind=EventKind.DUPLICATE_PREVENTED).count() == 2
    requests = fake_openai.requests()
    assert len(requests) == 4
    assert {t["function"]["name"] for t in requests[0].tools} >= {"calendar_create_event", "email_send"}
    assert requests[0].messages[0]["role"] == "system" and "read the conversation" in requests[0].messages[0]["content"]
    assert [r["status"] for r in tool_results(requests[1])] == ["done", "done"]
    # The model's second turn sees the first one, and gets the duplicate notes back.
    assert [m["content"] for m in requests[2].messages if m["role"] in ("user", "assistant")] == [
        "Confirmo las horas de psicología.", "Listo, agendé tus dos horas de psicología.",
        "Agéndame las horas en mi calendario."]
    duplicates = tool_results(requests[3])
    assert [d["status"] for d in duplicates] == ["duplicate", "duplicate"]
    assert all(d["duplicate"] and "already carried out" in d["note"] and d["original"]["claim"] for d in duplicates)
    turns = list(Turn.objects.order_by("pk"))
    assert [t.state for t in turns] == [TurnState.DONE, TurnState.DONE] and all(t.fired_effect for t in turns)
    # Typing during each turn (the model took 0.6 s to answer each time).
    typing = [c.wall for c in fake_telegram.calls("sendChatAction")]
    assert any(requests[0].wall <= t <= first.wall for t in typing)
    assert any(requests[2].wall <= t <= second.wall for t in typing)


def test_a_burst_of_three_is_one_model_request(processes, make_channel, fake_telegram, fake_openai):
    openai_channel(make_channel, fake_telegram, fake_openai)
    fake_openai.script(Reply("Perfecto, anotado."))
    web, _ = processes.web(wait=False), processes.worker(**KEY_ENV)
    for text in ["Confirmo psicología y", "también kine y", "el dentista"]:
        send(web, "tg", 101, text)
    [reply] = fake_telegram.wait_for("sendMessage", timeout=20)
    [request] = fake_openai.requests()
    assert request.messages[-1] == {"role": "user", "content": "Confirmo psicología y\ntambién kine y\nel dentista"}
    assert reply.params["text"] == "Perfecto, anotado."


def test_stop_during_a_burst_answers_at_once_and_asks_no_model(processes, make_channel, fake_telegram, fake_openai):
    openai_channel(make_channel, fake_telegram, fake_openai)
    web, _ = processes.web(wait=False), processes.worker(**KEY_ENV)
    send(web, "tg", 101, "Agéndame las horas y")
    send(web, "tg", 101, "/stop")
    [answer] = fake_telegram.wait_for("sendMessage", timeout=10)
    assert answer.params["text"] == "Stopped."
    assert MessageBuffer.objects.get().state == BufferState.DROPPED  # nothing left to become a turn
    assert not Turn.objects.exists() and fake_openai.requests() == []


def test_a_provider_timeout_ends_with_an_apology_and_no_tool_rerun(processes, make_channel, fake_telegram,
                                                                   fake_openai):
    openai_channel(make_channel, fake_telegram, fake_openai, timeout=1)
    fake_openai.script(ToolCalls([("calendar_create_event", PSICO[0])]), Delay(5, then=Reply("too late")))
    web, _ = processes.web(wait=False), processes.worker(**KEY_ENV)
    send(web, "tg", 101, "Agéndame psicología el 1 de diciembre a las 10.")
    [apology] = fake_telegram.wait_for("sendMessage", timeout=20)
    assert "couldn't finish" in apology.params["text"]
    turn = wait_until(lambda: Turn.objects.filter(state=TurnState.FAILED).first(), message="the turn failed")
    assert "did not answer within 1" in turn.outcome and turn.fired_effect
    assert CalendarEvent.objects.count() == 1 and len(fake_openai.requests()) == 2


def test_a_tools_secret_never_reaches_the_model_provider(processes, make_channel, fake_telegram, fake_openai):
    """A tool failing with the value of PARTNER_API_KEY in its message (issue 26): the
    request that carries the tool's result to the provider has it masked."""
    partner_key = "pk-live-Partner-8812ZZ"
    openai_channel(make_channel, fake_telegram, fake_openai)
    fake_openai.script(ToolCalls([("leaky_create", {"name": "x"})]), Reply("No pude hacerlo."))
    web = processes.web(wait=False)
    processes.worker(**KEY_ENV, PARTNER_API_KEY=partner_key, AGENTLOOP_EXTRA_TOOLS="tests.support.tools_for_tests.LeakyCreate")
    send(web, "tg", 101, "Hazlo.")
    fake_telegram.wait_for("sendMessage", timeout=20)
    requests = fake_openai.requests()
    [result] = tool_results(requests[1])
    assert result["status"] == "failed" and "the partner refused key" in result["error"]
    assert partner_key not in json.dumps([r.messages for r in requests])
