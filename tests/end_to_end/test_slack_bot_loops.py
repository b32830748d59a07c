"""Bots that talk to bots on Slack (conversations.loops, docs/routing.md#bots), through
the real web server and worker and the fake Slack with two apps in one channel
(tests/fakes/slack_bots.py: what one app posts reaches every app there as a bot's
`message` event, itself included): our own app's messages are never stored, a bot the
channel does not allow is kept as context and never answered, and two allowed echo bots
mentioning each other are stopped after the channel's bound."""

from dataclasses import replace

import pytest

from audit.models import AuditEvent, EventKind
from conversations.loops import LOOP_BREAKER
from conversations.models import Conversation, ConversationState, Disposition, InboundMessage, Turn
from tests.conftest import wait_until
from tests.end_to_end.test_bot_loops import AGENTS, settled
from tests.fakes.slack_bots import App, SlackWithBots, for_app
from tests.fakes.slack_events import message_event
from tests.support.slack import CHANNEL, SIGNING_SECRET, deliver, slack_channel, slack_settings

pytestmark = pytest.mark.e2e

ALPHA = App("xoxb-1-alpha-token", "U0ALPHA001", "B0ALPHA001", "alpha", "A0ALPHA001", signing_secret=SIGNING_SECRET)
BETA = App("xoxb-2-beta-token", "U0BETA0002", "B0BETA0002", "beta", "A0BETA0002", signing_secret=SIGNING_SECRET)
ANA, CARLA = "U0ANA00001", "U0CARLA003"


@pytest.fixture
def slack():
    with SlackWithBots() as fake:
        fake.relay(CHANNEL)
        yield fake


def bot_channel(make_channel, fake, app, **fields):
    """The Slack channel of one app, whose channel messages are answered (by default)
    only when they are addressed to it. (An agent's `<@U…>` is escaped on its way out: an
    app's reply mentions nobody, so two apps loop by answering in a thread.)"""
    fields.setdefault("agent", "named")
    fields.setdefault("group_replies", "mention")
    for window in ("window_closed", "window_greeting", "window_open", "window_neutral"):
        fields.setdefault(window, 0.3)  # the bots' replies follow each other quickly
    settings = slack_settings(fake, bot_token=app.token, messages_per_second=0, chat_interval=0)
    return slack_channel(make_channel, fake, slug=app.name, settings=settings, **fields)


def listening(fake, web, *apps):
    """The apps' request URLs, now that the web server runs."""
    for app in apps:
        fake.name_bot(replace(app, events_url=f"{web.url}/webhooks/slack/{app.name}/"))


def person_says(web, app, text, user=ANA):
    """A person's channel message, as Slack delivers it to `app`."""
    event = message_event(user, text, channel=CHANNEL, channel_type="channel")
    deliver(web, for_app(app, event), slug=app.name)


def posted(fake, app):
    return [c.body["text"] for c in fake.calls("chat.postMessage") if c.token == app.token]


def test_a_bot_the_channel_does_not_allow_is_context_and_our_own_messages_are_never_stored(
        processes, make_channel, slack):
    bot_channel(make_channel, slack, ALPHA, agent_config={"name": "alpha"})
    bot_channel(make_channel, slack, BETA, agent_config={"name": "beta"}, group_replies="always")  # allows no bot
    web, _ = processes.web(wait=False, **AGENTS), processes.worker(**AGENTS)
    listening(slack, web, ALPHA, BETA)
    person_says(web, ALPHA, f"<@{ALPHA.user_id}> hola")
    wait_until(lambda: InboundMessage.objects.filter(disposition=Disposition.BOT).exists(), timeout=20,
               message="alpha's reply kept by beta as a bot's message")
    wait_until(lambda: len(slack.deliveries) == 2, message="alpha's reply delivered to both apps")
    settled(slack, method="chat.postMessage")
    assert len(posted(slack, ALPHA)) == 1 and posted(slack, BETA) == []
    kept = InboundMessage.objects.get(channel__slug="beta")
    assert kept.from_bot is True and kept.disposition == Disposition.BOT and kept.buffer_id is None
    assert kept.sender_name == "alpha" and kept.conversation.channel.slug == "beta"
    # Alpha's own reply came back to alpha too: acknowledged, never stored, never a turn.
    assert list(InboundMessage.objects.filter(channel__slug="alpha").values_list("text", flat=True)) == ["hola"]
    assert Turn.objects.filter(conversation__channel__slug="alpha").count() == 1
    assert not Turn.objects.filter(conversation__channel__slug="beta").exists()
    assert AuditEvent.objects.filter(kind=EventKind.BOT_MESSAGE_IGNORED, channel_slug="beta").count() == 1
    # A person mentioning beta is answered, alpha's message given as the channel's context.
    person_says(web, BETA, f"<@{BETA.user_id}> ¿qué dijo alpha?", user=CARLA)
    wait_until(lambda: posted(slack, BETA), timeout=15, message="beta answering the person")
    turn = Turn.objects.get(conversation__channel__slug="beta")
    assert "alpha: " in turn.merged_input and "(alpha)" in turn.merged_input
    assert turn.merged_input.endswith("¿qué dijo alpha?")


def test_two_allowed_echo_bots_mentioning_each_other_are_stopped_after_n(processes, make_channel, slack):
    bound = {"loop_max_replies": 3, "loop_window_seconds": 120}
    # Beta answers everything said in the channel; alpha what mentions it or is said in a
    # thread it is in: the thread alpha opened answering the person, which beta answers in.
    bot_channel(make_channel, slack, ALPHA, agent_config={"name": "alpha"}, allowed_bots=BETA.user_id,
                **bound)  # by its user id
    bot_channel(make_channel, slack, BETA, agent_config={"name": "beta"}, allowed_bots="@Alpha",
                group_replies="always", **bound)  # by its name
    web, _ = processes.web(wait=False, **AGENTS), processes.worker(**AGENTS)
    listening(slack, web, ALPHA, BETA)
    person_says(web, ALPHA, f"<@{ALPHA.user_id}> hola a los dos")
    paused = wait_until(lambda: Conversation.objects.filter(held_by=LOOP_BREAKER).first(), timeout=40,
                        message=f"a conversation paused by the loop breaker; {slack.deliveries}, "
                                f"{posted(slack, ALPHA)}, {posted(slack, BETA)}, "
                                f"{list(InboundMessage.objects.values_list('channel__slug', 'disposition', 'text'))}")
    settled(slack, method="chat.postMessage")
    # Alpha answered the person, then each bot answered the other three times: beta's
    # fourth turn never ran (alpha's third reply reached a conversation at its bound).
    assert (paused.channel.slug, paused.state) == ("beta", ConversationState.PERSON)
    assert len(posted(slack, BETA)) == 3 and len(posted(slack, ALPHA)) == 4
    held = InboundMessage.objects.get(conversation=paused, disposition=Disposition.HELD)
    assert held.from_bot is True and held.sender_name == "alpha"
    assert Turn.objects.filter(conversation=paused).count() == 3
    [event] = AuditEvent.objects.filter(kind=EventKind.LOOP_BROKEN)
    assert event.conversation_id == paused.pk and "3 agent replies" in event.summary
    # Neither app ever took its own messages for someone else's.
    for app in (ALPHA, BETA):
        assert not InboundMessage.objects.filter(channel__slug=app.name, sender_name=app.name).exists()
