"""Files attached in the playground's web chat: uploaded over HTTP by the people who may
use the playground's socket, stored once, admitted as a media message of their web chat
whose file the worker reads back from the storage; the page shows it by its signed link."""

import asyncio

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from conversations import console, platforms
from conversations.media import fetching, uploads
from conversations.models import InboundMessage, MediaFile, MediaState
from tests.unit.test_media import jpeg

URL = "/console/playground/{}/files"


@pytest.fixture(autouse=True)
def media_root(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "files"


@pytest.fixture
def playground(make_channel):
    return make_channel("playground", kind="webchat")


def person(name, *perms, staff=True):
    user = get_user_model().objects.create_user(name, password="pw-" + name, is_staff=staff)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def client_of(user=None, **kw):
    client = Client(**kw)
    if user is not None:
        client.force_login(user)
    return client


@pytest.fixture
def operator(db):
    return client_of(person("olga", "view_auditevent", "change_channel"))


def attach(client, data=None, name="boleta.jpg", slug="playground", **fields):
    body = {**fields}
    if data is not None:
        body["file"] = SimpleUploadedFile(name, data, content_type="image/jpeg")
    return client.post(URL.format(slug), data=body)


def test_only_people_who_may_use_the_playground_may_attach(playground, db):
    photo = jpeg()
    assert attach(client_of(), photo).status_code == 403  # not logged in: JSON, not a login page
    auditor = client_of(person("ana", "view_auditevent"))
    refused = attach(auditor, photo)
    assert refused.status_code == 403 and "change_channel" in refused.json()["error"]
    former = client_of(person("beto", "change_channel", staff=False))
    assert attach(former, photo).status_code == 403
    strict = client_of(person("carla", "change_channel"), enforce_csrf_checks=True)
    assert attach(strict, photo).status_code == 403  # a form posted from another site
    assert not InboundMessage.objects.exists() and not MediaFile.objects.exists()


def test_a_wrong_method_an_unknown_channel_no_file_an_empty_one_or_one_too_large_are_refused(
        playground, operator, make_channel, settings):
    assert operator.get(URL.format("playground")).status_code == 405
    assert attach(operator, jpeg(), slug="nope").status_code == 404
    make_channel("shop", kind="api")
    assert attach(operator, jpeg(), slug="shop").status_code == 404  # not a web chat
    no_file = attach(operator, text="hola")
    assert no_file.status_code == 400 and "`file` part" in no_file.json()["error"]
    empty = attach(operator, b"")
    assert empty.status_code == 400 and empty.json() == {"error": "the file is empty"}
    long_caption = attach(operator, jpeg(), text="x" * 4001)
    assert long_caption.status_code == 400 and "4000 characters" in long_caption.json()["error"]
    settings.AGENTLOOP_MEDIA_MAX_BYTES = 1000
    over = attach(operator, b"\xff\xd8\xff" + b"x" * 5000)  # over the cap, read
    assert over.status_code == 413 and "over the 1 KB" in over.json()["error"]
    # A body past the route's own limit never reaches the view: the web server refuses it
    # (tests/hostile/test_webhooks.py, through the real server).
    assert not InboundMessage.objects.exists() and not MediaFile.objects.exists()


def test_an_image_is_admitted_into_the_persons_web_chat_and_read_back_by_the_worker(playground, operator):
    photo = jpeg()
    answer = attach(operator, photo, text="¿qué dice esta boleta?", id="p1")
    assert answer.status_code == 202, answer.content
    body = answer.json()
    assert (body["type"], body["id"], body["duplicate"], body["disposition"]) == ("admitted", "p1", False, "buffered")
    assert body["file"]["kind"] == "photo" and body["file"]["name"] == "boleta.jpg"
    again = attach(operator, photo, text="¿qué dice esta boleta?", id="p1")
    assert again.json()["duplicate"] is True

    [message] = InboundMessage.objects.all()
    assert (message.platform_message_id, message.media_type, message.text) == \
        ("console:p1", "photo", "¿qué dice esta boleta?")
    assert message.conversation.chat_id == f"console-{get_user_model().objects.get(username='olga').pk}"
    file = MediaFile.objects.get()
    assert file.pk == body["file"]["id"] and file.state == MediaState.PENDING
    assert file.ref.startswith(uploads.own_prefix(playground.pk))

    assert operator.get(body["file"]["url"]).status_code == 404  # not read back yet: the page tries again
    [claimed] = fetching.claim([file.pk], "w1")
    data = asyncio.run(fetching.fetch(claimed))  # WebchatPlatform.fetch_media: from the storage
    assert data == photo
    assert fetching.mark_stored(claimed, "w1", fetching.save(claimed, data))
    shown = operator.get(body["file"]["url"])
    assert shown.status_code == 200 and b"".join(shown.streaming_content) == photo
    assert shown["Content-Type"] == "image/jpeg"
    [item] = console.messages_of(message.conversation_id)
    assert item["file"]["kind"] == "photo" and item["file"]["state"] == MediaState.STORED


def test_the_web_chat_reads_back_only_its_own_uploads(playground, make_channel):
    from conversations.media.download import FileUnavailable

    other = make_channel("other", kind="webchat")
    name, _ = uploads.store(other.pk, b"someone else's")
    with pytest.raises(FileUnavailable, match="not a file uploaded to this channel"):
        asyncio.run(platforms.of(playground).fetch_media(playground, name, 1000))
    assert asyncio.run(platforms.of(other).fetch_media(other, name, 1000)) == b"someone else's"


def test_the_playground_page_has_the_attach_button_and_the_upload_address(playground, operator):
    page = operator.get("/console/playground/playground/").content.decode()
    assert 'data-upload="/console/playground/playground/files"' in page
    assert 'id="chat-file"' in page and "csrfmiddlewaretoken" in page
