"""SMS through Twilio, in process: X-Twilio-Signature checked with the `twilio` library's
RequestValidator over the channel's public URL (missing, wrong, another URL — a proxy's
inside address —, another account's), messages admitted by MessageSid and redeliveries
answered as duplicates, bad bodies, opt-out and opt-in keywords, an MMS's files fetched
with the account's credentials; status callbacks updating the ledger; the transport's
outcome for each Twilio error against the local fake over real HTTP; what a reply costs
in segments. End to end (the real web server and worker): test_sms_e2e.py."""

from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from audit.models import AuditEvent, EventKind
from conversations.media.download import FileUnavailable
from conversations.models import InboundMessage, MessageBuffer
from conversations.platforms import get
from conversations.platforms.sms import SmsPlatform, segments
from conversations.platforms.sms.transport import MAX_UNITS, SmsTransport
from delivery import receipts
from delivery.models import OutboundMessage, OutboundState, Outcome, UnreachableChat
from delivery.transports import Capability, Target
from tests.fakes import twilio_api as twilio
from tests.fakes.twilio_api import ACCOUNT_SID, FROM, PERSON, FakeTwilio
from tests.support.sms import PUBLIC, run, sms_channel

URL = "/webhooks/sms/sms/"
STATUS_URL = "/webhooks/sms/sms/status/"
FORM = "application/x-www-form-urlencoded"


@pytest.fixture
def fake_twilio():
    with FakeTwilio(callback_delay=0) as fake:
        yield fake


@pytest.fixture
def line(make_channel, fake_twilio):
    return sms_channel(make_channel, fake_twilio)


def post(client, params, token=twilio.AUTH_TOKEN, path=URL, signed_for=None):
    headers = {"X-Twilio-Signature": twilio.signature(signed_for or PUBLIC + path, params, token)} if token else {}
    return client.post(path, data=urlencode(params), content_type=FORM, headers=headers)  # as Twilio posts


def nothing_stored():
    return not InboundMessage.objects.exists() and not MessageBuffer.objects.exists()


# --- the webhook ------------------------------------------------------------------------------------


def test_a_message_is_admitted_by_its_sid_and_a_redelivery_is_a_duplicate(client, line):
    params = twilio.message_params("Hola, ¿hay hora el lunes?")
    for _ in range(3):
        response = post(client, params)
        assert response.status_code == 200 and response["Content-Type"].startswith("text/xml")
        assert response.content.decode().endswith("<Response></Response>")  # empty TwiML: the reply is the ledger's
    stored = InboundMessage.objects.get()
    assert stored.platform_message_id == params["MessageSid"] and stored.text == "Hola, ¿hay hora el lunes?"
    assert stored.conversation.chat_id == PERSON and stored.conversation.sender_id == PERSON
    assert MessageBuffer.objects.count() == 1


@pytest.mark.parametrize("how", ["missing", "wrong token", "inside url", "another account"])
def test_a_request_not_signed_by_twilio_for_the_public_url_is_refused_and_nothing_stored(client, line, how):
    params = twilio.message_params("hola")
    if how == "missing":
        response = post(client, params, token=None)
        assert response.status_code == 401 and "X-Twilio-Signature" in response.json()["error"]
    elif how == "wrong token":
        assert post(client, params, token="another-token").status_code == 403
    elif how == "inside url":  # what the process sees behind a proxy is not what Twilio signed
        assert post(client, params, signed_for=f"http://testserver{URL}").status_code == 403
    else:  # signed with our token, yet naming another account: refused all the same
        params["AccountSid"] = "AC" + "f" * 32
        assert post(client, params).status_code == 403
    assert nothing_stored()


def test_a_signature_over_the_url_with_its_default_port_is_accepted(client, line):
    params = twilio.message_params("hola")  # Twilio signs with or without :443, whichever way it called
    assert post(client, params, signed_for=f"https://sms.example.com:443{URL}").status_code == 200
    assert InboundMessage.objects.count() == 1


def test_a_query_string_is_part_of_the_signed_url(client, line):
    params = twilio.message_params("hola")
    response = client.post(f"{URL}?source=console", data=urlencode(params), content_type=FORM, headers={
        "X-Twilio-Signature": twilio.signature(f"{PUBLIC}{URL}?source=console", params)})
    assert response.status_code == 200 and InboundMessage.objects.count() == 1


def test_a_channel_without_a_token_or_public_url_refuses_everything(client, make_channel, fake_twilio):
    sms_channel(make_channel, fake_twilio, auth_token="")
    response = post(client, twilio.message_params("hola"))
    assert response.status_code == 403 and "--token" in response.json()["error"]
    assert nothing_stored()


@pytest.mark.parametrize("change, problem", [
    ({"MessageSid": "", "SmsMessageSid": ""}, "MessageSid"), ({"From": ""}, "MessageSid and From"),
    ({"NumMedia": "dos"}, "NumMedia")])
def test_a_signed_body_that_is_no_message_is_400(client, line, change, problem):
    params = {**twilio.message_params("hola"), **change}
    response = post(client, params)
    assert response.status_code == 400 and problem in response.json()["error"] and nothing_stored()


def test_a_body_of_too_many_fields_is_400_and_nothing_stored(client, line):
    params = {**twilio.message_params("hola"), **{f"X{i}": "1" for i in range(1100)}}
    response = post(client, params)
    assert response.status_code == 400 and "Twilio form" in response.json()["error"] and nothing_stored()


def test_an_oversized_body_is_413_and_nothing_stored(client, line, settings):
    settings.AGENTLOOP_MAX_BODY_BYTES = 2048
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2048
    response = post(client, twilio.message_params("x" * 4000))
    assert response.status_code == 413 and nothing_stored()


def test_unknown_channel_is_404(client, line):
    assert post(client, twilio.message_params("hola"), path="/webhooks/sms/nope/").status_code == 404


# --- opt-out ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, extra", [("STOP", {}), (" stop ", {}), ("Unsubscribe", {}),
                                         ("Basta ya", {"OptOutType": "STOP"})])
def test_an_opt_out_starts_no_turn_and_marks_the_chat_unreachable_once(client, line, text, extra):
    for _ in range(2):
        assert post(client, twilio.message_params(text, **extra)).status_code == 200
    assert nothing_stored()
    assert UnreachableChat.objects.get().chat_id == PERSON
    assert AuditEvent.objects.filter(kind=EventKind.CHAT_UNREACHABLE).count() == 1


def test_start_clears_the_mark_and_an_opt_in_word_with_more_is_admitted(client, line):
    post(client, twilio.message_params("STOP"))
    assert post(client, twilio.message_params("start")).status_code == 200
    assert not UnreachableChat.objects.exists() and nothing_stored()
    post(client, twilio.message_params("STOP"))
    post(client, twilio.message_params("Yes", OptOutType="START"))
    assert not UnreachableChat.objects.exists() and InboundMessage.objects.get().text == "Yes"


def test_help_is_an_ordinary_message(client, line):
    post(client, twilio.message_params("HELP", OptOutType="HELP"))
    assert InboundMessage.objects.get().text == "HELP" and not UnreachableChat.objects.exists()


def test_chat_opted_out_marks_once_and_chat_opted_in_clears(line):
    assert receipts.chat_opted_out(line, PERSON, "the person sent STOP") is True
    assert receipts.chat_opted_out(line, PERSON, "the person sent STOP") is False
    assert UnreachableChat.objects.get().error == "the person sent STOP"
    assert receipts.chat_opted_in(line, PERSON) is True and receipts.chat_opted_in(line, PERSON) is False


# --- MMS ---------------------------------------------------------------------------------------------


def test_an_mms_is_one_album_its_files_fetched_with_the_accounts_credentials(client, line, fake_twilio):
    photo, audio = fake_twilio.media(b"\xff\xd8\xff" + b"\x00" * 64), fake_twilio.media(b"OggS" + b"\x00" * 32,
                                                                                          "audio/ogg")
    params = twilio.message_params("mira", media=((photo, "image/jpeg"), (audio, "audio/ogg")))
    assert post(client, params).status_code == 200
    first, second = InboundMessage.objects.order_by("pk")
    assert first.platform_message_id == params["MessageSid"] and first.text == "mira"
    assert second.platform_message_id == f"{params['MessageSid']}/1"
    assert (first.media_type, second.media_type) == ("photo", "audio")
    platform = get("sms")
    assert run(platform.fetch_media(line, photo, 10_000)).startswith(b"\xff\xd8\xff")
    media, file = fake_twilio.calls("media"), fake_twilio.calls("file")
    assert media[0].status == 307 and file[0].status == 200  # the credentials went to the API root only


def test_a_file_elsewhere_or_without_credentials_is_not_fetched(line, make_channel, fake_twilio):
    platform = get("sms")
    with pytest.raises(FileUnavailable, match="API root"):
        run(platform.fetch_media(line, "https://evil.example/2010-04-01/x", 1000))
    other = sms_channel(make_channel, fake_twilio, slug="wrong", auth_token="wrong-token")
    with pytest.raises(FileUnavailable) as refused:
        run(platform.fetch_media(other, fake_twilio.media(b"x"), 1000))
    assert refused.value.permanent and not fake_twilio.calls("file")


# --- status callbacks ---------------------------------------------------------------------------------


def delivered_row(line, make_conversation, sid="SM" + "1" * 32):
    conversation = make_conversation(line, contact=PERSON)
    return OutboundMessage.objects.create(conversation=conversation, channel=line, chat_id=PERSON, text="Hola",
                                          state=OutboundState.DELIVERED, platform_message_id=sid, attempts=1,
                                          delivered_at=timezone.now())


def status(sid, state, code=""):
    params = {"MessageSid": sid, "MessageStatus": state, "AccountSid": ACCOUNT_SID, "To": PERSON, "From": FROM}
    return {**params, "ErrorCode": code} if code else params


def test_sent_and_delivered_change_nothing_undelivered_is_resent_labelled(client, line, make_conversation):
    row = delivered_row(line, make_conversation)
    for state in ("queued", "sent", "delivered"):
        assert post(client, status(row.platform_message_id, state), path=STATUS_URL).status_code == 200
    row.refresh_from_db()
    assert row.state == OutboundState.DELIVERED
    for _ in range(2):  # Twilio may call twice: the second changes nothing
        assert post(client, status(row.platform_message_id, "undelivered", "30003"), path=STATUS_URL).status_code == 200
    row.refresh_from_db()
    assert row.state == OutboundState.FAILED and row.next_attempt_at is not None and "30003" in row.last_error
    assert AuditEvent.objects.filter(kind=EventKind.REPLY_FAILED_AFTER_SEND).count() == 1
    assert not UnreachableChat.objects.exists()


def test_an_undeliverable_number_is_unreachable_never_resent(client, line, make_conversation):
    row = delivered_row(line, make_conversation)
    post(client, status(row.platform_message_id, "failed", "30005"), path=STATUS_URL)
    row.refresh_from_db()
    assert row.state == OutboundState.UNREACHABLE and "unknown destination" in row.last_error
    assert UnreachableChat.objects.get().chat_id == PERSON


def test_a_status_callback_is_signed_and_checked_like_a_message(client, line, make_conversation):
    row = delivered_row(line, make_conversation)
    assert post(client, status(row.platform_message_id, "undelivered", "30003"), token=None,
                path=STATUS_URL).status_code == 401
    assert post(client, status(row.platform_message_id, "undelivered", "30003"), path=STATUS_URL,
                signed_for=PUBLIC + URL).status_code == 403  # signed for the other URL
    assert post(client, {"MessageSid": row.platform_message_id}, path=STATUS_URL).status_code == 400
    assert post(client, status("SM" + "9" * 32, "undelivered", "30003"), path=STATUS_URL).status_code == 200  # unknown
    row.refresh_from_db()
    assert row.state == OutboundState.DELIVERED


# --- the transport ------------------------------------------------------------------------------------


def test_a_reply_goes_through_the_messages_api_with_its_status_callback(line, fake_twilio):
    result = run(SmsTransport(line).send_text(Target(PERSON), "Hola, sí hay hora"))
    assert result.ok and result.platform_message_id.startswith("SM")
    [call] = fake_twilio.sent()
    assert call.path == f"/2010-04-01/Accounts/{ACCOUNT_SID}/Messages.json"
    assert (call.value("To"), call.value("From"), call.value("Body")) == (PERSON, FROM, "Hola, sí hay hora")
    assert call.value("StatusCallback") == f"{PUBLIC}/webhooks/sms/sms/status/"


def test_a_messaging_service_sends_as_itself(make_channel, fake_twilio):
    service = "MG" + "a" * 32
    line = sms_channel(make_channel, fake_twilio, from_number=service)
    assert run(SmsTransport(line).send_text(Target(PERSON), "hola")).ok
    [call] = fake_twilio.sent()
    assert call.value("MessagingServiceSid") == service and not call.value("From")


@pytest.mark.parametrize("status, code, retry_after, outcome, wait, unreachable", [
    (429, 20429, 2, Outcome.FLOOD, 2.0, True), (429, 20429, None, Outcome.FLOOD, 5.0, True),
    (400, 21610, None, Outcome.PERMANENT, 0, True), (400, 21211, None, Outcome.PERMANENT, 0, True),
    (400, 21617, None, Outcome.PERMANENT, 0, False), (400, 21606, None, Outcome.CHANNEL_BLOCKED, 0, True),
    (500, 20500, None, Outcome.TEMPORARY, 0, True), (503, 20503, None, Outcome.TEMPORARY, 0, True),
    (400, 12345, None, Outcome.PERMANENT, 0, True)])
def test_each_twilio_error_maps_to_its_outcome(line, fake_twilio, status, code, retry_after, outcome, wait,
                                               unreachable):
    fake_twilio.fail_next(status, code, retry_after=retry_after)
    result = run(SmsTransport(line).send_text(Target(PERSON), "hola"))
    assert (result.outcome, result.retry_after, result.chat_unreachable) == (outcome, wait, unreachable)
    assert f"error {code}" in result.error


def test_an_opted_out_number_is_permanent_and_a_wrong_token_blocks_the_channel(line, make_channel, fake_twilio):
    fake_twilio.opt_out(PERSON)
    result = run(SmsTransport(line).send_text(Target(PERSON), "hola"))
    assert result.outcome == Outcome.PERMANENT and "replied STOP" in result.error
    wrong = sms_channel(make_channel, fake_twilio, slug="wrong", auth_token="wrong-token")
    result = run(SmsTransport(wrong).send_text(Target("+56933334444"), "hola"))
    assert result.outcome == Outcome.CHANNEL_BLOCKED and "wrong-token" not in result.error


def test_an_api_that_cannot_be_reached_is_not_sent(make_channel, fake_twilio):
    line = sms_channel(make_channel, fake_twilio, api_base="http://127.0.0.1:9")
    result = run(SmsTransport(line).send_text(Target(PERSON), "hola"))
    assert result.outcome == Outcome.NOT_SENT


def test_capabilities_pacing_and_the_limit(line):
    transport = SmsTransport(line)
    assert SmsTransport.capabilities() == {Capability.FILES}  # MMS; no typing, edits or reactions
    assert transport.max_units == MAX_UNITS == 1600
    pace = transport.pace(PERSON)
    assert pace is not None and pace.bot == f"sms:{FROM}" and pace.bot_interval == 1.0


def test_settings_are_checked():
    platform = SmsPlatform()
    cleaned = platform.clean_settings({"account_sid": ACCOUNT_SID, "from_number": "+15551234567",
                                       "public_base": "https://agent.example.com/"})
    assert cleaned["public_base"] == "https://agent.example.com" and cleaned["api_base"] == "https://api.twilio.com"
    assert cleaned["messages_per_second"] == 1.0
    for bad in ({"account_sid": "AC123"}, {"from_number": "5551234"}, {"public_base": "ftp://x"},
                {"public_base": "https://x.example/?a=1"}):
        with pytest.raises(ValidationError):
            platform.clean_settings(bad)
    assert set(platform.missing_to_run({})) == {"account_sid", "auth_token", "from_number", "public_base"}


# --- what a reply costs --------------------------------------------------------------------------------


def test_segments_are_counted_as_carriers_bill_them():
    assert segments.count("a" * 160) == segments.Cost("GSM-7", 160, 1)
    assert [len(p) for p in segments.split("a" * 161)] == [153, 8]
    assert segments.count("€" * 80) == segments.Cost("GSM-7", 160, 1)  # an extension character is two septets
    parts = segments.split("a" + "€" * 80)  # 161 septets: never an escape pair across two segments
    assert [sum(2 if c == "€" else 1 for c in p) for p in parts] == [153, 8] or \
        all(sum(2 if c == "€" else 1 for c in p) <= 153 for p in parts)
    assert segments.count("á" * 70) == segments.Cost("UCS-2", 70, 1)  # one non-GSM character: all UCS-2
    assert [len(p) for p in segments.split("á" * 71)] == [67, 4]
    emoji = segments.split("a" + "😀" * 40)  # 81 UTF-16 units: a surrogate pair is never cut
    assert "".join(emoji) == "a" + "😀" * 40 and all(len(p.encode("utf-16-le")) // 2 <= 67 for p in emoji)
    assert segments.count("ñandú").encoding == "UCS-2" and segments.count("ñandu").encoding == "GSM-7"
    assert segments.count("").segments == 0


def test_a_receipt_for_a_superseded_send_changes_nothing(line, make_conversation):
    row = delivered_row(line, make_conversation)
    OutboundMessage.objects.filter(pk=row.pk).update(platform_message_id="SM" + "2" * 32,
                                                     delivered_at=timezone.now() - timedelta(seconds=5))
    failure = receipts.Failure("SM" + "1" * 32, "undelivered, error 30003")
    assert receipts.failed_after_send(line, failure) == receipts.UNKNOWN


def test_addchannel_takes_the_twilio_settings(db, fake_twilio):
    from django.core.management import call_command

    from conversations.models import Channel

    call_command("addchannel", "txt", "--kind", "sms", "--account-sid", ACCOUNT_SID, "--token", twilio.AUTH_TOKEN,
                 "--from-number", FROM, "--public-base", "https://agent.example.com", "--api-base", fake_twilio.url)
    channel = Channel.objects.get(slug="txt")
    assert channel.send_blocked == "" and channel.setting("public_base") == "https://agent.example.com"
    assert twilio.AUTH_TOKEN in get("sms").secrets(channel)


# --- MMS out ------------------------------------------------------------------------------------------


@pytest.fixture
def media(settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path)  # the replies' stored files


def test_a_replys_files_go_as_one_mms_whose_links_serve_them(client, line, fake_twilio, media):
    from delivery import attachments

    photo, ics = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32, b"BEGIN:VCALENDAR\r\nEND:VCALENDAR\r\n"
    items = [attachments.OutboundFile(attachments.store(line.pk, photo), "plano.png", "image/png", len(photo)),
             attachments.OutboundFile(attachments.store(line.pk, ics), "cita.ics", "text/calendar", len(ics))]
    result = run(SmsTransport(line).send_files(Target(PERSON), items, "Tu cita"))
    assert result.ok
    [call] = fake_twilio.sent()
    urls = call.form["MediaUrl"]
    assert call.value("Body") == "Tu cita" and len(urls) == 2 and all(u.startswith(f"{PUBLIC}/files/") for u in urls)
    served = [client.get(url.removeprefix(PUBLIC)) for url in urls]  # what Twilio fetches, without credentials
    assert [r.status_code for r in served] == [200, 200]
    assert b"".join(served[0].streaming_content if served[0].streaming else [served[0].content]) == photo


def test_files_over_the_mms_limit_are_named_in_the_text(line, fake_twilio, media):
    from conversations.platforms.sms.transport import MMS_MAX_BYTES
    from delivery import attachments

    item = attachments.OutboundFile(attachments.store(line.pk, b"x"), "grande.pdf", "application/pdf",
                                    MMS_MAX_BYTES + 1)
    assert run(SmsTransport(line).send_files(Target(PERSON), [item], "Adjunto")).ok
    [call] = fake_twilio.sent()
    assert call.value("Body") == "Adjunto\n📎 grande.pdf" and "MediaUrl" not in call.form
