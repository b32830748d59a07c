"""Scheduled messages in-process: the API that schedules them, a tick's one ledger row,
and WhatsApp's 24-hour window (a tick outside it waits and says why)."""

from datetime import timedelta

from django.utils import timezone

from conversations import schedules
from conversations.models import Contact, Conversation, InboundMessage
from delivery.models import OutboundKind, OutboundMessage, ScheduledMessage, ScheduleState
from tests.whatsapp import whatsapp_settings


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
