"""Scheduled messages outside WhatsApp's 24-hour window, end to end: schedules posted to
the real web server's API, two real workers sending through the ledger to the local fake
Graph API, which keeps the platform's rule (free text outside the window fails with
131047; only registered templates with the right parameter count go)."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from conversations.models import Contact, ContextNote, Conversation, InboundMessage
from delivery.models import OutboundMessage, OutboundState, ScheduledMessage, ScheduleState, UnreachableChat
from tests.conftest import wait_until
from tests.fakes.graph_api import FakeGraphAPI
from tests.support import local_http
from tests.support.whatsapp import TOKEN, whatsapp_channel, whatsapp_settings

pytestmark = pytest.mark.e2e
ANA, BETO, CARLA, DANI = "5491100000001", "5491100000002", "5491100000003", "5491100000004"
OTHER_PHONE = "106540352242999"


def quiet_user(channel, wa_id, fake, hours=25):
    """A user whose last message (stored, and known to "Meta") was `hours` ago."""
    person = Contact.objects.create(channel=channel, platform_id=wa_id, display_name=f"u{wa_id[-1]}")
    talk = Conversation.objects.create(channel=channel, contact=person, chat_id=wa_id, sender_id=wa_id)
    then = timezone.now() - timedelta(hours=hours)
    InboundMessage.objects.create(channel=channel, conversation=talk, platform_message_id=f"wamid.{wa_id}",
                                  text="hola", received_at=then)
    fake.user_wrote(wa_id, at=then.timestamp())
    return talk


def schedule(web, key, talk, text, **template):
    response = local_http.post(f"{web.url}/api/v1/conversations/{talk.pk}/schedules", timeout=10,
                               headers={"Authorization": f"Bearer {key}"},
                               json={"text": text, "due_at": timezone.now().isoformat(), **template})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def test_outside_the_window_a_reminder_goes_once_as_the_template_or_waits_or_fails_with_its_reason(
        processes, make_channel, agent_key):
    with FakeGraphAPI(tokens=[TOKEN]) as fake:
        fake.add_template("appointment_reminder", "es", parameters=1)
        templated = whatsapp_channel(make_channel, fake, settings=whatsapp_settings(
            fake, template_name="appointment_reminder", template_language="es", messages_per_second=0))
        plain = whatsapp_channel(make_channel, fake, slug="wa-plain",
                                 settings=whatsapp_settings(fake, phone_number_id=OTHER_PHONE))
        ana, carla, dani = (quiet_user(templated, wa_id, fake) for wa_id in (ANA, CARLA, DANI))
        beto = quiet_user(plain, BETO, fake)
        key = agent_key(templated, plain)
        web = processes.web()
        processes.worker()
        processes.worker()  # two workers race for every tick
        sent = schedule(web, key, ana, "Tu hora es mañana\na las 10.")
        waits = schedule(web, key, beto, "Tu hora es mañana a las 10.")
        missing = schedule(web, key, carla, "Tu hora.", template_name="no_such_template")
        miscounted = schedule(web, key, dani, "martes\n10:00", template_fill="lines")  # 2 parameters for 1
        wait_until(lambda: len(fake.templates_sent(ANA)) == 1, timeout=30, message="Ana's reminder as the template")
        wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.UNREACHABLE).count() == 2, timeout=30,
                   message="the two refused templates recorded")
        wait_until(lambda: ScheduledMessage.objects.get(pk=waits).reason != "", timeout=30,
                   message="Beto's reminder waiting with its reason")
        time.sleep(2.0)  # both workers had more rounds: still once
        [template] = fake.templates_sent(ANA)
        calls = fake.calls("message")
    assert template == {"name": "appointment_reminder", "language": {"code": "es"},
                        "components": [{"type": "body", "parameters": [{"type": "text",
                                                                        "text": "Tu hora es mañana a las 10."}]}]}
    assert all(call.body["type"] == "template" for call in calls)  # never free text outside the window
    assert sorted(call.body["to"] for call in calls) == [ANA, CARLA, DANI]  # nothing to Beto, each once
    row = OutboundMessage.objects.get(conversation=ana)
    assert row.state == OutboundState.DELIVERED and row.dedup_key.startswith(f"schedule:{sent}:")
    assert ContextNote.objects.get(conversation=ana).text.endswith("Tu hora es mañana\na las 10.")
    waiting = ScheduledMessage.objects.get(pk=waits)
    assert waiting.state == ScheduleState.SCHEDULED and "approved templates" in waiting.reason
    assert "neither the schedule nor its channel names one" in waiting.reason
    assert not OutboundMessage.objects.filter(conversation=beto).exists()
    refused = {r.conversation_id: r.last_error for r in OutboundMessage.objects.filter(state=OutboundState.UNREACHABLE)}
    assert "template refused: no such approved template" in refused[carla.pk] and "132001" in refused[carla.pk]
    assert "parameter count differs" in refused[dani.pk] and "132000" in refused[dani.pk]
    assert not UnreachableChat.objects.exists()  # the templates were refused, not the users
    assert {ScheduledMessage.objects.get(pk=pk).state for pk in (sent, missing, miscounted)} == {ScheduleState.SENT}
