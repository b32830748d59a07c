"""Scheduled messages in-process: the API that schedules them, a tick's one ledger row,
and WhatsApp's 24-hour window (a tick outside it goes as an approved template, or waits
and says why)."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from conversations import schedules
from conversations.models import Contact, ContextNote, Conversation, InboundMessage
from delivery.models import OutboundKind, OutboundMessage, ScheduledMessage, ScheduleState
from tests.support.whatsapp import whatsapp_settings


def conversation(channel, who="ana"):
    person = Contact.objects.create(channel=channel, platform_id=who)
    return Conversation.objects.create(channel=channel, contact=person, chat_id=who, sender_id=who)


def post(client, key, conversation_id, body):
    return client.post(f"/api/v1/conversations/{conversation_id}/schedules", body, content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {key}")


def test_the_api_schedules_into_a_conversation_of_the_keys_channels(client, make_channel, agent_key):
    shop, other = make_channel("shop"), make_channel("other")
    mine, theirs = conversation(shop), conversation(other)
    key = agent_key(shop)
    due = timezone.now() + timedelta(hours=1)
    response = post(client, key, mine.pk, {"text": "Tu hora es mañana.", "due_at": due.isoformat(),
                                           "repeat_every_seconds": 86400, "cancel_on_reply": True})
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["state"], body["repeat_every_seconds"], body["cancel_on_reply"]) == ("scheduled", 86400, True)
    assert ScheduledMessage.objects.get().source == "api"
    assert post(client, key, theirs.pk, {"text": "x", "due_at": due.isoformat()}).status_code == 404
    assert post(client, key, mine.pk, {"text": "", "due_at": due.isoformat()}).status_code == 400


def test_a_repeating_tick_is_written_once_and_the_next_one_set(make_channel):
    talk = conversation(make_channel("shop"))
    due = timezone.now() - timedelta(minutes=1)
    reminder = schedules.schedule(talk, "Toma tu remedio.", due, repeat_every=timedelta(hours=8))
    assert schedules.send_due() == 1
    assert schedules.send_due() == 0  # the next tick is 8 hours away
    assert schedules.send_tick(reminder.pk, due, timezone.now()) is False  # the same tick again: refused
    reminder.refresh_from_db()
    assert (reminder.state, reminder.ticks_sent, reminder.due_at) == (ScheduleState.SCHEDULED, 1,
                                                                        due + timedelta(hours=8))
    [row] = OutboundMessage.objects.all()
    assert (row.kind, row.dedup_key) == (OutboundKind.SCHEDULED, schedules.dedup_key(reminder.pk, due))


def test_on_whatsapp_outside_the_24_hour_window_a_tick_waits_and_says_why(make_channel):
    channel = make_channel("wa", kind="whatsapp", platform_settings=whatsapp_settings())
    talk = conversation(channel, "56911112222")
    now = timezone.now()
    InboundMessage.objects.create(channel=channel, conversation=talk, platform_message_id="wamid.1", text="hola",
                                  received_at=now - timedelta(hours=30))
    reminder = schedules.schedule(talk, "Tu hora es mañana.", now - timedelta(seconds=1))
    assert schedules.send_due(now) == 0
    reminder.refresh_from_db()
    assert reminder.state == ScheduleState.SCHEDULED and "131047" in reminder.reason
    assert reminder.due_at == now + schedules.WAIT_RECHECK and not OutboundMessage.objects.exists()
    # The user writes: the window opens, and the tick goes at its next look.
    InboundMessage.objects.create(channel=channel, conversation=talk, platform_message_id="wamid.2", text="?",
                                  received_at=now + timedelta(minutes=1))
    assert schedules.send_due(now + timedelta(minutes=6)) == 1
    reminder.refresh_from_db()
    assert (reminder.state, reminder.reason) == (ScheduleState.SENT, "")


# --- outside the window: an approved template ----------------------------------------------------


def quiet_whatsapp_talk(make_channel, hours=30, **settings):
    """A WhatsApp conversation whose user last wrote `hours` ago (outside the window)."""
    channel = make_channel("wa", kind="whatsapp", platform_settings=whatsapp_settings(**settings))
    talk = conversation(channel, "56911112222")
    InboundMessage.objects.create(channel=channel, conversation=talk, platform_message_id="wamid.1", text="hola",
                                  received_at=timezone.now() - timedelta(hours=hours))
    return talk


def test_outside_the_window_a_tick_goes_as_the_channels_template_filled_with_its_text(make_channel):
    talk = quiet_whatsapp_talk(make_channel, template_name="appointment_reminder", template_language="es")
    reminder = schedules.schedule(talk, "Tu hora es mañana\na las 10.", timezone.now() - timedelta(seconds=1))
    assert schedules.send_due() == 1
    reminder.refresh_from_db()
    assert (reminder.state, reminder.reason) == (ScheduleState.SENT, "")
    [row] = OutboundMessage.objects.all()
    assert row.template == {"name": "appointment_reminder", "language": "es",
                            "parameters": ["Tu hora es mañana a las 10."]}  # one line: WhatsApp refuses new lines
    assert (row.text, row.chunks, row.dedup_key) == ("Tu hora es mañana\na las 10.", [],
                                                     schedules.dedup_key(reminder.pk, reminder.due_at))
    assert ContextNote.objects.get().text.endswith("Tu hora es mañana\na las 10.")  # in the agent's history


def test_a_schedules_own_template_wins_field_by_field_and_inside_the_window_text_goes(make_channel):
    talk = quiet_whatsapp_talk(make_channel, template_name="appointment_reminder", template_language="es")
    due = timezone.now() - timedelta(seconds=1)
    schedules.schedule(talk, "martes\n10:00\n\nDra. Rojas", due, template_name="appointment_details",
                       template_fill="lines")
    assert schedules.send_due() == 1
    assert OutboundMessage.objects.get().template == {"name": "appointment_details", "language": "es",
                                                      "parameters": ["martes", "10:00", "Dra. Rojas"]}
    InboundMessage.objects.filter(conversation=talk).update(received_at=timezone.now())  # the user wrote
    schedules.schedule(talk, "Recuerda traer tu carnet.", due)
    assert schedules.send_due() == 1
    assert OutboundMessage.objects.order_by("pk").last().template == {}  # free text in the window


def test_without_a_template_it_waits_and_says_so(make_channel):
    talk = quiet_whatsapp_talk(make_channel)
    reminder = schedules.schedule(talk, "Tu hora es mañana.", timezone.now() - timedelta(seconds=1))
    assert schedules.send_due() == 0
    reminder.refresh_from_db()
    assert reminder.state == ScheduleState.SCHEDULED and "neither the schedule nor its channel names one" in \
        reminder.reason and not OutboundMessage.objects.exists()


def test_template_settings_are_checked(make_channel):
    with pytest.raises(ValidationError, match="template_name"):
        make_channel("wa", kind="whatsapp", platform_settings=whatsapp_settings(template_name="Appointment Reminder"))
    with pytest.raises(ValidationError, match="template_language"):
        make_channel("wa", kind="whatsapp", platform_settings=whatsapp_settings(template_language="spanish"))
    with pytest.raises(ValidationError, match="template_fill"):
        make_channel("wa", kind="whatsapp", platform_settings=whatsapp_settings(template_fill="words"))
    talk = quiet_whatsapp_talk(make_channel)
    bad = ScheduledMessage(conversation=talk, text="x", due_at=timezone.now(), template_name="Bad Name")
    with pytest.raises(ValidationError, match="template_name"):
        bad.full_clean()


def test_the_api_takes_a_schedules_own_template_and_refuses_a_bad_one(client, make_channel, agent_key):
    talk = quiet_whatsapp_talk(make_channel)
    key, due = agent_key(talk.channel), (timezone.now() + timedelta(hours=1)).isoformat()
    response = post(client, key, talk.pk, {"text": "Tu hora.", "due_at": due, "template_name": "appointment_reminder",
                                           "template_language": "es_AR", "template_fill": "lines"})
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["template_name"], body["template_language"], body["template_fill"]) == (
        "appointment_reminder", "es_AR", "lines")
    for wrong in ({"template_name": "no spaces"}, {"template_language": "español"}, {"template_fill": "all"}):
        answer = post(client, key, talk.pk, {"text": "x", "due_at": due, **wrong})
        assert answer.status_code == 400 and list(wrong)[0] in answer.content.decode()


def test_the_admin_shows_a_schedules_template_and_its_last_ticks_refusal(admin_client, make_channel):
    talk = quiet_whatsapp_talk(make_channel, template_name="appointment_reminder")
    reminder = schedules.schedule(talk, "Tu hora.", timezone.now() - timedelta(seconds=1),
                                  template_name="no_such_template")
    schedules.send_due()
    OutboundMessage.objects.update(state="unreachable", last_error="template refused: no such approved template")
    page = admin_client.get(f"/admin/delivery/scheduledmessage/{reminder.pk}/change/").content.decode()
    assert "no_such_template" in page and "template refused: no such approved template" in page
    row = OutboundMessage.objects.get()
    page = admin_client.get(f"/admin/delivery/outboundmessage/{row.pk}/change/").content.decode()
    assert "no_such_template (en_US): Tu hora." in page
