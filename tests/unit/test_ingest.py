"""Admission and flushing on the database: dedup, buffers, merge, control commands,
double-texting strategies, recovery. Time is injected."""

from datetime import UTC, datetime, timedelta

import pytest

from audit.models import AuditEvent, EventKind
from conversations import engine, flushing, turns
from conversations.ingest import Inbound, admit
from conversations.models import (
    BufferState,
    Conversation,
    Disposition,
    InboundMessage,
    MessageBuffer,
    Turn,
    TurnState,
    WorkerHeartbeat,
)
from delivery.models import OutboundKind, OutboundMessage

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
pytestmark = pytest.mark.django_db


def at(seconds):
    return T0 + timedelta(seconds=seconds)


def msg(mid, text, *, chat="100", sender="100", **kw):
    return Inbound(platform_message_id=str(mid), chat_id=chat, sender_id=sender, text=text,
                   reply_target=str(mid), **kw)


@pytest.fixture
def channel(make_channel):
    return make_channel("chan")


def test_a_message_is_admitted_once(channel):
    first = admit(channel, msg(1, "hola"), now=at(0))
    again = admit(channel, msg(1, "hola"), now=at(1))
    assert not first.duplicate and again.duplicate
    assert InboundMessage.objects.count() == 1
    buffer = MessageBuffer.objects.get()
    assert buffer.message_count == 1 and buffer.flush_at == at(4.0)  # the retry did not re-arm it


def test_same_platform_id_on_another_channel_is_another_message(channel, make_channel):
    other = make_channel("other")
    admit(channel, msg(1, "hola"), now=at(0))
    assert not admit(other, msg(1, "hola"), now=at(0)).duplicate


def test_a_burst_shares_one_buffer_and_rearms_it(channel):
    admit(channel, msg(1, "Confirmo las horas y"), now=at(0))
    admit(channel, msg(2, "también la cita con"), now=at(1))
    last = admit(channel, msg(3, "¿me avisas?"), now=at(2))
    buffer = MessageBuffer.objects.get()
    assert buffer.message_count == 3
    assert last.flush_at == buffer.flush_at == at(2 + 1.2)
    assert (buffer.window_kind, buffer.planned_reason) == ("closed", "window")


def test_flush_turns_the_buffer_into_one_turn_in_order(channel):
    for i, text in enumerate(["uno y", "dos y", "tres"]):
        admit(channel, msg(i, text), now=at(i))
    assert flushing.flush_due(now=at(4.4)) == []  # 2 + 2.5 s not reached yet
    [turn] = flushing.flush_due(now=at(4.5))
    assert turn.merged_input == "uno y\ndos y\ntres"
    assert (turn.flush_reason, turn.state, turn.reply_target) == ("window", TurnState.READY, "2")
    assert MessageBuffer.objects.get().state == BufferState.FLUSHED


def test_a_buffer_is_flushed_once(channel):
    admit(channel, msg(1, "hola"), now=at(0))
    buffer = MessageBuffer.objects.get()
    assert flushing.flush_buffer(buffer.pk, at(5)) is not None
    assert flushing.flush_buffer(buffer.pk, at(5)) is None
    assert Turn.objects.count() == 1


def test_a_message_after_the_flush_starts_a_new_buffer(channel):
    admit(channel, msg(1, "hola"), now=at(0))
    flushing.flush_due(now=at(5))
    admit(channel, msg(2, "otra cosa."), now=at(6))
    assert MessageBuffer.objects.filter(state=BufferState.OPEN).count() == 1
    assert MessageBuffer.objects.count() == 2


def test_media_joins_the_burst_its_caption_classified_like_text(channel):
    admit(channel, msg(1, "mira esto y"), now=at(0))
    photo = admit(channel, msg(2, "la factura", media_type="photo"), now=at(1))
    assert (photo.window_kind, photo.flush_at) == ("neutral", at(3.5))
    assert flushing.flush_due(now=at(1)) == []  # no longer flushed at once
    [turn] = flushing.flush_due(now=at(3.5))
    assert turn.flush_reason == "window"
    assert turn.merged_input == "mira esto y\n[photo] la factura"


def test_a_photo_then_its_question_is_one_turn(channel):
    photo = admit(channel, msg(1, "", media_type="photo"), now=at(0))
    assert (photo.window_kind, photo.flush_at) == ("media", at(2.5))
    admit(channel, msg(2, "¿qué dice esta boleta?"), now=at(0.6))
    assert flushing.flush_due(now=at(1.7)) == []
    [turn] = flushing.flush_due(now=at(1.8))
    assert turn.merged_input == "[photo]\n¿qué dice esta boleta?"


def album(mid, caption="", group="album-1"):
    return msg(mid, caption, media_type="photo", album_id=group)


def test_an_album_and_its_question_are_one_turn_counted_as_two_messages(channel):
    channel.max_messages = 3
    channel.save()
    admit(channel, album(1, "¿cuánto suman?"), now=at(0))
    for i, when in ((2, 0.05), (3, 0.1), (4, 2.9)):  # the last item a slow upload later
        item = admit(channel, album(i), now=at(when))
        assert item.planned_reason == "album"
    assert MessageBuffer.objects.get().message_count == 1  # four items, one message
    assert flushing.flush_due(now=at(3.3)) == []  # the album window outlasts the caption's closed one
    question = admit(channel, msg(5, "¿cuánto suman en total?"), now=at(3.4))
    assert (question.planned_reason, question.flush_at) == ("window", at(4.6))
    buffer = MessageBuffer.objects.get()
    assert buffer.message_count == 2 and buffer.state == BufferState.OPEN  # not capped at 3
    [turn] = flushing.flush_due(now=at(4.6))
    assert turn.merged_input == "[photo] ¿cuánto suman?\n[photo]\n[photo]\n[photo]\n¿cuánto suman en total?"
    assert list(InboundMessage.objects.order_by("pk").values_list("album_id", flat=True)) == ["album-1"] * 4 + [""]


def test_a_backlog_is_cut_between_albums_never_inside_one(channel):
    channel.max_messages = 2
    channel.media_at_once = True  # everything lands in one buffer before it is flushed
    channel.save()
    for i in range(1, 4):
        admit(channel, album(i, group="a"), now=at(0))
    admit(channel, msg(4, "y esta"), now=at(0))
    for i in range(5, 7):
        admit(channel, album(i, group="b"), now=at(0))
    [first] = flushing.flush_due(now=at(0))
    assert first.merged_input == "[photo]\n[photo]\n[photo]\ny esta"  # album a and the text: two
    rest = MessageBuffer.objects.get(state=BufferState.OPEN)
    assert (rest.message_count, rest.last_album_id) == (1, "b")


def test_two_albums_count_twice_and_the_reason_says_album(channel):
    admit(channel, album(1, group="a"), now=at(0))
    admit(channel, album(2, group="a"), now=at(0.1))
    admit(channel, album(3, group="b"), now=at(1))
    assert MessageBuffer.objects.get().message_count == 2
    [turn] = flushing.flush_due(now=at(4))
    assert turn.flush_reason == "album"


def test_media_flushes_at_once_where_the_channel_chose_it(channel):
    channel.media_at_once = True
    channel.save()
    admit(channel, msg(1, "mira esto y"), now=at(0))
    admit(channel, msg(2, "la factura", media_type="photo"), now=at(1))
    [turn] = flushing.flush_due(now=at(1))
    assert turn.flush_reason == "media"
    assert turn.merged_input == "mira esto y\n[photo] la factura"


def test_max_messages_cap(channel):
    channel.max_messages = 2
    channel.save()
    admit(channel, msg(1, "a y"), now=at(0))
    admit(channel, msg(2, "b y"), now=at(0.5))
    [turn] = flushing.flush_due(now=at(0.5))
    assert turn.flush_reason == "max_messages"


def test_max_wait_cap(channel):
    channel.max_wait = 5.0
    channel.save()
    for i in range(4):
        admit(channel, msg(i, f"parte {i} y"), now=at(i * 1.5))  # never quiet for 4 s
    assert flushing.flush_due(now=at(4.9)) == []
    [turn] = flushing.flush_due(now=at(5.0))
    assert turn.flush_reason == "max_wait"


def test_group_merge_attributes_each_line(channel):
    group = dict(chat="-500", is_group=True)
    admit(channel, msg(1, "hola", sender="7", sender_name="Ana", **group), now=at(0))
    admit(channel, msg(2, "¿agendas?", sender="7", sender_name="Ana", **group), now=at(1))
    admit(channel, msg(3, "yo también", sender="8", sender_name="Bea", **group), now=at(1))
    assert Conversation.objects.count() == 2  # (chat, sender) pairs
    flushed = flushing.flush_due(now=at(10))
    inputs = sorted(t.merged_input for t in flushed)
    assert inputs == ["Ana: hola\nAna: ¿agendas?", "Bea: yo también"]


def test_a_buffer_waits_while_its_conversation_has_a_running_turn(channel):
    admit(channel, msg(1, "Listo."), now=at(0))
    [first] = flushing.flush_due(now=at(2))
    assert turns.start(first.pk, "w1", at(2))
    admit(channel, msg(2, "y otra cosa."), now=at(3))
    admit(channel, msg(3, "¿sí?"), now=at(3.5))
    assert flushing.flush_due(now=at(10)) == []  # enqueue: held until the turn ends
    assert turns.finish(first.pk, "w1", state=TurnState.DONE, reply_text="ok", now=at(11))
    [second] = flushing.flush_due(now=at(11))
    assert second.merged_input == "y otra cosa.\n¿sí?"


def test_only_one_turn_runs_per_conversation(channel):
    conversation = Conversation.objects.create(channel=channel, contact=channel.contacts.create(platform_id="1"),
                                               chat_id="1", sender_id="1")
    a = Turn.objects.create(conversation=conversation, merged_input="a", flush_reason="window")
    b = Turn.objects.create(conversation=conversation, merged_input="b", flush_reason="window")
    assert turns.ready_candidates(10) == [a.pk]
    assert turns.start(a.pk, "w1")
    assert not turns.start(b.pk, "w2")  # the partial unique index refuses it
    assert Turn.objects.get(pk=b.pk).state == TurnState.READY


# --- control commands ---------------------------------------------------------------

def test_stop_drops_the_pending_buffer_and_answers(channel):
    admit(channel, msg(1, "agéndame y"), now=at(0))
    admission = admit(channel, msg(2, "/stop"), now=at(1))
    assert admission.disposition == Disposition.CONTROL
    assert MessageBuffer.objects.get().state == BufferState.DROPPED
    assert MessageBuffer.objects.get().flush_reason == "control"
    assert InboundMessage.objects.get(platform_message_id="1").disposition == Disposition.DROPPED
    reply = OutboundMessage.objects.get()
    assert (reply.kind, reply.text, reply.reply_target) == (OutboundKind.CONTROL, "Stopped.", "2")
    assert flushing.flush_due(now=at(60)) == []


def test_stop_cancels_a_running_turn_without_effects(channel):
    admit(channel, msg(1, "Listo."), now=at(0))
    [turn] = flushing.flush_due(now=at(2))
    turns.start(turn.pk, "w1")
    admit(channel, msg(2, "/stop@agentloop_bot"), now=at(3))
    assert Turn.objects.get(pk=turn.pk).state == TurnState.CANCELLED


def test_stop_never_cancels_a_turn_that_fired_an_effect(channel):
    admit(channel, msg(1, "Listo."), now=at(0))
    [turn] = flushing.flush_due(now=at(2))
    turns.start(turn.pk, "w1")
    assert turns.mark_effect(turn.pk)
    admit(channel, msg(2, "/stop"), now=at(3))
    assert Turn.objects.get(pk=turn.pk).state == TurnState.RUNNING
    assert "already started an action" in OutboundMessage.objects.get().text


def test_reset_clears_the_context(channel):
    admit(channel, msg(1, "Listo."), now=at(0))
    [turn] = flushing.flush_due(now=at(2))
    turns.start(turn.pk, "w1")
    turns.finish(turn.pk, "w1", state=TurnState.DONE, reply_text="hola!")
    admit(channel, msg(2, "¿qué dije?"), now=at(5))
    [second] = flushing.flush_due(now=at(7))
    assert engine.conversation_history(second.conversation, second) == [
        {"role": "user", "content": "Listo."}, {"role": "assistant", "content": "hola!"}]
    admit(channel, msg(3, "/reset"), now=at(8))
    assert Conversation.objects.get().context_reset_at == at(8)
    assert Turn.objects.get(pk=second.pk).state == TurnState.CANCELLED
    admit(channel, msg(4, "¿y ahora?"), now=at(9))
    [third] = flushing.flush_due(now=at(11))
    assert engine.conversation_history(third.conversation, third) == []


def test_start_and_help_answer_without_touching_the_buffer(channel):
    admit(channel, msg(1, "hola y"), now=at(0))
    admit(channel, msg(2, "/start"), now=at(1))
    admit(channel, msg(3, "/help"), now=at(1))
    assert MessageBuffer.objects.get().state == BufferState.OPEN
    assert OutboundMessage.objects.filter(kind=OutboundKind.CONTROL).count() == 2


def test_unknown_slash_text_is_an_ordinary_message(channel):
    assert admit(channel, msg(1, "/weather madrid"), now=at(0)).disposition == Disposition.BUFFERED


# --- double texting -----------------------------------------------------------------

def running_turn(channel, *, effect=False):
    admit(channel, msg(1, "Confirmo las horas."), now=at(0))
    [turn] = flushing.flush_due(now=at(2))
    assert turns.start(turn.pk, "w1", at(2))
    if effect:
        assert turns.mark_effect(turn.pk)
    return turn


@pytest.mark.parametrize("strategy", ["enqueue", "reject", "interrupt", "rollback"])
def test_strategies_before_any_effect(channel, strategy):
    channel.double_texting = strategy
    channel.save()
    turn = running_turn(channel)
    admission = admit(channel, msg(2, "Agéndame las horas."), now=at(3))
    state = Turn.objects.get(pk=turn.pk).state
    if strategy == "enqueue":
        assert admission.disposition == Disposition.BUFFERED and state == TurnState.RUNNING
        assert flushing.flush_due(now=at(10)) == []  # waits for the running turn
    elif strategy == "reject":
        assert admission.disposition == Disposition.REJECTED and state == TurnState.RUNNING
        assert OutboundMessage.objects.get().kind == OutboundKind.NOTICE
        assert AuditEvent.objects.filter(kind=EventKind.MESSAGE_REJECTED).count() == 1
        assert not MessageBuffer.objects.filter(state=BufferState.OPEN).exists()
    else:
        assert admission.disposition == Disposition.BUFFERED and state == TurnState.CANCELLED
        [next_turn] = flushing.flush_due(now=at(10))
        if strategy == "interrupt":  # the interrupted input is carried into the next turn
            assert next_turn.merged_input == "Confirmo las horas.\nAgéndame las horas."
        else:  # rollback drops it
            assert next_turn.merged_input == "Agéndame las horas."


@pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
def test_no_interrupt_after_an_external_effect(channel, strategy):
    channel.double_texting = strategy
    channel.save()
    turn = running_turn(channel, effect=True)
    admission = admit(channel, msg(2, "Agéndame las horas."), now=at(3))
    assert admission.disposition == Disposition.BUFFERED
    assert Turn.objects.get(pk=turn.pk).state == TurnState.RUNNING
    assert AuditEvent.objects.filter(kind=EventKind.STRATEGY_FELL_BACK).count() == 1
    assert flushing.flush_due(now=at(10)) == []  # it falls back to enqueue


def test_cancel_and_effect_race_has_one_winner(channel):
    turn = running_turn(channel)
    assert turns.cancel(turn.pk, "interrupt")
    assert not turns.mark_effect(turn.pk)  # a cancelled turn may not act
    other = running_turn_in_new_conversation(channel)
    assert turns.mark_effect(other.pk)
    assert not turns.cancel(other.pk, "interrupt")


def running_turn_in_new_conversation(channel):
    admit(channel, msg(50, "Listo.", chat="200", sender="200"), now=at(0))
    [turn] = flushing.flush_due(now=at(2))
    turns.start(turn.pk, "w1")
    return turn


# --- recovery ------------------------------------------------------------------------

def test_dead_workers_turns_run_again_unless_they_acted(channel):
    quiet = running_turn(channel)
    acted = running_turn_in_new_conversation(channel)
    turns.mark_effect(acted.pk)
    Turn.objects.filter(pk__in=[quiet.pk, acted.pk]).update(owner="dead-host:1:x")
    WorkerHeartbeat.objects.create(owner="dead-host:1:x", hostname="dead-host", pid=1, seen_at=at(0))
    dead = engine.dead_owners()
    assert dead == ["dead-host:1:x"]
    assert engine.recover_turns(dead) == [quiet.pk]
    assert Turn.objects.get(pk=quiet.pk).state == TurnState.READY
    assert Turn.objects.get(pk=acted.pk).state == TurnState.FAILED  # never re-run blindly
    assert OutboundMessage.objects.get(turn=acted).kind == OutboundKind.NOTICE


def test_recovery_sweep_flushes_overdue_buffers(channel):
    admit(channel, msg(1, "Listo."), now=at(0))
    result = engine.recovery_sweep()
    assert result["flushed"] == 1 and Turn.objects.count() == 1


def test_a_message_racing_the_flusher_starts_the_next_buffer(channel):
    """The flusher claims buffers without locking the conversation: a message that read
    the buffer as open just before it was flushed must not be lost inside it."""
    from conversations.ingest import Arrival, admission

    admit(channel, msg(1, "Listo."), now=at(0))
    stale = MessageBuffer.objects.get()
    flushing.flush_due(now=at(2))  # flushed behind the second message's back
    conversation = Conversation.objects.get()
    late = InboundMessage.objects.create(channel=channel, conversation=conversation, platform_message_id="2",
                                         text="¿y esto?", buffer=stale)
    buffer = admission._rearm(Arrival(channel, conversation, msg(2, "¿y esto?"), at(2)), stale, late, None)
    assert buffer.pk != stale.pk and buffer.state == BufferState.OPEN
    assert InboundMessage.objects.get(pk=late.pk).buffer_id == buffer.pk
    assert Turn.objects.get().merged_input == "Listo."


def test_a_batch_start_falls_back_when_a_conversation_already_runs_a_turn(channel):
    running_turn(channel)  # conversation "100" has a running turn
    admit(channel, msg(60, "¿otra?", chat="300", sender="300"), now=at(0))
    admit(channel, msg(61, "¿más?"), now=at(3))  # waits behind the running turn …
    Turn.objects.create(conversation=Conversation.objects.get(chat_id="100"), merged_input="x",
                        flush_reason="window")  # … and a ready turn there is refused
    [other] = flushing.flush_due(now=at(5))
    ready = list(Turn.objects.filter(state=TurnState.READY).values_list("pk", flat=True))
    started = turns.start_many(ready, "w2", at(6))
    assert [t.pk for t in started] == [other.pk]
