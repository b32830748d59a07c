"""Bots that talk to bots (conversations.loops), through the real web server and
worker and the fake Telegram Bot API, which delivers what one bot says in a group to
the other (FakeBotAPI.relay): a bot the channel does not allow is kept as context and
never answered; two allowed echo bots mentioning each other are stopped after the
channel's bound, the operator is told (dashboard, audit, metric), and the paused
conversation answers again once the operator gives it back."""

import time

import pytest

from agentloop.console import dashboard
from audit.models import AuditEvent, EventKind
from conversations.loops import LOOP_BREAKER
from conversations.models import Conversation, ConversationState, Disposition, InboundMessage, Turn
from tests.conftest import wait_until
from tests.end_to_end.test_metrics import TOKEN as METRICS_TOKEN
from tests.end_to_end.test_metrics import scrape, value
from tests.support import local_http
from tests.support.e2e import UNPACED

pytestmark = pytest.mark.e2e

GROUP = -100555
ALPHA, BETA = "1111:ALPHA-TOKEN", "2222:BETA-TOKEN"
AGENTS = {"AGENTLOOP_EXTRA_AGENTS": "named=tests.support.agents_for_tests.NamedEchoAgent"}


def bot_channel(make_channel, fake, slug, token, **fields):
    """A Telegram channel in polling mode (the relay's updates are fetched), whose groups
    answer only what mentions its bot."""
    fields.setdefault("agent", "named")
    for window in ("window_closed", "window_greeting", "window_open", "window_neutral"):
        fields.setdefault(window, 0.3)  # the bots' replies follow each other quickly
    return make_channel(slug, kind="telegram", group_replies="mention", platform_settings={
        "bot_token": token, "api_base": fake.url, "mode": "polling", **UNPACED}, **fields)


def human_says(fake, token, text, user_id=501, name="Ana"):
    """A person's message in the group, as the bot behind `token` receives it."""
    mention = text.split()[0]
    fake.push_message(token, GROUP, text, user_id=user_id, first_name=name, chat_type="supergroup",
                      entities=[{"type": "mention", "offset": 0, "length": len(mention)}])


def sent(fake, token):
    return [c.params["text"] for c in fake.calls("sendMessage", token=token)]


def settled(fake, seconds=2.0, timeout=30.0, method="sendMessage"):
    """Wait until no bot has sent anything for `seconds`; the count of messages sent
    (`method`: the fake's sending method, chat.postMessage on the fake Slack)."""
    deadline = time.monotonic() + timeout
    count, since = len(fake.calls(method)), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = len(fake.calls(method))
        if now != count:
            count, since = now, time.monotonic()
        elif time.monotonic() - since >= seconds:
            return count
    raise AssertionError(f"the bots were still talking after {timeout} s: {count} messages")


def test_a_bot_the_channel_does_not_allow_is_kept_as_context_and_audited_once(processes, make_channel, fake_telegram):
    fake_telegram.name_bot(ALPHA, "alpha_bot")
    fake_telegram.name_bot(BETA, "beta_bot")
    fake_telegram.relay(GROUP, [ALPHA, BETA])
    bot_channel(make_channel, fake_telegram, "alpha", ALPHA, agent_config={"name": "alpha", "mention": "beta_bot"})
    bot_channel(make_channel, fake_telegram, "beta", BETA, agent_config={"name": "beta"})  # allows no bot
    web, _ = processes.web(wait=False, AGENTLOOP_METRICS_TOKEN=METRICS_TOKEN, **AGENTS), processes.worker(**AGENTS)
    human_says(fake_telegram, ALPHA, "@alpha_bot hola")
    human_says(fake_telegram, ALPHA, "@alpha_bot ¿y los sábados?", user_id=502, name="Beto")
    wait_until(lambda: InboundMessage.objects.filter(disposition=Disposition.BOT).count() == 2, timeout=20,
               message="both of alpha's replies kept by beta as a bot's messages")
    settled(fake_telegram)
    assert len(sent(fake_telegram, ALPHA)) == 2 and sent(fake_telegram, BETA) == []
    kept = InboundMessage.objects.filter(channel__slug="beta").get(text__contains="¿y los sábados?")
    assert kept.from_bot is True and kept.buffer_id is None and kept.sender_name
    assert not Turn.objects.filter(conversation__channel__slug="beta").exists()
    [event] = AuditEvent.objects.filter(kind=EventKind.BOT_MESSAGE_IGNORED)  # the first of the conversation
    assert event.channel_slug == "beta"
    assert value(scrape(web), "agentloop_bot_messages_ignored_total") == 2
    # A person mentioning beta is answered, the bot's messages given as the group's context.
    human_says(fake_telegram, BETA, "@beta_bot ¿qué dijo alpha?", user_id=503, name="Carla")
    fake_telegram.wait_for("sendMessage", token=BETA, timeout=15)
    turn = Turn.objects.get(conversation__channel__slug="beta")
    assert "¿y los sábados?" in turn.merged_input and turn.merged_input.endswith("¿qué dijo alpha?")


def test_two_echo_bots_mentioning_each_other_are_stopped_after_n_and_the_operator_told(
        processes, make_channel, fake_telegram, agent_key):
    fake_telegram.name_bot(ALPHA, "alpha_bot")
    fake_telegram.name_bot(BETA, "beta_bot")
    fake_telegram.relay(GROUP, [ALPHA, BETA])
    bound = {"loop_max_replies": 3, "loop_window_seconds": 120}
    bot_channel(make_channel, fake_telegram, "alpha", ALPHA, agent_config={"name": "alpha", "mention": "beta_bot"},
                allowed_bots="beta_bot", **bound)
    beta = bot_channel(make_channel, fake_telegram, "beta", BETA, agent_config={"name": "beta", "mention": "alpha_bot"},
                       allowed_bots="@Alpha_Bot", **bound)
    key = agent_key(beta, name="operator")
    web, _ = processes.web(wait=False, AGENTLOOP_METRICS_TOKEN=METRICS_TOKEN, **AGENTS), processes.worker(**AGENTS)

    human_says(fake_telegram, ALPHA, "@alpha_bot hola a los dos")
    paused = wait_until(lambda: Conversation.objects.filter(held_by=LOOP_BREAKER).first(), timeout=40,
                        message="a conversation paused by the loop breaker")
    settled(fake_telegram)
    # Alpha answered the person, then each bot answered the other three times: beta's
    # fourth turn never ran (alpha's third reply reached a conversation at its bound).
    assert (paused.channel.slug, paused.state) == ("beta", ConversationState.PERSON)
    assert len(sent(fake_telegram, BETA)) == 3 and len(sent(fake_telegram, ALPHA)) == 4
    assert all(text.startswith("@alpha_bot (beta)") for text in sent(fake_telegram, BETA))
    held = InboundMessage.objects.get(conversation=paused, disposition=Disposition.HELD)
    assert held.from_bot is True
    assert Turn.objects.filter(conversation=paused).count() == 3

    # The operator is told: an audit event, the dashboard's list, the metric.
    [event] = AuditEvent.objects.filter(kind=EventKind.LOOP_BROKEN)
    assert event.conversation_id == paused.pk and "3 agent replies" in event.summary
    assert AuditEvent.objects.filter(kind=EventKind.CONVERSATION_TAKEN_OVER, actor=LOOP_BREAKER).count() == 1
    picture = dashboard.snapshot()
    assert [row["conversation"] for row in picture["paused"]] == [paused.pk]
    assert any(e["event"] == EventKind.LOOP_BROKEN for e in picture["events"])
    assert value(scrape(web), "agentloop_loops_broken_total") == 1

    # Not given back by the idle time (that is a person's hold): an operator releases it.
    released = local_http.post(f"{web.url}/api/v1/conversations/{paused.pk}/release",
                               headers={"Authorization": f"Bearer {key}"}, timeout=10)
    assert released.status_code == 200 and released.json()["changed"] is True
    # A person's message afterwards is answered by beta; beta's answer reaches alpha,
    # whose own conversation with beta is at its bound: that side stops at once.
    human_says(fake_telegram, BETA, "@beta_bot ¿seguís ahí?", user_id=503, name="Carla")
    wait_until(lambda: len(sent(fake_telegram, BETA)) == 4, timeout=15, message="beta answering the person")
    assert sent(fake_telegram, BETA)[-1] == "@alpha_bot (beta) Carla: @beta_bot ¿seguís ahí?"
    wait_until(lambda: Conversation.objects.filter(held_by=LOOP_BREAKER, state=ConversationState.PERSON,
                                                   channel__slug="alpha").exists(), timeout=15,
               message="alpha's side paused")
    settled(fake_telegram)
    assert len(sent(fake_telegram, ALPHA)) == 4
    paused.refresh_from_db()
    assert paused.state == ConversationState.AGENT
    assert value(scrape(web), "agentloop_loops_broken_total") == 2
