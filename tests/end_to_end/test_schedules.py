"""Messages that go out by themselves: each tick through the ledger once, whatever
crashes or races it; cancelled by the user's reply when asked; scheduled by the agent's
guarded tool once however often it is asked."""

import json
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from conversations import schedules
from conversations.models import Contact, ContextNote, Conversation
from delivery.models import OutboundKind, OutboundMessage, OutboundState, ScheduledMessage, ScheduleState
from tests.conftest import wait_until
from tests.support.e2e import UNPACED, send, telegram_channel

pytestmark = pytest.mark.e2e
AGENT = {"AGENTLOOP_EXTRA_AGENTS": "scripted=tests.support.agents_for_tests.ScriptedToolAgent"}


def conversation(channel, chat_id):
    person = Contact.objects.create(channel=channel, platform_id=str(chat_id), display_name=f"c{chat_id}")
    return Conversation.objects.create(channel=channel, contact=person, chat_id=str(chat_id),
                                       sender_id=str(chat_id))


def texts(fake, chat_id=None):
    return [c.params["text"] for c in fake.calls("sendMessage")
            if chat_id is None or int(c.params["chat_id"]) == chat_id]


def test_a_reminder_due_while_the_worker_is_killed_is_sent_once_after_restart(processes, make_channel,
                                                                               fake_telegram):
    channel = telegram_channel(make_channel, fake_telegram)
    talk = conversation(channel, 101)
    processes.worker().kill()
    reminder = schedules.schedule(talk, "Tu hora es mañana a las 10.", timezone.now() + timedelta(seconds=1))
    time.sleep(1.5)  # due, and no worker alive
    processes.worker()
    [sent] = fake_telegram.wait_for("sendMessage", timeout=15)
    assert sent.params["text"] == "Tu hora es mañana a las 10."
    time.sleep(6)  # a second housekeeping round, and the ledger's sweeps: nothing more
    assert texts(fake_telegram) == ["Tu hora es mañana a las 10."]
    reminder.refresh_from_db()
    assert (reminder.state, reminder.ticks_sent) == (ScheduleState.SENT, 1)
    row = OutboundMessage.objects.get()
    assert (row.kind, row.state, row.dedup_key) == (OutboundKind.SCHEDULED, OutboundState.DELIVERED,
                                                    schedules.dedup_key(reminder.pk, reminder.due_at))
    assert ContextNote.objects.get(conversation=talk).text.endswith("Tu hora es mañana a las 10.")


def test_a_reminder_cancelled_by_the_users_reply_is_not_sent(processes, make_channel, fake_telegram):
    channel = telegram_channel(make_channel, fake_telegram)
    talk = conversation(channel, 101)
    web, _ = processes.web(wait=False), processes.worker()
    follow_up = schedules.schedule(talk, "¿Pudiste revisar la propuesta?", timezone.now() + timedelta(seconds=2),
                                   cancel_on_reply=True)
    kept = schedules.schedule(talk, "Recordatorio: cita el lunes.", timezone.now() + timedelta(seconds=2))
    send(web, "tg", 101, "Sí, la revisé.")
    wait_until(lambda: ScheduledMessage.objects.filter(state=ScheduleState.SCHEDULED).count() == 0, timeout=15,
               message="both schedules settled")
    fake_telegram.wait_for("sendMessage", count=2, timeout=15)  # the echo reply and the kept reminder
    time.sleep(1.0)
    follow_up.refresh_from_db()
    assert follow_up.state == ScheduleState.CANCELLED and "the user wrote" in follow_up.reason
    assert sorted(texts(fake_telegram)) == ["Recordatorio: cita el lunes.", "Sí, la revisé."]
    assert kept.pk in ScheduledMessage.objects.filter(state=ScheduleState.SENT).values_list("pk", flat=True)


def test_two_workers_send_two_hundred_reminders_due_at_once_each_once(processes, make_channel, fake_telegram):
    channel = telegram_channel(make_channel, fake_telegram, extra=UNPACED)
    talks = [conversation(channel, 1000 + n) for n in range(20)]
    due = timezone.now() + timedelta(seconds=3)
    ScheduledMessage.objects.bulk_create([ScheduledMessage(conversation=talks[n % 20], text=f"aviso {n}", due_at=due)
                                          for n in range(200)])
    processes.worker(), processes.worker()
    fake_telegram.wait_for("sendMessage", count=200, timeout=60)
    time.sleep(6)  # both workers' next rounds: nothing more
    sent = texts(fake_telegram)
    assert sorted(sent) == sorted(f"aviso {n}" for n in range(200))
    assert OutboundMessage.objects.filter(kind=OutboundKind.SCHEDULED).count() == 200
    assert not ScheduledMessage.objects.exclude(state=ScheduleState.SENT).exists()


def test_reminder_create_asked_twice_schedules_once(processes, make_channel, fake_telegram):
    calls = [{"name": "reminder_create", "arguments": {"text": "Tu cita es mañana.", "due_at": due}}
             for due in ("2027-06-24T09:00", "2027-06-24T09:00:00")]
    telegram_channel(make_channel, fake_telegram, agent="scripted", agent_config={"tool_calls": calls})
    web, _ = processes.web(wait=False), processes.worker(**AGENT)
    send(web, "tg", 101, "Recuérdame mi cita mañana a las 9.")
    [reply] = fake_telegram.wait_for("sendMessage", timeout=15)
    results = [json.loads(line) for line in reply.params["text"].splitlines()]
    assert [r["status"] for r in results] == ["done", "duplicate"], results
    [reminder] = ScheduledMessage.objects.all()
    assert (reminder.text, reminder.state, reminder.source) == ("Tu cita es mañana.", ScheduleState.SCHEDULED,
                                                                "agent")
    assert results[1]["result"]["schedule_id"] == reminder.pk
