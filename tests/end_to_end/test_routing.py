"""Routing rules (conversations.routing), through the real web server and worker and
the fake Telegram Bot API: three forum topics of one group go to three agents (echo
agents that say who they are), a burst no rule matches to the channel's own agent, and
an agent hands the conversation to another with the guarded handoff_to_agent tool —
once, though asked twice — which holds until /reset."""

import json

import pytest

from audit.models import AuditEvent, EventKind
from conversations.models import Conversation, RoutingRule, Turn
from tests.conftest import wait_until
from tests.support import local_http
from tests.support.e2e import SECRET, UNPACED, send, telegram_channel, update
from tools.models import ActionClaim

pytestmark = pytest.mark.e2e

FORUM = -100888
AGENTS = {"AGENTLOOP_EXTRA_AGENTS": "named=tests.support.agents_for_tests.NamedEchoAgent,"
                                    "scripted=tests.support.agents_for_tests.ScriptedToolAgent"}


def in_topic(web, topic, text, user_id=701):
    """A person's message in one of the forum's topics (message_thread_id)."""
    body = update(FORUM, text, user_id=user_id, first_name="Ana")
    body["message"].update({"chat": {"id": FORUM, "type": "supergroup", "title": "Tienda", "is_forum": True},
                            "message_thread_id": topic, "is_topic_message": True})
    response = local_http.post(f"{web.url}/webhooks/telegram/tg/", json=body,
                               headers={"X-Telegram-Bot-Api-Secret-Token": SECRET}, timeout=10)
    assert response.status_code == 200, response.text


def rule(channel, position, name, **fields):
    return RoutingRule.objects.create(channel=channel, position=position, name=name, agent="named",
                                      agent_config={"name": name}, **fields)


def test_rules_route_three_topics_to_three_agents(processes, make_channel, fake_telegram):
    channel = telegram_channel(make_channel, fake_telegram, extra=UNPACED, agent="named",
                               agent_config={"name": "front desk"})
    rule(channel, 1, "sales", chat_id=str(FORUM), thread_id="11")
    rule(channel, 2, "support", thread_id="22")
    rule(channel, 3, "billing", keywords="factura, invoice")
    rule(channel, 4, "never", keywords="factura", language="de")  # after billing: never reached
    web, _ = processes.web(wait=False, **AGENTS), processes.worker(**AGENTS)

    for count, (topic, text) in enumerate([(11, "¿Precio del plan anual?"), (22, "No me anda el login."),
                                           (33, "Necesito la FACTURA de marzo."), (33, "¿Hay alguien?")], 1):
        in_topic(web, topic, text)
        fake_telegram.wait_for("sendMessage", count=count, timeout=15)
    replies = [(c.params["text"], int(c.params["message_thread_id"])) for c in fake_telegram.calls("sendMessage")]
    assert replies == [("(sales) Ana: ¿Precio del plan anual?", 11), ("(support) Ana: No me anda el login.", 22),
                       ("(billing) Ana: Necesito la FACTURA de marzo.", 33), ("(front desk) Ana: ¿Hay alguien?", 33)]
    routes = list(Turn.objects.order_by("pk").values_list("routing_rule__name", "route"))
    assert routes == [("sales", "rule sales: chat -100888, thread 11"), ("support", "rule support: thread 22"),
                      ("billing", "rule billing: keyword 'factura'"), (None, None)]

    # The story page says which rule chose the agent.
    from django.contrib.auth import get_user_model
    from django.test import Client

    operator = get_user_model().objects.create_superuser("op", password="pw")
    client = Client()
    client.force_login(operator)
    page = client.get(f"/console/conversations/{Conversation.objects.get().pk}/story/").content.decode()
    assert "rule billing: keyword &#x27;factura&#x27;" in page and "rule sales: chat -100888, thread 11" in page


def test_an_agent_hands_the_conversation_over_once_though_asked_twice_until_reset(
        processes, make_channel, fake_telegram):
    handoff = {"name": "handoff_to_agent", "arguments": {"agent": "support", "reason": "a broken login"}}
    channel = telegram_channel(make_channel, fake_telegram, extra=UNPACED, agent="scripted",
                               agent_config={"tool_calls": [handoff, {**handoff, "arguments": {
                                   "agent": "support", "reason": "asked again"}}]})
    rule(channel, 1, "support")  # no criterion: reached only by a handoff
    web, _ = processes.web(wait=False, **AGENTS), processes.worker(**AGENTS)

    send(web, "tg", 101, "No puedo entrar a mi cuenta.")
    [first] = fake_telegram.wait_for("sendMessage", timeout=15)
    results = [json.loads(line) for line in first.params["text"].splitlines()]
    assert [r["status"] for r in results] == ["done", "duplicate"]
    assert results[0]["result"]["handed_to_agent"] == "support"
    conversation = Conversation.objects.get()
    assert conversation.pinned_rule.name == "support"
    [event] = AuditEvent.objects.filter(kind=EventKind.AGENT_HANDOFF)
    assert (event.summary, event.extra["to_agent"], event.actor) == ("a broken login", "support", "agent")
    assert ActionClaim.objects.filter(action="handoff_to_agent").count() == 1

    send(web, "tg", 101, "¿Me ayudás?")
    second = fake_telegram.wait_for("sendMessage", count=2, timeout=15)[1]
    assert second.params["text"] == "(support) ¿Me ayudás?"
    assert Turn.objects.order_by("pk").last().route == "handed over to support"

    send(web, "tg", 101, "/reset")
    fake_telegram.wait_for("sendMessage", count=3, timeout=15)
    wait_until(lambda: Conversation.objects.get().pinned_rule_id is None, message="the pin lifted by /reset")
