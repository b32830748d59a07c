"""Limits per person (conversations.limits), through the real web server and worker: a
contact over the hour's turns gets exactly one notice and no turns until the limit
resets (time injected by moving the rows back), another contact is not affected, and a
daily token budget is spent from the usage the (fake) provider reports."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent, EventKind
from conversations import limits
from conversations.models import Contact, Disposition, InboundMessage, Turn, TurnState
from tests.conftest import wait_until
from tests.fakes.openai_api import FakeOpenAI, Reply
from tests.support.e2e import UNPACED, send, telegram_channel

pytestmark = pytest.mark.e2e


def texts(fake, chat_id):
    return [c.params["text"] for c in fake.calls("sendMessage") if int(c.params["chat_id"]) == chat_id]


def say(web, fake, chat_id, text, expect):
    send(web, "tg", chat_id, text)
    wait_until(lambda: len(texts(fake, chat_id)) >= expect, timeout=15, message=f"{expect} replies to {chat_id}")


def test_over_the_hours_turns_one_notice_no_turns_until_the_reset(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram, extra=UNPACED, turns_per_contact_per_hour=2)
    web, _ = processes.web(wait=False), processes.worker()
    say(web, fake_telegram, 101, "uno.", 1)
    say(web, fake_telegram, 101, "dos.", 2)
    say(web, fake_telegram, 101, "tres.", 3)
    for text in ("cuatro.", "cinco."):
        send(web, "tg", 101, text)
        time.sleep(2.0)  # each its own burst
    say(web, fake_telegram, 202, "otra persona.", 1)  # not affected
    time.sleep(1.0)
    assert texts(fake_telegram, 101) == ["uno.", "dos.", limits.LIMIT_NOTICE]
    assert texts(fake_telegram, 202) == ["otra persona."]
    assert Turn.objects.filter(state=TurnState.CANCELLED, outcome__startswith="limit:").count() == 3
    assert InboundMessage.objects.filter(disposition=Disposition.LIMITED).count() == 3  # stored, never dropped
    assert AuditEvent.objects.filter(kind=EventKind.LIMIT_REACHED).count() == 3
    contact = Contact.objects.get(platform_id="101")
    assert contact.limited_until > timezone.now() + timedelta(minutes=55)

    # Time injected: an hour and a bit later.
    past = timedelta(hours=1, minutes=1)
    for turn in Turn.objects.filter(conversation__contact=contact):
        Turn.objects.filter(pk=turn.pk).update(created_at=turn.created_at - past)
    Contact.objects.filter(pk=contact.pk).update(limited_until=contact.limited_until - past)
    say(web, fake_telegram, 101, "seis.", 4)
    assert texts(fake_telegram, 101)[-1] == "seis."


def test_an_operator_lifts_a_limit(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram, extra=UNPACED, turns_per_contact_per_hour=1)
    web, _ = processes.web(wait=False), processes.worker()
    say(web, fake_telegram, 101, "uno.", 1)
    say(web, fake_telegram, 101, "dos.", 2)
    assert texts(fake_telegram, 101)[-1] == limits.LIMIT_NOTICE
    limits.lift([Contact.objects.get(platform_id="101").pk], "ops")
    say(web, fake_telegram, 101, "tres.", 3)
    assert texts(fake_telegram, 101)[-1] == "tres."
    assert AuditEvent.objects.filter(kind=EventKind.LIMIT_LIFTED, actor="ops").exists()


def test_the_daily_token_budget_is_spent_from_reported_usage(processes, make_channel, fake_telegram):
    with FakeOpenAI() as fake_openai:
        fake_openai.script(Reply("Primera respuesta."), Reply("Segunda respuesta."), Reply("Tercera."))
        telegram_channel(make_channel, fake_telegram, extra=UNPACED, agent="openai", tokens_per_contact_per_day=20,
                         agent_config={"base_url": fake_openai.url, "model": "fake-model", "stream": False,
                                       "api_key_env": "FAKE_OPENAI_API_KEY"})
        web, _ = processes.web(wait=False), processes.worker(FAKE_OPENAI_API_KEY="sk-test")
        say(web, fake_telegram, 101, "Hola, una consulta larga sobre mis horas de psicología.", 1)
        first = Turn.objects.get()
        assert first.tokens_used >= 20, "the provider's usage, recorded on the turn"
        say(web, fake_telegram, 101, "¿Y otra cosa?", 2)
        assert texts(fake_telegram, 101) == ["Primera respuesta.", limits.LIMIT_NOTICE]
        assert "model tokens per day" in Contact.objects.get(platform_id="101").limit_reason
