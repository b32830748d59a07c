"""Google Chat, in process: the endpoint's bearer token verified with google-auth against
the local fake's certificates (missing, wrong key, expired, wrong audience, wrong issuer;
both Authentication Audiences), events parsed (DMs, spaces, mentions, threads,
redeliveries, what is only acknowledged, bad bodies), the settings; the transport's
outcomes against the fake Chat API and token endpoint over real HTTP, and the fake's
write quota. End to end (the real web server and worker): test_google_chat_e2e.py."""

import json
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError

from conversations.models import Channel, InboundMessage, MessageBuffer
from conversations.platforms.google_chat import GoogleChatPlatform, verify
from conversations.platforms.google_chat.transport import GoogleChatTransport, close_clients
from delivery.models import Outcome
from delivery.transports import Target
from tests.fakes import google_chat_api as chat
from tests.fakes.google_chat_api import DM_SPACE, PROJECT_NUMBER, ROOM, FakeGoogleChat, Signer
from tests.support.google_chat import google_chat_channel
from tests.support.loops import run_then_close

URL = "/webhooks/google_chat/gc/"


@pytest.fixture
def fake_chat():
    verify.forget()
    with FakeGoogleChat() as fake:
        yield fake
    verify.forget()


@pytest.fixture
def gc(make_channel, fake_chat):
    return google_chat_channel(make_channel, fake_chat)


def post(client, event, token):
    raw = event if isinstance(event, bytes) else json.dumps(event).encode()
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return client.post(URL, data=raw, content_type="application/json", headers=headers)


def nothing_stored():
    return not InboundMessage.objects.exists() and not MessageBuffer.objects.exists()


# --- the bearer token ---------------------------------------------------------------------------


def test_a_dm_is_admitted_by_its_message_name_and_a_redelivery_is_a_duplicate(client, gc, fake_chat):
    event = chat.message_event("Hola, quiero una hora")
    for _ in range(3):
        response = post(client, event, fake_chat.chat_token())
        assert response.status_code == 200 and response.json() == {}  # an empty answer posts nothing
    stored = InboundMessage.objects.get()
    assert stored.platform_message_id == event["message"]["name"] and stored.text == "Hola, quiero una hora"
    assert stored.conversation.chat_id == DM_SPACE and stored.conversation.sender_id == chat.USER
    assert MessageBuffer.objects.count() == 1


def _expired(fake):
    return fake.chat_token(expires_in=-3600)


def _wrong_audience(fake):
    return fake.chat_token("999999999999")


def _wrong_issuer(fake):
    return fake.chat_token(issuer="someone@evil.iam.gserviceaccount.com")


def _wrong_key(fake):
    return fake.chat_token(signer=Signer(chat.CHAT_ISSUER))  # a key Google never published


def _not_a_jwt(fake):
    return "not.a.jwt"


@pytest.mark.parametrize("token", [_expired, _wrong_audience, _wrong_issuer, _wrong_key, _not_a_jwt])
def test_a_token_that_is_not_chats_for_this_app_is_403_and_nothing_stored(client, gc, fake_chat, token):
    response = post(client, chat.message_event("hola"), token(fake_chat))
    assert response.status_code == 403, response.content
    assert "not Google Chat's" in response.json()["error"]
    assert nothing_stored()


@pytest.mark.parametrize("header", [None, "Basic abc", "Bearer "])
def test_no_bearer_token_is_401(client, gc, fake_chat, header):
    headers = {} if header is None else {"Authorization": header}
    response = client.post(URL, data=json.dumps(chat.message_event("hola")), content_type="application/json",
                           headers=headers)
    assert response.status_code == 401 and nothing_stored()


def test_a_channel_without_an_audience_refuses_everything(client, make_channel, fake_chat):
    google_chat_channel(make_channel, fake_chat, audience="", is_active=False)
    Channel.objects.filter(slug="gc").update(is_active=True)  # as an import could leave it
    assert post(client, chat.message_event("hola"), fake_chat.chat_token()).status_code == 403
    assert nothing_stored()


def test_the_endpoint_url_audience_takes_googles_id_token_for_chat_only(client, make_channel, fake_chat):
    audience = "https://agent.example.com/webhooks/google_chat/gc/"
    google_chat_channel(make_channel, fake_chat, audience=audience, certs_url=fake_chat.certs_url("google"))
    google = dict(issuer="https://accounts.google.com", signer=fake_chat.google_signer)
    good = fake_chat.chat_token(audience, email=chat.CHAT_ISSUER, email_verified=True, **google)
    assert post(client, chat.message_event("hola"), good).status_code == 200
    anyone = fake_chat.chat_token(audience, email="someone@gmail.com", email_verified=True, **google)
    assert post(client, chat.message_event("otra"), anyone).status_code == 403
    chats_own = fake_chat.chat_token(audience)  # the project-number kind of token, for a URL audience
    assert post(client, chat.message_event("otra"), chats_own).status_code == 403
    assert InboundMessage.objects.count() == 1


def test_certificates_are_fetched_once_and_again_for_a_rotated_key(client, gc, fake_chat):
    assert post(client, chat.message_event("uno"), fake_chat.chat_token()).status_code == 200
    assert post(client, chat.message_event("dos"), fake_chat.chat_token()).status_code == 200
    fake_chat.chat_signer = Signer(chat.CHAT_ISSUER)  # Google rotates its key
    verify._fetched_at.clear()  # (the refetch's rate limit, 30 s, is not this test's subject)
    assert post(client, chat.message_event("tres"), fake_chat.chat_token()).status_code == 200
    assert InboundMessage.objects.count() == 3


def test_googles_certificates_unreachable_is_503_and_nothing_stored(client, make_channel, fake_chat):
    google_chat_channel(make_channel, fake_chat, certs_url="http://127.0.0.1:9/certs")
    assert post(client, chat.message_event("hola"), fake_chat.chat_token()).status_code == 503
    assert nothing_stored()


# --- the events ----------------------------------------------------------------------------------


def test_a_space_message_mentioning_the_app_is_addressed_and_threaded(client, gc, fake_chat):
    event = chat.message_event("¿hay hora el lunes?", space=ROOM, mention=True)
    assert post(client, event, fake_chat.chat_token()).status_code == 200
    stored = InboundMessage.objects.get()
    assert stored.text == "¿hay hora el lunes?" and stored.mentioned is True
    assert stored.conversation.chat_id == ROOM


def test_a_space_message_without_the_mention_is_kept_unaddressed(client, gc, fake_chat):
    assert post(client, chat.message_event("de paso", space=ROOM), fake_chat.chat_token()).status_code == 200
    assert InboundMessage.objects.get().mentioned is False


@pytest.mark.parametrize("kind", ["ADDED_TO_SPACE", "REMOVED_FROM_SPACE", "SOMETHING_NEW"])
def test_membership_events_are_acknowledged_and_store_nothing(client, gc, fake_chat, kind):
    event = {"type": kind, "space": {"name": ROOM, "type": "ROOM"}, "user": {"name": chat.USER}}
    response = post(client, event, fake_chat.chat_token())
    assert (response.status_code, response.json()) == (200, {}) and nothing_stored()


def test_added_by_a_mention_admits_the_mention(client, gc, fake_chat):
    event = {**chat.message_event("hola equipo", space=ROOM, mention=True), "type": "ADDED_TO_SPACE"}
    assert post(client, event, fake_chat.chat_token()).status_code == 200
    assert InboundMessage.objects.get().text == "hola equipo"


@pytest.mark.parametrize("raw", [b"{not json", b"[]", b'"x"', b'{"message": {}}',
                                 b'{"type": "MESSAGE", "message": {"text": "no name"}, "space": {}}'])
def test_a_verified_body_that_is_no_event_is_400(client, gc, fake_chat, raw):
    assert post(client, raw, fake_chat.chat_token()).status_code == 400 and nothing_stored()


def test_an_oversized_body_is_413_and_nothing_stored(client, gc, fake_chat, settings):
    event = chat.message_event("x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 10))
    assert post(client, event, fake_chat.chat_token()).status_code == 413 and nothing_stored()


def test_an_unknown_card_click_is_told_to_the_tapper_alone(client, gc, fake_chat):
    event = chat.card_clicked(f"{DM_SPACE}/messages/q1", "c:AAAAAAAAAAAAAAAAAAAA:y")
    response = post(client, event, fake_chat.chat_token())
    assert response.status_code == 200
    answer = response.json()
    assert answer["privateMessageViewer"] == {"name": chat.USER} and answer["text"]


# --- settings ------------------------------------------------------------------------------------


def test_settings_check_the_key_and_the_audience(fake_chat):
    platform = GoogleChatPlatform()
    good = platform.clean_settings({"service_account_key": fake_chat.service_account_key(),
                                    "audience": PROJECT_NUMBER})
    assert good["api_base"] == "https://chat.googleapis.com/v1/" and good["chat_interval"] == 1.0
    for bad in ({"service_account_key": "{not json"}, {"service_account_key": json.dumps({"type": "user"})},
                {"audience": "my project"}, {"api_base": "ftp://x"}):
        with pytest.raises(ValidationError):
            platform.clean_settings(bad)


# --- the transport, against the fake Chat API ------------------------------------------------------


def run(coro):
    return run_then_close(coro, close_clients)


def send(channel, text="hola", **target):
    return run(GoogleChatTransport(channel).send_text(Target(target.pop("chat_id", ROOM), **target), text))


def test_a_reply_goes_into_the_thread_with_the_service_accounts_token(gc, fake_chat):
    thread = f"{ROOM}/threads/t9"
    result = send(gc, "Hola 👋", thread_id=thread)
    assert result.ok and result.platform_message_id.startswith(f"{ROOM}/messages/")
    [call] = fake_chat.calls("create")
    assert call.body == {"text": "Hola 👋", "thread": {"name": thread}}
    assert call.query == {"messageReplyOption": "REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD"}
    assert call.token.startswith("ya29.") and len(fake_chat.calls("token")) == 1
    send(gc, "otra", chat_id=DM_SPACE)  # the token is kept: no second exchange
    assert len(fake_chat.calls("token")) == 1 and "thread" not in fake_chat.calls("create")[1].body


def test_a_long_text_is_split_and_buttons_ride_on_the_last_piece(gc, fake_chat):
    fake_chat.space_interval = 0.0
    result = send(gc, "a" * 5000, buttons=(("Sí", "c:tok:y"), ("No", "c:tok:n")))
    assert result.ok
    first, second = fake_chat.calls("create")
    assert len(first.body["text"]) == 4096 and "cardsV2" not in first.body
    buttons = second.body["cardsV2"][0]["card"]["sections"][0]["widgets"][0]["buttonList"]["buttons"]
    assert [b["onClick"]["action"]["parameters"][0]["value"] for b in buttons] == ["c:tok:y", "c:tok:n"]


@pytest.mark.parametrize(("status", "retry_after", "outcome", "wait"), [
    (429, 3, Outcome.FLOOD, 3.0), (429, None, Outcome.FLOOD, 2.0), (500, None, Outcome.TEMPORARY, 0.0),
    (503, None, Outcome.TEMPORARY, 0.0), (403, None, Outcome.PERMANENT, 0.0), (404, None, Outcome.PERMANENT, 0.0),
    (400, None, Outcome.PERMANENT, 0.0), (401, None, Outcome.CHANNEL_BLOCKED, 0.0)])
def test_each_chat_api_error_maps_to_its_outcome(gc, fake_chat, status, retry_after, outcome, wait):
    fake_chat.fail_next("create", status=status, retry_after=retry_after)
    result = send(gc)
    assert (result.outcome, result.retry_after) == (outcome, wait), result.error
    assert result.chat_unreachable is (status in (403, 404, 401, 500, 503, 429))
    if status == 401:  # a refused token is dropped: the next send asks for another
        assert send(gc).ok and len(fake_chat.calls("token")) == 2


def test_the_fakes_per_space_quota_answers_429_and_is_a_flood(gc, fake_chat):
    fake_chat.clock = lambda: 1000.0  # the sends in one instant, however slow the machine
    assert send(gc).ok
    second = send(gc)
    assert second.outcome == Outcome.FLOOD and "RESOURCE_EXHAUSTED" in second.error
    assert send(gc, chat_id=DM_SPACE).ok  # another space has its own second


def test_the_fakes_per_minute_quota_answers_429(make_channel):
    with FakeGoogleChat(per_minute=2, space_interval=0.0, clock=lambda: 1000.0) as fake:
        channel = google_chat_channel(make_channel, fake)
        assert send(channel).ok and send(channel, chat_id=DM_SPACE).ok
        assert send(channel, chat_id="spaces/THIRD").outcome == Outcome.FLOOD


def test_a_revoked_key_blocks_the_channel(gc, fake_chat):
    fake_chat.revoke()
    result = send(gc)
    assert result.outcome == Outcome.CHANNEL_BLOCKED and "refused the service account key" in result.error
    assert not fake_chat.calls("create")


def test_unreachable_endpoints_are_not_sent(make_channel, fake_chat):
    no_token = google_chat_channel(make_channel, fake_chat, slug="gc1", token_uri="http://127.0.0.1:9/token")
    assert send(no_token).outcome == Outcome.NOT_SENT
    no_api = google_chat_channel(make_channel, fake_chat, slug="gc2", api_base="http://127.0.0.1:9/v1/")
    result = send(no_api)
    assert result.outcome == Outcome.NOT_SENT and fake_chat.calls("token")


def test_a_preview_is_one_message_edited_then_the_final_edit_keeps_the_card(gc, fake_chat):
    fake_chat.space_interval = 0.0  # (the quota counts edits too: its own test above)
    thread = f"{ROOM}/threads/t7"
    target = Target(ROOM, thread_id=thread)

    async def stream():
        transport = GoogleChatTransport(gc)
        preview = transport.preview_for(target, turn_id=1)
        shown = [await preview.show(text) for text in ("Hola ▍", "Hola, sí ▍")]
        final = await transport.edit_text(Target(ROOM, thread_id=thread, buttons=(("Sí", "c:tok:y"),)),
                                          shown[0].message_id, "Hola, sí hay hora.")
        return preview, shown, final

    preview, shown, final = run(stream())
    assert preview.is_message and all(s.shown for s in shown) and shown[0].message_id == shown[1].message_id
    assert final.ok and final.platform_message_id == shown[0].message_id
    create, *patches = fake_chat.calls("create") + fake_chat.calls("patch")
    assert create.body == {"text": "Hola ▍", "thread": {"name": thread}}
    assert [p.query["updateMask"] for p in patches] == ["text", "text,cardsV2"]
    message = fake_chat.message(shown[0].message_id)
    assert message["text"] == "Hola, sí hay hora." and message["cardsV2"][0]["cardId"] == "confirmation"


def test_a_discarded_preview_is_deleted_and_deleting_it_again_is_done(gc, fake_chat):
    fake_chat.space_interval = 0.0

    async def stream():
        transport = GoogleChatTransport(gc)
        preview = transport.preview_for(Target(DM_SPACE), turn_id=2)
        shown = await preview.show("Un momento ▍")
        await preview.discard()
        return shown, await transport.delete_message(Target(DM_SPACE), shown.message_id)

    shown, again = run(stream())
    assert fake_chat.deleted() == [shown.message_id] and again.ok


def test_a_429_on_a_preview_says_flood(gc, fake_chat):
    fake_chat.fail_next("create", status=429)
    result = run(GoogleChatTransport(gc).preview_for(Target(ROOM), turn_id=3).show("Hola ▍"))
    assert (result.shown, result.flood, result.stop) == (False, True, False)


def test_a_question_that_expired_loses_its_card_through_the_api(gc, fake_chat, make_conversation):
    from django.utils import timezone

    from delivery.models import OutboundMessage, OutboundState
    from tools.models import ActionClaim, ClaimState, Confirmation, Proposal, ProposalState
    from tools.questions import withdraw_question

    sent = send(gc, "¿Agendo el lunes?", chat_id=DM_SPACE, buttons=(("Sí", "c:tok:y"),))
    talk = make_conversation(gc, chat.USER)
    question = OutboundMessage.objects.create(conversation=talk, channel=gc, chat_id=DM_SPACE, text="¿Agendo el lunes?",
                                              state=OutboundState.DELIVERED, platform_message_id=sent.platform_message_id)
    past = timezone.now() - timedelta(minutes=1)
    claim = ActionClaim.objects.create(scope="contact:1", action="calendar_create_event", fingerprint="f1",
                                       state=ClaimState.RELEASED, live=False, expires_at=past, lease_until=past)
    proposal = Proposal.objects.create(claim=claim, state=ProposalState.EXPIRED, expires_at=past)
    Confirmation.objects.create(proposal=proposal, conversation=talk, question=question, text="¿Agendo el lunes?")
    fake_chat.space_interval = 0.0
    withdraw_question(proposal.pk)
    [patch] = fake_chat.calls("patch")
    assert patch.query == {"updateMask": "text,cardsV2"} and patch.body["cardsV2"] == []
    message = fake_chat.message(sent.platform_message_id)
    assert message["cardsV2"] == [] and message["text"].startswith("¿Agendo el lunes?") and message["text"] != "¿Agendo el lunes?"


# --- files ---------------------------------------------------------------------------------------


def test_a_file_uploaded_with_a_message_is_stored_pending_and_fetched_with_the_apps_token(client, gc, fake_chat):
    from conversations import platforms
    from conversations.models import MediaFile, MediaState

    photo = fake_chat.attachment(b"\xff\xd8\xff\xe0 a jpeg", "image/jpeg", "boleta.jpg")
    event = chat.message_event("mira esto", attachments=(photo,))
    for _ in range(2):  # a redelivery: one message, one file
        assert post(client, event, fake_chat.chat_token()).status_code == 200
    stored = InboundMessage.objects.get()
    assert (stored.platform_message_id, stored.text, stored.media_type) == (event["message"]["name"], "mira esto",
                                                                             "photo")
    file = MediaFile.objects.get()
    assert file.state == MediaState.PENDING and file.pk == stored.media_file_id
    assert file.ref == photo["attachmentDataRef"]["resourceName"] and file.file_name == "boleta.jpg"
    assert file.file_key == event["message"]["attachment"][0]["name"] and file.declared_type == "image/jpeg"
    data = run(platforms.of(gc).fetch_media(gc, file.ref, 1_000_000))
    assert data == b"\xff\xd8\xff\xe0 a jpeg"
    [download] = fake_chat.downloads()
    assert download.path == file.ref and download.query == {"alt": "media"} and download.token.startswith("ya29.")


def test_several_files_are_one_album_and_a_file_alone_needs_no_text(client, gc, fake_chat):
    files = (fake_chat.attachment(b"%PDF-1.4 one", "application/pdf", "a.pdf"),
             fake_chat.attachment(b"ID3 audio", "audio/mpeg", "nota.mp3"))
    event = chat.message_event("", space=ROOM, attachments=files)
    for _ in range(2):
        assert post(client, event, fake_chat.chat_token()).status_code == 200
    first, second = InboundMessage.objects.order_by("pk")
    name = event["message"]["name"]
    assert (first.platform_message_id, second.platform_message_id) == (name, f"{name}#2")
    assert (first.media_type, second.media_type) == ("document", "audio") and first.text == second.text == ""
    assert first.album_id and first.album_id == second.album_id and first.mentioned is False
    assert {m.media_file.ref for m in (first, second)} == {f["attachmentDataRef"]["resourceName"] for f in files}


def test_a_drive_file_is_its_name_and_link_in_the_text_and_nothing_is_fetched(client, gc, fake_chat):
    from conversations.models import MediaFile

    event = chat.message_event("el presupuesto", attachments=(chat.drive_attachment("1AbCdEf"),))
    assert post(client, event, fake_chat.chat_token()).status_code == 200
    stored = InboundMessage.objects.get()
    assert stored.text == "el presupuesto\n📎 Presupuesto.pdf: https://drive.google.com/open?id=1AbCdEf"
    assert not stored.media_type and not MediaFile.objects.exists()
    only = chat.message_event("", attachments=(chat.drive_attachment("2XyZ", name="Plan.xlsx"),))
    assert post(client, only, fake_chat.chat_token()).status_code == 200
    assert InboundMessage.objects.get(platform_message_id=only["message"]["name"]).text.startswith("📎 Plan.xlsx: ")


def test_a_download_that_cannot_be_had_says_whether_to_try_again(make_channel, fake_chat, settings):
    from conversations import platforms
    from conversations.media.download import FileTooLarge, FileUnavailable

    gc = google_chat_channel(make_channel, fake_chat)
    resource = fake_chat.attachment(b"x" * 5000)["attachmentDataRef"]["resourceName"]

    def fetch(channel=gc, ref=resource, limit=1_000_000):
        return run(platforms.of(channel).fetch_media(channel, ref, limit))

    with pytest.raises(FileUnavailable, match="404") as unknown:
        fetch(ref="ATTnot-a-file")
    assert unknown.value.permanent
    with pytest.raises(FileTooLarge):
        fetch(limit=1000)
    settings.AGENTLOOP_MEDIA_FETCH_DEADLINE = 0.5
    fake_chat.media_delay = 2.0
    with pytest.raises(FileUnavailable, match="within 0.5 s") as slow:
        fetch()
    assert not slow.value.permanent
    fake_chat.media_delay = 0.0
    no_token = google_chat_channel(make_channel, fake_chat, slug="gc3", token_uri="http://127.0.0.1:9/token")
    with pytest.raises(FileUnavailable) as unreachable:
        fetch(channel=no_token)
    assert not unreachable.value.permanent
    fake_chat.revoke()
    with pytest.raises(FileUnavailable, match="refused the service account key") as revoked:
        fetch(channel=google_chat_channel(make_channel, fake_chat, slug="gc4"))
    assert revoked.value.permanent


def test_the_fakes_media_download_wants_the_bearer(fake_chat):
    import httpx

    resource = fake_chat.attachment(b"secret bytes")["attachmentDataRef"]["resourceName"]
    url = f"{fake_chat.api_base}media/{resource}"
    assert httpx.get(url, params={"alt": "media"}, timeout=5).status_code == 401
    assert httpx.get(url, params={"alt": "media"}, headers={"Authorization": "Bearer ya29.forged"},
                     timeout=5).status_code == 401
    assert not fake_chat.downloads()


def test_a_replys_files_are_named_in_the_thread_as_chat_takes_no_upload_from_an_app(gc, fake_chat):
    from delivery.attachments import OutboundFile
    from delivery.transports import Capability

    assert Capability.FILES not in GoogleChatTransport.capabilities()
    thread = f"{ROOM}/threads/t5"
    files = [OutboundFile("outbound/1/ab/abc", "reserva.ics", "text/calendar", 320)]
    result = run(GoogleChatTransport(gc).send_files(Target(ROOM, thread_id=thread), files, "Tu hora:"))
    assert result.ok
    [call] = fake_chat.calls("create")
    assert call.body == {"text": "Tu hora:\n📎 reserva.ics", "thread": {"name": thread}}


@pytest.mark.parametrize("junk", ["a string", {"not": "a list"}, [1, None, {"contentName": "raro.bin"}],
                                  [{"attachmentDataRef": {"resourceName": "R" * 600}, "contentName": "big.bin"}]])
def test_attachments_chat_would_not_send_lose_nothing_of_the_message(client, gc, fake_chat, junk):
    from conversations.models import MediaFile

    event = chat.message_event("hola")
    event["message"]["attachment"] = junk
    assert post(client, event, fake_chat.chat_token()).status_code == 200
    stored = InboundMessage.objects.get()
    assert stored.text.startswith("hola") and not MediaFile.objects.exists()
    named = [item["contentName"] for item in junk if isinstance(item, dict)] if isinstance(junk, list) else []
    assert all(f"📎 {name} (not readable by the app)" in stored.text for name in named)
