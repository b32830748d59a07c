"""Files users send (conversations.media): read from the bytes, fetched from a local Bot
API server through python-telegram-bot and httpx under a cap and a deadline, stored once,
retried or settled, and shown to the model as content parts."""

import asyncio
import base64
import io
from datetime import timedelta

import pytest
from django.core.files.storage import default_storage
from django.utils import timezone
from PIL import Image

from conversations import platforms
from conversations.ingest import MediaRef
from conversations.media import fetching, files, for_agents, sniff
from conversations.media.download import FileTooLarge, FileUnavailable
from conversations.models import MediaFile, MediaState
from delivery import transports
from tests.support.e2e import TOKEN, telegram_channel


def jpeg(width=64, height=48) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(out, "JPEG")
    return out.getvalue()


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGBA", (8, 8)).save(out, "PNG")
    return out.getvalue()


@pytest.fixture(autouse=True)
def media_root(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "files"  # FileSystemStorage follows the setting's change
    yield
    if settings.STORAGES["default"]["BACKEND"].endswith("FileSystemStorage"):  # not a test's S3 bucket
        assert str(tmp_path) in default_storage.path("x")


def ref(key="u1", **kw):
    return MediaRef(key=key, ref=kw.pop("ref", f"file-{key}"), kind=kw.pop("kind", "photo"), **kw)


# --- what the bytes are -------------------------------------------------------------------

@pytest.mark.parametrize(("data", "mime"), [
    (jpeg(), "image/jpeg"),
    (png(), "image/png"),
    ("¿Cuánto suman? 12 + 30\n".encode(), "text/plain"),
    (b"PK\x03\x04" + b"\x00" * 40, "application/zip"),  # a ZIP named boleta.jpg is a ZIP
    (b"\x00\x01\x02binary", "application/octet-stream"),
    (b"", "application/octet-stream"),
])
def test_the_content_type_comes_from_the_bytes(data, mime):
    assert sniff.content_type(data) == mime


# --- one row per platform file --------------------------------------------------------------

def test_the_same_platform_file_is_one_row_and_one_over_the_cap_is_skipped_at_once(make_channel, settings):
    channel = make_channel("tg", kind="telegram")
    first = files.file_id_for(channel, ref("same"))
    assert files.file_id_for(channel, ref("same", ref="another-file-id")) == first
    settings.AGENTLOOP_MEDIA_MAX_BYTES = 1000
    big = MediaFile.objects.get(pk=files.file_id_for(channel, ref("big", declared_size=5_000_000)))
    assert big.state == MediaState.SKIPPED and "5.0 MB is over the 1 KB" in big.problem


# --- fetched from a local Bot API server -----------------------------------------------------

def fetch(channel, file_id, limit=1_000_000):
    async def once():
        try:
            return await platforms.of(channel).fetch_media(channel, file_id, limit)
        finally:
            await transports.close_clients()  # the bot's HTTP session belongs to this loop
    return asyncio.run(once())


@pytest.fixture
def bot_channel(make_channel, fake_telegram):
    return telegram_channel(make_channel, fake_telegram)


def test_a_telegram_file_is_fetched_with_get_file_then_its_download(bot_channel, fake_telegram):
    photo = jpeg()
    given = fake_telegram.add_file(TOKEN, photo)
    assert fetch(bot_channel, given["file_id"]) == photo
    assert [c.params["file_id"] for c in fake_telegram.calls("getFile")] == [given["file_id"]]
    assert fake_telegram.downloads == [given["file_id"]]


def test_an_unknown_file_id_is_unavailable_for_good(bot_channel):
    with pytest.raises(FileUnavailable) as caught:
        fetch(bot_channel, "no-such-file")
    assert caught.value.permanent and "wrong file_id" in str(caught.value).lower()


def test_a_file_over_the_cap_is_refused_by_its_size_and_by_its_bytes_when_the_size_lies(bot_channel, fake_telegram):
    honest = fake_telegram.add_file(TOKEN, b"x" * 5000)
    with pytest.raises(FileTooLarge):
        fetch(bot_channel, honest["file_id"], limit=1000)
    liar = fake_telegram.add_file(TOKEN, b"y" * 5000, size=10)  # getFile says 10 bytes
    with pytest.raises(FileTooLarge):
        fetch(bot_channel, liar["file_id"], limit=1000)


def test_a_download_that_trickles_meets_the_deadline_and_names_no_token(bot_channel, fake_telegram, settings):
    settings.AGENTLOOP_MEDIA_FETCH_DEADLINE = 0.5
    slow = fake_telegram.add_file(TOKEN, b"z" * 20_000, trickle=0.1)  # 2 s in all
    with pytest.raises(FileUnavailable) as caught:
        fetch(bot_channel, slow["file_id"])
    assert not caught.value.permanent and "0.5 s" in str(caught.value) and TOKEN not in str(caught.value)


# --- retried, settled ----------------------------------------------------------------------

def claimed(channel, key="u1"):
    pk = files.file_id_for(channel, ref(key))
    [file] = fetching.claim([pk], "w1")
    return file


def test_a_failed_try_is_retried_later_then_given_up_and_a_refusal_settles_at_once(make_channel, settings):
    channel = make_channel("tg", kind="telegram")
    settings.AGENTLOOP_MEDIA_ATTEMPTS = 2
    file = claimed(channel)
    assert fetching.mark_failed(file, "w1", FileUnavailable("reset by peer")) == MediaState.PENDING
    again = MediaFile.objects.get(pk=file.pk)
    assert again.next_attempt_at > timezone.now() and again.problem == "reset by peer"
    assert fetching.claim([file.pk], "w1") == []  # not due yet: claimed by the due query only
    MediaFile.objects.filter(pk=file.pk).update(next_attempt_at=timezone.now())
    [second] = fetching.claim(fetching.due_ids(10), "w1")
    assert second.attempts == 2
    assert fetching.mark_failed(second, "w1", FileUnavailable("reset again")) == MediaState.FAILED
    refused = claimed(channel, "u2")
    assert fetching.mark_failed(refused, "w1", FileUnavailable("404", permanent=True)) == MediaState.FAILED
    large = claimed(channel, "u3")
    assert fetching.mark_failed(large, "w1", FileTooLarge(10, 5)) == MediaState.SKIPPED


def test_a_claim_is_taken_once_and_an_expired_lease_or_a_dead_owner_gives_it_back(make_channel):
    channel = make_channel("tg", kind="telegram")
    pk = files.file_id_for(channel, ref())
    assert len(fetching.claim([pk], "w1")) == 1
    assert fetching.claim([pk], "w2") == []
    MediaFile.objects.filter(pk=pk).update(lease_until=timezone.now() - timedelta(seconds=1))
    assert fetching.release_expired() == 1
    assert [f.owner for f in fetching.claim([pk], "w2")] == ["w2"]
    assert fetching.release_expired(dead_owners=["w1"]) == 0  # its lease is w2's, alive
    assert fetching.release_expired(dead_owners=["w2"]) == 1  # w2 died: not waited out
    assert MediaFile.objects.get(pk=pk).state == MediaState.PENDING


def test_stored_once_under_its_digest_even_when_saved_again_after_a_crash(make_channel):
    channel = make_channel("tg", kind="telegram")
    file = claimed(channel)
    first, second = fetching.save(file, jpeg()), fetching.save(file, jpeg())
    assert first == second and first["content_type"] == "image/jpeg"
    assert fetching.mark_stored(file, "w1", first)
    assert not fetching.mark_stored(file, "w2", first)  # not its claim


# --- what the model is shown -----------------------------------------------------------------

def stored(channel, key, data, **kw):
    file = claimed(channel, key)
    MediaFile.objects.filter(pk=file.pk).update(**kw)
    fetching.mark_stored(file, "w1", fetching.save(file, data))
    return file.pk


def test_images_become_image_parts_large_ones_downscaled_documents_their_text_the_rest_described(
        make_channel, settings):
    channel = make_channel("tg", kind="telegram")
    settings.AGENTLOOP_MEDIA_IMAGE_MAX_SIDE = 256
    small, big = stored(channel, "a", jpeg()), stored(channel, "b", jpeg(2000, 1000))
    doc = stored(channel, "c", b"Total: 42 USD\n", kind="document", file_name="boleta.txt")
    voice = stored(channel, "d", b"OggS\x00\x02" + b"\x00" * 60, kind="voice", duration=12)
    gone = claimed(channel, "e")
    fetching.mark_failed(gone, "w1", FileUnavailable("the platform answered 404 for the file", permanent=True))
    parts = for_agents.parts(for_agents.attachments([small, big, doc, voice, gone.pk]))
    assert [p["type"] for p in parts] == ["image_url", "image_url", "text", "text", "text"]
    assert parts[0]["image_url"]["url"] == "data:image/jpeg;base64," + base64.b64encode(jpeg()).decode()
    scaled = Image.open(io.BytesIO(base64.b64decode(parts[1]["image_url"]["url"].split(",", 1)[1])))
    assert scaled.size == (256, 128)
    assert "'boleta.txt', text/plain" in parts[2]["text"] and "Total: 42 USD" in parts[2]["text"]
    assert parts[3]["text"] == "[voice note: audio/ogg, 66 bytes, 12 s; not transcribed]"
    assert parts[4]["text"] == "[photo; could not be read: the platform answered 404 for the file]"


def test_images_beyond_what_a_burst_may_carry_are_described(make_channel, settings):
    channel = make_channel("tg", kind="telegram")
    ids = [stored(channel, f"k{i}", jpeg(64 + i, 48)) for i in range(3)]
    settings.AGENTLOOP_MEDIA_MAX_TURN_BYTES = sum(MediaFile.objects.get(pk=pk).size for pk in ids[:2])
    parts = for_agents.parts(for_agents.attachments(ids))
    assert [p["type"] for p in parts] == ["image_url", "image_url", "text"]
    assert "over what one burst may carry" in parts[2]["text"]


# --- voice notes as text -------------------------------------------------------------------

OGG = b"OggS\x00\x02" + b"\x01" * 200


def test_a_channel_transcribes_with_its_own_server_the_deployments_or_not_at_all(make_channel, settings):
    from django.core.exceptions import ValidationError

    from conversations.agents import validate_agent_config
    from conversations.media import transcribe

    settings.AGENTLOOP_TRANSCRIPTION_BASE_URL = ""
    plain = make_channel("a", kind="telegram")
    assert transcribe.transcriber_for(plain) is None  # nothing configured: described, not transcribed
    own = make_channel("b", kind="telegram", agent_config={"transcription": {"base_url": "http://asr/v1",
                                                                             "model": "large-v3"}})
    assert (transcribe.transcriber_for(own).base_url, transcribe.transcriber_for(own).model) == \
        ("http://asr/v1", "large-v3")
    settings.AGENTLOOP_TRANSCRIPTION_BASE_URL = "http://everyone/v1"
    assert transcribe.transcriber_for(plain).model == "whisper-1"
    off = make_channel("c", kind="telegram", agent_config={"transcription": False})
    assert transcribe.transcriber_for(off) is None
    for bad, why in [({"transcription": "yes"}, "must be an object"),
                     ({"transcription": {"url": "x"}}, "unknown keys: url"),
                     ({"transcription": {"api_key_env": "SECRET_KEY"}}, "is not allowed")]:
        with pytest.raises(ValidationError, match=why):
            validate_agent_config(bad)


def voice_file(channel, key="v1"):
    file = claimed(channel, key)
    MediaFile.objects.filter(pk=file.pk).update(kind="voice", duration=3)
    file.kind, file.duration = "voice", 3
    return file


def test_a_transcription_that_fails_or_never_answers_is_told_to_the_model_redacted(make_channel, settings,
                                                                                 monkeypatch):
    import socket
    import time

    from conversations.media import transcribe
    from tests.fakes.openai_api import Error, FakeOpenAI

    channel = make_channel("tg", kind="telegram")
    secret = "sk-proj-" + "Zq9" * 12
    monkeypatch.setenv("ASR_API_KEY", secret)
    settings.AGENTLOOP_TRANSCRIPTION_API_KEY_ENV = "ASR_API_KEY"
    with FakeOpenAI(api_keys=[secret]) as server:
        settings.AGENTLOOP_TRANSCRIPTION_BASE_URL = server.url
        server.transcript = Error(500, f"decoder crashed reading key={secret}")
        file = voice_file(channel)
        found = asyncio.run(transcribe.transcript_of(file, OGG))
        assert found["transcript"] == "" and found["problem"].startswith("not transcribed: InternalServerError")
        assert secret not in found["problem"]
        assert len(server.transcriptions()) == 1  # not retried: the file itself is stored
    fetching.mark_stored(file, "w1", {**fetching.save(file, OGG), **found})
    [part] = for_agents.parts(for_agents.attachments([file.pk]))
    assert part["text"].startswith("[voice note: audio/ogg, 206 bytes, 3 s; not transcribed: InternalServerError")

    with socket.socket() as silent:  # accepts the connection, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        settings.AGENTLOOP_TRANSCRIPTION_BASE_URL = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
        settings.AGENTLOOP_TRANSCRIPTION_TIMEOUT = 0.5
        started = time.monotonic()
        found = asyncio.run(transcribe.transcript_of(voice_file(channel, "v2"), OGG))
        assert time.monotonic() - started < 3
    assert found["problem"] in ("not transcribed: no answer within 0.5 s",
                                "not transcribed: APITimeoutError: Request timed out.")


def test_only_sound_is_transcribed(make_channel, settings):
    from conversations.media import transcribe
    from tests.fakes.openai_api import FakeOpenAI

    channel = make_channel("tg", kind="telegram")
    with FakeOpenAI() as server:
        settings.AGENTLOOP_TRANSCRIPTION_BASE_URL = server.url
        assert asyncio.run(transcribe.transcript_of(claimed(channel, "p1"), jpeg())) == {}  # a photo
        assert asyncio.run(transcribe.transcript_of(voice_file(channel), OGG)) == {
            "transcript": f"({len(OGG)} bytes of voice.ogg)", "problem": ""}
        assert [t.file_name for t in server.transcriptions()] == ["voice.ogg"]


# --- signed links ---------------------------------------------------------------------------

def test_a_link_gives_its_file_until_it_expires_and_nothing_for_a_file_not_stored(make_channel, settings, client):
    from conversations.media import links

    channel = make_channel("tg", kind="telegram")
    pk = stored(channel, "l1", b"Total: 42 USD\n", kind="document", file_name="boleta.txt")
    path = links.path_for(pk)
    answer = client.get(path)
    assert answer.status_code == 200 and b"".join(answer.streaming_content) == b"Total: 42 USD\n"
    assert answer["Content-Type"] == "text/plain" and 'filename="boleta.txt"' in answer["Content-Disposition"]
    assert answer["X-Content-Type-Options"] == "nosniff"
    pending = claimed(channel, "l2").pk
    assert client.get(links.path_for(pending)).status_code == 404  # not stored (yet)
    assert client.get(links.path_for(999_999)).status_code == 404
    assert client.get("/files/not-a-token").json() == {"error": "this link is not valid"}
    settings.AGENTLOOP_MEDIA_URL_TTL = -1  # every link is older than that
    assert client.get(path).json()["error"].startswith("this link expired")
    settings.AGENTLOOP_MEDIA_URL_TTL = 3600
    default_storage.delete(MediaFile.objects.get(pk=pk).storage_name)
    assert client.get(path).status_code == 404  # the row says stored, the bytes are gone


# --- what operators see ----------------------------------------------------------------------

def test_the_admin_shows_a_thumbnail_and_the_story_what_the_agent_was_shown(admin_client, make_channel):
    import re

    from conversations.ingest import Inbound, admit
    from conversations.models import InboundMessage

    channel = make_channel("tg", kind="telegram")
    admit(channel, Inbound(platform_message_id="1", chat_id="5", sender_id="5", text="¿qué es?", media_type="photo",
                           media=ref("t1")))
    message = InboundMessage.objects.get()
    [file] = fetching.claim([message.media_file_id], "w1")
    fetching.mark_stored(file, "w1", fetching.save(file, jpeg(1200, 800)))

    listing = admin_client.get("/admin/conversations/mediafile/").content.decode()
    [src] = re.findall(r'<img src="(/files/[^"]+\?thumbnail=1)"', listing)
    small = admin_client.get(src.replace("&amp;", "&"))
    assert small["Content-Type"] == "image/jpeg"
    assert Image.open(io.BytesIO(small.content)).size == (160, 107)
    assert admin_client.get(f"/admin/conversations/mediafile/{file.pk}/change/").status_code == 200

    story = admin_client.get(f"/console/conversations/{message.conversation_id}/story/").content.decode()
    assert "[photo: image/jpeg, 1200" not in story  # the size is in KB, not pixels
    assert re.search(r"<dt>File</dt><dd>\[photo: image/jpeg, \d+ KB\]</dd>", story), story
    assert f"/admin/conversations/mediafile/{file.pk}/change/" in story


# --- an S3-compatible bucket ------------------------------------------------------------------

def test_files_go_to_an_s3_bucket_when_one_is_named_and_are_served_from_it(make_channel, settings, client,
                                                                          s3_server):
    from conversations.media import links

    settings.STORAGES = s3_server.storages()
    channel = make_channel("tg", kind="telegram")
    photo = jpeg(300, 200)
    pk = stored(channel, "s1", photo)
    [key] = s3_server.keys()
    assert key == MediaFile.objects.get(pk=pk).storage_name and key.startswith(f"media/{channel.pk}/")
    assert stored(channel, "s2", photo) != pk and s3_server.keys() == [key]  # the same bytes: one object
    [item] = for_agents.attachments([pk])
    assert item.read() == photo
    served = client.get(links.path_for(pk))
    assert served.status_code == 200 and b"".join(served.streaming_content) == photo


def test_the_history_carries_what_an_earlier_turn_was_shown_of_its_files(make_channel):
    """The next turn's history: the earlier turn's text with the lines describing its
    files, a voice note's transcript with its line — the bytes are not sent again."""
    from datetime import timedelta

    from conversations import engine, flushing, turns
    from conversations.ingest import Inbound, admit
    from conversations.models import TurnState

    channel = make_channel("tg", kind="telegram", window_media=1.0)
    t0 = timezone.now() - timedelta(minutes=5)
    admit(channel, Inbound(platform_message_id="1", chat_id="9", sender_id="9", media_type="photo",
                           media=ref("h1")), now=t0)
    admit(channel, Inbound(platform_message_id="2", chat_id="9", sender_id="9", media_type="voice",
                           media=ref("h2", kind="voice", duration=3)), now=t0)
    photo, voice = MediaFile.objects.order_by("pk")
    for file, data, extra in ((photo, jpeg(), {}), (voice, b"OggS\x00\x02" + b"\x00" * 60,
                                                     {"transcript": "Llego a las cinco."})):
        [claimed_file] = fetching.claim([file.pk], "w1")
        fetching.mark_stored(claimed_file, "w1", {**fetching.save(claimed_file, data), **extra})
    [first] = flushing.flush_due(now=t0 + timedelta(seconds=5))
    turns.start(first.pk, "w1")
    turns.finish(first.pk, "w1", state=TurnState.DONE, reply_text="Anotado.")
    admit(channel, Inbound(platform_message_id="3", chat_id="9", sender_id="9", text="¿y la foto?"),
          now=t0 + timedelta(seconds=10))
    [second] = flushing.flush_due(now=t0 + timedelta(seconds=20))
    [user, assistant] = engine.conversation_history(second.conversation, second)
    assert user == {"role": "user", "content": f"[photo]\n[voice]\n[photo: image/jpeg, {len(jpeg())} bytes]\n"
                                               "[voice note: audio/ogg, 66 bytes, 3 s; transcribed]\nLlego a las cinco."}
    assert assistant == {"role": "assistant", "content": "Anotado."}

