"""Stale recoveries (delivery/ledger/recoveries.py) with real processes and the fake
Telegram Bot API: a reply left mid-send by a SIGKILLed worker, whose conversation then got
a newer reply delivered, is resent dated ("♻️ … from 14:02 — …", in the channel's time zone
and the user's language) or dropped, per the channel; and the ledger's freshness is the
channel's."""

from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from audit.models import AuditEvent, EventKind
from delivery import ledger
from delivery.models import OutboundKind, OutboundMessage, OutboundState
from tests.conftest import wait_until
from tests.end_to_end.test_ledger_e2e import conversation_for, texts
from tests.support.e2e import UNPACED, send, telegram_channel

pytestmark = pytest.mark.e2e
ZONE = "America/Argentina/Buenos_Aires"
FIRST, SECOND = "¿A qué hora abren?", "¿Y los sábados?"


def state_of(row):
    return OutboundMessage.objects.get(pk=row.pk).state


def a_recovery_after_a_newer_reply(processes, make_channel, fake_telegram, **fields):
    """The first reply's send is held by the platform when its worker is SIGKILLed; the
    next worker's labelled resend gets a 500 (resent after its 30 s back-off); meanwhile
    the person asks again and that answer is delivered. Then the back-off runs out."""
    telegram_channel(make_channel, fake_telegram, extra=UNPACED, time_zone=ZONE, **fields)
    web = processes.web()
    hold = fake_telegram.hold("sendMessage")
    worker = processes.worker()
    send(web, "tg", 101, FIRST, language_code="es")
    hold.wait_held(1, timeout=15)
    worker.kill()
    hold.release()
    wait_until(lambda: hold.held == 0, message="the held send answered (to nobody)")  # before the 500 is set
    first = OutboundMessage.objects.get()
    fake_telegram.fail_next("sendMessage", status=500, description="Internal Server Error")
    processes.worker()
    wait_until(lambda: state_of(first) == OutboundState.FAILED, timeout=15, message="the resend to fail")
    send(web, "tg", 101, SECOND, language_code="es")
    wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).count() == 1, timeout=15,
               message="the newer reply delivered")
    assert texts(fake_telegram, 101)[-1] == SECOND
    OutboundMessage.objects.filter(pk=first.pk).update(next_attempt_at=timezone.now())  # the back-off is over
    return first


def test_a_recovery_after_a_newer_reply_says_when_it_was_written(processes, make_channel, fake_telegram):
    first = a_recovery_after_a_newer_reply(processes, make_channel, fake_telegram)
    wait_until(lambda: state_of(first) == OutboundState.DELIVERED, timeout=15, message="the recovery delivered")
    written = first.created_at.astimezone(ZoneInfo(ZONE))
    sent = texts(fake_telegram, 101)
    assert sent[0] == FIRST and sent[2] == SECOND  # the held first send; the newer answer
    assert sent[1].startswith("♻️ Respuesta recuperada — ")  # the 500'd resend: nothing newer then
    assert sent[3] == (f"♻️ Respuesta recuperada de las {written:%H:%M} — puede repetir un mensaje que ya "
                       f"recibiste.\n\n{FIRST}")
    assert len(sent) == 4
    assert AuditEvent.objects.filter(kind=EventKind.REPLY_RECOVERED).count() == 1


def test_a_recovery_after_a_newer_reply_is_dropped_where_the_channel_says_so(processes, make_channel,
                                                                            fake_telegram):
    first = a_recovery_after_a_newer_reply(processes, make_channel, fake_telegram, stale_recoveries="drop")
    wait_until(lambda: state_of(first) == OutboundState.ABANDONED, timeout=15, message="the recovery dropped")
    [event] = AuditEvent.objects.filter(kind=EventKind.REPLY_ABANDONED)
    assert "newer reply was delivered" in event.summary and event.target == f"ledger row {first.pk}"
    assert texts(fake_telegram, 101)[2:] == [SECOND]  # nothing after the newer answer
    assert not AuditEvent.objects.filter(kind=EventKind.REPLY_RECOVERED).exists()


def test_the_freshness_is_the_channels(processes, make_channel, fake_telegram):
    """A reply written 30 h ago goes out on a channel that keeps replies 48 h fresh; one
    written 2 h ago is abandoned, never sent, on a channel that keeps them 1 h."""
    patient = telegram_channel(make_channel, fake_telegram, extra=UNPACED, recovery_freshness=timedelta(hours=48))
    hasty = telegram_channel(make_channel, fake_telegram, slug="tg2", extra=UNPACED,
                             recovery_freshness=timedelta(hours=1))
    old = ledger.enqueue(conversation_for(patient, "101"), "Escrito hace 30 h.", kind=OutboundKind.REPLY)
    late = ledger.enqueue(conversation_for(hasty, "202"), "Escrito hace 2 h.", kind=OutboundKind.REPLY)
    OutboundMessage.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(hours=30))
    OutboundMessage.objects.filter(pk=late.pk).update(created_at=timezone.now() - timedelta(hours=2))
    processes.worker()
    wait_until(lambda: state_of(old) == OutboundState.DELIVERED, timeout=15, message="the 30 h old reply sent")
    wait_until(lambda: state_of(late) == OutboundState.ABANDONED, timeout=15, message="the 2 h old one abandoned")
    assert texts(fake_telegram) == ["Escrito hace 30 h."]
    [event] = AuditEvent.objects.filter(kind=EventKind.REPLY_ABANDONED)
    assert "older than 1 h (its channel's freshness)" in event.summary
