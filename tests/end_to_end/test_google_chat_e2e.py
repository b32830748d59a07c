"""Google Chat end to end: the real web server (daphne) receiving events with the bearer
token Chat signs them with (verified against the local fake's certificates), the real
worker sending through the fake Chat API with the service account's token from the fake
token endpoint. Tokens refused; a storm of redeliveries is one message; a burst in a
space is one reply in the user's thread; a 429 is resent unlabelled after its Retry-After;
a 403 is never retried; in a space only a mention is answered, the rest kept as context,
a file uploaded with it fetched with the app's token;
a question's card tapped three times applies its action once."""

import threading
import time

import httpx
import pytest

from conversations.models import Disposition, InboundMessage, MessageBuffer, Turn
from delivery.models import OutboundMessage, OutboundState, UnreachableChat
from tests.conftest import wait_until
from tests.fakes import google_chat_api as chat
from tests.fakes.google_chat_api import ROOM, FakeGoogleChat, Signer
from tests.support.google_chat import google_chat_channel

pytestmark = pytest.mark.e2e


@pytest.fixture
def fake_chat():
    with FakeGoogleChat() as fake:
        yield fake


def endpoint(web):
    return f"{web.url}/webhooks/google_chat/gc/"


def deliver(web, fake, event):
    response = chat.post(endpoint(web), event, fake.chat_token())
    assert response.status_code == 200, response.text
    return response.json()


QUICK = {f"window_{kind}": 1.0 for kind in ("closed", "greeting", "open", "neutral")}  # bursts not this test's subject


def delivered(count):
    return lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).count() >= count


@pytest.mark.serial  # the resend's time after the 429: 2 s, within 1.8-8
def test_a_storm_of_redeliveries_and_a_burst_are_one_reply_in_the_thread_after_a_429(processes, make_channel,
                                                                                      fake_chat):
    google_chat_channel(make_channel, fake_chat, group_replies="mention")
    web, _ = processes.web(wait=False), processes.worker()
    first = chat.message_event("Hola,", space=ROOM, mention=True)
    thread = first["message"]["thread"]["name"]
    # Refused before anything is stored: no token, a key Google never published, another app's.
    assert chat.post(endpoint(web), first, None).status_code == 401
    assert chat.post(endpoint(web), first, fake_chat.chat_token(signer=Signer(chat.CHAT_ISSUER))).status_code == 403
    assert chat.post(endpoint(web), first, fake_chat.chat_token("999")).status_code == 403
    assert not InboundMessage.objects.exists()

    fake_chat.fail_next("create", status=429, retry_after=2)  # the reply's first send: over the quota
    start, answers = threading.Barrier(12), []

    def redeliver():
        start.wait()
        answers.append(chat.post(endpoint(web), first, fake_chat.chat_token()).status_code)

    threads = [threading.Thread(target=redeliver) for _ in range(12)]
    for each in threads:
        each.start()
    for each in threads:
        each.join()
    assert answers == [200] * 12
    for text in ("quería agendar psicología", "¿hay hora el lunes?"):
        deliver(web, fake_chat, chat.message_event(text, space=ROOM, mention=True, thread=thread))
    refused, sent = fake_chat.wait_for("create", count=2, timeout=30)
    assert 1.8 <= sent.at - refused.at < 8, sent.at - refused.at
    said = "\n".join(f"Camila: {text}" for text in ("Hola,", "quería agendar psicología", "¿hay hora el lunes?"))
    assert sent.body == {"text": said, "thread": {"name": thread}}  # the echo agent, a group's lines named
    assert sent.query == {"messageReplyOption": "REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD"}
    wait_until(delivered(1), timeout=10, message="the resend recorded")
    row = OutboundMessage.objects.get()
    assert row.flood_waits == 1 and row.attempts == 1 and not row.needs_marker
    assert row.platform_message_id.startswith(f"{ROOM}/messages/")
    assert InboundMessage.objects.count() == 3 and MessageBuffer.objects.count() == 1 and Turn.objects.count() == 1
    assert len(fake_chat.calls("token")) == 1


def test_only_a_mention_is_answered_in_a_space_and_a_403_is_never_retried(processes, make_channel, fake_chat,
                                                                          tmp_path):
    """…and the photo uploaded with the mention is fetched by the worker (media.download,
    the app's token) before the turn."""
    from conversations.models import MediaFile, MediaState

    google_chat_channel(make_channel, fake_chat, group_replies="mention", **QUICK)
    web, _ = processes.web(wait=False), processes.worker(AGENTLOOP_MEDIA_ROOT=str(tmp_path / "files"))
    deliver(web, fake_chat, chat.message_event("alguien fue ayer", space=ROOM, user=chat.OTHER_USER,
                                               display_name="Beto"))
    wait_until(lambda: InboundMessage.objects.filter(disposition=Disposition.CONTEXT).exists(), timeout=20,
               message="the unaddressed message kept as context")
    photo = fake_chat.attachment(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, "image/png", "horario.png")
    deliver(web, fake_chat, chat.message_event("¿a qué hora abren?", space=ROOM, mention=True, attachments=(photo,)))
    [reply] = fake_chat.wait_for("create", timeout=20)
    turn = Turn.objects.get()
    assert "Beto: alguien fue ayer" in turn.merged_input and turn.merged_input.endswith("¿a qué hora abren?")
    assert "[photo]" in turn.merged_input
    [download] = fake_chat.downloads()
    assert download.path == photo["attachmentDataRef"]["resourceName"] and download.token.startswith("ya29.")
    assert MediaFile.objects.get().state == MediaState.STORED

    fake_chat.fail_next("create", status=403)  # the app was removed from that space
    gone = "spaces/GONEAAAAAAA"
    deliver(web, fake_chat, chat.message_event("¿sigues ahí?", space=gone, mention=True))
    wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.UNREACHABLE).exists(), timeout=20,
               message="the row unreachable")
    deliver(web, fake_chat, chat.message_event("¿y el sábado?", space=ROOM, mention=True))
    wait_until(delivered(2), timeout=20, message="the room's second reply")
    time.sleep(1.0)  # sweeps pass: the unreachable row is not sent again
    assert [c.path for c in fake_chat.calls("create")] == [f"{ROOM}/messages", f"{gone}/messages", f"{ROOM}/messages"]
    assert OutboundMessage.objects.get(state=OutboundState.UNREACHABLE).attempts == 1
    assert UnreachableChat.objects.get().chat_id == gone


def test_a_card_tapped_three_times_applies_once(processes, make_channel, fake_chat):
    from tools.models import CalendarEvent, Proposal, ProposalState, ToolPolicy

    google_chat_channel(make_channel, fake_chat, agent="demo", **QUICK)
    ToolPolicy.objects.create(name="calendar_create_event", approval="user")
    web, _ = processes.web(wait=False), processes.worker()
    deliver(web, fake_chat, chat.message_event("Confirmo las horas de psicología: lunes a las 10"))
    wait_until(lambda: any("cardsV2" in c.body for c in fake_chat.calls("create")), timeout=30,
               message="the question with its card")
    [question] = [c for c in fake_chat.calls("create") if "cardsV2" in c.body]
    wait_until(lambda: OutboundMessage.objects.filter(text=question.body["text"], state=OutboundState.DELIVERED)
               .exists(), timeout=10, message="the question recorded")
    row = OutboundMessage.objects.get(text=question.body["text"])
    buttons = question.body["cardsV2"][0]["card"]["sections"][0]["widgets"][0]["buttonList"]["buttons"]
    yes = next(p["value"] for b in buttons for p in b["onClick"]["action"]["parameters"] if p["value"].endswith(":y"))
    tap = chat.card_clicked(row.platform_message_id, yes)
    answers = [deliver(web, fake_chat, tap) for _ in range(3)]
    assert all(a["actionResponse"] == {"type": "UPDATE_MESSAGE"} and a["cardsV2"] == [] for a in answers)
    assert "✅" in answers[0]["text"]
    assert CalendarEvent.objects.count() == 1
    assert Proposal.objects.get().state == ProposalState.APPLIED
    unsigned = httpx.post(endpoint(web), json=tap, timeout=10)
    assert unsigned.status_code == 401


def test_a_worker_killed_mid_send_resends_once_labelled(processes, make_channel, fake_chat):
    from audit.models import AuditEvent, EventKind
    from delivery import ledger

    google_chat_channel(make_channel, fake_chat, **QUICK)
    web = processes.web(wait=False)
    doomed = processes.worker(wait=False, AGENTLOOP_FAILPOINT="ledger.after_send")
    event = chat.message_event("¿Me confirmas la hora?", space=ROOM, mention=True)
    deliver(web, fake_chat, event)
    wait_until(lambda: doomed.popen.poll() is not None, timeout=30, message="the worker killed after the send")
    processes.worker()  # its boot sweep finds the row mid-send
    wait_until(delivered(1), timeout=20, message="the row delivered after the restart")
    said = "Camila: ¿Me confirmas la hora?"
    assert fake_chat.texts() == [said, f"{ledger.RECOVERY_PREFIX}{said}"]
    assert all(c.body["thread"] == event["message"]["thread"] for c in fake_chat.calls("create"))
    row = OutboundMessage.objects.get()
    assert row.attempts == 2 and row.needs_marker
    assert AuditEvent.objects.filter(kind=EventKind.REPLY_RECOVERED).count() == 1


def test_a_streamed_reply_is_one_preview_message_edited_into_the_final(processes, make_channel, fake_chat):
    from tests.fakes.openai_api import FakeOpenAI, Reply

    long = "Claro: " + " ".join(f"palabra{i}" for i in range(11)) + " fin."
    with FakeOpenAI() as fake_openai:
        fake_openai.script(Reply(long, pace=0.25))  # 13 pieces: 3 s of writing
        google_chat_channel(make_channel, fake_chat, agent="openai", agent_config={
            "base_url": fake_openai.url, "model": "fake-model", "api_key_env": "FAKE_OPENAI_API_KEY"}, **QUICK)
        web, _ = processes.web(wait=False), processes.worker(FAKE_OPENAI_API_KEY="sk-test-agentloop")
        deliver(web, fake_chat, chat.message_event("Explícame algo."))
        row = wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).first(), timeout=25,
                         message="the final delivered")
    [preview] = fake_chat.calls("create")  # the one message: the preview
    edits = [c for c in fake_chat.calls("patch") if c.path == row.platform_message_id]
    assert preview.body["text"].endswith("▍") and edits and edits[-1].body == {"text": long}
    assert fake_chat.message(row.platform_message_id)["text"] == long and fake_chat.texts() == [long]
    # The previews' writes keep the space's quota (PREVIEW_INTERVAL apart). The final's edits
    # are the ledger's, paced by its own slots: not `edits[:-1]`, which took in a final edit
    # sent twice (once, under load) as if it were a preview's.
    writes = [preview, *(edit for edit in edits if edit.body.get("text", "").endswith("▍"))]
    gaps = [round(b.at - a.at, 2) for a, b in zip(writes, writes[1:])]
    assert all(gap >= 1.3 for gap in gaps), (gaps, [(edit.at, edit.body) for edit in edits])
    assert Turn.objects.get().preview_message_id == row.platform_message_id
