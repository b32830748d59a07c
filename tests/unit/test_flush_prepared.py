"""On SQLite a flush works out its turns before its transaction (conversations.flushing._prepare: the
buffers, their messages, the merge, the INSERT's parameter), and inside it uses them
only if what its claim won is what it read. Here another writer runs right after the
preparation, where a concurrent process may: the turn must be made from the rows as
the claim finds them, or not at all. On PostgreSQL nothing is prepared (its claim and
read are one statement); the other writer then runs before the transaction, and the
turn is the same. Time is injected."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from conversations import flushing
from conversations.ingest import Inbound, admit
from conversations.models import Channel, Conversation, InboundMessage, MessageBuffer, Turn, TurnState

T0 = datetime(2026, 12, 5, 9, 0, 0, tzinfo=UTC)
OWNER = "host:1:1:ab"
pytestmark = pytest.mark.django_db


@pytest.fixture
def verdicts(monkeypatch):
    """What each prepared flush found inside its transaction (True: nothing had changed)."""
    found = []
    holds = flushing._Prepared.holds

    def recorded(self, claimed, message_rows):
        found.append(holds(self, claimed, message_rows))
        return found[-1]

    monkeypatch.setattr(flushing._Prepared, "holds", recorded)
    return found


def after_preparing(monkeypatch, other_writer):
    """Run `other_writer` once, right after the next flush's preparation."""
    prepare = flushing._prepare
    pending = [other_writer]

    def prepare_then_write(*args):
        prepared = prepare(*args)
        while pending:
            pending.pop()()
        return prepared

    monkeypatch.setattr(flushing, "_prepare", prepare_then_write)


def sqlite(*found):
    """What `verdicts` holds on SQLite; on PostgreSQL nothing is prepared."""
    return list(found) if connection.vendor == "sqlite" else []


def one_message(channel, chat="9", text="hola y"):
    admit(channel, Inbound(platform_message_id=f"{chat}-1", chat_id=chat, sender_id=chat, text=text), now=T0)
    return MessageBuffer.objects.get(conversation__chat_id=chat)


def test_a_prepared_flush_makes_what_the_orm_would_load(make_channel, verdicts):
    channel = make_channel("prep-rows", agent_config={"delay": 0.5})
    buffer = one_message(channel)
    due = buffer.flush_at + timedelta(seconds=1)

    [turn] = flushing.flush_many([buffer.pk], due, owner=OWNER, start=1)

    assert verdicts == sqlite(True)
    loaded = MessageBuffer.objects.select_related("conversation__channel").get(pk=buffer.pk)
    built = turn.buffer
    for field in MessageBuffer._meta.concrete_fields:
        assert getattr(built, field.attname) == getattr(loaded, field.attname), field.name
    assert (built.state, built.flush_reason) == ("flushed", loaded.planned_reason)
    assert built.flushed_by == loaded.flushed_by and loaded.flushed_by.startswith(f"{OWNER}#")
    for model, mine, theirs in ((Conversation, built.conversation, loaded.conversation),
                                (Channel, built.conversation.channel, loaded.conversation.channel)):
        for field in model._meta.concrete_fields:
            assert getattr(mine, field.attname) == getattr(theirs, field.attname), f"{model.__name__}.{field.name}"
    stored = Turn.objects.get()
    assert (stored.pk, stored.merged_input, stored.state, stored.owner) == (turn.pk, "hola y", TurnState.RUNNING, OWNER)
    assert stored.flush_reason == turn.flush_reason == loaded.planned_reason


def test_the_channels_buffers_of_one_batch_share_one_channel_object(make_channel, verdicts):
    channel = make_channel("prep-share")
    ids = [one_message(channel, chat=str(chat)).pk for chat in (1, 2, 3)]

    made = flushing.flush_many(ids, T0 + timedelta(minutes=1))

    assert len(made) == 3 and len({id(turn.buffer.conversation.channel) for turn in made}) == 1
    assert verdicts == sqlite(True)


def test_a_message_edited_after_the_preparation_is_read_as_edited(make_channel, monkeypatch, verdicts):
    """An edit writes the message's text, then re-plans its buffer (edits._set_text,
    then _correct_open_buffer): a flush may come in between."""
    channel = make_channel("prep-edit")
    buffer = one_message(channel, text="a las 5")
    message = InboundMessage.objects.get()
    after_preparing(monkeypatch, lambda: InboundMessage.objects.filter(pk=message.pk).update(text="a las 6"))

    [turn] = flushing.flush_many([buffer.pk], T0 + timedelta(minutes=1))

    assert turn.merged_input == Turn.objects.get().merged_input == "a las 6"
    assert verdicts == sqlite(False)


def test_a_message_added_after_the_preparation_is_in_the_turn(make_channel, monkeypatch, verdicts):
    """Past its max_wait a buffer stays due as messages come in: the second joins the
    turn, though the preparation read one."""
    channel = make_channel("prep-added")
    buffer = one_message(channel, text="hola y")
    late = T0 + timedelta(seconds=channel.max_wait + 1)
    after_preparing(monkeypatch, lambda: admit(channel, Inbound(
        platform_message_id="9-2", chat_id="9", sender_id="9", text="¿mañana?"), now=late))

    [turn] = flushing.flush_many([buffer.pk], late + timedelta(seconds=1))

    assert turn.merged_input == Turn.objects.get().merged_input == "hola y\n¿mañana?"
    assert MessageBuffer.objects.get(pk=buffer.pk).message_count == 2
    assert verdicts == sqlite(False)


def test_a_channel_changed_after_the_preparation_decides_the_turn(make_channel, monkeypatch, verdicts):
    """A turn is born running under the flushing worker unless its channel's agent is
    an external one that pulls its turns: the channel as the claim finds it decides."""
    channel = make_channel("prep-agent")
    buffer = one_message(channel)
    after_preparing(monkeypatch, lambda: Channel.objects.filter(pk=channel.pk).update(agent="pull"))

    [turn] = flushing.flush_many([buffer.pk], T0 + timedelta(minutes=1), owner=OWNER, start=1)

    assert (turn.state, turn.owner) == (TurnState.READY, "")
    assert Turn.objects.get().state == TurnState.READY
    assert verdicts == sqlite(False)


def test_a_buffer_another_flush_claimed_after_the_preparation_gets_no_second_turn(
        make_channel, monkeypatch, verdicts):
    channel = make_channel("prep-race")
    buffer = one_message(channel)
    due = T0 + timedelta(minutes=1)
    theirs = []
    after_preparing(monkeypatch, lambda: theirs.extend(flushing.flush_many([buffer.pk], due, owner="other:2:2:cd")))

    assert flushing.flush_many([buffer.pk], due, owner=OWNER) == []

    [turn] = theirs
    assert list(Turn.objects.values_list("pk", flat=True)) == [turn.pk]
    assert MessageBuffer.objects.get(pk=buffer.pk).flushed_by.startswith("other:2:2:cd#")
    assert verdicts == sqlite(True)  # the other flush's own; ours lost its claim before comparing
