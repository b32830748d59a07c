"""Messenger and Instagram: the webhook (Meta's handshake and X-Hub-Signature-256, shared
with WhatsApp through conversations.platforms.meta; bad input refused, nothing stored),
the events parsed (texts, attachments, Instagram's story replies and mentions, echoes,
reactions, quick replies), and the transport against the local fake Send API over real
HTTP: each Graph error code's outcome and its path through the ledger, the 24-hour
window and its message tag, quick replies, typing and mark_seen, files."""

import json

import pytest
from django.core.management import call_command

from conversations.ingest import Inbound, admit
from conversations.models import InboundMessage, MediaFile, MessageBuffer
from conversations.platforms import messenger, meta
from conversations.platforms.messenger.events import Tap, key_of, parse
from delivery import ledger, transports
from delivery.models import OutboundKind, OutboundState, Outcome, UnreachableChat
from delivery.transports import Target
from tests.fakes import graph_api
from tests.fakes import graph_messenger as fb
from tests.fakes.graph_messenger import FakeMetaGraph
from tests.support.loops import run_then_close
from tests.support.messenger import (
    APP_SECRET,
    IG,
    IG_USER,
    PAGE,
    TOKEN,
    USER,
    VERIFY,
    meta_channel,
    meta_settings,
    signed_post,
)

KINDS = ["messenger", "instagram"]


@pytest.fixture
def fake():
    with FakeMetaGraph(tokens=[TOKEN], accounts={PAGE: "messenger", IG: "instagram"}) as server:
        yield server


@pytest.fixture
def page(make_channel, fake):
    return meta_channel(make_channel, fake)


@pytest.fixture
def insta(make_channel, fake):
    return meta_channel(make_channel, fake, kind="instagram")


def nothing_stored():
    return not InboundMessage.objects.exists() and not MessageBuffer.objects.exists()


def body(*events, kind="messenger"):
    return fb.event_body(PAGE if kind == "messenger" else IG, *events, kind=kind)


def run(coro):
    """On an event loop of its own, whose Graph client is closed before it ends."""
    return run_then_close(coro, meta.close_clients)


def transport(channel):
    return transports.transport_for(channel)


# --- the webhook: Meta's checks, shared with WhatsApp ------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_the_handshake_echoes_the_challenge_and_refuses_a_wrong_token(client, make_channel, fake, kind):
    meta_channel(make_channel, fake, kind=kind)
    path = f"/webhooks/{kind}/{'fb' if kind == 'messenger' else 'ig'}/"
    ok = client.get(path, {"hub.mode": "subscribe", "hub.verify_token": VERIFY, "hub.challenge": "1158201444"})
    assert ok.status_code == 200 and ok.content == b"1158201444"
    assert client.get(path, {"hub.mode": "subscribe", "hub.verify_token": "guess", "hub.challenge": "1"}).status_code == 403
    assert client.get(path, {"hub.mode": "subscribe", "hub.challenge": "1"}).status_code == 403


@pytest.mark.parametrize("signature, status", [(False, 401), ("", 403), ("sha256=" + "0" * 64, 403), ("sha1=ab", 403)])
def test_a_missing_or_wrong_signature_is_refused_and_nothing_stored(client, page, signature, status):
    response = signed_post(client, body(fb.text_event(USER, PAGE, "hola")), signature=signature)
    assert response.status_code == status and "X-Hub-Signature-256" in response.json()["error"]
    assert nothing_stored()


def test_another_apps_secret_or_a_tampered_body_is_403(client, page):
    event = body(fb.text_event(USER, PAGE, "hola"))
    assert signed_post(client, event, secret="another-app").status_code == 403
    raw = json.dumps(event).encode()
    assert signed_post(client, raw.replace(b"hola", b"hole"),
                       signature=graph_api.signature(APP_SECRET, raw)).status_code == 403
    assert nothing_stored()


def test_an_oversized_body_is_413_and_nothing_stored(client, page, settings):
    event = fb.text_event(USER, PAGE, "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 10))
    assert signed_post(client, body(event)).status_code == 413
    assert nothing_stored()


@pytest.mark.parametrize("raw", [b"{not json", b"[]", b'{"object": "page"}', b'"x"',
                                 b'{"object": "instagram", "entry": []}'])
def test_a_signed_body_that_is_no_messenger_event_is_400(client, page, raw):
    assert signed_post(client, raw).status_code == 400
    assert nothing_stored()


def test_a_text_is_admitted_once_and_its_redelivery_is_a_duplicate(client, page):
    event = fb.text_event(USER, PAGE, "Hola, ¿tienen hora?")
    first = signed_post(client, body(event)).json()
    again = signed_post(client, body(event)).json()
    assert first == {"ok": True, "admitted": 1, "duplicates": 0, "refused": 0, "ignored": 0}
    assert again["duplicates"] == 1 and again["admitted"] == 0
    stored = InboundMessage.objects.get()
    assert stored.platform_message_id == event["message"]["mid"] and stored.text == "Hola, ¿tienen hora?"
    assert (stored.conversation.chat_id, stored.conversation.sender_id) == (USER, USER)
    assert not stored.conversation.is_group and stored.sent_at is not None


def test_echoes_reads_and_another_pages_entries_are_ignored(client, page):
    read = fb.event(USER, PAGE, read={"watermark": 1764500000000})
    other = fb.event_body("999000111", fb.text_event(USER, "999000111", "not ours"))["entry"]
    sent = body(fb.echo_event(PAGE, USER, "our own reply"), read)
    sent["entry"] += other
    answer = signed_post(client, sent).json()
    assert answer["ignored"] == 3 and answer["admitted"] == 0
    assert nothing_stored()


def test_an_unknown_event_kind_unstorable_ids_and_missing_parts_are_ignored_not_500(client, page):
    broken = [fb.event(USER, PAGE, message={"text": "no mid"}), fb.event("", PAGE, message={"mid": "m_1", "text": "x"}),
              fb.event(USER, PAGE, optin={"ref": "x"}), fb.event(USER, PAGE, reaction={"action": "react"}),
              {"sender": "nope"}]
    answer = signed_post(client, body(*broken)).json()
    assert answer["ignored"] == 5 and nothing_stored()


# --- what each event becomes -----------------------------------------------------------------


def parsed(data, kind="messenger"):
    return parse(data, kind, PAGE if kind == "messenger" else IG, lambda payload: payload.startswith("c:")).items


def test_an_attachment_is_a_file_fetched_from_the_url_it_came_with(client, page, fake):
    url = fake.add_attachment(b"\xff\xd8\xff" + b"\x00" * 64)
    event = fb.attachment_event(USER, PAGE, url, "image", text="mi boleta")
    assert signed_post(client, body(event)).json()["admitted"] == 1
    stored = InboundMessage.objects.get()
    assert stored.media_type == "photo" and stored.text == "mi boleta"
    media = MediaFile.objects.get()
    assert media.ref == url and media.kind == "photo"
    data = run(messenger.MessengerPlatform().fetch_media(page, url, 10_000))
    assert data.startswith(b"\xff\xd8\xff") and len(fake.fetched) == 1


def test_instagram_story_replies_and_mentions_are_messages_of_their_own_kinds(client, insta, fake):
    story = fake.add_attachment(b"\x00" * 32, "video/mp4")
    reply = fb.story_reply_event(IG_USER, IG, "¡Qué lindo local!", story)
    mention = fb.story_mention_event(IG_USER, IG, fake.add_attachment(b"\x01" * 32))
    answer = signed_post(client, body(reply, mention, kind="instagram"), kind="instagram").json()
    assert answer["admitted"] == 2
    kinds = dict(InboundMessage.objects.values_list("media_type", "text"))
    assert kinds == {"story reply": "¡Qué lindo local!", "story mention": ""}
    assert sorted(MediaFile.objects.values_list("kind", flat=True)) == ["story", "story"]


def test_an_instagram_mid_longer_than_the_column_is_stored_as_its_digest_and_still_deduplicated(client, insta):
    event = fb.text_event(IG_USER, IG, "hola", kind="instagram")
    assert len(event["message"]["mid"]) > 120
    for _ in range(2):
        signed_post(client, body(event, kind="instagram"), kind="instagram")
    stored = InboundMessage.objects.get()
    assert stored.platform_message_id == key_of(event["message"]["mid"]) and stored.platform_message_id.startswith("sha256:")


def test_a_reaction_on_a_reply_is_a_reaction_and_an_unreact_takes_it_back():
    react, unreact = fb.reaction_event(USER, PAGE, "m_ours", "😍"), fb.reaction_event(USER, PAGE, "m_ours", action="unreact")
    first, second = parsed(body(react, unreact))
    assert (first.platform_message_id, first.emoji, first.source) == ("m_ours", "😍", "messenger")
    assert second.emoji == "" and first.key != second.key


def test_a_quick_reply_or_postback_answering_a_question_is_a_tap_others_are_text():
    tap = fb.quick_reply_event(USER, PAGE, "✅ Yes, do it", "c:abcdefghijklmnopqrstuvwx:y")
    plain = fb.quick_reply_event(USER, PAGE, "Horarios", "MENU_HOURS")
    postback = fb.postback_event(USER, PAGE, "❌ No", "c:abcdefghijklmnopqrstuvwx:n")
    first, second, third = parsed(body(tap, plain, postback))
    assert first == Tap(tap["message"]["mid"], USER, USER, "c:abcdefghijklmnopqrstuvwx:y")
    assert isinstance(second, Inbound) and second.text == "Horarios"
    assert isinstance(third, Tap) and third.data.endswith(":n")


def test_a_burst_admitted_out_of_order_is_sorted_by_its_timestamps():
    later = fb.text_event(USER, PAGE, "segundo", timestamp=1764500010000)
    earlier = fb.text_event(USER, PAGE, "primero", timestamp=1764500000000)
    assert [m.text for m in parsed(body(later, earlier))] == ["primero", "segundo"]


def test_plain_messages_take_the_lean_path_and_taps_djangos_view():
    webhook = messenger.MessengerPlatform().webhook()
    assert webhook.lean and webhook.takes_lean(json.dumps(body(fb.text_event(USER, PAGE, "hola"))).encode())
    for tap in (fb.quick_reply_event(USER, PAGE, "Sí", "c:abcdefghijklmnopqrstuvwx:y"),
                fb.postback_event(USER, PAGE, "Sí", "c:abcdefghijklmnopqrstuvwx:y")):
        assert not webhook.takes_lean(json.dumps(body(tap)).encode())


def test_a_tap_that_decides_nothing_is_answered_and_admits_nothing(client, page):
    tap = fb.quick_reply_event(USER, PAGE, "✅ Yes, do it", "c:abcdefghijklmnopqrstuvwx:y")
    assert signed_post(client, body(tap)).json()["tap_invalid"] == 1
    assert nothing_stored()


# --- the transport against the fake Send API -------------------------------------------------


def test_a_reply_is_a_response_to_the_person_and_returns_the_mid(page, fake):
    result = run(transport(page).send_text(Target(USER, "m_in"), "Hola 👋"))
    assert result.ok and result.platform_message_id.startswith("m_")
    [call] = fake.calls("send")
    assert call.body == {"recipient": {"id": USER}, "messaging_type": "RESPONSE", "message": {"text": "Hola 👋"},
                         "ok": True}
    assert call.token == TOKEN and call.version == "v23.0" and call.phone_number_id == PAGE


def test_texts_are_split_at_2000_characters_and_instagrams_at_1000_bytes(page, insta, fake):
    assert run(transport(page).send_text(Target(USER), "a" * 2500)).ok
    assert [len(t) for t in fake.texts(USER)] == [2000, 500]
    assert run(transport(insta).send_text(Target(IG_USER), "ñ" * 700)).ok  # 1,400 bytes
    assert [len(t.encode()) for t in fake.texts(IG_USER)] == [1000, 400]
    assert ledger.split_for(page, "a" * 2500)  # the ledger chunks at 2,000 too; bytes are the transport's


def test_a_questions_buttons_go_as_quick_replies_on_its_last_piece(page, fake):
    buttons = (("✅ Yes, do it", "c:abcdefghijklmnopqrstuvwx:y"), ("❌ No", "c:abcdefghijklmnopqrstuvwx:n"))
    assert run(transport(page).send_text(Target(USER, buttons=buttons), "Please confirm: book it.")).ok
    [message] = fake.sent(USER)
    assert message["quick_replies"] == [{"content_type": "text", "title": label, "payload": data}
                                        for label, data in buttons]


@pytest.mark.parametrize("code, subcode, outcome, phrase", [
    (613, None, Outcome.FLOOD, "rate limited"), (4, None, Outcome.FLOOD, "rate limited"),
    (17, None, Outcome.FLOOD, "rate limited"), (32, None, Outcome.FLOOD, "rate limited"),
    (551, 1545041, Outcome.PERMANENT, "isn't available"), (100, 2018001, Outcome.PERMANENT, "no matching user"),
    (10, 2018278, Outcome.PERMANENT, "messaging window"), (10, 2018108, Outcome.PERMANENT, "cannot receive"),
    (1200, None, Outcome.TEMPORARY, "Temporary send message failure"), (2, None, Outcome.TEMPORARY, "unexpected"),
    (190, None, Outcome.CHANNEL_BLOCKED, "token"), (100, None, Outcome.PERMANENT, "rejected"),
])
def test_each_graph_error_code_maps_to_its_outcome(page, fake, code, subcode, outcome, phrase):
    fake.fail_next("send", code=code, subcode=subcode)
    result = run(transport(page).send_text(Target(USER), "hola"))
    assert result.outcome == outcome and phrase in result.error, result.error
    assert TOKEN not in result.error
    if outcome == Outcome.FLOOD:
        assert result.retry_after == meta.FLOOD_BACKOFF


def test_a_rate_limit_waits_as_long_as_meta_estimates():
    headers = {"x-business-use-case-usage": json.dumps({"1": [{"estimated_time_to_regain_access": 3}]})}
    assert meta.regain_after(headers) == 180
    assert meta.regain_after({"x-business-use-case-usage": "not json"}) is None
    assert meta.regain_after({"x-app-usage": json.dumps({"call_count": 100})}) is None


def test_the_fakes_own_rate_is_met_as_a_flood_with_its_estimate(page, fake):
    fake.per_second = 1
    assert run(transport(page).send_text(Target(USER), "uno")).ok
    result = run(transport(page).send_text(Target(USER), "dos"))
    assert result.outcome == Outcome.FLOOD and result.retry_after == 60 and "613" in result.error


def test_outside_the_window_a_reply_is_permanent_and_with_human_agent_it_goes_tagged(make_channel, fake):
    fake.strict_window = True
    fake.user_wrote(USER, at=__import__("time").time() - 3 * 86400)  # three days ago
    plain = meta_channel(make_channel, fake)
    result = run(transport(plain).send_text(Target(USER), "¿Sigues ahí?"))
    assert result.outcome == Outcome.PERMANENT and "messaging window" in result.error and result.chat_unreachable
    plain.platform_settings["message_tag"] = "HUMAN_AGENT"
    plain.save()
    assert run(transport(plain).send_text(Target(USER), "¿Sigues ahí?")).ok
    tagged = fake.calls("send")[-1].body
    assert tagged["messaging_type"] == "MESSAGE_TAG" and tagged["tag"] == "HUMAN_AGENT"
    fake.user_wrote(USER, at=__import__("time").time() - 8 * 86400)  # past the tag's 7 days
    assert run(transport(plain).send_text(Target(USER), "¿Hola?")).outcome == Outcome.PERMANENT


def test_typing_marks_the_message_seen_once_then_shows_typing_on(page, fake):
    for _ in range(3):
        run(transport(page).send_typing(Target(USER, "m_last", conversation_id=1)))
    actions = [c.body["sender_action"] for c in fake.calls("action")]
    assert actions == ["mark_seen", "typing_on", "typing_on", "typing_on"]
    fake.fail_next("action", code=613)
    with pytest.raises(Exception, match="rate limited"):
        run(transport(page).send_typing(Target(USER, "m_last")))


def test_a_file_is_uploaded_with_its_message_and_instagram_without_a_public_url_names_it(page, insta, fake,
                                                                                           settings, tmp_path):
    from delivery.attachments import OutboundFile, store

    settings.AGENTLOOP_MEDIA_ROOT = tmp_path
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 100
    item = OutboundFile(store(page.pk, png), "horario.png", "image/png", len(png))
    assert run(transport(page).send_files(Target(USER), [item], "el horario")).ok
    [upload] = fake.calls("upload")
    assert upload.body["message"] == {"attachment": {"type": "image", "payload": {"is_reusable": False}}}
    assert upload.body["recipient"] == {"id": USER} and upload.body["messaging_type"] == "RESPONSE"
    assert fake.received_files[0]["data"] == png and fake.received_files[0]["via"] == "upload"
    assert fake.texts(USER) == ["el horario"]  # the caption follows
    assert run(transport(insta).send_files(Target(IG_USER), [item], "")).ok
    assert fake.texts(IG_USER) == ["📎 horario.png"] and len(fake.calls("upload")) == 1


def test_a_connection_dropped_after_the_request_is_ambiguous_and_nobody_listening_is_not_sent(page, fake,
                                                                                              make_channel):
    from tests.conftest import free_port

    fake.drop_connection_next("send")
    assert run(transport(page).send_text(Target(USER), "hola")).outcome == Outcome.AMBIGUOUS
    page.platform_settings["api_base"] = f"http://127.0.0.1:{free_port()}"
    page.platform_settings["token"] = TOKEN
    page.save()
    assert run(transport(page).send_text(Target(USER), "hola")).outcome == Outcome.NOT_SENT


# --- through the ledger ------------------------------------------------------------------------


def through_the_ledger(channel):
    admit(channel, Inbound(platform_message_id="m_in", chat_id=USER, sender_id=USER, text="hola", reply_target="m_in"))
    row = ledger.enqueue(channel.conversations.get(), "¿Me confirmas la hora?", kind=OutboundKind.REPLY)
    [claimed] = ledger.claim_due("test-owner")
    ledger.finish(claimed, "test-owner", run(ledger.send(claimed)))
    row.refresh_from_db()
    return row


@pytest.mark.parametrize("code, subcode, state", [
    (613, None, OutboundState.FAILED), (551, 1545041, OutboundState.UNREACHABLE),
    (10, 2018278, OutboundState.UNREACHABLE), (1200, None, OutboundState.FAILED), (190, None, OutboundState.PENDING),
])
def test_every_kind_of_outcome_through_the_ledger(page, fake, code, subcode, state):
    fake.fail_next("send", code=code, subcode=subcode)
    row = through_the_ledger(page)
    assert row.state == state, (row.state, row.last_error)
    if code == 613:
        assert row.flood_waits == 1 and ledger.resends_used(row) == 0
    if state == OutboundState.UNREACHABLE:
        assert UnreachableChat.objects.filter(chat_id=USER).exists() and row.next_attempt_at is None


def test_a_reaction_on_a_delivered_reply_is_a_note_for_the_next_turn_once(client, page, fake):
    row = through_the_ledger(page)
    assert row.state == OutboundState.DELIVERED
    react = fb.reaction_event(USER, PAGE, row.platform_message_id, "👍")
    assert signed_post(client, body(react)).json()["reactions"] == 1
    assert signed_post(client, body(react)).json().get("reactions", 0) == 0  # Meta's redelivery


# --- operators ---------------------------------------------------------------------------------


def test_addchannel_takes_the_options_and_the_settings_are_checked(db, fake):
    from django.core.exceptions import ValidationError

    from conversations.models import Channel

    call_command("addchannel", "shop", "--kind", "instagram", "--agent", "demo", "--account-id", IG,
                 "--token", TOKEN, "--app-secret", APP_SECRET, "--verify-token", VERIFY, "--api-base", fake.url)
    channel = Channel.objects.get(slug="shop")
    assert channel.platform_settings["account_id"] == IG and not channel.send_blocked
    platform = messenger.InstagramPlatform()
    with pytest.raises(ValidationError):
        platform.clean_settings({**meta_settings(kind="instagram"), "account_id": "my_shop"})
    with pytest.raises(ValidationError):
        platform.clean_settings({**meta_settings(kind="instagram"), "message_tag": "ACCOUNT_UPDATE"})
    assert TOKEN in platform.secrets(channel) and APP_SECRET in platform.secrets(channel)


def test_make_run_makes_a_channel_of_each_kind_whose_variables_are_set(db, monkeypatch):
    from conversations.models import Channel

    monkeypatch.setenv("META_APP_SECRET", APP_SECRET)
    for name, value in {"MESSENGER_PAGE_ID": PAGE, "MESSENGER_PAGE_TOKEN": TOKEN, "MESSENGER_VERIFY_TOKEN": VERIFY}.items():
        monkeypatch.setenv(name, value)
    said = messenger.MessengerPlatform().bootstrap(None)
    assert "/webhooks/messenger/messenger/" in said and "messaging_postbacks" in said
    assert messenger.InstagramPlatform().bootstrap(None) == ""  # only the shared app secret: no channel, no noise
    monkeypatch.setenv("INSTAGRAM_ACCOUNT_ID", IG)
    assert "INSTAGRAM_TOKEN" in messenger.InstagramPlatform().bootstrap(None)
    assert Channel.objects.get(slug="messenger").platform_settings["account_id"] == PAGE
