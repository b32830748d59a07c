"""POST /api/v1/channels/<slug>/messages for api channels, with agent keys."""

import pytest
from django.utils import timezone

from conversations.models import AgentKey, InboundMessage, MessageBuffer

URL = "/api/v1/channels/{}/messages"


@pytest.fixture
def api_channel(make_channel):
    return make_channel("shop", kind="api")


@pytest.fixture
def key(api_channel, agent_key):
    return agent_key(api_channel, name="owner")


def post(client, body, *, key=None, slug="shop", **extra):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
    return client.post(URL.format(slug), data=body, content_type="application/json", **headers, **extra)


def test_accepted_with_the_flush_deadline(client, key):
    response = post(client, {"message_id": "m1", "contact": "ana", "text": "Confirmo las horas y"}, key=key)
    assert response.status_code == 202
    body = response.json()
    assert body["duplicate"] is False and body["disposition"] == "buffered"
    assert (body["window"], body["flush_reason"]) == ("open", "window")
    assert 3.5 < body["flush_in"] <= 4.0
    assert MessageBuffer.objects.get().flush_at.isoformat().startswith(body["flush_at"][:19])


def test_an_album_through_the_api_counts_once_and_keeps_the_buffer_open(client, key):
    for i, caption in enumerate(("Las boletas", "", "")):
        body = post(client, {"message_id": f"p{i}", "contact": "ana", "text": caption, "media_type": "photo",
                             "album": "a1"}, key=key).json()
        assert (body["flush_reason"], body["window"]) == ("album", "neutral" if caption else "media")
    assert MessageBuffer.objects.get().message_count == 1
    long_album = post(client, {"message_id": "p9", "contact": "ana", "media_type": "photo", "album": "x" * 65},
                      key=key)
    assert long_album.status_code == 400 and "album" in long_album.json()["fields"]
    assert InboundMessage.objects.count() == 3


def test_duplicate_is_reported(client, key):
    payload = {"message_id": "m1", "contact": "ana", "text": "hola"}
    post(client, payload, key=key)
    body = post(client, payload, key=key).json()
    assert body["duplicate"] is True and body["disposition"] == "duplicate"
    assert InboundMessage.objects.count() == 1


def test_chat_and_sender_name_make_a_group_conversation(client, key):
    post(client, {"message_id": "1", "contact": "ana", "chat": "team", "sender_name": "Ana", "text": "hola",
                  "is_group": True}, key=key)
    message = InboundMessage.objects.get()
    assert (message.conversation.chat_id, message.conversation.sender_id) == ("team", "ana")
    assert message.conversation.is_group


@pytest.mark.parametrize("header", [None, "Bearer", "Bearer nope", "Token abc", "Bearer a b"])
def test_missing_or_bad_key_is_refused(client, api_channel, header):
    extra = {"HTTP_AUTHORIZATION": header} if header else {}
    response = client.post(URL.format("shop"), data={"message_id": "1", "contact": "a", "text": "x"},
                           content_type="application/json", **extra)
    assert response.status_code in (401, 403)
    assert "error" in response.json()
    assert not InboundMessage.objects.exists()


def test_revoked_key_is_refused(client, key):
    AgentKey.objects.update(revoked_at=timezone.now())
    assert post(client, {"message_id": "1", "contact": "a", "text": "x"}, key=key).status_code == 401


def test_a_key_sees_only_its_channels(client, make_channel, agent_key, key):
    make_channel("other", kind="api")
    response = post(client, {"message_id": "1", "contact": "a", "text": "x"}, key=key, slug="other")
    assert response.status_code == 403 and "no access" in response.json()["error"]
    assert not InboundMessage.objects.exists()


def test_unknown_channel_is_404(client, key):
    response = post(client, {"message_id": "1", "contact": "a", "text": "x"}, key=key, slug="nope")
    assert response.status_code == 404 and "error" in response.json()


def test_only_api_channels_take_generic_messages(client, make_channel, agent_key):
    tg = make_channel("tg", kind="telegram")
    response = post(client, {"message_id": "1", "contact": "a", "text": "x"}, key=agent_key(tg), slug="tg")
    assert response.status_code == 400


@pytest.mark.parametrize("body, field", [
    ({"contact": "a", "text": "x"}, "message_id"),
    ({"message_id": "1", "text": "x"}, "contact"),
    ({"message_id": "1", "contact": "a", "text": "   "}, "text"),
    ({"message_id": "1" * 121, "contact": "a", "text": "x"}, "message_id"),  # the column holds 120
])
def test_invalid_fields_are_400_with_the_field_named(client, key, body, field):
    response = post(client, body, key=key)
    assert response.status_code == 400
    assert field in response.json()["fields"]
    assert not InboundMessage.objects.exists()


def test_malformed_json_is_400(client, key):
    response = client.post(URL.format("shop"), data="{oops", content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 400 and "error" in response.json()


def test_oversized_body_is_413(client, key, settings):
    body = {"message_id": "1", "contact": "a", "text": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)}
    response = post(client, body, key=key)
    assert response.status_code == 413 and response.json() == {"error": "request body too large"}
    assert not InboundMessage.objects.exists()


def test_schema_is_public_and_lists_the_endpoint(client):
    response = client.get("/api/schema/")
    assert response.status_code == 200
    assert b"/api/v1/channels/{slug}/messages" in response.content


# --- a file with the message (multipart) ---------------------------------------------------

def upload(client, key, message, data=None, name="boleta.jpg", **extra):
    import json

    from django.core.files.uploadedfile import SimpleUploadedFile

    parts = {"message": json.dumps(message) if isinstance(message, dict) else message}
    if data is not None:
        parts["file"] = SimpleUploadedFile(name, data, content_type="image/jpeg")
    return client.post(URL.format("shop"), data=parts, HTTP_AUTHORIZATION=f"Bearer {key}", **extra)


def test_a_file_uploaded_with_the_message_is_stored_once_and_its_kind_read_from_its_bytes(
        client, key, settings, tmp_path):
    from conversations.media import for_agents, uploads
    from conversations.models import MediaFile, MediaState
    from tests.unit.test_media import jpeg

    settings.MEDIA_ROOT = tmp_path / "files"
    photo = jpeg()
    first = upload(client, key, {"message_id": "m1", "contact": "ana", "text": "¿qué dice?"}, photo)
    assert first.status_code == 202, first.content
    again = upload(client, key, {"message_id": "m1", "contact": "ana", "text": "¿qué dice?"}, photo)
    assert again.status_code == 202 and again.json()["duplicate"] is True
    [message] = InboundMessage.objects.all()
    assert message.media_type == "photo"
    [file] = MediaFile.objects.all()  # the retry stored nothing new
    assert (file.kind, file.state, file.file_name, file.declared_size) == ("photo", MediaState.PENDING,
                                                                            "boleta.jpg", len(photo))
    assert file.ref == uploads.storage_name(file.channel_id, file.file_key.removeprefix("upload:"))
    assert sorted(p.name for p in (tmp_path / "files").rglob("*") if p.is_file()) == [file.file_key[7:]]

    import asyncio

    from conversations.media import fetching
    [claimed] = fetching.claim([file.pk], "w1")
    fetching.mark_stored(claimed, "w1", fetching.save(claimed, asyncio.run(fetching.fetch(claimed))))
    [item] = for_agents.attachments([file.pk])
    assert item.readable and item.content_type == "image/jpeg" and item.read() == photo


def test_a_file_upload_that_is_empty_too_large_or_without_its_message_is_refused(client, key, settings, tmp_path):
    from conversations.models import MediaFile

    settings.MEDIA_ROOT = tmp_path / "files"
    settings.AGENTLOOP_MEDIA_MAX_BYTES = 10_000
    message = {"message_id": "m2", "contact": "ana"}
    too_large = upload(client, key, message, b"\xff\xd8\xff" + b"x" * 19_997)
    assert too_large.status_code == 413
    assert too_large.json() == {"error": "the file is 20 KB, over the 10 KB a file may have"}
    empty = upload(client, key, message, b"")
    assert empty.status_code == 400 and empty.json() == {"error": "the file is empty"}
    no_file = upload(client, key, message)
    assert no_file.status_code == 400 and "needs a `file` part" in no_file.json()["error"]
    not_json = upload(client, key, "{oops", b"abc")
    assert not_json.status_code == 400 and "the message as a JSON object" in not_json.json()["error"]
    bad_field = upload(client, key, {"message_id": "m2", "contact": 7}, b"abc")
    assert bad_field.status_code == 400 and "contact" in bad_field.json()["fields"]
    assert not InboundMessage.objects.exists() and not MediaFile.objects.exists()
    assert not (tmp_path / "files").exists()


def test_the_api_channel_reads_back_only_its_own_uploads(make_channel):
    import asyncio

    from conversations import platforms
    from conversations.media.download import FileUnavailable

    channel = make_channel("own", kind="api")
    for ref in ("media/999/ab/abc", f"media/{channel.pk}/../999/ab/abc", "/etc/passwd"):
        with pytest.raises(FileUnavailable, match="not a file uploaded to this channel"):
            asyncio.run(platforms.of(channel).fetch_media(channel, ref, 1000))
