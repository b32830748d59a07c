"""The grown benchmark's pre-filled database (tests/bench/prefill.py), at a small scale:
its set-based INSERTs still fit the models (a new column without a default fails here,
not an hour into `make bench`), and what it writes hangs together."""

import time

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.db.models import F

from audit.models import AuditEvent
from conversations.models import Conversation, InboundMessage, MessageBuffer, Turn
from delivery.models import OutboundMessage
from tests.bench import prefill
from tools.models import ActionClaim

pytestmark = pytest.mark.django_db

SMALL = {"CONVERSATIONS": 2_000, "MESSAGES": 2_000, "LEDGER_ROWS": 3_000, "CLAIMS": 500, "EVENTS": 3_000}


@pytest.fixture
def small(monkeypatch):
    for name, value in SMALL.items():
        monkeypatch.setattr(prefill, name, value)
    big_buffers = prefill.MESSAGES // prefill.BLOCK // 2
    monkeypatch.setattr(prefill, "BIG_BUFFERS", big_buffers)
    monkeypatch.setattr(prefill, "BUFFERS", big_buffers + (prefill.MESSAGES - prefill.MESSAGES // prefill.BLOCK) // 5 * 3)
    channels = prefill.base_rows(prefill.CHANNELS)
    with connection.cursor() as cursor:
        prefill.traffic(cursor, prefill.Sql(connection, time.time()), [channels[s].pk for s in prefill.CHANNELS])
    return channels


def test_the_prefill_writes_every_table_as_counted(small):
    assert (Conversation.objects.count(), InboundMessage.objects.count(), OutboundMessage.objects.count(),
            ActionClaim.objects.count(), AuditEvent.objects.count()) == (2_000, 2_000, 3_000, 500, 3_000)
    assert MessageBuffer.objects.count() == Turn.objects.count() == prefill.BUFFERS


def test_its_rows_hang_together(small):
    assert InboundMessage.objects.filter(conversation_id=prefill.BIG).count() == 2_000 // prefill.BLOCK
    # Each message's buffer is its own conversation's, and each turn's too.
    assert not InboundMessage.objects.exclude(buffer__conversation_id=F("conversation_id")).exists()
    assert not Turn.objects.exclude(buffer__conversation_id=F("conversation_id")).exists()
    assert not OutboundMessage.objects.exclude(turn__conversation_id=F("conversation_id")).exists()
    # Nothing owed: a worker started on it has nothing to do.
    assert not MessageBuffer.objects.filter(state="open").exists()
    assert not Turn.objects.filter(state__in=Turn.ACTIVE).exists()
    assert not OutboundMessage.objects.filter(state__in=OutboundMessage.OPEN).exists()
    first, last = (InboundMessage.objects.order_by(f).values_list("received_at", flat=True).first()
                   for f in ("received_at", "-received_at"))
    assert 6.9 < (last - first).total_seconds() / 86400 <= 7.0  # a week


def test_the_staff_user_signs_in_to_the_long_conversations_story(small, client):
    staff = User.objects.get(username=prefill.STAFF[0])
    assert staff.check_password(prefill.STAFF[1]) and staff.is_staff  # as the benchmark signs in
    client.force_login(staff)
    assert client.get(f"/console/conversations/{prefill.BIG}/story/").status_code == 200
