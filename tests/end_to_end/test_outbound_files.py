"""Files in replies (issue 24's outbound media): an agent answers with an image or a
document (a booking's .ics); each is a chunk of the reply's ledger row, uploaded to the
local Bot API with sendPhoto / sendDocument / sendMediaGroup, and a worker killed
(SIGKILL) after an upload and before its outcome is recorded resends that file once,
labelled in its caption — never a silent second copy."""

import hashlib
import signal

import pytest

from conversations.agents import Answer, File
from conversations.media import outbound
from delivery import attachments, ledger
from delivery.models import OutboundKind, OutboundMessage, OutboundState
from tests.conftest import wait_until
from tests.end_to_end.test_ledger_e2e import conversation_for, delivered, texts
from tests.faults.agent import ics
from tests.support.agents_for_tests import jpeg
from tests.support.e2e import UNPACED, send, telegram_channel

AGENT = {"AGENTLOOP_EXTRA_AGENTS": "files=tests.support.agents_for_tests.FilesAgent"}


def stored(channel, *files):
    return outbound.stored_answer(channel.pk, Answer("", tuple(files)))[1]


def uploads(fake, method):
    return [c for c in fake.calls(method)]


# --- the row ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_reply_with_files_is_its_text_then_an_album_then_each_document(make_channel):
    channel = make_channel("tg", kind="telegram", platform_settings={"bot_token": "1:x", "api_base": "http://127.0.0.1:9"})
    files = stored(channel, File("a.jpg", jpeg(1)), File("b.jpg", jpeg(2), caption="dos fotos"),
                   File("cita.ics", ics(), caption="x" * 2000))
    row = ledger.enqueue(conversation_for(channel), "Listo, agendado.", kind=OutboundKind.REPLY, files=files)
    row.refresh_from_db()
    text, album, document = row.chunks
    assert text == "Listo, agendado."
    assert [f["name"] for f in album["files"]] == ["a.jpg", "b.jpg"]
    assert [f["type"] for f in album["files"]] == ["image/jpeg", "image/jpeg"]
    assert document["files"][0]["type"] == "text/plain" and document["files"][0]["name"] == "cita.ics"
    # A caption leaves room for the recovery marker within Telegram's 1,024.
    assert len(ledger.RECOVERY_PREFIX + document["files"][0]["caption"]) <= 1024
    assert attachments.read(document["files"][0]["file"]) == ics()
    # The same bytes twice are one stored object.
    assert stored(channel, File("again.ics", ics()))[0].file == document["files"][0]["file"]


@pytest.mark.django_db
def test_files_an_agent_cannot_attach_are_said_in_the_reply_not_sent(make_channel, settings):
    settings.AGENTLOOP_MEDIA_MAX_BYTES = 1000
    channel = make_channel("tg", kind="telegram", platform_settings={"bot_token": "1:x", "api_base": "http://127.0.0.1:9"})
    answer = Answer("Aquí está.", (File("empty.pdf", b""), File("big.bin", b"x" * 1001), File("../../etc/ok.txt", b"ok"),
                                   File("broken.png", None)))
    text, files = outbound.stored_answer(channel.pk, answer)
    assert [f.name for f in files] == ["ok.txt"]  # no path kept in a name
    assert text.splitlines()[0] == "Aquí está."
    assert "empty.pdf could not be attached: it is empty" in text and "big.bin was not attached" in text
    assert "broken.png could not be attached: it has no bytes" in text
    many = Answer("", tuple(File(f"{n}.txt", b"n") for n in range(12)))
    text, files = outbound.stored_answer(channel.pk, many)
    assert len(files) == 10 and text.count("at most 10 files") == 2


# --- sent for real: a worker and the local Bot API -----------------------------------------------


@pytest.mark.e2e
def test_an_agents_files_reach_telegram_once_photo_album_and_document(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram, agent="files", extra=UNPACED)
    web, _ = processes.web(wait=False, **AGENT), processes.worker(**AGENT)
    send(web, "tg", 101, "agenda el lunes y mándame las fotos")
    wait_until(delivered(1), timeout=30, message="the reply with its files delivered")
    assert texts(fake_telegram) == ["Agendado: agenda el lunes y mándame las fotos"]
    [album] = uploads(fake_telegram, "sendMediaGroup")
    shown = fake_telegram.sent_messages(chat_id=101)
    photos = [m["photo"][-1] for m in shown if "photo" in m]
    assert [p["sha256"] for p in photos] == [hashlib.sha256(jpeg(n)).hexdigest() for n in (1, 2)]
    [document] = uploads(fake_telegram, "sendDocument")
    assert document.params["document"]["sha256"] == hashlib.sha256(ics()).hexdigest()
    assert document.params["document"]["filename"] == "cita.ics" and document.params["caption"] == "Tu cita"
    assert not uploads(fake_telegram, "sendPhoto")
    row = OutboundMessage.objects.get()
    assert (row.state, row.attempts, row.chunks_delivered, row.needs_marker) == (OutboundState.DELIVERED, 1, 2, False)
    assert len(album.params["media"]) == 2


@pytest.mark.e2e
def test_killed_after_an_upload_resends_that_file_once_labelled(processes, make_channel, fake_telegram):
    channel = telegram_channel(make_channel, fake_telegram, extra=UNPACED)
    files = stored(channel, File("cita.ics", ics(), caption="Tu cita del lunes"))
    row = ledger.enqueue(conversation_for(channel), "Listo, agendado.", kind=OutboundKind.REPLY, files=files)
    doomed = processes.worker(wait=False, AGENTLOOP_FAILPOINT="ledger.after_upload")
    wait_until(lambda: doomed.popen.poll() is not None, timeout=30, message="the worker to die after the upload")
    assert doomed.popen.returncode == -signal.SIGKILL
    row.refresh_from_db()
    assert (row.state, row.chunks_started, row.chunks_delivered) == (OutboundState.ATTEMPTING, 2, 1)
    processes.worker()  # its boot sweep takes the dead worker's row
    wait_until(delivered(1), timeout=30, message="the file resent")
    assert texts(fake_telegram) == ["Listo, agendado."]  # the text was known delivered: never again
    captions = [c.params["caption"] for c in uploads(fake_telegram, "sendDocument")]
    assert captions == ["Tu cita del lunes", ledger.RECOVERY_PREFIX + "Tu cita del lunes"]
    row.refresh_from_db()
    assert (row.attempts, row.needs_marker) == (2, True)


@pytest.mark.e2e
def test_a_refused_upload_is_permanent_and_a_flood_waits_unlabelled(processes, make_channel, fake_telegram):
    channel = telegram_channel(make_channel, fake_telegram, extra=UNPACED)
    photo = stored(channel, File("foto.jpg", jpeg(3)))
    flooded = ledger.enqueue(conversation_for(channel), "", kind=OutboundKind.REPLY, files=photo)
    assert len(flooded.chunks) == 1  # no text: the photo is the whole reply
    fake_telegram.fail_next("sendPhoto", status=429, description="Too Many Requests: retry after 1", retry_after=1)
    processes.worker()
    wait_until(delivered(1), timeout=30, message="the photo sent after the flood")
    captions = [c.params.get("caption") for c in uploads(fake_telegram, "sendPhoto")]
    assert captions == [None, None]  # refused, then sent: never labelled
    flooded.refresh_from_db()
    assert flooded.attempts == 1 and flooded.flood_waits == 1
    fake_telegram.fail_next("sendDocument", status=400, description="Bad Request: file must be non-empty")
    refused = ledger.enqueue(conversation_for(channel, "102"), "", kind=OutboundKind.REPLY,
                             files=stored(channel, File("x.ics", ics())))
    wait_until(lambda: OutboundMessage.objects.get(pk=refused.pk).state == OutboundState.FAILED
               or OutboundMessage.objects.get(pk=refused.pk).state == OutboundState.UNREACHABLE,
               timeout=30, message="the refused upload settled")
    refused.refresh_from_db()
    assert refused.state == OutboundState.UNREACHABLE and "rejected" in refused.last_error


# --- WhatsApp: upload, then a message naming the media id ----------------------------------------


@pytest.fixture
def fake_graph():
    from tests.fakes.graph_api import FakeGraphAPI
    from tests.support.whatsapp import PHONE, TOKEN

    with FakeGraphAPI(tokens=[TOKEN], phone_number_ids=[PHONE]) as fake:
        yield fake


@pytest.mark.e2e
def test_an_agents_files_reach_whatsapp_uploaded_then_sent_once(processes, make_channel, fake_graph):
    from tests.support.whatsapp import USER, whatsapp_channel
    from tests.support.whatsapp import send as whatsapp_send

    whatsapp_channel(make_channel, fake_graph, agent="files")
    web, _ = processes.web(wait=False, **AGENT), processes.worker(**AGENT)
    wamid = whatsapp_send(web, "agenda el lunes")
    wait_until(delivered(1), timeout=30, message="the reply with its files delivered")
    assert fake_graph.texts(USER) == ["Agendado: agenda el lunes"]
    sent = fake_graph.file_messages(USER)
    assert [(m["type"], m.get("filename"), m.get("caption")) for m in sent] == [
        ("image", None, None), ("image", None, None), ("document", "cita.ics", "Tu cita")]  # no albums there
    assert [m["data"] for m in sent] == [jpeg(1), jpeg(2), ics()]
    assert len(fake_graph.calls("upload")) == 3
    assert all("context" not in c.body for c in fake_graph.calls("message")[1:])  # only the text threads
    assert fake_graph.calls("message")[0].body["context"] == {"message_id": wamid}


@pytest.mark.e2e
def test_a_whatsapp_upload_that_never_answers_sends_nothing_and_resends_unlabelled(processes, make_channel,
                                                                                    fake_graph):
    from tests.support.whatsapp import USER, whatsapp_channel

    channel = whatsapp_channel(make_channel, fake_graph)
    files = stored(channel, File("cita.ics", ics(), caption="Tu cita"))
    fake_graph.drop_connection_next("upload")
    row = ledger.enqueue(conversation_for(channel, USER), "", kind=OutboundKind.REPLY, files=files)
    processes.worker()
    wait_until(delivered(1), timeout=30, message="the file sent after the lost upload")
    [sent] = fake_graph.file_messages(USER)
    assert sent["caption"] == "Tu cita" and sent["data"] == ics()  # never labelled: nothing had left
    row.refresh_from_db()
    assert (row.attempts, row.flood_waits, row.needs_marker) == (1, 1, False)


@pytest.mark.django_db
def test_operators_see_a_replys_files_on_its_ledger_row_and_the_story(make_channel, admin_client):
    from agentloop.console import story

    channel = make_channel("tg", kind="telegram", platform_settings={"bot_token": "1:x", "api_base": "http://127.0.0.1:9"})
    conversation = conversation_for(channel)
    row = ledger.enqueue(conversation, "Listo.", kind=OutboundKind.REPLY,
                         files=stored(channel, File("cita.ics", ics()), File("foto.jpg", jpeg(4))))
    assert attachments.listed(row.chunks) == ["cita.ics (text/plain, 1 KB)", f"foto.jpg (image/jpeg, {round(len(jpeg(4)) / 1024) or 1} KB)"]
    page = admin_client.get(f"/admin/delivery/outboundmessage/{row.pk}/change/")
    assert page.status_code == 200 and "cita.ics (text/plain, 1 KB)" in page.content.decode()
    [entry] = [e for e in story.page(conversation.pk).entries if e.kind == "ledger"]
    assert dict(entry.details)["Files"].startswith("cita.ics (text/plain, 1 KB); foto.jpg")


@pytest.mark.django_db(transaction=True)
def test_the_web_chat_shows_a_replys_files_by_signed_links(make_channel, client):
    """The web chat has no uploads of its own: a file chunk is pushed to the page as a
    link it shows (a thumbnail for an image), served by /files/ like a user's file."""
    from asgiref.sync import async_to_sync
    from django.utils import timezone

    from agentloop.core import live
    from agentloop.core.models import LiveEvent, LiveListener
    from delivery.transports import Target, transport_for

    channel = make_channel("web", kind="webchat")
    conversation = conversation_for(channel)
    LiveListener.objects.create(name="test:1", seen_at=timezone.now())
    live.forget_listeners()
    files = list(stored(channel, File("foto.jpg", jpeg(5)), File("cita.ics", ics())))
    result = async_to_sync(transport_for(channel).send_files)(Target("101", conversation_id=conversation.pk),
                                                              files, "Tus archivos")
    assert result.ok
    [event] = [e.payload for e in LiveEvent.objects.all()]
    assert event["kind"] == "reply" and event["text"] == "Tus archivos"
    assert [(f["name"], f["type"]) for f in event["files"]] == [("foto.jpg", "image/jpeg"), ("cita.ics", "text/plain")]
    photo = client.get(event["files"][0]["url"])
    assert photo.status_code == 200 and b"".join(photo.streaming_content) == jpeg(5)
    assert photo["Content-Type"] == "image/jpeg" and photo["X-Content-Type-Options"] == "nosniff"
    small = client.get(event["files"][0]["url"] + "?thumbnail=1")
    assert small.status_code == 200 and small.content[:2] == b"\xff\xd8"
    # A link is signed: another storage name, or one outside replies' files, is refused.
    from django.core import signing

    from conversations.media.links import SALT

    forged = signing.TimestampSigner(salt=SALT).sign_object({"o": "media/1/aa/secret", "t": "x", "n": "x"})
    assert client.get(f"/files/{forged}").status_code == 403
    assert client.get(event["files"][1]["url"][:-3] + "abc").status_code == 403
    # After a reload, the page's transcript shows the reply's files by the same kind of link.
    from agentloop.console.consumers import _transcript

    ledger.enqueue(conversation, "Tus archivos", kind=OutboundKind.REPLY, files=files)
    [reply] = [item for item in _transcript(conversation.pk) if item["kind"] == "reply"]
    assert [f["name"] for f in reply["files"]] == ["foto.jpg", "cita.ics"]
    assert b"".join(client.get(reply["files"][1]["url"]).streaming_content) == ics()
    assert set(reply["files"][0]) == {"name", "type", "size", "url"}  # no storage name reaches the page
