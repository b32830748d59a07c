"""A Spanish-speaking Telegram user whose model is down reads a Spanish apology: the
product's real processes (web server, worker), python-telegram-bot talking to the local
fake Bot API, the openai agent to the local fake OpenAI-compatible server answering 503."""

import pytest

from conversations.models import Contact, Turn, TurnState
from delivery.models import OutboundMessage
from tests.fakes.openai_api import Error, FakeOpenAI
from tests.support.e2e import send, telegram_channel

pytestmark = pytest.mark.e2e
KEY_ENV = {"FAKE_OPENAI_API_KEY": "sk-test-agentloop"}
SPANISH_APOLOGY = "Lo siento — no he podido terminar eso ahora. Inténtalo de nuevo en un momento."
ENGLISH_APOLOGY = "Sorry — I couldn't finish that just now. Please try again in a moment."
PORTUGUESE_APOLOGY = "Desculpe — não consegui terminar isso agora. Tente de novo daqui a pouco."


@pytest.fixture
def fake_openai():
    with FakeOpenAI() as fake:
        yield fake


def texts(fake, chat_id):
    return [c.params["text"] for c in fake.calls("sendMessage") if int(c.params["chat_id"]) == chat_id]


def test_a_spanish_user_whose_model_is_down_reads_a_spanish_apology(processes, make_channel, fake_telegram,
                                                                    fake_openai):
    telegram_channel(make_channel, fake_telegram, agent="openai", language="pt", agent_config={
        "base_url": fake_openai.url, "model": "fake-model", "api_key_env": "FAKE_OPENAI_API_KEY"})
    fake_openai.script(Error(503), Error(503), Error(503))
    web, _ = processes.web(wait=False), processes.worker(**KEY_ENV)
    send(web, "tg", 101, "¿Me confirmas la hora de mañana?", language_code="es")
    send(web, "tg", 202, "Can you confirm tomorrow's time?", language_code="en-GB", first_name="Ann")
    send(web, "tg", 303, "Você confirma o horário?", first_name="João")  # no language: the channel's
    fake_telegram.wait_for("sendMessage", count=3, timeout=20)

    assert texts(fake_telegram, 101) == [SPANISH_APOLOGY]
    assert texts(fake_telegram, 202) == [ENGLISH_APOLOGY]
    assert texts(fake_telegram, 303) == [PORTUGUESE_APOLOGY]
    assert Contact.objects.get(platform_id="101").language == "es"
    assert sorted(OutboundMessage.objects.values_list("language", flat=True)) == ["en", "es", "pt"]
    assert set(Turn.objects.values_list("state", flat=True)) == {TurnState.FAILED}
    assert Turn.objects.get(conversation__chat_id="101").reply_text == SPANISH_APOLOGY
