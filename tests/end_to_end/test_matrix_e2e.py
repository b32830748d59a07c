"""Matrix end to end against a real homeserver: Synapse (matrix-synapse from PyPI, its
own venv, SQLite, no federation; tests/support/synapse.py), started once per test
session on a loopback port; the real worker holds the bot's `/sync` (the channel's
lease); people drive the conversation through the client-server API. A burst in a direct
room is one reply answering the last message; another, Synapse killed and started again
in the middle of it, is answered with nothing lost or doubled; in a group room only the
message that mentions the bot is answered (the one before it kept as context), and a
message in a thread is answered in that thread; an encrypted room's message is refused,
logged and audited, never answered; a 429 (the bot's rc_message made low) is waited out
and the reply sent unlabelled; a room the bot was kicked from (403 M_FORBIDDEN) is tried
once; a worker killed mid-send, the sync position rewound so Synapse sends the message
again: one turn, and the labelled resend carries the row's transaction id, so Synapse
posts no second message; a confirmation question's 👍 applies its action once whatever
else is reacted; while a turn runs the bot is typing, its streamed reply is one message
edited (`m.replace`) into the final, and the person's message carries 👀 (redacted when
done) then ✅."""

import sys
import uuid

import pytest

from audit.models import AuditEvent, EventKind
from conversations.models import Channel, InboundMessage, InboundReaction, ReactionOutcome, Turn
from delivery import ledger
from delivery.models import OutboundMessage, OutboundState
from tests.conftest import run_python, wait_until
from tests.support.synapse import Synapse, User, limit_messages

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="session")
def synapse_server(tmp_path_factory):
    with Synapse(tmp_path_factory.mktemp("synapse")) as server:
        yield server


@pytest.fixture
def people(synapse_server):
    """This test's bot account, and two people (ana, an admin of the homeserver, and bob)."""
    suffix = uuid.uuid4().hex[:8]
    bot = User(synapse_server, *synapse_server.register(f"bot{suffix}"))
    ana = User(synapse_server, *synapse_server.register(f"ana{suffix}", admin=True))
    bob = User(synapse_server, *synapse_server.register(f"bob{suffix}"))
    return bot, ana, bob


def add_channel(processes, server, bot, agent="echo", window="1.0"):
    command = [sys.executable, "manage.py", "addchannel", "mx1", "--kind", "matrix", "--homeserver", server.url,
               "--token", bot.token, "--messages-per-second", "0", "--agent", agent,
               *[arg for kind in ("closed", "greeting", "open", "neutral") for arg in (f"--window-{kind}", window)]]
    done = run_python(command, env=processes.env(), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def connected():
    return lambda: (Channel.objects.get(slug="mx1").poll_session or {}).get("next_batch")


def rooms_with_bot(ana, bot, *rooms):
    """Rooms ana creates (each given as the others in it, and whether it is encrypted),
    every one joined by the bot (its auto_join) before they are returned."""
    created = []
    for others, encrypted in rooms:
        room = ana.create_room(bot.user_id, *(other.user_id for other in others), encrypted=encrypted)
        for other in others:
            other.join(room)
        created.append(room)
    wait_until(lambda: all(bot.user_id in ana.members(room) for room in created), timeout=30,
               message="the bot joined every room (auto_join)")
    return created


DIRECT = ((), False)  # a room of ana and the bot, unencrypted


def replies(ana, room, bot):
    return [event["content"] for event in ana.events(room, bot.user_id)]


def test_a_burst_a_synapse_restart_mid_burst_mentions_and_an_encrypted_room(processes, synapse_server, people):
    bot, ana, bob = people
    add_channel(processes, synapse_server, bot)
    processes.worker()
    wait_until(connected(), timeout=30, message="the first sync's position stored")
    direct, other, group, secret = rooms_with_bot(ana, bot, DIRECT, DIRECT, ((bob,), False), ((), True))

    # A burst: one reply, answering the last message.
    ana.say(direct, "hola")
    ana.say(direct, "quiero reservar")
    last = ana.say(direct, "para mañana")
    # Another, Synapse killed and started again in the middle of it: nothing lost, nothing doubled.
    ana.say(other, "buenas")
    ana.say(other, "una mesa para dos")
    wait_until(lambda: InboundMessage.objects.count() == 5, timeout=15, message="the five admitted")
    synapse_server.restart()
    ana.say(other, "esta noche")
    # The group: kept as context, then addressed by a mention.
    bob.say(group, "¿alguien sabe?")
    asked = ana.say(group, "bot: ¿abren mañana?", **{"m.mentions": {"user_ids": [bot.user_id]}})
    ana.send(secret, "m.room.encrypted", {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "AwgAEn...",
                                          "sender_key": "k", "session_id": "s", "device_id": "D"})

    said = ("buenas", "una mesa para dos", "esta noche")
    # The direct room's reply too: its burst came before the restart, and its send may be
    # the one the restart cut (resent after the ledger's backoff, after the other rooms').
    wait_until(lambda: len(replies(ana, direct, bot)) == 1 and len(replies(ana, group, bot)) == 1 and AuditEvent.objects.filter(
        kind=EventKind.MESSAGE_REFUSED).exists() and all(
        any(text in reply["body"] for reply in replies(ana, other, bot)) for text in said), timeout=60,
        message="every message answered, the encrypted one refused")
    [reply] = replies(ana, direct, bot)
    assert reply["body"] == "hola\nquiero reservar\npara mañana"
    assert reply["m.relates_to"] == {"m.in_reply_to": {"event_id": last}}
    answered_across = "\n".join(reply["body"] for reply in replies(ana, other, bot))
    assert all(answered_across.count(text) == 1 for text in said)
    [answered] = replies(ana, group, bot)
    context, addressed = answered["body"].split("[Addressed to you]")
    assert "¿alguien sabe?" in context and "¿abren mañana?" in addressed  # kept as context, then answered
    assert answered["m.relates_to"]["m.in_reply_to"]["event_id"] == asked
    assert not any(ledger.RECOVERY_PREFIX.strip() in body["body"] for room in (direct, other, group)
                   for body in replies(ana, room, bot))
    assert replies(ana, secret, bot) == []
    refusal = AuditEvent.objects.get(kind=EventKind.MESSAGE_REFUSED)
    assert "encrypted" in refusal.summary and refusal.actor == ana.user_id
    # Each message admitted once, across the restart (the sync resumed from its stored position).
    assert sorted(InboundMessage.objects.values_list("text", flat=True)) == sorted(
        ["hola", "quiero reservar", "para mañana", *said, "¿alguien sabe?", "bot: ¿abren mañana?"])


def test_a_429_is_waited_out_a_thread_answered_in_it_and_a_room_the_bot_left_is_tried_once(
        processes, synapse_server, people):
    bot, ana, bob = people
    add_channel(processes, synapse_server, bot)
    processes.worker()
    wait_until(connected(), timeout=30, message="the first sync's position stored")
    first, second, kicked, group = rooms_with_bot(ana, bot, DIRECT, DIRECT, DIRECT, ((bob,), False))
    root = ana.say(group, "tengo una pregunta")  # not for the bot: kept as context
    limit_messages(ana, bot.user_id, per_second=1, burst=1)  # one message, then one a second
    ana.say(first, "hola")
    ana.say(second, "buenas")
    ana.say(kicked, "¿hola?")
    wait_until(lambda: InboundMessage.objects.filter(text="¿hola?").exists(), timeout=10, interval=0.01,
               message="the message admitted")
    ana.kick(kicked, bot.user_id)  # before the reply is written (the burst's window)
    in_thread = ana.say(group, f"{bot.user_id} ¿abren el domingo?",
                        **{"m.relates_to": {"rel_type": "m.thread", "event_id": root}})
    wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).count() == 3
               and OutboundMessage.objects.filter(state=OutboundState.UNREACHABLE).exists(), timeout=40,
               message="three replies delivered, one unreachable")
    assert [r["body"] for r in replies(ana, first, bot)] == ["hola"]
    assert [r["body"] for r in replies(ana, second, bot)] == ["buenas"]
    [threaded] = replies(ana, group, bot)
    assert "domingo" in threaded["body"] and threaded["m.relates_to"]["rel_type"] == "m.thread"
    assert threaded["m.relates_to"]["event_id"] == root
    assert threaded["m.relates_to"]["m.in_reply_to"]["event_id"] == in_thread
    rows = OutboundMessage.objects.filter(state=OutboundState.DELIVERED)
    assert sum(row.flood_waits for row in rows) >= 1  # a real 429 from Synapse, waited out, unlabelled
    assert all(row.attempts == 1 for row in rows)
    unreachable = OutboundMessage.objects.get(state=OutboundState.UNREACHABLE)
    assert unreachable.attempts == 1 and "M_FORBIDDEN" in unreachable.last_error


def test_a_worker_killed_mid_send_and_the_sync_replayed_is_one_turn_and_one_message(processes, synapse_server,
                                                                                       people):
    bot, ana, _ = people
    add_channel(processes, synapse_server, bot)
    doomed = processes.worker(AGENTLOOP_FAILPOINT="ledger.after_send")
    wait_until(connected(), timeout=30, message="the first sync's position stored")
    [room] = rooms_with_bot(ana, bot, DIRECT)
    wait_until(lambda: Channel.objects.get(slug="mx1").poll_offset and not OutboundMessage.objects.exists(),
               timeout=10, message="settled")
    before = Channel.objects.get(slug="mx1").poll_session
    ana.say(room, "¿me confirmas la hora?")
    wait_until(lambda: doomed.popen.poll() is not None, timeout=30, message="the worker killed after the send")
    # The position rewound to before the message: Synapse sends it again (a redelivery).
    Channel.objects.filter(slug="mx1").update(poll_session=before)
    processes.worker()
    wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).exists(), timeout=30,
               message="the killed send resent")
    row = OutboundMessage.objects.get()
    assert row.attempts == 2 and row.needs_marker  # the resend went out labelled, with the row's transaction id ...
    assert [r["body"] for r in replies(ana, room, bot)] == ["¿me confirmas la hora?"]  # ... which Synapse knew
    assert InboundMessage.objects.count() == 1 and Turn.objects.count() == 1


def test_a_confirmation_answered_by_reactions_is_applied_once(processes, synapse_server, people):
    from tools.models import CalendarEvent, Proposal, ProposalState, ToolPolicy

    bot, ana, _ = people
    add_channel(processes, synapse_server, bot, agent="demo")
    ToolPolicy.objects.create(name="calendar_create_event", approval="user")
    processes.worker()
    wait_until(connected(), timeout=30, message="the first sync's position stored")
    [room] = rooms_with_bot(ana, bot, DIRECT)
    ana.say(room, "Confirmo las horas de psicología: lunes a las 10")
    asking = lambda: [event for event in ana.events(room, bot.user_id)  # noqa: E731
                      if event["content"]["body"].startswith("Please confirm")]
    [question] = wait_until(asking, timeout=30, message="the question")
    for key in ("👍", "+1", "👎"):
        ana.react(room, question["event_id"], key)
    wait_until(lambda: Proposal.objects.filter(state=ProposalState.APPLIED).exists(), timeout=30,
               message="the action applied")
    # Each row is stored first (the dedup) and its outcome written after its decision: the
    # 👎's row says "rejected" until its decision, a moment later, finds the proposal applied.
    settled = [ReactionOutcome.CONFIRMED, ReactionOutcome.ALREADY, ReactionOutcome.ALREADY]
    outcomes = lambda: list(InboundReaction.objects.order_by("pk").values_list("outcome", flat=True))  # noqa: E731
    wait_until(lambda: outcomes() == settled, timeout=10, message="the three reactions stored and decided")
    assert CalendarEvent.objects.count() == 1
    assert Proposal.objects.get().state == ProposalState.APPLIED


def test_a_streamed_reply_is_one_message_edited_into_the_final_with_status_reactions(processes, synapse_server,
                                                                                         people):
    bot, ana, _ = people
    add_channel(processes, synapse_server, bot)
    # Fifteen words 0.25 s apart: about 3.7 s of stream against PREVIEW_INTERVAL's 1 s, so
    # the preview is edited before the final however late its first send (at 0.1 s apart,
    # 1.5 s in all, a first send half a second late left only the final's edit, once).
    Channel.objects.filter(slug="mx1").update(agent_config={"stream_pace": 0.25}, status_reaction="seen_done")
    processes.worker()
    wait_until(connected(), timeout=30, message="the first sync's position stored")
    [room] = rooms_with_bot(ana, bot, DIRECT)
    said = "cuéntame con calma todo lo que hay que saber para reservar una mesa el sábado"
    asked = ana.say(room, said)
    wait_until(lambda: bot.user_id in ana.typing(room), timeout=10, interval=0.1,
               message="the bot typing while the turn runs")
    wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).exists()
               and any(event["content"].get("m.relates_to", {}).get("key") == "✅"
                       for event in ana.events(room, bot.user_id, "m.reaction"))
               and ana.events(room, bot.user_id, "m.room.redaction"), timeout=30,
               message="the reply delivered, ✅ on the message")
    messages = ana.events(room, bot.user_id)
    [preview] = [event for event in messages if "m.new_content" not in event["content"]]
    edits = [event["content"] for event in messages if "m.new_content" in event["content"]]
    assert preview["content"]["m.relates_to"] == {"m.in_reply_to": {"event_id": asked}}
    assert len(edits) >= 2 and all(edit["m.relates_to"] == {"rel_type": "m.replace", "event_id": preview["event_id"]}
                                   for edit in edits)
    assert edits[0]["m.new_content"]["body"].endswith("▍") and edits[-1]["m.new_content"]["body"] == said
    assert OutboundMessage.objects.get().platform_message_id == preview["event_id"]  # one message in the room
    # 👀 on the person's message while the turn ran, redacted (its content gone), then ✅.
    seen, done = ana.events(room, bot.user_id, "m.reaction")
    [redaction] = ana.events(room, bot.user_id, "m.room.redaction")
    assert seen["content"] == {} and (redaction.get("redacts") or redaction["content"]["redacts"]) == seen["event_id"]
    assert done["content"]["m.relates_to"] == {"rel_type": "m.annotation", "event_id": asked, "key": "✅"}
