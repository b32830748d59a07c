"""Matrix, in process: room events parsed (direct rooms, group mention gating by
`m.mentions`, user id or display name, threads, replies' quoted fallback, edits,
reactions, redactions, our own events and malformed ones ignored, encrypted ones
refused); a sync batch admitted with its position stored after it, a redelivered event
admitted once, an unknown edit and reaction answered as such; the homeserver's answers
mapped to the ledger's outcomes; the settings checked.

Against a real Synapse with the real worker: tests/end_to_end/test_matrix_e2e.py."""

import httpx
import pytest
from django.core.exceptions import ValidationError

from audit.models import AuditEvent, EventKind
from conversations.deletions import Deletion
from conversations.edits import Edit, EditResult
from conversations.ingest import Admission, Inbound
from conversations.models import Channel, InboundMessage
from conversations.platforms import get as platform
from conversations.platforms.connection import admit_received
from conversations.platforms.matrix import events
from conversations.platforms.matrix.transport import MatrixTransport
from conversations.reactions import Reaction, ReactionOutcome, ReactionResult
from delivery.models import Outcome
from delivery.transports import Target

BOT, ANA, ROOM = "@bot:example.org", "@ana:example.org", "!room:example.org"


def message(event_id, text, members=2, sender=ANA, **content):
    event = {"type": "m.room.message", "event_id": event_id, "sender": sender, "origin_server_ts": 1_700_000_000_000,
             "content": {"msgtype": "m.text", "body": text, **content}}
    return {"room": ROOM, "event": event, "members": members, "bot": BOT, "bot_name": "Asistente",
            "sender_name": "Ana"}


def test_a_message_in_a_direct_room_is_an_inbound_answering_itself():
    found = events.parse(message("$1", "hola"))
    assert isinstance(found, Inbound)
    assert (found.platform_message_id, found.chat_id, found.sender_id, found.text) == ("$1", ROOM, ANA, "hola")
    assert (found.reply_target, found.is_group, found.mentioned, found.sender_name) == ("$1", False, None, "Ana")
    assert found.sent_at is not None and found.sent_at.year == 2023


def test_in_a_group_a_mention_by_id_name_or_m_mentions_addresses_the_bot():
    def mentioned(text, **content):
        return events.parse(message("$1", text, members=3, **content)).mentioned

    assert mentioned("¿alguien sabe?") is False
    assert mentioned("hola", **{"m.mentions": {"user_ids": [BOT]}}) is True
    assert mentioned(f"{BOT}: ¿abren?") is True
    assert mentioned("asistente, ¿abren?") is True
    assert mentioned("asistentes") is False  # a word, not the name
    assert mentioned("mira", formatted_body=f'<a href="https://matrix.to/#/{BOT}">Asistente</a>') is True


def test_a_thread_keeps_its_root_and_a_reply_loses_its_quoted_fallback():
    found = events.parse(message("$2", "> <@bob:example.org> antes\n> dijo\n\nahora yo",
                                 **{"m.relates_to": {"rel_type": "m.thread", "event_id": "$root"}}))
    assert (found.thread_id, found.text) == ("$root", "ahora yo")


def test_edits_reactions_and_redactions_are_ours_to_apply():
    edit = events.parse(message("$3", "* hola!", **{"m.new_content": {"msgtype": "m.text", "body": "hola!"},
                                                   "m.relates_to": {"rel_type": "m.replace", "event_id": "$1"}}))
    assert isinstance(edit, Edit) and (edit.platform_message_id, edit.text, edit.chat_id) == ("$1", "hola!", ROOM)
    reaction = events.parse({"room": ROOM, "bot": BOT, "event": {
        "type": "m.reaction", "event_id": "$4", "sender": ANA,
        "content": {"m.relates_to": {"rel_type": "m.annotation", "event_id": "$q", "key": "👍"}}}})
    assert isinstance(reaction, Reaction) and (reaction.key, reaction.platform_message_id, reaction.emoji) == (
        "$4", "$q", "👍")
    deletion = events.parse({"room": ROOM, "bot": BOT, "event": {
        "type": "m.room.redaction", "event_id": "$5", "sender": ANA, "redacts": "$1", "content": {}}})
    assert isinstance(deletion, Deletion) and deletion.platform_message_id == "$1"


def test_our_own_events_malformed_ones_and_what_is_not_text_are_nothing_to_act_on():
    assert events.parse(message("$1", "eco", sender=BOT)) is None
    for malformed in (None, [], {}, {"room": ROOM}, {"room": ROOM, "event": "x"},
                      {"room": ROOM, "event": {"type": "m.room.message", "sender": ANA, "content": {}}},
                      {"room": ROOM, "event": {"type": "m.room.message", "event_id": "$1", "sender": ANA,
                                               "content": "x"}},
                      {"next_batch": ""}):
        assert events.parse(malformed) is None
    assert events.parse(message("$1", "   ")) is None
    image = message("$1", "foto.jpg", msgtype="m.image")
    assert events.parse(image) is None
    member = {"room": ROOM, "bot": BOT, "event": {"type": "m.room.member", "event_id": "$6", "sender": ANA,
                                                  "content": {"membership": "join"}}}
    assert events.parse(member) is None


def test_an_encrypted_event_is_a_refusal():
    found = events.parse({"room": ROOM, "bot": BOT, "event": {
        "type": "m.room.encrypted", "event_id": "$7", "sender": ANA, "content": {"algorithm": "m.megolm.v1.aes-sha2"}}})
    assert found == events.Encrypted("$7", ANA, ROOM)


@pytest.fixture
def channel(make_channel):
    return make_channel("mx", kind="matrix", platform_settings={"homeserver": "http://127.0.0.1:1",
                                                                "access_token": "syt_secret"})


@pytest.mark.django_db
def test_a_batch_is_admitted_then_its_position_stored_and_a_redelivery_admitted_once(channel):
    Channel.objects.filter(pk=channel.pk).update(poll_owner="tester")
    connection = platform("matrix").connection()
    encrypted = {"room": ROOM, "bot": BOT, "event": {"type": "m.room.encrypted", "event_id": "$e", "sender": ANA,
                                                     "content": {}}}
    batch = [message("$1", "hola"), message("$2", "quiero reservar"), {"junk": True}, encrypted,
             {"next_batch": "s72_1", "bot": BOT}]
    assert admit_received(connection, channel.pk, "tester", batch, 1) == 2
    stored = Channel.objects.get(pk=channel.pk)
    assert stored.poll_session == {"next_batch": "s72_1", "user_id": BOT} and stored.poll_offset == 1
    # The same events again (a resume from an older position): nothing new.
    assert admit_received(connection, channel.pk, "tester", batch[:2] + [{"next_batch": "s72_2"}], 2) == 0
    assert InboundMessage.objects.count() == 2
    assert Channel.objects.get(pk=channel.pk).poll_session["next_batch"] == "s72_2"
    refusal = AuditEvent.objects.get(kind=EventKind.MESSAGE_REFUSED)
    assert "encrypted" in refusal.summary and refusal.actor == ANA and "$e" in refusal.target


@pytest.mark.django_db
def test_an_edit_or_a_reaction_of_an_unknown_event_changes_nothing(channel):
    connection = platform("matrix").connection()
    edit = message("$9", "* x", **{"m.new_content": {"body": "x"}, "m.relates_to": {"rel_type": "m.replace",
                                                                                  "event_id": "$unknown"}})
    [edited] = connection.results(connection.receive(channel, connection.parse(channel, edit)))
    assert isinstance(edited, EditResult) and edited.outcome == "unknown_message"
    reaction = {"room": ROOM, "bot": BOT, "event": {"type": "m.reaction", "event_id": "$r", "sender": ANA, "content": {
        "m.relates_to": {"rel_type": "m.annotation", "event_id": "$unknown", "key": "👍"}}}}
    [reacted] = connection.results(connection.receive(channel, connection.parse(channel, reaction)))
    assert isinstance(reacted, ReactionResult) and reacted.outcome == ReactionOutcome.IGNORED
    [admitted] = connection.results(connection.receive(channel, connection.parse(channel, message("$1", "hola"))))
    assert isinstance(admitted, Admission) and not admitted.duplicate


@pytest.mark.django_db
def test_each_answer_of_the_homeserver_has_its_outcome(channel):
    transport = MatrixTransport(channel)

    def outcome(status, body, headers=None):
        return transport.outcome(status, body, httpx.Headers(headers or {}))

    flood = outcome(429, {"errcode": "M_LIMIT_EXCEEDED", "error": "Too Many Requests", "retry_after_ms": 2500})
    assert (flood.outcome, flood.retry_after) == (Outcome.FLOOD, 2.5)
    assert outcome(429, {}, {"Retry-After": "3"}).retry_after == 3.0
    assert outcome(401, {"errcode": "M_UNKNOWN_TOKEN"}).outcome == Outcome.CHANNEL_BLOCKED
    forbidden = outcome(403, {"errcode": "M_FORBIDDEN", "error": "User not in room"})
    assert forbidden.outcome == Outcome.PERMANENT and forbidden.chat_unreachable and "M_FORBIDDEN" in forbidden.error
    assert outcome(404, {"errcode": "M_NOT_FOUND"}).chat_unreachable
    too_large = outcome(413, {"errcode": "M_TOO_LARGE"})
    assert too_large.outcome == Outcome.PERMANENT and not too_large.chat_unreachable
    assert outcome(502, {}).outcome == Outcome.TEMPORARY
    assert "syt_secret" not in outcome(400, {"errcode": "M_BAD_JSON", "error": "token syt_secret"}).error


@pytest.mark.django_db
def test_a_reply_answers_the_message_and_stays_in_its_thread(channel):
    transport = MatrixTransport(channel)
    plain = transport.content(Target(ROOM, "$1"), "hola")
    assert plain["m.relates_to"] == {"m.in_reply_to": {"event_id": "$1"}} and plain["m.mentions"] == {}
    threaded = transport.content(Target(ROOM, "$2", "$root"), "hola")
    assert threaded["m.relates_to"] == {"rel_type": "m.thread", "event_id": "$root", "is_falling_back": True,
                                        "m.in_reply_to": {"event_id": "$2"}}


@pytest.mark.django_db
def test_settings_are_checked(make_channel):
    channel = make_channel("mx", kind="matrix", platform_settings={"homeserver": "https://matrix.example.org"})
    assert channel.send_blocked == "no access_token set"
    assert channel.platform_settings["auto_join"] == "on" and channel.platform_settings["messages_per_second"] == 0.2
    for wrong in ({"homeserver": "not a url"}, {"auto_join": "maybe"}, {"acess_token": "x"}):
        with pytest.raises(ValidationError):
            Channel(slug="bad", kind="matrix", platform_settings=wrong).save()
