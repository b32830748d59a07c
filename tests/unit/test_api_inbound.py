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
