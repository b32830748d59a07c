"""Microsoft Teams, in process: the Bot Connector's bearer token verified with PyJWT
against the local fake identity provider's OpenID metadata and keys (missing, wrong key,
expired, wrong audience, issuer, algorithm, endorsement, serviceUrl), activities parsed
with the Agents SDK's model (personal chats, channels and group chats, mentions, threads,
redeliveries, edits, deletions, what is only acknowledged, bad bodies), the settings; the
transport's outcomes against the fake Bot Connector and token endpoint over real HTTP,
the fake's rate limits; files both ways (a personal chat's files fetched from their
pre-authorised downloadUrl; a reply's file as a consent card, uploaded once on accept). End to end (the real web server and worker): test_teams_e2e.py."""

import json
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError

from conversations.models import Channel, InboundMessage, MessageBuffer
from conversations.platforms.teams import TeamsPlatform, streaming, verify
from conversations.platforms.teams.streaming import TeamsStream
from conversations.platforms.teams.transport import MAX_UNITS, MessagePreview, TeamsTransport
from delivery.models import Outcome
from delivery.transports import Capability, Target
from tests.fakes import teams_api as teams
from tests.fakes.teams_api import GROUP_CHAT, PERSONAL, TEAM_CHANNEL, FakeTeams, Signer
from tests.support.teams import run, teams_channel

URL = "/webhooks/teams/teams/"


def forget():
    from conversations.platforms.teams import files, transport

    for module in (verify, streaming, transport, files):  # what the process holds: tokens, keys, chats, taps
        module.forget()


@pytest.fixture
def fake_teams():
    forget()
    with FakeTeams() as fake:
        yield fake
    forget()


@pytest.fixture
def bot(make_channel, fake_teams):
    return teams_channel(make_channel, fake_teams)


def post(client, activity, token):
    raw = activity if isinstance(activity, bytes) else json.dumps(activity).encode()
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return client.post(URL, data=raw, content_type="application/json", headers=headers)


def nothing_stored():
    return not InboundMessage.objects.exists() and not MessageBuffer.objects.exists()


# --- the bearer token ---------------------------------------------------------------------------


def test_a_personal_message_is_admitted_by_its_activity_id_and_a_redelivery_is_a_duplicate(client, bot, fake_teams):
    activity = teams.message_activity("Hola, quiero una hora")
    for _ in range(3):
        response = post(client, activity, fake_teams.connector_token())
        assert response.status_code == 200 and response.json() == {}  # the reply is the ledger's
    stored = InboundMessage.objects.get()
    assert stored.platform_message_id == activity["id"] and stored.text == "Hola, quiero una hora"
    # A personal chat's chat is the person: its conversation id (130 characters) is the Connector's to give.
    assert len(PERSONAL) > 100 and activity["conversation"]["id"] == PERSONAL
    assert stored.conversation.chat_id == teams.USER and stored.conversation.sender_id == teams.USER
    assert stored.mentioned is None and MessageBuffer.objects.count() == 1


def _expired(fake):
    return fake.connector_token(expires_in=-3600)


def _wrong_audience(fake):
    return fake.connector_token("another-bots-app-id")


def _wrong_issuer(fake):
    return fake.connector_token(issuer="https://sts.windows.net/evil/")


def _wrong_key(fake):
    return fake.connector_token(signer=Signer())  # a key the identity provider never published


def _another_service_url(fake):
    return fake.connector_token(service_url="https://attacker.example/")


def _not_a_jwt(fake):
    return "not.a.jwt"


def _symmetric(fake):
    import jwt

    return jwt.encode({"iss": teams.ISSUER, "aud": teams.APP_ID, "exp": 2**31}, "a-shared-secret-of-thirty-two-bytes!", algorithm="HS256",
                      headers={"kid": fake.signer.kid})


@pytest.mark.parametrize("token", [_expired, _wrong_audience, _wrong_issuer, _wrong_key, _another_service_url,
                                   _not_a_jwt, _symmetric])
def test_a_token_that_is_not_the_connectors_for_this_bot_is_401_and_nothing_stored(client, bot, fake_teams, token):
    response = post(client, teams.message_activity("hola"), token(fake_teams))
    assert response.status_code == 401, response.content
    assert "not the Bot Connector's" in response.json()["error"]
    assert nothing_stored()


def test_a_key_not_endorsed_for_teams_is_refused(client, bot, fake_teams):
    fake_teams.signer = Signer("webchat-only", endorsements=("webchat",))
    response = post(client, teams.message_activity("hola"), fake_teams.connector_token())
    assert response.status_code == 401 and "endorse" in response.json()["error"] and nothing_stored()


@pytest.mark.parametrize("header", [None, "Basic abc", "Bearer "])
def test_no_bearer_token_is_401(client, bot, fake_teams, header):
    headers = {} if header is None else {"Authorization": header}
    response = client.post(URL, data=json.dumps(teams.message_activity("hola")), content_type="application/json",
                           headers=headers)
    assert response.status_code == 401 and nothing_stored()


def test_a_channel_without_an_app_id_refuses_everything(client, make_channel, fake_teams):
    teams_channel(make_channel, fake_teams, app_id="", is_active=False)
    Channel.objects.filter(slug="teams").update(is_active=True)  # as an import could leave it
    assert post(client, teams.message_activity("hola"), fake_teams.connector_token()).status_code == 403
    assert nothing_stored()


def test_keys_are_fetched_once_and_again_for_a_rolled_key(client, bot, fake_teams):
    assert post(client, teams.message_activity("uno"), fake_teams.connector_token()).status_code == 200
    assert post(client, teams.message_activity("dos"), fake_teams.connector_token()).status_code == 200
    fake_teams.signer = Signer("rolled")  # Microsoft rolls its signing key
    verify._fetched_at.clear()  # (the refetch's rate limit, 30 s, is not this test's subject)
    assert post(client, teams.message_activity("tres"), fake_teams.connector_token()).status_code == 200
    assert InboundMessage.objects.count() == 3
    # A made-up key id right after: refused without fetching again.
    assert post(client, teams.message_activity("cuatro"), fake_teams.connector_token(signer=Signer())).status_code == 401


def test_the_identity_provider_unreachable_is_503_and_nothing_stored(client, make_channel, fake_teams):
    teams_channel(make_channel, fake_teams, openid_metadata_url="http://127.0.0.1:9/openid")
    assert post(client, teams.message_activity("hola"), fake_teams.connector_token()).status_code == 503
    assert nothing_stored()


# --- the activities ------------------------------------------------------------------------------


def test_a_channel_post_mentioning_the_bot_is_addressed_without_the_mention_and_threaded(client, bot, fake_teams):
    activity = teams.message_activity("¿hay hora el lunes?", kind="channel", mention=True)
    assert post(client, activity, fake_teams.connector_token()).status_code == 200
    stored = InboundMessage.objects.get()
    assert stored.text == "¿hay hora el lunes?" and stored.mentioned is True
    assert stored.conversation.chat_id == f"{TEAM_CHANNEL};messageid={activity['id']}"


def test_a_reply_in_a_channel_thread_stays_in_that_thread(client, bot, fake_teams):
    activity = teams.message_activity("y otra cosa", kind="channel", mention=True, reply_to="1700000000001")
    assert post(client, activity, fake_teams.connector_token()).status_code == 200
    stored = InboundMessage.objects.get()
    assert stored.conversation.chat_id == f"{TEAM_CHANNEL};messageid=1700000000001"


@pytest.mark.parametrize("kind", ["groupChat", "channel"])
def test_a_group_message_without_the_mention_is_kept_unaddressed(client, bot, fake_teams, kind):
    assert post(client, teams.message_activity("de paso", kind=kind), fake_teams.connector_token()).status_code == 200
    stored = InboundMessage.objects.get()
    assert stored.mentioned is False and stored.text == "de paso"


def test_an_edit_and_a_deletion_reach_the_stored_message(client, bot, fake_teams):
    from conversations.models import MessageEdit

    original = teams.message_activity("el lunes", kind="groupChat", mention=True)
    assert post(client, original, fake_teams.connector_token()).status_code == 200
    edited = teams.update_activity(original, "<at>Agentloop</at> el martes")
    assert post(client, edited, fake_teams.connector_token()).status_code == 200
    stored = InboundMessage.objects.get()
    assert stored.text == "el martes" and MessageEdit.objects.count() == 1
    assert post(client, teams.delete_activity(original), fake_teams.connector_token()).status_code == 200
    stored.refresh_from_db()
    assert stored.deleted_at is not None


def test_pasted_images_are_one_album_fetched_with_the_bots_token_from_the_connector_only(client, bot, fake_teams):
    from conversations.media.download import FileUnavailable
    from conversations.models import MediaFile
    from conversations.platforms import teams as teams_platform

    first, second = (fake_teams.add_attachment(data) for data in (b"\x89PNG one", b"\x89PNG two"))
    activity = teams.message_activity("mira esto", images=(first, second))
    assert post(client, activity, fake_teams.connector_token()).status_code == 200
    one, two = InboundMessage.objects.order_by("pk")
    assert (one.platform_message_id, one.text, one.media_type) == (activity["id"], "mira esto", "image")
    assert (two.platform_message_id, two.text) == (f"{activity['id']}.1", "")
    assert MediaFile.objects.count() == 2  # the HTML rendition beside them is not a file
    platform = teams_platform.TeamsPlatform()
    assert run(platform.fetch_media(bot, first, 1024)) == b"\x89PNG one"
    [(_id, authorization)] = fake_teams.downloads()
    assert authorization.startswith("Bearer ")
    with FakeTeams() as elsewhere:  # another host: the bot's token is not sent there
        stranger = elsewhere.add_attachment(b"x")
        with pytest.raises(FileUnavailable):
            run(platform.fetch_media(bot, stranger, 1024))
        assert elsewhere.downloads()[0][1] == ""


def test_an_image_alone_is_a_message(client, bot, fake_teams):
    activity = teams.message_activity("", images=(fake_teams.add_attachment(b"\x89PNG"),))
    assert post(client, activity, fake_teams.connector_token()).status_code == 200
    assert InboundMessage.objects.get().media_type == "image"


def test_files_sent_in_a_personal_chat_are_one_album_fetched_from_their_download_url_without_a_token(
        client, bot, fake_teams):
    from conversations.media.download import FileUnavailable
    from conversations.models import MediaFile

    report, sheet = fake_teams.add_file(b"%PDF-1.7 uno", "informe.pdf"), fake_teams.add_file(b"PK\x03\x04", "notas.xlsx")
    activity = teams.message_activity("", files=(report, sheet))
    for _ in range(2):  # a redelivery stores nothing twice
        assert post(client, activity, fake_teams.connector_token()).status_code == 200
    one, two = InboundMessage.objects.order_by("pk")
    assert (one.platform_message_id, one.media_type, two.platform_message_id) == (activity["id"], "document",
                                                                                  f"{activity['id']}.1")
    assert one.album_id == activity["id"] == two.album_id
    stored = MediaFile.objects.get(file_key=report["content"]["uniqueId"])
    url = report["content"]["downloadUrl"]
    assert len(url) > 500 and stored.ref == url and stored.file_name == "informe.pdf"
    assert stored.declared_type == "application/pdf"
    assert run(TeamsPlatform().fetch_media(bot, url, 1024)) == b"%PDF-1.7 uno"
    [(_id, authorization)] = fake_teams.downloads()
    assert authorization == ""  # pre-authorised: the bot's token never goes to OneDrive
    tempauth = url.rsplit("tempauth=", 1)[1]
    with pytest.raises(FileUnavailable) as refused:
        run(TeamsPlatform().fetch_media(bot, url.replace(tempauth, "v1.expired"), 1024))
    assert refused.value.permanent and tempauth not in str(refused.value)
    with pytest.raises(FileUnavailable):  # over the cap
        run(TeamsPlatform().fetch_media(bot, url, 4))


@pytest.fixture
def media(settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path)  # the replies' stored files


def _offered(bot, fake_teams, data=b"BEGIN:VCALENDAR\r\nEND:VCALENDAR\r\n", name="cita.ics", chat_id=teams.USER):
    """A reply's file sent into `chat_id`: (the SendResult, the card's acceptContext)."""
    from delivery import attachments

    item = attachments.OutboundFile(attachments.store(bot.pk, data), name, "text/calendar", len(data))
    result = run(TeamsTransport(bot).send_files(Target(chat_id, reply_target="1700000000042"), [item],
                                                "Tu cita"))
    body = fake_teams.calls("create")[-1].body
    card = (body.get("attachments") or [{}])[0]
    return result, body, (card.get("content") or {}).get("acceptContext")


def test_a_file_in_a_personal_chat_is_a_consent_card_uploaded_once_when_accepted(client, bot, fake_teams, media):
    data = b"BEGIN:VCALENDAR\r\nEND:VCALENDAR\r\n"
    result, body, context = _offered(bot, fake_teams, data)
    assert result.ok and result.platform_message_id  # the ledger's row: the card, delivered once
    [card] = body["attachments"]
    assert card["contentType"] == "application/vnd.microsoft.teams.card.file.consent" and card["name"] == "cita.ics"
    assert card["content"]["sizeInBytes"] == len(data) and card["content"]["declineContext"] == context
    assert body["text"] == "Tu cita" and body["replyToId"] == "1700000000042" and not fake_teams.uploads()
    upload = fake_teams.upload_info("cita.ics")
    for _ in range(3):  # a double tap, a redelivered invoke: one upload, one card
        response = post(client, teams.consent_invoke(context, "accept", upload), fake_teams.connector_token())
        assert (response.status_code, response.json()) == (200, {})
    again = teams.consent_invoke(context, "accept", fake_teams.upload_info("cita.ics"))  # the card accepted again
    assert post(client, again, fake_teams.connector_token()).status_code == 200
    [put] = fake_teams.uploads()
    assert put["range"] == f"bytes 0-{len(data) - 1}/{len(data)}" and put["authorization"] == ""
    assert fake_teams.uploaded("cita.ics") == data
    shown = fake_teams.calls("create")[-1]
    [info] = shown.body["attachments"]
    assert shown.conversation == PERSONAL and info["contentType"] == "application/vnd.microsoft.teams.card.file.info"
    assert (info["contentUrl"], info["content"]) == (upload["contentUrl"], {"uniqueId": upload["uniqueId"],
                                                                           "fileType": "ics"})
    assert len(fake_teams.calls("create")) == 2 and nothing_stored()


def test_a_declined_a_forged_or_someone_elses_consent_uploads_nothing(client, bot, fake_teams, media):
    _result, _body, context = _offered(bot, fake_teams)
    token = context["file"]
    for invoke in (teams.consent_invoke(context, "decline"),
                   teams.consent_invoke({"file": token[:-2] + "xx"}, "accept", fake_teams.upload_info()),
                   teams.consent_invoke({"file": "outbound/1/ab/cd"}, "accept", fake_teams.upload_info()),
                   teams.consent_invoke(context, "accept", fake_teams.upload_info(), user=teams.OTHER_USER),
                   teams.consent_invoke(context, "accept"),  # no uploadInfo
                   {**teams.consent_invoke(context), "value": "nonsense"}):
        response = post(client, invoke, fake_teams.connector_token())
        assert (response.status_code, response.json()) == (200, {})
    assert not fake_teams.uploads() and len(fake_teams.calls("create")) == 1 and nothing_stored()


def test_a_file_gone_from_storage_or_a_failed_send_is_told_to_the_person(client, bot, fake_teams, media):
    from django.core import signing
    from django.core.files.storage import default_storage

    _result, _body, context = _offered(bot, fake_teams, b"primero", "uno.txt")
    upload = fake_teams.upload_info("uno.txt")
    fake_teams.fail_next("create", status=500)  # the file's card: the upload went, the card did not
    post(client, teams.consent_invoke(context, "accept", upload), fake_teams.connector_token())
    assert "uno.txt" in fake_teams.texts()[-1] and fake_teams.uploaded("uno.txt") == b"primero"
    _result, _body, gone = _offered(bot, fake_teams, b"segundo", "dos.txt")
    default_storage.delete(signing.loads(gone["file"], salt="agentloop.teams.file-consent")["f"])
    post(client, teams.consent_invoke(gone, "accept", fake_teams.upload_info("dos.txt")), fake_teams.connector_token())
    assert "dos.txt" in fake_teams.texts()[-1] and fake_teams.uploaded("dos.txt") is None
    assert len(fake_teams.uploads()) == 1


def test_files_in_group_chats_and_channels_are_named_in_the_text(bot, fake_teams, media):
    result, body, context = _offered(bot, fake_teams, chat_id=GROUP_CHAT)
    assert result.ok and context is None and body["text"] == "Tu cita\n📎 cita.ics"


@pytest.mark.parametrize("kind", ["conversationUpdate", "installationUpdate", "typing", "messageReaction"])
def test_other_activities_are_acknowledged_and_store_nothing(client, bot, fake_teams, kind):
    activity = {**teams.message_activity("x"), "type": kind}
    response = post(client, activity, fake_teams.connector_token())
    assert (response.status_code, response.json()) == (200, {}) and nothing_stored()


@pytest.mark.parametrize("raw", [b"{not json", b"[]", b'"x"', b'{"text": "no type"}',
                                 b'{"type": "message", "text": "no ids"}'])
def test_a_verified_body_that_is_no_activity_is_400(client, bot, fake_teams, raw):
    assert post(client, raw, fake_teams.connector_token(service_url="")).status_code == 400 and nothing_stored()


def test_an_oversized_body_is_413_and_nothing_stored(client, bot, fake_teams, settings):
    activity = teams.message_activity("x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 10))
    assert post(client, activity, fake_teams.connector_token()).status_code == 413 and nothing_stored()


def test_an_unknown_card_tap_is_told_to_the_tapper_alone(client, bot, fake_teams):
    invoke = teams.invoke_activity("c:AAAAAAAAAAAAAAAAAAAA:y", reply_to="1700000000001")
    response = post(client, invoke, fake_teams.connector_token())
    assert response.status_code == 200
    answer = response.json()
    assert answer["statusCode"] == 200 and answer["type"] == "application/vnd.microsoft.activity.message"
    assert answer["value"] and nothing_stored()


# --- settings ------------------------------------------------------------------------------------


def test_settings_and_their_defaults():
    platform = TeamsPlatform()
    good = platform.clean_settings({"app_id": teams.APP_ID, "app_password": "s"})
    assert good["service_url"] == "https://smba.trafficmanager.net/teams/" and good["chat_interval"] == 2.0
    assert good["openid_metadata_url"] == "https://login.botframework.com/v1/.well-known/openidconfiguration"
    assert platform.missing_to_run({"app_id": teams.APP_ID}) == ["app_password"]
    for bad in ({"service_url": "ftp://x"}, {"token_url": "not a url"}, {"bot_token": "x"}):
        with pytest.raises(ValidationError):
            platform.clean_settings(bad)
    assert TeamsTransport.capabilities() >= {Capability.TYPING, Capability.PREVIEWS, Capability.EDIT,
                                             Capability.DELETE, Capability.FILES}


# --- the transport, against the fake Bot Connector -------------------------------------------------



def send(channel, text="hola", chat_id=teams.USER, **target):
    return run(TeamsTransport(channel).send_text(Target(chat_id, **target), text))


def test_a_reply_answers_the_message_with_the_apps_token_kept(bot, fake_teams):
    result = send(bot, "Hola 👋", reply_target="1700000000042")
    assert result.ok and result.platform_message_id
    [call] = fake_teams.calls("create")
    assert call.conversation == PERSONAL and call.activity_id == "1700000000042"
    assert call.body == {"type": "message", "text": "Hola 👋", "textFormat": "markdown", "replyToId": "1700000000042"}
    [token] = fake_teams.calls("token")
    assert token.body == {"client_id": teams.APP_ID, "scope": "https://api.botframework.com/.default"}
    [asked] = fake_teams.calls("conversation")  # the person's chat, asked for once
    assert asked.body == {"isGroup": False, "bot": {"id": teams.BOT}, "members": [{"id": teams.USER}],
                          "channelData": {"tenant": {"id": teams.TENANT}}, "tenantId": teams.TENANT}
    assert send(bot, "otra").ok and send(bot, "otra", chat_id=GROUP_CHAT).ok  # the token and the chat are kept
    assert len(fake_teams.calls("token")) == 1 and len(fake_teams.calls("conversation")) == 1
    assert fake_teams.calls("create")[2].activity_id == "" and fake_teams.calls("create")[2].conversation == GROUP_CHAT


def test_a_personal_chat_the_connector_refuses_is_permanent(bot, fake_teams):
    fake_teams.fail_next("conversation", status=403, code="BotNotInConversationRoster")  # the app was uninstalled
    result = send(bot)
    assert result.outcome == Outcome.PERMANENT and "BotNotInConversationRoster" in result.error
    assert not fake_teams.calls("create")


def test_a_long_text_is_split_at_the_limit_and_the_question_card_rides_on_the_last_piece(bot, fake_teams):
    result = send(bot, "a" * (MAX_UNITS + 100), buttons=(("Sí", "c:tok:y"), ("No", "c:tok:n")))
    assert result.ok
    first, second = fake_teams.calls("create")
    assert len(first.body["text"]) == MAX_UNITS and "attachments" not in first.body
    [attachment] = second.body["attachments"]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    actions = attachment["content"]["actions"]
    assert [(a["type"], a["verb"], a["data"]) for a in actions] == [
        ("Action.Execute", "confirm", {"data": "c:tok:y"}), ("Action.Execute", "confirm", {"data": "c:tok:n"})]
    assert attachment["content"]["body"][0]["text"] == "a" * 100
    assert len(json.dumps(first.body, ensure_ascii=False).encode()) < 28 * 1024


@pytest.mark.parametrize(("status", "retry_after", "outcome", "wait", "unreachable"), [
    (429, 3, Outcome.FLOOD, 3.0, True), (429, None, Outcome.FLOOD, 2.0, True),
    (500, None, Outcome.TEMPORARY, 0.0, True), (503, None, Outcome.TEMPORARY, 0.0, True),
    (403, None, Outcome.PERMANENT, 0.0, True), (404, None, Outcome.PERMANENT, 0.0, True),
    (400, None, Outcome.PERMANENT, 0.0, False), (413, None, Outcome.PERMANENT, 0.0, False),
    (401, None, Outcome.CHANNEL_BLOCKED, 0.0, True)])
def test_each_connector_error_maps_to_its_outcome(bot, fake_teams, status, retry_after, outcome, wait, unreachable):
    fake_teams.fail_next("create", status=status, retry_after=retry_after)
    result = send(bot)
    assert (result.outcome, result.retry_after) == (outcome, wait), result.error
    assert result.chat_unreachable is unreachable
    if status == 401:  # a refused token is dropped: the next send asks for another
        assert send(bot).ok and len(fake_teams.calls("token")) == 2


def test_the_fakes_thread_limit_answers_429_with_retry_after_and_is_a_flood(bot, fake_teams):
    fake_teams.clock = lambda: 1000.0  # the eight sends in one instant, however slow the machine
    results = [send(bot, f"{i}") for i in range(8)]
    assert all(r.ok for r in results[:7])
    assert results[7].outcome == Outcome.FLOOD and results[7].retry_after == 1.0
    assert send(bot, chat_id=GROUP_CHAT).ok  # another thread has its own budget


def test_the_fakes_bot_limit_answers_429(make_channel):
    with FakeTeams(bot_per_second=2, clock=lambda: 1000.0) as fake:
        channel = teams_channel(make_channel, fake)
        assert send(channel).ok and send(channel, chat_id=GROUP_CHAT).ok
        assert send(channel, chat_id="19:third@thread.v2").outcome == Outcome.FLOOD


def test_a_wrong_secret_blocks_the_channel(make_channel, fake_teams):
    channel = teams_channel(make_channel, fake_teams, app_password="revoked-secret")
    result = send(channel)
    assert result.outcome == Outcome.CHANNEL_BLOCKED and "invalid_client" in result.error
    assert "revoked-secret" not in result.error and not fake_teams.calls("create")


def test_unreachable_endpoints_are_not_sent(make_channel, fake_teams):
    no_token = teams_channel(make_channel, fake_teams, slug="t1", token_url="http://127.0.0.1:9/token")
    assert send(no_token).outcome == Outcome.NOT_SENT
    no_connector = teams_channel(make_channel, fake_teams, slug="t2", service_url="http://127.0.0.1:9/")
    result = send(no_connector)
    assert result.outcome == Outcome.NOT_SENT and fake_teams.calls("token")


def test_typing_is_a_typing_activity(bot, fake_teams):
    run(TeamsTransport(bot).send_typing(Target(teams.USER)))
    [call] = fake_teams.calls("typing")
    assert call.body == {"type": "typing"} and call.conversation == PERSONAL


def test_a_preview_is_one_message_edited_then_the_final_edit_carries_the_card(bot, fake_teams):
    target = Target(GROUP_CHAT, reply_target="1700000000007")

    async def stream():
        transport = TeamsTransport(bot)
        preview = transport.preview_for(target, turn_id=1)
        assert isinstance(preview, MessagePreview)  # a group chat: Teams streams in personal chats only
        shown = [await preview.show(text) for text in ("Hola ▍", "Hola, sí ▍")]
        final = await transport.edit_text(Target(GROUP_CHAT, buttons=(("Sí", "c:tok:y"),)), shown[0].message_id,
                                          "Hola, sí hay hora.")
        return preview, shown, final

    preview, shown, final = run(stream())
    assert preview.is_message and all(s.shown for s in shown) and shown[0].message_id == shown[1].message_id
    assert final.ok and final.platform_message_id == shown[0].message_id
    [create] = fake_teams.calls("create")
    assert create.body["text"] == "Hola ▍" and create.body["replyToId"] == "1700000000007"
    assert [u.activity_id for u in fake_teams.calls("update")] == [shown[0].message_id] * 2
    message = fake_teams.message(shown[0].message_id)
    assert teams.shown(message) == "Hola, sí hay hora." and message["attachments"][0]["content"]["actions"]


def test_a_discarded_preview_is_deleted_and_deleting_it_again_is_done(bot, fake_teams):
    async def stream():
        transport = TeamsTransport(bot)
        preview = transport.preview_for(Target(GROUP_CHAT), turn_id=2)
        shown = await preview.show("Un momento ▍")
        await preview.discard()
        return shown, await transport.delete_message(Target(GROUP_CHAT), shown.message_id)

    shown, again = run(stream())
    assert fake_teams.deleted() == [shown.message_id] and again.ok


def test_a_429_on_a_preview_says_flood(bot, fake_teams):
    fake_teams.fail_next("create", status=429)
    result = run(TeamsTransport(bot).preview_for(Target(GROUP_CHAT), turn_id=3).show("Hola ▍"))
    assert (result.shown, result.flood, result.stop) == (False, True, False)


def test_a_personal_chat_streams_natively_and_the_final_ends_the_stream_with_the_card(bot, fake_teams):
    async def stream():
        transport = TeamsTransport(bot)
        preview = transport.preview_for(Target(teams.USER, reply_target="1700000000008"), turn_id=4)
        assert isinstance(preview, TeamsStream) and preview.is_message
        shown = [await preview.show(text) for text in ("Hola ▍", "Hola ▍", "Hola, sí ▍")]
        final = await transport.edit_text(Target(teams.USER, buttons=(("Sí", "c:tok:y"),)), shown[0].message_id,
                                          "Hola, sí hay hora.")
        return shown, final

    shown, final = run(stream())
    assert [s.shown for s in shown] == [True, False, True]  # the same text twice is sent once
    stream_id = shown[0].message_id
    assert final.ok and final.platform_message_id == stream_id == shown[2].message_id
    first, second, last = fake_teams.calls("stream")
    assert first.body == {"type": "typing", "text": "Hola", "entities": [
        {"type": "streaminfo", "streamType": "streaming", "streamSequence": 1}]}
    assert second.body["entities"] == [{"type": "streaminfo", "streamType": "streaming", "streamSequence": 2,
                                        "streamId": stream_id}] and second.body["text"] == "Hola, sí"
    assert last.body["type"] == "message" and last.body["entities"] == [
        {"type": "streaminfo", "streamType": "final", "streamId": stream_id}]
    assert last.body["attachments"][0]["content"]["actions"][0]["verb"] == "confirm"  # attachments in the final only
    assert not fake_teams.stream(stream_id)["open"] and teams.shown(fake_teams.message(stream_id)) == "Hola, sí hay hora."
    assert not fake_teams.calls("create") and not fake_teams.calls("update")


def test_a_chat_that_refuses_streaming_gets_edited_previews_from_then_on(bot, fake_teams):
    fake_teams.fail_next("stream", status=403, code="ContentStreamNotAllowed")

    async def stream():
        transport = TeamsTransport(bot)
        refused = await transport.preview_for(Target(teams.USER), turn_id=5).show("Hola ▍")
        return refused, transport.preview_for(Target(teams.USER), turn_id=6)

    refused, then = run(stream())
    assert (refused.shown, refused.stop) == (False, True) and isinstance(then, MessagePreview)


def test_a_stream_an_earlier_run_left_is_not_streamed_to_and_the_final_replaces_it(bot, fake_teams):
    async def first_run():
        return await TeamsTransport(bot).preview_for(Target(teams.USER), turn_id=7).show("Hola ▍")

    shown = run(first_run())
    streaming._streams.clear()  # the worker that started it was killed

    async def second_run():
        transport = TeamsTransport(bot)
        again = await transport.preview_for(Target(teams.USER), turn_id=7, message_id=shown.message_id).show("Hola, sí ▍")
        return again, await transport.edit_text(Target(teams.USER), shown.message_id, "Hola, sí hay hora.")

    again, final = run(second_run())
    assert (again.shown, again.stop) == (False, True) and final.ok
    assert len(fake_teams.calls("stream")) == 1 and [u.activity_id for u in fake_teams.calls("update")] == [shown.message_id]


def test_a_429_on_a_stream_update_stops_the_updates_and_the_final_still_ends_it(bot, fake_teams):
    async def stream():
        transport = TeamsTransport(bot)
        preview = transport.preview_for(Target(teams.USER), turn_id=8)
        first = await preview.show("Hola ▍")
        fake_teams.fail_next("stream", status=429, retry_after=1)
        flooded = await preview.show("Hola, sí ▍")
        return first, flooded, await transport.edit_text(Target(teams.USER), first.message_id, "Hola, sí.")

    first, flooded, final = run(stream())
    assert (flooded.shown, flooded.flood, flooded.stop) == (False, True, True) and final.ok
    assert not fake_teams.stream(first.message_id)["open"]


def test_a_question_that_expired_loses_its_card_through_the_connector(bot, fake_teams, make_conversation):
    from django.utils import timezone

    from delivery.models import OutboundMessage, OutboundState
    from tools.models import ActionClaim, ClaimState, Confirmation, Proposal, ProposalState
    from tools.questions import withdraw_question

    sent = send(bot, "¿Agendo el lunes?", buttons=(("Sí", "c:tok:y"),))
    talk = make_conversation(bot, teams.USER)
    talk.chat_id = teams.USER
    talk.save(update_fields=["chat_id"])
    question = OutboundMessage.objects.create(conversation=talk, channel=bot, chat_id=teams.USER, text="¿Agendo el lunes?",
                                              state=OutboundState.DELIVERED, platform_message_id=sent.platform_message_id)
    past = timezone.now() - timedelta(minutes=1)
    claim = ActionClaim.objects.create(scope="contact:1", action="calendar_create_event", fingerprint="f1",
                                       state=ClaimState.RELEASED, live=False, expires_at=past, lease_until=past)
    proposal = Proposal.objects.create(claim=claim, state=ProposalState.EXPIRED, expires_at=past)
    Confirmation.objects.create(proposal=proposal, conversation=talk, question=question, text="¿Agendo el lunes?")
    withdraw_question(proposal.pk)
    [update] = fake_teams.calls("update")
    assert update.activity_id == sent.platform_message_id and "attachments" not in update.body
    message = fake_teams.message(sent.platform_message_id)
    assert message["text"].startswith("¿Agendo el lunes?") and message["text"] != "¿Agendo el lunes?"
