"""Retention: old rows go, in batches; nothing a guarantee still needs does (an open
buffer, a ready or running turn, an open ledger row, a claim inside its window or owed,
a conversation's recent history, a file still named). Runs on both databases."""

from datetime import timedelta

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.utils import timezone

from audit.models import AuditEvent, EventKind
from conversations import retention
from conversations.models import (
    BufferState,
    ContextNote,
    InboundMessage,
    MediaFile,
    MediaState,
    MessageBuffer,
    Turn,
    TurnState,
)
from delivery.models import OutboundMessage, OutboundState, ScheduledMessage, ScheduleState, UnreachableChat
from tools.models import ActionClaim, ClaimState, Proposal, ProposalState

pytestmark = pytest.mark.django_db
NOW = timezone.now()


def ago(days):
    return NOW - timedelta(days=days)


def buffer(conversation, days, state=BufferState.FLUSHED):
    return MessageBuffer.objects.create(conversation=conversation, state=state, first_message_at=ago(days),
                                        last_message_at=ago(days), flush_at=ago(days))


def message(conversation, pid, days, buf=None, media_file=None):
    return InboundMessage.objects.create(channel=conversation.channel, conversation=conversation,
                                         platform_message_id=pid, text=f"text {pid}", received_at=ago(days),
                                         buffer=buf, media_file=media_file)


def turn(conversation, days, state=TurnState.DONE, buf=None):
    return Turn.objects.create(conversation=conversation, merged_input=f"input {days}", state=state,
                               flush_reason="window", created_at=ago(days), buffer=buf)


def ledger_row(conversation, days, state):
    return OutboundMessage.objects.create(conversation=conversation, channel=conversation.channel, chat_id="1",
                                          text=f"reply {state}", state=state, created_at=ago(days))


def claim(scope, days_past_window, state, proposal=None):
    row = ActionClaim.objects.create(scope=scope, action="email_send", fingerprint=f"{scope}{state}{proposal}",
                                     state=state, live=False, created_at=ago(days_past_window),
                                     expires_at=ago(days_past_window), lease_until=ago(days_past_window))
    if proposal:
        Proposal.objects.create(claim=row, state=proposal, expires_at=ago(days_past_window))
    return row


@pytest.fixture
def old(make_channel, make_conversation):
    return make_conversation(make_channel("old"), "olga")


@pytest.fixture
def active(make_channel, make_conversation):
    return make_conversation(make_channel("act"), "ana")


def test_old_rows_go_and_what_the_guarantees_need_stays(old, active):
    # An idle conversation: everything past 30 days goes.
    gone_buffer = buffer(old, 40)
    gone_turn = turn(old, 40, buf=gone_buffer)
    gone_message = message(old, "m-old", 40, gone_buffer)
    gone_note = ContextNote.objects.create(conversation=old, text="old note", created_at=ago(40))
    # Never, whatever their age: an open buffer and its message, ready and running turns.
    open_buffer = buffer(old, 40, BufferState.OPEN)
    kept_message = message(old, "m-open", 40, open_buffer)
    ready, running = turn(old, 40, TurnState.READY), turn(old, 41, TurnState.RUNNING)
    # Recent rows stay (a recent turn would make the conversation active: see below).
    recent_message = message(old, "m-new", 2)
    # An active conversation keeps its 20 newest finished turns whatever their age.
    history = [turn(active, 60 - i) for i in range(25)]
    recent_turn = turn(active, 1)
    result = retention.sweep(now=NOW)
    assert result["conversations.Turn"] == 7  # gone_turn, and the active history past its 20 newest (one recent)
    assert not Turn.objects.filter(pk__in=[gone_turn.pk, *[t.pk for t in history[:6]]]).exists()
    assert set(Turn.objects.filter(pk__in=[t.pk for t in history]).values_list("pk", flat=True)) == {
        t.pk for t in history[6:]}
    assert set(Turn.objects.filter(conversation=old).values_list("pk", flat=True)) == {ready.pk, running.pk}
    assert Turn.objects.filter(pk=recent_turn.pk).exists()
    assert set(InboundMessage.objects.values_list("pk", flat=True)) == {kept_message.pk, recent_message.pk}
    assert not InboundMessage.objects.filter(pk=gone_message.pk).exists()
    assert not MessageBuffer.objects.filter(pk=gone_buffer.pk).exists()
    assert MessageBuffer.objects.filter(pk=open_buffer.pk).exists()
    assert not ContextNote.objects.filter(pk=gone_note.pk).exists()


def test_a_message_stays_while_its_turn_does(active):
    buf = buffer(active, 50)
    kept = turn(active, 50, buf=buf)
    turn(active, 1)  # the conversation is active: its history is kept
    msg = message(active, "m1", 50, buf)
    retention.sweep(now=NOW)
    assert Turn.objects.filter(pk=kept.pk).exists() and InboundMessage.objects.filter(pk=msg.pk).exists()


def test_the_ledger_keeps_open_rows_and_recent_finished_ones(old):
    rows = {state: ledger_row(old, 8, state) for state in OutboundState.values}
    recent = ledger_row(old, 6, OutboundState.DELIVERED)
    retention.sweep(now=NOW)
    left = set(OutboundMessage.objects.values_list("pk", flat=True))
    assert left == {rows[s].pk for s in OutboundMessage.OPEN} | {recent.pk}


def test_claims_live_their_window_and_owed_ones_stay():
    gone = claim("contact:1", 31, ClaimState.DONE)
    gone_released = claim("contact:1", 31, ClaimState.RELEASED, proposal=ProposalState.REJECTED)
    inside = claim("contact:1", 29, ClaimState.DONE)
    owed = [claim("contact:1", 90, state) for state in (ClaimState.IN_FLIGHT, ClaimState.UNCERTAIN)]
    proposed = claim("contact:1", 90, ClaimState.PROPOSED, proposal=ProposalState.PENDING)
    window = ActionClaim.objects.create(scope="contact:2", action="a", fingerprint="f", state=ClaimState.DONE,
                                        created_at=ago(40), expires_at=NOW + timedelta(minutes=5),
                                        lease_until=ago(40))  # a long window, still open
    retention.sweep(now=NOW)
    left = set(ActionClaim.objects.values_list("pk", flat=True))
    assert left == {inside.pk, proposed.pk, window.pk, *(c.pk for c in owed)}
    assert not ActionClaim.objects.filter(pk__in=[gone.pk, gone_released.pk]).exists()
    assert list(Proposal.objects.values_list("claim_id", flat=True)) == [proposed.pk]


def test_finished_schedules_and_unreachable_marks_go_after_theirs(old, settings):
    settings.AGENTLOOP_RETAIN_SCHEDULES_DAYS = settings.AGENTLOOP_RETAIN_UNREACHABLE_DAYS = 30

    def schedule(state, created, last_tick=None):
        return ScheduledMessage.objects.create(conversation=old, text=f"{state} {created}", due_at=ago(created),
                                               state=state, created_at=ago(created),
                                               last_sent_at=ago(last_tick) if last_tick is not None else None)

    gone = [schedule(ScheduleState.SENT, 40, last_tick=35), schedule(ScheduleState.CANCELLED, 40)]
    kept = [schedule(ScheduleState.SCHEDULED, 90),  # waiting: never, whatever its age
            schedule(ScheduleState.CANCELLED, 40, last_tick=5),  # a repeating one, its last tick recent
            schedule(ScheduleState.SENT, 10, last_tick=10)]
    chats = {chat: UnreachableChat.objects.create(channel=old.channel, chat_id=chat, error="blocked", since=ago(60),
                                                  last_failure_at=ago(days)) for chat, days in (("a", 31), ("b", 2))}
    result = retention.sweep(now=NOW)
    assert set(ScheduledMessage.objects.values_list("pk", flat=True)) == {row.pk for row in kept}
    assert result["delivery.ScheduledMessage"] == len(gone)
    assert list(UnreachableChat.objects.values_list("pk", flat=True)) == [chats["b"].pk]
    assert dict(retention.defaults())["Scheduled messages"].startswith("30 days after their last tick")


def test_audit_events_stay_a_year():
    old_event = AuditEvent.objects.create(kind=EventKind.CONTROL_COMMAND, at=ago(366))
    year = AuditEvent.objects.create(kind=EventKind.CONTROL_COMMAND, at=ago(300))
    retention.sweep(now=NOW)
    assert list(AuditEvent.objects.values_list("pk", flat=True)) == [year.pk]
    assert not AuditEvent.objects.filter(pk=old_event.pk).exists()


def test_files_go_with_their_rows_and_bytes_named_elsewhere_stay(old, settings, tmp_path,
                                                                django_capture_on_commit_callbacks):
    settings.MEDIA_ROOT = str(tmp_path)
    shared = default_storage.save("media/1/ab/shared", ContentFile(b"shared"))
    alone = default_storage.save("media/1/cd/alone", ContentFile(b"alone"))

    def media(key, name, days, state=MediaState.STORED):
        return MediaFile.objects.create(channel=old.channel, file_key=key, ref=key, kind="photo", state=state,
                                        storage_name=name, created_at=ago(days))

    gone, twin, named = media("a", alone, 40), media("b", shared, 40), media("c", shared, 2)
    fetching = media("d", "", 40, MediaState.FETCHING)
    still_named = media("e", "", 40)
    message(old, "m-new", 2, media_file=still_named)
    with django_capture_on_commit_callbacks(execute=True):  # the bytes go once the rows' deletion commits
        retention.sweep(now=NOW)
    assert set(MediaFile.objects.values_list("pk", flat=True)) == {named.pk, fetching.pk, still_named.pk}
    assert not MediaFile.objects.filter(pk__in=[gone.pk, twin.pk]).exists()
    assert not default_storage.exists(alone) and default_storage.exists(shared)


def test_the_sweep_goes_in_batches_and_stops_at_its_budget(old, settings):
    settings.AGENTLOOP_RETENTION_BATCH = 7
    for n in range(30):
        message(old, f"m{n}", 40)
    assert retention.sweep(now=NOW)["conversations.InboundMessage"] == 30
    for n in range(30):
        message(old, f"n{n}", 40)
    assert retention.sweep(now=NOW, budget_seconds=0) == {}
    assert InboundMessage.objects.count() == 30


def test_files_replies_carried_go_with_their_ledger_rows_unless_a_kept_row_names_them(
        old, settings, tmp_path, django_capture_on_commit_callbacks):
    from delivery import attachments

    settings.MEDIA_ROOT = str(tmp_path)
    channel = old.channel.pk
    alone, shared, kept = (attachments.store(channel, data) for data in (b"alone", b"shared", b"kept"))

    def row(days, state, *names):
        sent = ledger_row(old, days, state)
        sent.chunks = ["text first", {"files": [{"file": n, "name": "f.png", "type": "image/png", "size": 5}
                                                for n in names]}]
        sent.save(update_fields=["chunks"])
        return sent

    gone = row(8, OutboundState.DELIVERED, alone, shared)
    twin = row(9, OutboundState.ABANDONED, shared)
    recent = row(6, OutboundState.DELIVERED, shared)  # kept: it still names the shared bytes
    pending = row(30, OutboundState.PENDING, kept)  # open: kept with its file
    assert all(name.startswith(f"outbound/{channel}/") for name in (alone, shared, kept))
    with django_capture_on_commit_callbacks(execute=True):
        retention.sweep(now=NOW)
    assert set(OutboundMessage.objects.values_list("pk", flat=True)) == {recent.pk, pending.pk}
    assert not OutboundMessage.objects.filter(pk__in=[gone.pk, twin.pk]).exists()
    assert not default_storage.exists(alone)
    assert default_storage.exists(shared) and default_storage.exists(kept)
    recent.delete()
    from delivery.ledger.sweeps import delete_unnamed_files
    assert delete_unnamed_files({shared}) == 1 and not default_storage.exists(shared)
