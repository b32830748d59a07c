"""Hostile input at the platforms' inbound URLs (docs/security.md): what a person in a
chat, or anyone who can reach a webhook URL, can send, and what holds.

Per-person limits (issue 51, finding 1): a turn the person cancels with `/stop` cost the
agent all the same, so it counts against the hour's turns and the day's tokens, and a
stream cut before the provider said its usage is charged an estimate of what it read and
wrote. Through the real web server, worker, fake Bot API and fake OpenAI-compatible
provider (the openai SDK streaming from it)."""


import pytest

from conversations import limits
from conversations.models import Turn, TurnState
from tests.conftest import wait_until
from tests.e2e import UNPACED, send, telegram_channel
from tests.fakes.openai_api import FakeOpenAI, Reply

pytestmark = pytest.mark.e2e
CHAT = 101
# 40 pieces 0.2 s apart: 8 s of writing, time enough to /stop it half-way.
SLOW = Reply(" ".join(f"palabra{i}" for i in range(40)), pace=0.2)


@pytest.fixture
def fake_openai():
    with FakeOpenAI() as fake:
        yield fake


def model_channel(make_channel, fake_telegram, fake_openai, stream, **limits_):
    return telegram_channel(make_channel, fake_telegram, agent="openai", extra=UNPACED, agent_config={
        "base_url": fake_openai.url, "model": "fake-model", "api_key_env": "FAKE_OPENAI_API_KEY",
        "stream": stream}, **limits_)


def sent_texts(fake_telegram):
    return [c.params["text"] for c in fake_telegram.calls("sendMessage") if int(c.params["chat_id"]) == CHAT]


def stopped_while_the_model_answers(web, fake_telegram, fake_openai, started):
    """A message whose turn reaches the model, then `/stop` while the model still answers."""
    send(web, "tg", CHAT, "Cuéntame todo sobre mis horas de psicología.")
    wait_until(started, timeout=15, message="the model answering")
    send(web, "tg", CHAT, "/stop")
    return wait_until(lambda: Turn.objects.filter(state=TurnState.CANCELLED).first(), timeout=15,
                      message="the turn cancelled by /stop")


def test_a_turn_stopped_while_the_model_answers_counts_against_the_hour(processes, make_channel, fake_telegram,
                                                                        fake_openai):
    model_channel(make_channel, fake_telegram, fake_openai, stream=False, turns_per_contact_per_hour=1)
    web, _ = processes.web(wait=False), processes.worker(FAKE_OPENAI_API_KEY="sk-test")
    hold = fake_openai.hold()
    stopped_while_the_model_answers(web, fake_telegram, fake_openai, lambda: hold.held)
    hold.release()

    send(web, "tg", CHAT, "Otra pregunta.")
    wait_until(lambda: limits.LIMIT_NOTICE in sent_texts(fake_telegram), timeout=15, message="the limit's notice")
    assert len(fake_openai.requests()) == 1, "the stopped turn was the hour's one turn: no second model request"


def test_a_finished_stream_spends_the_usage_the_provider_reports(processes, make_channel, fake_telegram,
                                                                 fake_openai):
    fake_openai.script(Reply("Primera respuesta, larga y completa."))
    model_channel(make_channel, fake_telegram, fake_openai, stream=True, tokens_per_contact_per_day=20)
    web, _ = processes.web(wait=False), processes.worker(FAKE_OPENAI_API_KEY="sk-test")
    send(web, "tg", CHAT, "Hola, una consulta larga sobre mis horas de psicología.")
    wait_until(lambda: Turn.objects.filter(state=TurnState.DONE).exists(), timeout=15, message="the streamed turn")
    assert fake_openai.requests()[0].body["stream_options"] == {"include_usage": True}
    assert Turn.objects.get().tokens_used >= 20, "the usage the provider sent after the stream's last chunk"

    send(web, "tg", CHAT, "¿Y otra cosa?")
    wait_until(lambda: limits.LIMIT_NOTICE in sent_texts(fake_telegram), timeout=15, message="the limit's notice")
    assert len(fake_openai.requests()) == 1


def test_a_stream_stopped_half_way_is_charged_and_counts(processes, make_channel, fake_telegram, fake_openai):
    fake_openai.script(SLOW)
    model_channel(make_channel, fake_telegram, fake_openai, stream=True, tokens_per_contact_per_day=20)
    web, _ = processes.web(wait=False), processes.worker(FAKE_OPENAI_API_KEY="sk-test")
    turn = stopped_while_the_model_answers(web, fake_telegram, fake_openai, lambda: fake_openai.streamed_chunks >= 5)
    # The provider never said its usage (the stream was cut before its end): the turn is
    # charged an estimate of the prompt it read and the text it wrote.
    wait_until(lambda: Turn.objects.get(pk=turn.pk).tokens_used >= 20, timeout=10, message="the cut stream charged")

    send(web, "tg", CHAT, "Sigue, por favor.")
    wait_until(lambda: limits.LIMIT_NOTICE in sent_texts(fake_telegram), timeout=15, message="the limit's notice")
    assert len(fake_openai.requests()) == 1, "the stopped stream spent the day's budget: no second model request"
