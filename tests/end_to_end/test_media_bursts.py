"""Media is part of the burst, through the real web server and worker: an album of three
photos with its question after it is one turn, and so is a photo followed by its
question — the two cases that made four and two replies while media flushed at once —
and an album of ten, delivered out of order, is one model request with ten images."""

import itertools
import time

import pytest

from conversations.models import BufferState, MessageBuffer, Turn, TurnState
from delivery.models import OutboundMessage, OutboundState
from tests.conftest import wait_until
from tests.support import local_http
from tests.support.e2e import SECRET, send, telegram_channel

pytestmark = pytest.mark.e2e
_ids = itertools.count(700_000)


def photo_update(chat_id, *, caption="", album=""):
    """A Telegram photo message as the Bot API sends it (sizes of one photo; an album's
    items share `media_group_id`)."""
    message_id = next(_ids)
    message = {
        "message_id": message_id, "date": int(time.time()),
        "from": {"id": chat_id, "is_bot": False, "first_name": "Camila"},
        "chat": {"id": chat_id, "type": "private", "first_name": "Camila"},
        "photo": [{"file_id": f"photo-{message_id}-s", "file_unique_id": f"u{message_id}s", "width": 90,
                   "height": 67, "file_size": 1_200},
                  {"file_id": f"photo-{message_id}-m", "file_unique_id": f"u{message_id}m", "width": 800,
                   "height": 600, "file_size": 61_000}],
    }
    if caption:
        message["caption"] = caption
    if album:
        message["media_group_id"] = album
    return {"update_id": next(_ids), "message": message}


def post(web, body):
    response = local_http.post(f"{web.url}/webhooks/telegram/tg/", json=body,
                               headers={"X-Telegram-Bot-Api-Secret-Token": SECRET}, timeout=10)
    assert response.status_code == 200, response.text


def settled(chat_id):
    """Every buffer of the chat flushed, its turns over and their replies delivered."""
    def check():
        buffers = MessageBuffer.objects.filter(conversation__chat_id=str(chat_id))
        turns = Turn.objects.filter(conversation__chat_id=str(chat_id))
        return (buffers.exists() and not buffers.filter(state=BufferState.OPEN).exists()
                and not turns.exclude(state__in=[TurnState.DONE, TurnState.FAILED]).exists()
                and not OutboundMessage.objects.filter(chat_id=str(chat_id)).exclude(
                    state=OutboundState.DELIVERED).exists())
    return check


def replies(fake, chat_id):
    return [c.params["text"] for c in fake.calls("sendMessage") if str(c.params["chat_id"]) == str(chat_id)]


def test_an_album_and_a_photo_each_with_their_question_are_one_turn_each(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram)
    web, _ = processes.web(wait=False), processes.worker()
    album = [photo_update(501, caption="Las boletas de ayer", album="13579"),
             photo_update(501, album="13579"), photo_update(501, album="13579")]
    for item in album:  # as a phone uploads them: one after the other
        post(web, item)
    time.sleep(0.5)  # the user's pause before the question (the table's 0.5 s), not a wait for a result
    send(web, "tg", 501, "¿cuánto suman en total?")
    post(web, photo_update(502))
    time.sleep(0.6)
    send(web, "tg", 502, "¿qué dice esta boleta?")

    for chat in (501, 502):
        wait_until(settled(chat), timeout=30, message=f"chat {chat} answered")
    assert replies(fake_telegram, 501) == ["[photo] Las boletas de ayer\n[photo]\n[photo]\n¿cuánto suman en total?"]
    assert replies(fake_telegram, 502) == ["[photo]\n¿qué dice esta boleta?"]
    [album_turn] = Turn.objects.filter(conversation__chat_id="501")
    [photo_turn] = Turn.objects.filter(conversation__chat_id="502")
    assert (album_turn.flush_reason, photo_turn.flush_reason) == ("window", "window")
    buffer = MessageBuffer.objects.get(conversation__chat_id="501")
    assert buffer.message_count == 2  # the album and its question


def answered_by_a_model(model, answer, processes, make_channel, fake_telegram, tmp_path):
    """A Telegram channel whose OpenAI-compatible agent is `model` (answering `answer`),
    its web server and worker storing files under tmp_path; returns the web server."""
    from tests.fakes.openai_api import Reply

    model.script(Reply(answer))
    telegram_channel(make_channel, fake_telegram, agent="openai", agent_config={
        "base_url": model.url, "model": "fake-model", "api_key_env": "FAKE_OPENAI_API_KEY"})
    web = processes.web(wait=False, AGENTLOOP_MEDIA_ROOT=tmp_path / "files")
    processes.worker(AGENTLOOP_MEDIA_ROOT=tmp_path / "files")
    return web


def test_the_model_receives_every_image_of_the_album_fetched_once(processes, make_channel, fake_telegram, tmp_path):
    """An album of 3 photos the local Bot API serves (getFile, then each download) and
    its question: one model request carrying the 3 images, each fetched once even though
    the album's first update is delivered again."""
    import io

    from PIL import Image

    from conversations.models import MediaFile, MediaState
    from tests.fakes.openai_api import FakeOpenAI
    from tests.support.e2e import TOKEN

    def jpeg(shade):
        out = io.BytesIO()
        Image.new("RGB", (40, 30), (shade, 10, 10)).save(out, "JPEG")
        return out.getvalue()

    with FakeOpenAI() as model:
        web = answered_by_a_model(model, "Suman 42.", processes, make_channel, fake_telegram, tmp_path)
        album = []
        for shade in (50, 120, 200):
            update = photo_update(601, album="24680", caption="las boletas" if shade == 50 else "")
            update["message"]["photo"] = [{**fake_telegram.add_file(TOKEN, jpeg(shade)), "width": 40, "height": 30}]
            album.append(update)
        for item in album:
            post(web, item)
        post(web, album[0])  # delivered again: stored once, fetched once
        send(web, "tg", 601, "¿cuánto suman en total?")
        wait_until(settled(601), timeout=30, message="the album answered")

        [request] = model.requests()
        content = request.messages[-1]["content"]
        assert [part["type"] for part in content] == ["text", "image_url", "image_url", "image_url"]
        assert content[0]["text"] == "[photo] las boletas\n[photo]\n[photo]\n¿cuánto suman en total?"
        assert all(part["image_url"]["url"].startswith("data:image/jpeg;base64,") for part in content[1:])
    assert replies(fake_telegram, 601) == ["Suman 42."]
    assert sorted(fake_telegram.downloads) == sorted(u["message"]["photo"][0]["file_id"] for u in album)
    assert set(MediaFile.objects.values_list("state", flat=True)) == {MediaState.STORED}


def test_a_photo_the_platform_cannot_give_is_told_to_the_model(processes, make_channel, fake_telegram, tmp_path):
    """A file id the Bot API does not know (getFile: 400): settled at once as failed, and the
    model is told it could not be read; the turn is not held up."""
    from tests.fakes.openai_api import FakeOpenAI

    with FakeOpenAI() as model:
        web = answered_by_a_model(model, "No pude ver la foto.", processes, make_channel, fake_telegram, tmp_path)
        post(web, photo_update(602, caption="¿qué dice?"))
        wait_until(settled(602), timeout=30, message="the photo answered")
        [request] = model.requests()
        content = request.messages[-1]["content"]
    assert content[0] == {"type": "text", "text": "[photo] ¿qué dice?"}
    assert content[1]["type"] == "text" and "could not be read" in content[1]["text"]
    assert "wrong file_id" in content[1]["text"].lower()
    assert replies(fake_telegram, 602) == ["No pude ver la foto."]


def test_a_voice_note_is_transcribed_once_and_the_model_reads_its_text(
        processes, make_channel, fake_telegram, tmp_path):
    """A voice note (its update delivered twice) and then a question: one turn whose model
    request carries the note's transcript, from one download and one transcription
    request to the OpenAI-compatible /v1/audio/transcriptions (the language passed on)."""
    from conversations.models import Channel, MediaFile
    from tests.fakes.openai_api import FakeOpenAI
    from tests.support.e2e import TOKEN

    ogg = b"OggS\x00\x02" + bytes(range(256)) * 40  # what a voice note's bytes begin with
    with FakeOpenAI() as model:
        model.transcript = "Reserva para el martes a las cinco, por favor."
        web = answered_by_a_model(model, "Listo, martes 17:00.", processes, make_channel, fake_telegram, tmp_path)
        Channel.objects.filter(slug="tg").update(agent_config={
            **Channel.objects.get(slug="tg").agent_config,
            "transcription": {"base_url": model.url, "model": "whisper-1", "api_key_env": "FAKE_OPENAI_API_KEY",
                              "language": "es"}})
        voice = photo_update(603)
        del voice["message"]["photo"]
        voice["message"]["voice"] = {**fake_telegram.add_file(TOKEN, ogg), "duration": 4, "mime_type": "audio/ogg"}
        post(web, voice)
        post(web, voice)  # delivered again: one file, fetched and transcribed once
        send(web, "tg", 603, "¿puedes?")
        wait_until(settled(603), timeout=30, message="the voice note answered")
        [request] = model.requests()
        [transcription] = model.transcriptions()
    content = request.messages[-1]["content"]
    assert content[0] == {"type": "text", "text": "[voice]\n¿puedes?"}
    assert content[1]["type"] == "text" and content[1]["text"].startswith("[voice note: audio/ogg")
    assert "4 s; transcribed]\nReserva para el martes a las cinco, por favor." in content[1]["text"]
    assert (transcription.model, transcription.language, transcription.data) == ("whisper-1", "es", ogg)
    assert transcription.file_name.endswith(".ogg")
    assert fake_telegram.downloads == [voice["message"]["voice"]["file_id"]]
    assert MediaFile.objects.get().transcript == "Reserva para el martes a las cinco, por favor."
    assert replies(fake_telegram, 603) == ["Listo, martes 17:00."]


@pytest.mark.parametrize("storage", ["filesystem", "s3"])
def test_an_agent_in_another_service_gets_signed_links_to_the_files(processes, make_channel, fake_telegram,
                                                                    agent_key, tmp_path, request, storage):
    """A webhook agent receives the photo's facts and a signed link in its POST; the link
    gives the stored bytes, and the same link with one character changed is refused. The
    turn the agent took over lists the same file through the API. With an S3 bucket the
    worker stores the file there and the web server serves it from there (nothing on
    either's disk): what lets several hosts share files."""
    from tests.end_to_end.test_remote_agents_e2e import SECRET as AGENT_SECRET
    from tests.end_to_end.test_remote_agents_e2e import AgentService, api
    from tests.support.e2e import TOKEN
    from tests.unit.test_media import jpeg

    service = AgentService("later")
    try:
        channel = telegram_channel(make_channel, fake_telegram, agent="webhook",
                                   agent_config={"url": service.url, "secret": AGENT_SECRET})
        key = agent_key(channel)
        s3 = request.getfixturevalue("s3_server") if storage == "s3" else None
        env = {"AGENTLOOP_MEDIA_ROOT": tmp_path / "files", **(s3.env() if s3 else {})}
        web = processes.web(wait=False, **env)
        processes.worker(**env)
        photo = jpeg(320, 240)
        update = photo_update(604, caption="¿qué es esto?")
        update["message"]["photo"] = [{**fake_telegram.add_file(TOKEN, photo), "width": 320, "height": 240}]
        post(web, update)
        [payload] = wait_until(lambda: service.received, timeout=20, message="the agent service called")
    finally:
        service.close()
    assert payload["text"] == "[photo] ¿qué es esto?"
    [item] = payload["media"]
    assert {k: item[k] for k in ("kind", "state", "content_type", "size")} == \
        {"kind": "photo", "state": "stored", "content_type": "image/jpeg", "size": len(photo)}
    fetched = local_http.get(f"{web.url}{item['url']}", timeout=10)
    assert fetched.status_code == 200 and fetched.content == photo
    assert fetched.headers["Content-Type"] == "image/jpeg"
    assert fetched.headers["Content-Security-Policy"].startswith("sandbox")
    token = item["url"].rsplit("/", 1)[1]
    forged = item["url"][:-len(token)] + token[:-1] + ("A" if token[-1] != "A" else "B")
    refused = local_http.get(f"{web.url}{forged}", timeout=10)
    assert refused.status_code == 403 and refused.json() == {"error": "this link is not valid"}
    [listed] = api(web, key, "GET", "/api/v1/turns?state=running").json()
    assert [m["content_type"] for m in listed["media"]] == ["image/jpeg"]
    assert local_http.get(f"{web.url}{listed['media'][0]['url']}", timeout=10).content == photo
    if s3 is not None:
        assert len(s3.keys()) == 1 and not (tmp_path / "files").exists()


def test_an_album_of_ten_out_of_order_and_its_question_is_one_turn_with_ten_images(
        processes, make_channel, fake_telegram, tmp_path):
    """An album of 10 photos (one media_group_id, its updates delivered out of order and
    one of them twice) and its question 0.5 s later: one turn, one reply, one model
    request carrying all 10 images — each the bytes of its photo — and each file
    downloaded once."""
    import base64
    import io
    import random

    from PIL import Image

    from conversations.models import MediaFile, MediaState
    from tests.fakes.openai_api import FakeOpenAI
    from tests.support.e2e import TOKEN

    def jpeg(shade):
        out = io.BytesIO()
        Image.new("RGB", (40, 30), (shade, 90, 10)).save(out, "JPEG")
        return out.getvalue()

    photos = [jpeg(20 + 23 * n) for n in range(10)]
    with FakeOpenAI() as model:
        web = answered_by_a_model(model, "Son 10 boletas.", processes, make_channel, fake_telegram, tmp_path)
        album = []
        for n, data in enumerate(photos):
            update = photo_update(605, album="97531", caption="las diez boletas" if n == 0 else "")
            update["message"]["photo"] = [{**fake_telegram.add_file(TOKEN, data), "width": 40, "height": 30}]
            album.append(update)
        delivered = random.Random(605).sample(album, len(album))
        delivered.insert(4, delivered[1])  # one item delivered twice
        for item in delivered:
            post(web, item)
        time.sleep(0.5)  # the user's pause before the question, not a wait for a result
        send(web, "tg", 605, "¿cuánto suman?")
        wait_until(settled(605), timeout=30, message="the album of ten answered")
        [request] = model.requests()

    content = request.messages[-1]["content"]
    assert [part["type"] for part in content] == ["text"] + ["image_url"] * 10
    arrived = list(dict.fromkeys(album.index(item) for item in delivered))  # the album's order as it came
    assert content[0]["text"] == "\n".join(
        ["[photo] las diez boletas" if n == 0 else "[photo]" for n in arrived] + ["¿cuánto suman?"])
    shown = [base64.b64decode(part["image_url"]["url"].split(",", 1)[1]) for part in content[1:]]
    assert shown == [photos[n] for n in arrived]
    assert replies(fake_telegram, 605) == ["Son 10 boletas."]
    [turn] = Turn.objects.filter(conversation__chat_id="605")
    assert turn.state == TurnState.DONE
    assert sorted(fake_telegram.downloads) == sorted(u["message"]["photo"][0]["file_id"] for u in album)
    assert MediaFile.objects.filter(state=MediaState.STORED).count() == 10


def test_a_photo_given_by_https_url_to_an_api_channel_reaches_the_model_as_an_image(
        processes, make_channel, agent_key, tmp_path):
    """A message into an API channel with the photo's `https` URL on a local TLS file
    server (its CA trusted by AGENTLOOP_MEDIA_URL_CA_BUNDLE, its host allowed by the
    channel): accepted at once, fetched by the worker from the address it checked, and
    the model gets the image as a content part; a second message with a plain-http URL
    is refused at admission (400)."""
    from conversations.models import MediaFile, MediaState
    from tests.fakes.file_server import FileServer
    from tests.fakes.openai_api import FakeOpenAI, Reply
    from tests.unit.test_media import jpeg

    photo = jpeg(320, 240)
    with FakeOpenAI() as model, FileServer(tmp_path) as files:
        model.script(Reply("Es una boleta."))
        channel = make_channel("shop", kind="api", agent="openai", platform_settings={
            "allowed_media_hosts": ["localhost"]}, agent_config={
            "base_url": model.url, "model": "fake-model", "api_key_env": "FAKE_OPENAI_API_KEY"})
        key = agent_key(channel)
        env = {"AGENTLOOP_MEDIA_ROOT": tmp_path / "files", "AGENTLOOP_MEDIA_URL_CA_BUNDLE": files.ca_file}
        web = processes.web(wait=False, **env)
        processes.worker(**env)
        url = files.add("boleta.jpg", photo)
        headers = {"Authorization": f"Bearer {key}"}
        accepted = local_http.post(f"{web.url}/api/v1/channels/shop/messages", headers=headers, timeout=10, json={
            "message_id": "m1", "contact": "ana", "text": "¿qué es esto?", "media_url": url})
        assert accepted.status_code == 202, accepted.text
        refused = local_http.post(f"{web.url}/api/v1/channels/shop/messages", headers=headers, timeout=10, json={
            "message_id": "m2", "contact": "ana", "media_url": url.replace("https:", "http:")})
        assert refused.status_code == 400
        assert refused.json()["fields"]["media_url"] == ["only https URLs are fetched (it must begin with https://)"]
        wait_until(settled("ana"), timeout=30, message="the photo answered")
        [request] = model.requests()
        assert files.requests == [("/files/boleta.jpg", f"localhost:{files.server_address[1]}")]
    content = request.messages[-1]["content"]
    assert [part["type"] for part in content] == ["text", "image_url"]
    assert content[0]["text"] == "[photo] ¿qué es esto?"
    assert content[1]["image_url"]["url"].startswith("data:image/jpeg;base64,")
    file = MediaFile.objects.get()
    assert (file.state, file.content_type, file.size) == (MediaState.STORED, "image/jpeg", len(photo))


def test_an_image_attached_in_the_playground_reaches_the_model_as_an_image(processes, make_channel, tmp_path):
    """An operator logged in to the real web server attaches a photo with its caption in
    the playground (the page's POST, its CSRF token) and then types a question: one turn,
    whose model request carries the image the worker read back from the storage; the
    thumbnail's signed link gives the bytes."""
    import httpx
    from django.contrib.auth import get_user_model

    from conversations.models import MediaFile, MediaState
    from tests.fakes.openai_api import FakeOpenAI, Reply
    from tests.unit.test_media import jpeg

    photo = jpeg(300, 200)
    user = get_user_model().objects.create_superuser("olga", "olga@example.com", "pw-olga-upload")
    chat = f"console-{user.pk}"
    with FakeOpenAI() as model:
        model.script(Reply("Es una boleta de 42."))
        make_channel("playground", kind="webchat", agent="openai", agent_config={
            "base_url": model.url, "model": "fake-model", "api_key_env": "FAKE_OPENAI_API_KEY"})
        env = {"AGENTLOOP_MEDIA_ROOT": tmp_path / "files"}
        web = processes.web(**env)
        processes.worker(**env)
        with httpx.Client(base_url=web.url, timeout=30, trust_env=False) as page:
            page.get("/admin/login/")
            logged_in = page.post("/admin/login/", data={"username": "olga", "password": "pw-olga-upload",
                                                        "next": "/admin/",
                                                        "csrfmiddlewaretoken": page.cookies["csrftoken"]})
            assert logged_in.status_code == 302, logged_in.text
            sent = page.post("/console/playground/playground/files", headers={"X-CSRFToken": page.cookies["csrftoken"]},
                             data={"text": "la de ayer", "id": "a1"}, files={"file": ("boleta.jpg", photo, "image/jpeg")})
            assert sent.status_code == 202, sent.text
            wait_until(settled(chat), timeout=30, message="the photo answered")
            thumbnail = page.get(sent.json()["file"]["url"])
        [request] = model.requests()
    content = request.messages[-1]["content"]
    assert [part["type"] for part in content] == ["text", "image_url"]
    assert content[0]["text"] == "[photo] la de ayer"
    assert content[1]["image_url"]["url"].startswith("data:image/jpeg;base64,")
    assert thumbnail.status_code == 200 and thumbnail.content == photo
    assert MediaFile.objects.get().state == MediaState.STORED
