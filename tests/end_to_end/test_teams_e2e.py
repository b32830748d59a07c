"""Microsoft Teams end to end: the real web server receiving activities with the bearer
token the Bot Connector signs them with (verified against the local fake identity
provider's keys), the real worker replying through the fake Bot Connector with the app's
token from the fake token endpoint. Tokens refused; a storm of redeliveries is one
message; a burst in a channel thread is one reply in that thread; a 429 is resent
unlabelled after its Retry-After; a 403 is never retried; in a channel only a mention is
answered, the rest kept as context; a question's card tapped three times applies its
action once; a worker killed mid-send resends once, labelled; a streamed reply in a
personal chat is one native stream, ended by the ledger's final; a file sent in a personal
chat is fetched without a token, and the reply's file goes as a consent card, uploaded
once when the person accepts."""

import threading
import time

import httpx
import pytest

from conversations.models import Disposition, InboundMessage, MessageBuffer, Turn
from delivery.models import OutboundMessage, OutboundState, UnreachableChat
from tests.conftest import wait_until
from tests.fakes import teams_api as teams
from tests.fakes.teams_api import FakeTeams, Signer
from tests.support.teams import teams_channel

pytestmark = pytest.mark.e2e


@pytest.fixture
def fake_teams():
    with FakeTeams() as fake:
        yield fake


def endpoint(web):
    return f"{web.url}/webhooks/teams/teams/"


def deliver(web, fake, activity):
    response = teams.post(endpoint(web), activity, fake.connector_token())
    assert response.status_code == 200, response.text
    return response.json()


QUICK = {f"window_{kind}": 1.0 for kind in ("closed", "greeting", "open", "neutral")}  # bursts not this test's subject


def delivered(count):
    return lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).count() >= count


@pytest.mark.serial  # the resend's time after the 429: 2 s, within 1.8-8
def test_a_storm_of_redeliveries_and_a_burst_are_one_reply_in_the_thread_after_a_429(processes, make_channel,
                                                                                      fake_teams):
    teams_channel(make_channel, fake_teams, group_replies="mention")
    web, _ = processes.web(wait=False), processes.worker()
    first = teams.message_activity("Hola,", kind="channel", mention=True)
    thread = first["conversation"]["id"]
    # Refused before anything is stored: no token, a key never published, another bot's.
    assert teams.post(endpoint(web), first, None).status_code == 401
    assert teams.post(endpoint(web), first, fake_teams.connector_token(signer=Signer())).status_code == 401
    assert teams.post(endpoint(web), first, fake_teams.connector_token("another-app")).status_code == 401
    assert not InboundMessage.objects.exists()

    fake_teams.fail_next("create", status=429, retry_after=2)  # the reply's first send: over the thread's limit
    start, answers = threading.Barrier(12), []

    def redeliver():
        start.wait()
        answers.append(teams.post(endpoint(web), first, fake_teams.connector_token()).status_code)

    threads = [threading.Thread(target=redeliver) for _ in range(12)]
    for each in threads:
        each.start()
    for each in threads:
        each.join()
    assert answers == [200] * 12
    for text in ("quería agendar psicología", "¿hay hora el lunes?"):
        deliver(web, fake_teams, teams.message_activity(text, kind="channel", mention=True, reply_to=first["id"]))
    refused, sent = fake_teams.wait_for("create", count=2, timeout=30)
    assert 1.8 <= sent.at - refused.at < 8, sent.at - refused.at
    said = "\n".join(f"Camila: {text}" for text in ("Hola,", "quería agendar psicología", "¿hay hora el lunes?"))
    assert sent.conversation == thread and sent.body["text"] == said  # the echo agent, a group's lines named
    assert sent.activity_id == sent.body["replyToId"]  # a reply to the person's message, in its thread
    wait_until(delivered(1), timeout=10, message="the resend recorded")
    row = OutboundMessage.objects.get()
    assert row.flood_waits == 1 and row.attempts == 1 and not row.needs_marker and row.platform_message_id
    assert InboundMessage.objects.count() == 3 and MessageBuffer.objects.count() == 1 and Turn.objects.count() == 1
    assert len(fake_teams.calls("token")) == 1


def test_only_a_mention_is_answered_in_a_channel_and_a_403_is_never_retried(processes, make_channel, fake_teams):
    teams_channel(make_channel, fake_teams, group_replies="mention", **QUICK)
    web, _ = processes.web(wait=False), processes.worker()
    root = teams.message_activity("alguien fue ayer", kind="channel", user=teams.OTHER_USER, name="Beto")
    deliver(web, fake_teams, root)
    wait_until(lambda: InboundMessage.objects.filter(disposition=Disposition.CONTEXT).exists(), timeout=20,
               message="the unaddressed message kept as context")
    deliver(web, fake_teams, teams.message_activity("¿a qué hora abren?", kind="channel", mention=True,
                                                    reply_to=root["id"]))
    [reply] = fake_teams.wait_for("create", timeout=20)
    turn = Turn.objects.get()
    assert "Beto: alguien fue ayer" in turn.merged_input and turn.merged_input.endswith("¿a qué hora abren?")
    assert reply.conversation == root["conversation"]["id"]

    fake_teams.fail_next("create", status=403, code="BotNotInConversationRoster")  # the bot was removed there
    gone = "19:gone0000channel@thread.tacv2;messageid=1"
    deliver(web, fake_teams, teams.message_activity("¿sigues ahí?", kind="channel", mention=True, conversation=gone))
    wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.UNREACHABLE).exists(), timeout=20,
               message="the row unreachable")
    deliver(web, fake_teams, teams.message_activity("¿y el sábado?", kind="channel", mention=True,
                                                    reply_to=root["id"]))
    wait_until(delivered(2), timeout=20, message="the thread's second reply")
    time.sleep(1.0)  # sweeps pass: the unreachable row is not sent again
    assert [c.conversation for c in fake_teams.calls("create")] == [root["conversation"]["id"], gone,
                                                                    root["conversation"]["id"]]
    assert OutboundMessage.objects.get(state=OutboundState.UNREACHABLE).attempts == 1
    assert UnreachableChat.objects.get().chat_id == gone


def test_a_card_tapped_three_times_applies_once(processes, make_channel, fake_teams):
    from tools.models import CalendarEvent, Proposal, ProposalState, ToolPolicy

    teams_channel(make_channel, fake_teams, agent="demo", **QUICK)
    ToolPolicy.objects.create(name="calendar_create_event", approval="user")
    web, _ = processes.web(wait=False), processes.worker()
    deliver(web, fake_teams, teams.message_activity("Confirmo las horas de psicología: lunes a las 10"))
    wait_until(lambda: any("attachments" in c.body for c in fake_teams.calls("create")), timeout=30,
               message="the question with its card")
    [question] = [c for c in fake_teams.calls("create") if "attachments" in c.body]
    card = question.body["attachments"][0]["content"]
    wait_until(lambda: OutboundMessage.objects.filter(text=card["body"][0]["text"], state=OutboundState.DELIVERED)
               .exists(), timeout=10, message="the question recorded")
    row = OutboundMessage.objects.get(text=card["body"][0]["text"])
    yes = next(a["data"]["data"] for a in card["actions"] if a["data"]["data"].endswith(":y"))
    tap = teams.invoke_activity(yes, reply_to=row.platform_message_id)
    answers = [deliver(web, fake_teams, tap) for _ in range(3)]
    assert all(a["statusCode"] == 200 and a["type"] == "application/vnd.microsoft.card.adaptive"
               and "actions" not in a["value"] for a in answers)
    assert "✅" in answers[0]["value"]["body"][0]["text"]
    assert CalendarEvent.objects.count() == 1
    assert Proposal.objects.get().state == ProposalState.APPLIED
    unsigned = httpx.post(endpoint(web), json=tap, timeout=10)
    assert unsigned.status_code == 401


def test_a_worker_killed_mid_send_resends_once_labelled(processes, make_channel, fake_teams):
    from audit.models import AuditEvent, EventKind
    from delivery import ledger

    teams_channel(make_channel, fake_teams, **QUICK)
    web = processes.web(wait=False)
    doomed = processes.worker(wait=False, AGENTLOOP_FAILPOINT="ledger.after_send")
    activity = teams.message_activity("¿Me confirmas la hora?")
    deliver(web, fake_teams, activity)
    wait_until(lambda: doomed.popen.poll() is not None, timeout=30, message="the worker killed after the send")
    processes.worker()  # its boot sweep finds the row mid-send
    wait_until(delivered(1), timeout=20, message="the row delivered after the restart")
    said = "¿Me confirmas la hora?"
    assert fake_teams.texts() == [said, f"{ledger.RECOVERY_PREFIX}{said}"]
    assert all(c.body["replyToId"] == activity["id"] and (c.service, c.conversation) == ("amer", teams.PERSONAL)
               for c in fake_teams.calls("create")) and not fake_teams.calls("conversation")  # by its reference
    row = OutboundMessage.objects.get()
    assert row.attempts == 2 and row.needs_marker
    assert AuditEvent.objects.filter(kind=EventKind.REPLY_RECOVERED).count() == 1


def test_a_streamed_reply_in_a_personal_chat_is_one_native_stream_ended_by_the_final(processes, make_channel,
                                                                                       fake_teams):
    from tests.fakes.openai_api import FakeOpenAI, Reply

    long = "Claro: " + " ".join(f"palabra{i}" for i in range(11)) + " fin."
    with FakeOpenAI() as fake_openai:
        fake_openai.script(Reply(long, pace=0.25))  # 13 pieces: 3 s of writing
        teams_channel(make_channel, fake_teams, agent="openai", agent_config={
            "base_url": fake_openai.url, "model": "fake-model", "api_key_env": "FAKE_OPENAI_API_KEY"}, **QUICK)
        web, _ = processes.web(wait=False), processes.worker(FAKE_OPENAI_API_KEY="sk-test-agentloop")
        deliver(web, fake_teams, teams.message_activity("Explícame algo."))
        row = wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).first(), timeout=25,
                         message="the final delivered")
    *updates, final = fake_teams.calls("stream")
    assert updates and [u.body["entities"][0]["streamSequence"] for u in updates] == list(range(1, len(updates) + 1))
    assert final.body["text"] == long and final.body["entities"][0] == {
        "type": "streaminfo", "streamType": "final", "streamId": row.platform_message_id}
    assert all(b.at - a.at >= 1.3 for a, b in zip(updates, updates[1:]))  # Microsoft: 1.5 to 2 s between updates
    assert not fake_teams.stream(row.platform_message_id)["open"] and fake_teams.texts() == [long]
    assert not fake_teams.calls("create") and Turn.objects.get().preview_message_id == row.platform_message_id


def test_a_file_in_is_fetched_and_the_replys_file_is_uploaded_once_on_accept(processes, make_channel, fake_teams,
                                                                             tmp_path):
    from conversations.models import MediaFile, MediaState

    env = {"AGENTLOOP_EXTRA_AGENTS": "echofile=tests.support.agents_for_tests.EchoFileAgent",
           "AGENTLOOP_MEDIA_ROOT": str(tmp_path / "files")}
    teams_channel(make_channel, fake_teams, agent="echofile", **QUICK)
    web, _ = processes.web(wait=False, **env), processes.worker(**env)
    sent = fake_teams.add_file(b"%PDF-1.7 mis notas", "notas.pdf")
    deliver(web, fake_teams, teams.message_activity("mándame the file", files=(sent,)))
    wait_until(lambda: any(c.body.get("attachments") for c in fake_teams.calls("create")), timeout=30,
               message="the reply's consent card")
    assert MediaFile.objects.get().state == MediaState.STORED and fake_teams.downloads()[0][1] == ""  # no token
    [card] = [c.body["attachments"][0] for c in fake_teams.calls("create") if c.body.get("attachments")]
    assert card["contentType"] == "application/vnd.microsoft.teams.card.file.consent" and card["name"] == "notes.txt"
    upload = fake_teams.upload_info("notes.txt")
    for _ in range(2):  # a double tap: one upload
        assert deliver(web, fake_teams, teams.consent_invoke(card["content"]["acceptContext"], "accept", upload)) == {}
    assert "mándame the file".encode() in (fake_teams.uploaded("notes.txt") or b"") and len(fake_teams.uploads()) == 1
    info = fake_teams.calls("create")[-1].body["attachments"][0]
    assert info["contentType"] == "application/vnd.microsoft.teams.card.file.info"
    assert OutboundMessage.objects.filter(state=OutboundState.DELIVERED).count() == 1
