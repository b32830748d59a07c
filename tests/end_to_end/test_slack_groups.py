"""Slack channels follow the common `group_replies` rule (conversations.groups), end to
end: the real web server receiving signed Events API requests, the real worker, the
openai agent asking the local fake OpenAI-compatible server through the official SDK,
replies through slack-sdk to the local fake Web API."""

import time

import pytest

from conversations.models import Disposition, InboundMessage, Turn
from tests.conftest import wait_until
from tests.fakes import slack_api
from tests.fakes.openai_api import FakeOpenAI, Reply
from tests.support.slack import CHANNEL, deliver, slack_channel, slack_settings

pytestmark = pytest.mark.e2e
KEY_ENV = {"FAKE_OPENAI_API_KEY": "sk-test-agentloop"}
BOT = slack_api.BOT_USER
UNPACED = {"messages_per_second": 0, "chat_interval": 0}
ANA, BETO, CARLA, DANI, EVA = "U0ANA00001", "U0BETO0002", "U0CARLA003", "U0DANI0004", "U0EVA00005"


@pytest.fixture
def fake_slack():
    with slack_api.FakeSlackAPI() as fake:
        yield fake


def say(web, user, text, **fields):
    """A channel message as Slack sends it: the `message` event, and for a mention of the
    app its `app_mention` event too (one message, stored once)."""
    event = slack_api.message_event(user, text, channel=CHANNEL, channel_type="channel", **fields)
    deliver(web, slack_api.envelope(event))
    if f"<@{BOT}>" in text:
        deliver(web, slack_api.envelope({**event, "type": "app_mention"}))
    return event


def test_five_members_two_mentions_make_two_turns_with_the_channel_as_context(processes, make_channel,
                                                                               fake_slack):
    with FakeOpenAI() as model:
        model.script(Reply("Abrimos a las 9."), Reply("Los sábados no abrimos."), Reply("De nada."))
        slack_channel(make_channel, fake_slack, settings=slack_settings(fake_slack, **UNPACED),
                      group_replies="mention", agent="openai", agent_config={
                          "base_url": model.url, "model": "fake-model", "api_key_env": "FAKE_OPENAI_API_KEY"})
        web, _ = processes.web(wait=False), processes.worker(**KEY_ENV)
        say(web, ANA, "hola a todos")
        say(web, BETO, "alguien fue ayer")
        carla = say(web, CARLA, f"<@{BOT}> ¿a qué hora abren?")
        [first] = fake_slack.wait_for("chat.postMessage", timeout=20)
        say(web, DANI, "yo quiero el martes")
        say(web, EVA, f"<@{BOT}> ¿y los sábados?")
        fake_slack.wait_for("chat.postMessage", count=2, timeout=20)
        wait_until(lambda: InboundMessage.objects.filter(disposition=Disposition.CONTEXT).count() == 3,
                   timeout=15, message="the three unmentioned messages kept as context")
        time.sleep(1.0)  # nothing more comes of them
        assert Turn.objects.count() == 2 and len(fake_slack.calls("chat.postMessage")) == 2
        first_request, second_request = model.requests()
        # A reply in the thread the app answered Carla in counts as addressed (no mention).
        say(web, CARLA, "gracias", thread_ts=carla["ts"], parent_user_id=CARLA)
        fake_slack.wait_for("chat.postMessage", count=3, timeout=20)
    seen = first_request.messages[-1]["content"]
    assert seen == (f"[Earlier in the group, not addressed to you]\n<@{ANA}>: hola a todos\n"
                    f"<@{BETO}>: alguien fue ayer\n[Addressed to you]\n<@{CARLA}>: ¿a qué hora abren?")
    later = second_request.messages[-1]["content"]
    assert f"<@{DANI}>: yo quiero el martes" in later and "hola a todos" not in later
    assert later.endswith(f"<@{EVA}>: ¿y los sábados?")
    assert first.body["channel"] == CHANNEL and first.body["thread_ts"] == carla["ts"]
    assert first.body["text"] == "Abrimos a las 9."
    third = fake_slack.calls("chat.postMessage")[2]
    assert third.body["thread_ts"] == carla["ts"] and third.body["text"] == "De nada."
    assert InboundMessage.objects.get(text="gracias").mentioned is True


def test_never_stores_the_channel_and_answers_nothing(processes, make_channel, fake_slack):
    slack_channel(make_channel, fake_slack, settings=slack_settings(fake_slack, **UNPACED), group_replies="never")
    web, _ = processes.web(wait=False), processes.worker()
    say(web, ANA, f"<@{BOT}> ¿hola?")
    say(web, BETO, "nadie responde")
    wait_until(lambda: InboundMessage.objects.filter(disposition=Disposition.CONTEXT).count() == 2, timeout=15,
               message="both messages kept as context")
    time.sleep(0.5)
    assert not Turn.objects.exists() and fake_slack.calls("chat.postMessage") == []
