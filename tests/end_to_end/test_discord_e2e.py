"""Discord end to end: two real workers (one holds the Gateway: the channel's lease),
the fake Gateway and REST API as local servers speaking Discord's protocols. A burst of
DMs, one of them dispatched twice, is one turn and one reply threaded to the last
message, sent after the 429 before it was waited out; the websocket killed mid-burst is
RESUMEd from the stored session and sequence number and every message answered once; in
a guild channel, only the message that mentions the bot is answered, the one before it
kept as context; a chat Discord refuses (403) is tried once; a confirmation question's
button tapped three times applies the action once; a worker killed mid-send: the next
worker takes the Gateway over by RESUME (the message sent meanwhile answered) and resends
the reply once, labelled; a photo in is fetched once from the CDN, the streamed reply is
one preview message edited into the final, its file uploaded (multipart), and the
person's message carries 👀 then ✅. (No web server: Discord reaches us through the
worker's Gateway alone.)"""

import sys

import pytest

from conversations.models import Channel, InboundMessage, MediaFile, MediaState, Turn
from delivery import ledger
from delivery.models import OutboundMessage, OutboundState
from tests.conftest import run_python, wait_until
from tests.fakes.discord_api import BOT_USER_ID, DiscordGateway, DiscordRest, message

pytestmark = pytest.mark.e2e

TOKEN = "discord-e2e-t0ken"
DM, DM2, GUILD_CHANNEL = "600000000000000001", "600000000000000002", "600000000000000003"
LOCKED = "600000000000000004"  # a DM the bot may no longer write into (403 Missing Access)


def add_channel(processes, rest, agent="echo"):
    command = [sys.executable, "manage.py", "addchannel", "disc1", "--kind", "discord", "--token", TOKEN,
               "--api-base", rest.url, "--agent", agent,
               *[arg for kind in ("closed", "greeting", "open", "neutral") for arg in (f"--window-{kind}", "1.5")]]
    done = run_python(command, env=processes.env(), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def replies_to(rest, chat):
    return [sent for sent in rest.messages if sent["channel_id"] == chat]


def test_bursts_resumes_floods_and_mentions(processes):
    with DiscordGateway(TOKEN, heartbeat_ms=2000) as gateway, DiscordRest(TOKEN, gateway.url) as rest:
        add_channel(processes, rest)
        processes.worker()
        processes.worker()  # a second worker: still one Gateway connection (the channel's lease)
        wait_until(lambda: gateway.connected() and Channel.objects.get(slug="disc1").poll_session, timeout=30,
                   message="the Gateway identified and the session stored")

        # A burst, one MESSAGE_CREATE sent twice (as after a resume): one turn, one reply,
        # threaded to the last message; its first send answered 429 (global), waited out.
        rest.flood_next = 1
        for message_id, text in (("701", "hola"), ("702", "quiero reservar"), ("702", "quiero reservar"),
                                 ("703", "para mañana")):
            gateway.dispatch("MESSAGE_CREATE", message(message_id, DM, text))
        # The websocket killed mid-burst in another DM: the message sent meanwhile is
        # replayed on RESUME, and every message is answered once.
        gateway.dispatch("MESSAGE_CREATE", message("801", DM2, "buenas"))
        wait_until(lambda: InboundMessage.objects.filter(platform_message_id="801").exists(), timeout=15,
                   message="the first message of the second burst admitted")
        gateway.drop()
        gateway.dispatch("MESSAGE_CREATE", message("802", DM2, "una mesa para dos"))
        wait_until(gateway.connected, timeout=15, message="the Gateway resumed")
        gateway.dispatch("MESSAGE_CREATE", message("803", DM2, "esta noche"))
        # A chat Discord refuses (403): unreachable at once, never tried again.
        rest.forbidden.add(LOCKED)
        gateway.dispatch("MESSAGE_CREATE", message("851", LOCKED, "hola?"))
        # A guild channel: kept as context, then addressed by a mention.
        gateway.dispatch("MESSAGE_CREATE", message("901", GUILD_CHANNEL, "¿alguien sabe?", guild_id="1"))
        gateway.dispatch("MESSAGE_CREATE", message("902", GUILD_CHANNEL, f"<@{BOT_USER_ID}> ¿abren mañana?",
                                                   guild_id="1", mentions=(BOT_USER_ID,)))

        wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).count() >= 3
                   and OutboundMessage.objects.filter(state=OutboundState.UNREACHABLE).exists(), timeout=40,
                   message="three replies delivered, one unreachable")
        first, second, guild = replies_to(rest, DM), replies_to(rest, DM2), replies_to(rest, GUILD_CHANNEL)
        assert len(first) == len(second) == len(guild) == 1
        assert all(word in first[0]["content"] for word in ("hola", "quiero reservar", "para mañana"))
        assert first[0]["message_reference"]["message_id"] == "703"
        sends_refused = sorted(status for status, body in rest.refused if body is not None)  # (typing has none)
        assert sends_refused == [403, 429]  # each once: neither sent the same again
        assert not any(ledger.RECOVERY_PREFIX.strip() in sent["content"] for sent in rest.messages)  # all unlabelled
        assert DM in rest.typing  # "typing…" from the first message of the burst
        assert all(word in second[0]["content"] for word in ("buenas", "una mesa para dos", "esta noche"))
        assert gateway.identifies == 1 and len(gateway.resumes) == 1 and gateway.most_open == 1
        assert "¿abren mañana?" in guild[0]["content"] and guild[0]["message_reference"]["message_id"] == "902"
        assert InboundMessage.objects.filter(platform_message_id="901").exists()  # kept, never answered alone
        assert sorted(InboundMessage.objects.values_list("platform_message_id", flat=True)) == [
            "701", "702", "703", "801", "802", "803", "851", "901", "902"]
        assert Turn.objects.count() == 4


def test_a_confirmation_tapped_three_times_is_applied_once(processes):
    from tools.models import CalendarEvent, Proposal, ProposalState, ToolPolicy

    with DiscordGateway(TOKEN, heartbeat_ms=2000) as gateway, DiscordRest(TOKEN, gateway.url) as rest:
        add_channel(processes, rest, agent="demo")
        ToolPolicy.objects.create(name="calendar_create_event", approval="user")
        processes.worker()
        wait_until(lambda: gateway.connected() and Channel.objects.get(slug="disc1").poll_session, timeout=30,
                   message="the Gateway identified and the session stored")
        gateway.dispatch("MESSAGE_CREATE", message("1001", DM, "Confirmo las horas de psicología: lunes a las 10"))
        wait_until(lambda: any(sent["components"] for sent in rest.messages), timeout=30,
                   message="the question with its buttons")
        [question] = [sent for sent in rest.messages if sent["components"]]
        [yes] = [button["custom_id"] for button in question["components"][0]["components"]
                 if button["custom_id"].endswith(":y")]
        taps = [rest.interaction(question["id"], yes, "300000000000000001", DM) for _ in range(3)]
        for tap in taps:
            gateway.dispatch("INTERACTION_CREATE", tap)
        wait_until(lambda: len(rest.answered) == 3, timeout=15, message="each tap answered")
        assert CalendarEvent.objects.count() == 1
        assert Proposal.objects.get().state == ProposalState.APPLIED
        first = rest.answered[taps[0]["id"]]
        assert first["type"] == 7 and first["data"]["components"] == []  # the question updated, its buttons gone
        assert "✅" in question["content"] and question["components"] == []


def test_a_worker_killed_mid_send_resends_once_labelled_and_the_next_one_resumes_the_gateway(processes):
    with DiscordGateway(TOKEN, heartbeat_ms=2000) as gateway, DiscordRest(TOKEN, gateway.url) as rest:
        add_channel(processes, rest)
        doomed = processes.worker(AGENTLOOP_FAILPOINT="ledger.after_send")
        wait_until(lambda: gateway.connected() and Channel.objects.get(slug="disc1").poll_session, timeout=30,
                   message="the Gateway identified and the session stored")
        gateway.dispatch("MESSAGE_CREATE", message("1101", DM, "¿me confirmas la hora?"))
        wait_until(lambda: doomed.popen.poll() is not None, timeout=30, message="the worker killed after the send")
        gateway.dispatch("MESSAGE_CREATE", message("1102", DM2, "otra cosa"))  # while no one holds the Gateway
        processes.worker()  # takes the lease of a holder gone from this host at once, and RESUMEs
        wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).count() == 2, timeout=30,
                   message="the killed send resent, and the message sent meanwhile answered")
        assert [sent["content"] for sent in replies_to(rest, DM)] == [
            "¿me confirmas la hora?", f"{ledger.RECOVERY_PREFIX}¿me confirmas la hora?"]
        assert [sent["content"] for sent in replies_to(rest, DM2)] == ["otra cosa"]
        assert gateway.identifies == 1 and [seq for _, seq in gateway.resumes] == [2]  # READY, 1101


def test_a_photo_in_a_streamed_reply_edited_into_one_message_a_file_out_and_status_reactions(processes, tmp_path):
    from tests.support.agents_for_tests import jpeg

    agents = {"AGENTLOOP_EXTRA_AGENTS": "echofile=tests.support.agents_for_tests.EchoFileAgent",
              "AGENTLOOP_MEDIA_ROOT": tmp_path / "files"}
    with DiscordGateway(TOKEN, heartbeat_ms=2000) as gateway, DiscordRest(TOKEN, gateway.url) as rest:
        add_channel(processes, rest)
        Channel.objects.filter(slug="disc1").update(agent="echofile", agent_config={"stream_pace": 0.15},
                                                    status_reaction="seen_done")
        processes.worker(**agents)
        wait_until(lambda: gateway.connected() and Channel.objects.get(slug="disc1").poll_session, timeout=30,
                   message="the Gateway identified and the session stored")
        photo = rest.attachment(jpeg(3), "foto.jpg", "image/jpeg", DM)
        said = "mira esta foto y mándame the file con todo lo que te dije hoy por favor"
        gateway.dispatch("MESSAGE_CREATE", message("2101", DM, said, attachments=(photo,)))
        wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).exists()
                   and any(sent["attachments"] for sent in rest.messages) and rest.reactions.get("2101") == ["✅"],
                   timeout=30, message="the reply delivered, its file uploaded, ✅ on the message")
        row = OutboundMessage.objects.get()
        final, upload = replies_to(rest, DM)
        assert rest.downloads == [photo["id"]] and MediaFile.objects.get().state == MediaState.STORED
        # The preview: one message threaded to the person's, edited as it grew, then into the final.
        assert Turn.objects.get().preview_message_id == final["id"] and row.platform_message_id == upload["id"]
        assert final["message_reference"]["message_id"] == "2101"
        edited = [body["content"] for message_id, body in rest.edits if message_id == final["id"]]
        assert len(edited) >= 2 and edited[0].endswith("▍") and not final["content"].endswith("▍")
        assert said in final["content"] and final["content"] == edited[-1]
        [attached] = upload["attachments"]
        assert attached["filename"] == "notes.txt" and said.encode() in attached["data"]
        assert rest.refused == []
        assert ("PUT", "2101", "👀") in rest.reaction_calls
