"""`manage.py backup`: a consistent copy while the product writes; open replies in the copy
are resent labelled by a restored product (never silently twice)."""

import sqlite3
import threading

import pytest
from django.core.management import call_command
from django.db import connection, connections
from django.utils import timezone

from conversations.ingest import Inbound, admit
from conversations.models import BufferState, MessageBuffer, Turn
from delivery import ledger
from delivery.ledger.replies import forget_restore_point
from delivery.models import OutboundKind, OutboundMessage, OutboundState, RestorePoint

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.skipif("connection.vendor != 'sqlite'")
def test_a_sqlite_backup_while_messages_are_admitted(make_channel, make_conversation, tmp_path):
    channel = make_channel("bk")
    conversation = make_conversation(channel)
    ledger.enqueue(conversation, "owed reply", kind=OutboundKind.REPLY)
    sent = ledger.enqueue(conversation, "sent reply", kind=OutboundKind.REPLY)
    OutboundMessage.objects.filter(pk=sent.pk).update(state=OutboundState.DELIVERED)
    stop = threading.Event()

    def write():
        n = 0
        while not stop.is_set():
            admit(channel, Inbound(platform_message_id=f"w{n}", chat_id="x", sender_id="x", text=f"msg {n}"))
            n += 1
        connections.close_all()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        call_command("backup", str(tmp_path / "copy.sqlite3"))
    finally:
        stop.set()
        writer.join()
    copy = sqlite3.connect(tmp_path / "copy.sqlite3")
    assert copy.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    rows = dict(copy.execute("SELECT text, chunks_started > chunks_delivered FROM delivery_outboundmessage"))
    assert rows == {"owed reply": 1, "sent reply": 0}  # the owed one will go out labelled
    assert copy.execute("SELECT COUNT(*) FROM conversations_inboundmessage").fetchone()[0] >= 0
    [(last_buffer, at)] = copy.execute("SELECT last_buffer_id, at FROM delivery_restorepoint").fetchall()
    newest = copy.execute("SELECT COALESCE(MAX(id), 0) FROM conversations_messagebuffer").fetchone()[0]
    assert last_buffer == newest and at.startswith(str(timezone.now().year))  # the copy's newest buffer
    with pytest.raises(Exception, match="exists"):
        call_command("backup", str(tmp_path / "copy.sqlite3"))
    assert connection.vendor == "sqlite"


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_a_postgres_backup_is_a_pg_dump_archive(make_channel, make_conversation, tmp_path):
    import shutil
    import subprocess

    ledger.enqueue(make_conversation(make_channel("bk")), "owed reply", kind=OutboundKind.REPLY)
    call_command("backup", str(tmp_path / "db.dump"))
    listing = subprocess.run([shutil.which("pg_restore"), "--list", str(tmp_path / "db.dump")],
                             capture_output=True, text=True, check=True).stdout
    assert "delivery_outboundmessage" in listing
    call_command("backup", "--mark-restored")  # what the restore procedure runs on the restored database
    assert OutboundMessage.objects.get().chunks_started == 1
    assert RestorePoint.objects.get().last_turn_id == 0


@pytest.fixture
def restore_point():
    forget_restore_point()
    yield
    forget_restore_point()


def test_replies_of_turns_in_flight_at_the_backup_are_written_labelled(make_channel, make_conversation,
                                                                      restore_point):
    conversation = make_conversation(make_channel("bk"))

    def turn(buffer=None):
        return Turn.objects.create(conversation=conversation, merged_input="x", flush_reason="window", buffer=buffer)

    def buffer(state=BufferState.OPEN):
        now = timezone.now()
        return MessageBuffer.objects.create(conversation=conversation, first_message_at=now, last_message_at=now,
                                            flush_at=now, state=state)

    ready, old_buffer = turn(), buffer()
    call_command("backup", "--mark-restored")  # the copy: one turn ready, one buffer open
    later, from_old_buffer, new = turn(), turn(old_buffer), turn(buffer(BufferState.FLUSHED))
    rows = {t.pk: ledger.enqueue(conversation, "reply", kind=OutboundKind.REPLY, turn=t)
            for t in (ready, later, from_old_buffer, new)}
    rows[0] = ledger.enqueue(conversation, "no turn", kind=OutboundKind.NOTICE)
    started = {pk: row.chunks_started for pk, row in rows.items()}
    assert started == {ready.pk: 1, from_old_buffer.pk: 1, later.pk: 0, new.pk: 0, 0: 0}
