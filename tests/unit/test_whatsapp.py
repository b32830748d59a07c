"""WhatsApp (Cloud API), in process: the webhook (verification handshake, signature,
notifications in the documented shapes), the transport against the local fake Graph API
over real HTTP (each error code's outcome and its path through the ledger, threading,
splitting, typing), delivery receipts, the platform's settings and addchannel.

End-to-end runs with the real web server and worker are in test_whatsapp_e2e.py."""

import json

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.utils import timezone

from audit.models import AuditEvent, EventKind
from conversations import flushing, platforms
from conversations.ingest import Inbound, admit
from conversations.models import Channel, InboundMessage, MessageBuffer, Turn
from conversations.platforms.whatsapp.inbound import parse
from conversations.platforms.whatsapp.transport import FLOOD_BACKOFF, WhatsAppTransport, close_clients
from conversations.worker.typing import open_windows
from delivery import ledger, receipts, transports
from delivery.models import OutboundKind, OutboundMessage, OutboundState, Outcome, UnreachableChat
from delivery.transports import Target
from tests.fakes import graph_api
from tests.fakes.graph_api import FakeGraphAPI
from tests.support.loops import run_then_close
from tests.support.whatsapp import (
    APP_SECRET,
    PHONE,
    TOKEN,
    USER,
    VERIFY,
    signed_post,
    whatsapp_channel,
    whatsapp_settings,
)


@pytest.fixture
def fake_graph():
    with FakeGraphAPI(tokens=[TOKEN], phone_number_ids=[PHONE]) as fake:
        yield fake


@pytest.fixture
def wa(make_channel, fake_graph):
    return whatsapp_channel(make_channel, fake_graph)


def nothing_stored():
    return not InboundMessage.objects.exists() and not MessageBuffer.objects.exists()


def body_with(*messages, statuses=()):
    return graph_api.webhook_body(PHONE, messages=messages, statuses=statuses)


# --- the verification handshake -------------------------------------------------------------


def verify(client, slug="wa", **query):
    return client.get(f"/webhooks/whatsapp/{slug}/", {f"hub.{k}": v for k, v in query.items()})


def test_the_verify_handshake_echoes_the_challenge_as_text(client, wa):
    response = verify(client, mode="subscribe", verify_token=VERIFY, challenge="1158201444")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain") and response.content == b"1158201444"


@pytest.mark.parametrize("query", [
    {"mode": "subscribe", "verify_token": "wrong", "challenge": "1"},
    {"mode": "subscribe", "verify_token": VERIFY + "x", "challenge": "1"},
    {"mode": "unsubscribe", "verify_token": VERIFY, "challenge": "1"},
    {"mode": "subscribe", "challenge": "1"},
    {},
])
def test_a_wrong_handshake_is_403(client, wa, query):
    response = verify(client, **query)
    assert response.status_code == 403 and b"1" not in response.content


def test_a_channel_without_a_verify_token_refuses_the_handshake(client, make_channel, fake_graph):
    whatsapp_channel(make_channel, fake_graph, settings=whatsapp_settings(fake_graph, verify_token=""))
    assert verify(client, mode="subscribe", verify_token="", challenge="1").status_code == 403


def test_unknown_or_other_kind_channels_are_404(client, wa, make_channel):
    make_channel("api-chan", kind="api")
    assert verify(client, slug="nope", mode="subscribe", verify_token=VERIFY, challenge="1").status_code == 404
    assert signed_post(client, body_with(), slug="api-chan").status_code == 404


# --- the signature -----------------------------------------------------------------------


def test_a_text_message_is_admitted_with_its_wamid(client, wa):
    message = graph_api.text_message(USER, "Hola, quiero una hora")
    response = signed_post(client, body_with(message))
    assert response.status_code == 200
    assert response.json() == {"ok": True, "admitted": 1, "duplicates": 0, "refused": 0, "ignored": 0}
    stored = InboundMessage.objects.get()
    assert stored.platform_message_id == message["id"] == stored.reply_target
    assert len(stored.reply_target) > 50  # real wamids are long
    assert (stored.conversation.chat_id, stored.conversation.sender_id) == (USER, USER)
    assert stored.sender_name == "Camila Rojas" and stored.text == "Hola, quiero una hora"
    assert stored.sent_at is not None


@pytest.mark.parametrize("signature, status", [
    (False, 401),
    ("", 403),
    ("sha256=", 403),
    ("sha256=" + "0" * 64, 403),
    ("sha1=abc", 403),
])
def test_a_missing_or_wrong_signature_is_refused_and_nothing_stored(client, wa, signature, status):
    response = signed_post(client, body_with(graph_api.text_message(USER, "hola")), signature=signature)
    assert response.status_code == status
    assert "X-Hub-Signature-256" in response.json()["error"]
    assert nothing_stored()


def test_a_signature_made_with_another_secret_or_over_another_body_is_403(client, wa):
    body = body_with(graph_api.text_message(USER, "hola"))
    assert signed_post(client, body, secret="another-app-secret").status_code == 403
    raw = json.dumps(body).encode()
    tampered = raw.replace(b"hola", b"hole")
    assert signed_post(client, tampered, signature=graph_api.signature(APP_SECRET, raw)).status_code == 403
    assert nothing_stored()


def test_a_channel_without_an_app_secret_refuses_every_notification(client, make_channel, fake_graph):
    whatsapp_channel(make_channel, fake_graph, settings=whatsapp_settings(fake_graph, app_secret=""))
    assert signed_post(client, body_with(graph_api.text_message(USER, "hola")), secret="").status_code == 403
    assert nothing_stored()


def test_an_oversized_body_is_413_and_nothing_stored(client, wa, settings):
    body = body_with(graph_api.text_message(USER, "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 10)))
    assert signed_post(client, body).status_code == 413
    assert nothing_stored()


@pytest.mark.parametrize("raw", [b"{not json", b"[]", b'{"object": "whatsapp_business_account"}', b'"x"'])
def test_a_signed_body_that_is_no_notification_is_400(client, wa, raw):
    assert signed_post(client, raw).status_code == 400
    assert nothing_stored()


def test_post_and_get_only(client, wa):
    assert client.put("/webhooks/whatsapp/wa/").status_code == 405


# --- what a notification carries ------------------------------------------------------------


def test_several_entries_changes_and_messages_in_one_body_are_all_admitted(client, wa):
    ana, bea = "5491100000001", "5491100000002"
    first = graph_api.webhook_body(PHONE, messages=[graph_api.text_message(ana, "hola y"),
                                                    graph_api.text_message(ana, "quería saber")])
    second = graph_api.webhook_body(PHONE, messages=[graph_api.text_message(bea, "¿hay hora?")])
    third = graph_api.webhook_body(PHONE, messages=[graph_api.text_message(bea, "el lunes")])
    first["entry"][0]["changes"].append(third["entry"][0]["changes"][0])  # two changes in one entry
    first["entry"].append(second["entry"][0])  # and a second entry
    response = signed_post(client, first)
    assert response.json()["admitted"] == 4
    assert MessageBuffer.objects.count() == 2
    assert sorted(InboundMessage.objects.filter(conversation__chat_id=bea).values_list("text", flat=True)) == \
        ["el lunes", "¿hay hora?"]
    assert list(InboundMessage.objects.filter(conversation__chat_id=ana).order_by("pk")
                .values_list("text", flat=True)) == ["hola y", "quería saber"]


def test_a_retried_notification_is_a_duplicate(client, wa):
    body = body_with(graph_api.text_message(USER, "hola"))
    signed_post(client, body)
    assert signed_post(client, body).json()["duplicates"] == 1
    assert InboundMessage.objects.count() == 1


def test_media_gets_a_window_by_its_caption(client, wa):
    signed_post(client, body_with(graph_api.media_message(USER, "image", "la factura")))
    message = InboundMessage.objects.get()
    assert (message.media_type, message.text, message.kind) == ("image", "la factura", "media")
    buffer = MessageBuffer.objects.get()
    assert (buffer.window_kind, buffer.window_seconds) == ("neutral", 2.5)  # the caption's window
    assert flushing.flush_due() == []
    [turn] = flushing.flush_due(now=buffer.flush_at)
    assert turn.flush_reason == "window" and turn.reply_target == message.platform_message_id


def test_a_tapped_button_is_text_and_reactions_are_ignored(client, wa):
    tap = {"from": USER, "id": graph_api.new_wamid(USER), "timestamp": "1764500000", "type": "interactive",
           "interactive": {"type": "button_reply", "button_reply": {"id": "yes", "title": "Sí"}}}
    reaction = {"from": USER, "id": graph_api.new_wamid(USER), "timestamp": "1764500000", "type": "reaction",
                "reaction": {"message_id": "wamid.X", "emoji": "👍"}}
    unsupported = {"from": USER, "id": graph_api.new_wamid(USER), "timestamp": "1764500000", "type": "unsupported",
                   "errors": [{"code": 131051, "title": "Message type unknown"}]}
    answer = signed_post(client, body_with(tap, reaction, unsupported)).json()
    assert (answer["admitted"], answer["ignored"]) == (1, 2)
    assert InboundMessage.objects.get().text == "Sí"


def test_an_unknown_field_and_another_number_are_answered_200_and_ignored(client, wa):
    other_field = graph_api.webhook_body(PHONE, field_name="account_update")
    other_field["entry"][0]["changes"][0]["value"] = {"phone_number": "15550001111", "event": "VERIFIED_ACCOUNT"}
    other_number = graph_api.webhook_body("999999999", messages=[graph_api.text_message(USER, "hola")])
    for body in (other_field, other_number):
        response = signed_post(client, body)
        assert response.status_code == 200 and response.json()["ignored"] == 1
    assert nothing_stored()


def test_a_control_command_works_as_on_any_platform(client, wa):
    signed_post(client, body_with(graph_api.text_message(USER, "hola y")))
    signed_post(client, body_with(graph_api.text_message(USER, "/stop")))
    assert not MessageBuffer.objects.filter(state="open").exists()
    notice = OutboundMessage.objects.get(kind=OutboundKind.CONTROL)
    assert notice.chat_id == USER and notice.reply_target.startswith("wamid.")


def test_an_unstorable_message_is_refused_alone_and_audited(client, wa):
    bad = graph_api.text_message(USER, "nul \x00 here")
    good = graph_api.text_message(USER, "hola")
    answer = signed_post(client, body_with(bad, good)).json()
    assert (answer["admitted"], answer["refused"]) == (1, 1)
    assert AuditEvent.objects.filter(kind=EventKind.MESSAGE_REFUSED).count() == 1


def test_messages_of_one_body_are_admitted_in_the_order_they_were_written(client, wa):
    later = graph_api.text_message(USER, "segundo", timestamp=1764500010)
    earlier = graph_api.text_message(USER, "primero", timestamp=1764500000)
    signed_post(client, body_with(later, earlier))
    assert list(InboundMessage.objects.order_by("pk").values_list("text", flat=True)) == ["primero", "segundo"]


def test_parse_reads_the_documented_shapes():
    message = graph_api.text_message(USER, "hola")
    failed = graph_api.status("wamid.Z", "failed", USER, error_code=131047)
    found = parse(body_with(message, statuses=[graph_api.status("wamid.Y", "delivered", USER), failed]), PHONE)
    assert [m.text for m in found.messages] == ["hola"]
    assert [(r.status, r.error_code) for r in found.receipts] == [("delivered", None), ("failed", 131047)]
    assert "Re-engagement" in found.receipts[1].error
    with pytest.raises(ValueError):
        parse({"object": "page"}, PHONE)


# --- delivery receipts -------------------------------------------------------------------


def delivered_row(channel, wamid, text="Su cita es el lunes."):
    conversation = channel.conversations.first() or _conversation(channel)
    row = ledger.enqueue(conversation, text, kind=OutboundKind.REPLY)
    OutboundMessage.objects.filter(pk=row.pk).update(state=OutboundState.DELIVERED, platform_message_id=wamid,
                                                     attempts=1, chunks_started=1, owner="w")
    return row


def _conversation(channel):
    wamid = graph_api.new_wamid(USER)
    admit(channel, Inbound(platform_message_id=wamid, chat_id=USER, sender_id=USER, text="hola",
                           reply_target=wamid))
    return channel.conversations.get()


def receipt_body(wamid, state, code=None):
    return body_with(statuses=[graph_api.status(wamid, state, USER, error_code=code)])


def test_sent_delivered_and_read_receipts_change_nothing(client, wa):
    row = delivered_row(wa, "wamid.SENT1")
    for state in ("sent", "delivered", "read", "delivered"):  # out of order, twice: harmless
        assert signed_post(client, receipt_body("wamid.SENT1", state)).json()["noted"] == 1
    row.refresh_from_db()
    assert row.state == OutboundState.DELIVERED


def test_a_failed_receipt_puts_the_reply_back_in_the_ledger_once(client, wa):
    row = delivered_row(wa, "wamid.FAIL1")
    answer = signed_post(client, receipt_body("wamid.FAIL1", "failed", 131000)).json()
    assert answer["failed"] == 1
    row.refresh_from_db()
    assert row.state == OutboundState.FAILED and row.last_outcome == Outcome.TEMPORARY
    assert "131000" in row.last_error and "Something went wrong" in row.last_error
    assert (row.next_attempt_at - row.created_at).total_seconds() > 25  # the ledger's first back-off
    event = AuditEvent.objects.get(kind=EventKind.REPLY_FAILED_AFTER_SEND)
    assert event.target == f"ledger row {row.pk}" and event.extra["platform_message_id"] == "wamid.FAIL1"
    # Meta delivers it again: nothing more happens.
    assert signed_post(client, receipt_body("wamid.FAIL1", "failed", 131000)).json()["unchanged"] == 1
    assert AuditEvent.objects.filter(kind=EventKind.REPLY_FAILED_AFTER_SEND).count() == 1


def test_a_failed_receipt_outside_the_24_hour_window_marks_the_chat_unreachable(client, wa):
    row = delivered_row(wa, "wamid.FAIL2")
    assert signed_post(client, receipt_body("wamid.FAIL2", "failed", 131047)).json()["unreachable"] == 1
    row.refresh_from_db()
    assert row.state == OutboundState.UNREACHABLE and "the user must write first" in row.last_error
    assert UnreachableChat.objects.get().chat_id == USER
    assert AuditEvent.objects.filter(kind=EventKind.CHAT_UNREACHABLE).count() == 1


def test_a_receipt_for_a_message_we_do_not_know_is_ignored(client, wa):
    assert signed_post(client, receipt_body("wamid.NOPE", "failed", 131026)).json()["unknown"] == 1


def test_a_failed_receipt_error_never_shows_a_secret(wa):
    row = delivered_row(wa, "wamid.FAIL3")
    receipts.failed_after_send(wa, receipts.Failure("wamid.FAIL3", f"token {TOKEN} refused"))
    row.refresh_from_db()
    assert TOKEN not in row.last_error and "•••" in row.last_error


# --- the transport, against the fake Graph API over HTTP ----------------------------------------


def transport(channel):
    return transports.transport_for(channel)


def run(coro):
    """On an event loop of its own, whose Graph client is closed before it ends."""
    return run_then_close(coro, close_clients)


def test_a_reply_threads_to_the_message_and_returns_the_wamid(wa, fake_graph):
    result = run(transport(wa).send_text(Target(USER, "wamid.IN1"), "Hola 👋"))
    assert result.ok and result.platform_message_id.startswith("wamid.")
    [call] = fake_graph.calls("message")
    assert call.body == {"messaging_product": "whatsapp", "recipient_type": "individual", "to": USER,
                         "type": "text", "text": {"preview_url": False, "body": "Hola 👋"},
                         "context": {"message_id": "wamid.IN1"}}
    assert call.token == TOKEN and call.version == "v23.0" and call.phone_number_id == PHONE


def test_a_text_over_4096_is_split_and_only_the_first_piece_threads(wa, fake_graph):
    text = " ".join(f"palabra{i}" for i in range(700))  # ~6,700 characters
    result = run(transport(wa).send_text(Target(USER, "wamid.IN1"), text))
    assert result.ok
    calls = fake_graph.calls("message")
    assert len(calls) == 2 and all(len(c.body["text"]["body"]) <= 4096 for c in calls)
    assert "context" in calls[0].body and "context" not in calls[1].body
    assert ledger.split_for(wa, text)  # the ledger chunks it too (4,096 less the recovery prefix)


@pytest.mark.parametrize("code, outcome, phrase", [
    (130429, Outcome.FLOOD, "rate limited"),
    (131056, Outcome.FLOOD, "rate limited"),
    (80007, Outcome.FLOOD, "rate limited"),
    (4, Outcome.FLOOD, "rate limited"),
    (131047, Outcome.PERMANENT, "the user must write first"),
    (131026, Outcome.PERMANENT, "undeliverable"),
    (131051, Outcome.PERMANENT, "unsupported"),
    (131021, Outcome.PERMANENT, "sender's own number"),
    (1, Outcome.TEMPORARY, "API Unknown"),
    (2, Outcome.TEMPORARY, "API Service"),
    (131000, Outcome.TEMPORARY, "Something went wrong"),
    (100, Outcome.PERMANENT, "rejected"),
])
def test_each_graph_error_code_maps_to_its_outcome(wa, fake_graph, code, outcome, phrase):
    fake_graph.fail_next("message", code=code)
    result = run(transport(wa).send_text(Target(USER), "hola"))
    assert result.outcome == outcome and phrase in result.error, result.error
    if outcome == Outcome.FLOOD:
        assert result.retry_after == FLOOD_BACKOFF


@pytest.mark.parametrize("code", [190, 0])
def test_a_dead_token_blocks_the_channel(wa, fake_graph, code):
    fake_graph.fail_next("message", code=code)
    result = run(transport(wa).send_text(Target(USER), "hola"))
    assert result.outcome == Outcome.CHANNEL_BLOCKED and "token" in result.error and TOKEN not in result.error


def test_a_5xx_without_a_graph_error_is_temporary(wa, fake_graph):
    fake_graph.fail_next("message", code=99999, status=502)
    assert run(transport(wa).send_text(Target(USER), "hola")).outcome == Outcome.TEMPORARY


def test_no_answer_after_the_request_went_out_is_ambiguous(wa, fake_graph, settings):
    settings.AGENTLOOP_CALLBACK_TIMEOUT = 0.5
    with fake_graph.hold("message") as hold:
        result = run(transport(wa).send_text(Target(USER), "hola"))
        # The request went out and reached the fake: read there (and held) perhaps only
        # after the client gave up, when the test process is starved (the suite's idle backfill).
        assert hold.wait_held(1) == 1
    assert result.outcome == Outcome.AMBIGUOUS and "no answer within 0.5 s" in result.error


def test_a_connection_dropped_after_the_request_is_ambiguous(wa, fake_graph):
    fake_graph.drop_connection_next("message")
    assert run(transport(wa).send_text(Target(USER), "hola")).outcome == Outcome.AMBIGUOUS


def test_nobody_listening_is_not_sent(make_channel):
    from tests.conftest import free_port

    channel = whatsapp_channel(make_channel, settings={**whatsapp_settings(), "api_base": f"http://127.0.0.1:{free_port()}"})
    result = run(transport(channel).send_text(Target(USER), "hola"))
    assert result.outcome == Outcome.NOT_SENT and "ConnectError" in result.error  # never left: resent plain


def test_typing_marks_the_last_message_read_with_a_typing_indicator(wa, fake_graph):
    run(transport(wa).send_typing(Target(USER, "wamid.LAST", conversation_id=1)))
    [call] = fake_graph.calls("typing")
    assert call.body == {"messaging_product": "whatsapp", "status": "read", "message_id": "wamid.LAST",
                         "typing_indicator": {"type": "text"}}
    assert WhatsAppTransport.supports_typing and 15 <= WhatsAppTransport.typing_refresh < 25


@pytest.mark.django_db(transaction=True)
def test_window_typing_shows_against_the_windows_last_message(make_channel):
    with FakeGraphAPI(tokens=[TOKEN]) as fake:
        channel = whatsapp_channel(make_channel, fake)
        for n, wamid in enumerate(("wamid.FIRST", "wamid.SECOND")):
            admit(channel, Inbound(platform_message_id=wamid, chat_id=USER, sender_id=USER, text=f"parte {n} y",
                                   reply_target=wamid))
        [window] = open_windows([channel.pk], 0, 1, 10)  # the worker's look
        run(transport(channel).send_typing(Target(USER, window.reply_target,
                                                  conversation_id=window.conversation_id)))
        [call] = fake.calls("typing")
        assert call.body["message_id"] == "wamid.SECOND"


def test_a_refused_typing_call_raises_with_the_flood_wait(wa, fake_graph):
    fake_graph.fail_next("typing", code=130429)
    with pytest.raises(Exception) as raised:
        run(transport(wa).send_typing(Target(USER, "wamid.LAST")))
    assert raised.value.retry_after == FLOOD_BACKOFF


# --- each error code's path through the ledger (claim, send over HTTP, record) -----------------


def through_the_ledger(channel, text="¿Me confirmas la hora?"):
    conversation = _conversation(channel)
    row = ledger.enqueue(conversation, text, kind=OutboundKind.REPLY,
                         reply_target=InboundMessage.objects.get().reply_target)
    [claimed] = ledger.claim_due("test-owner")
    ledger.finish(claimed, "test-owner", run(ledger.send(claimed)))
    row.refresh_from_db()
    return row


def test_a_delivered_reply_keeps_the_wamid_for_its_receipts(wa, fake_graph):
    row = through_the_ledger(wa)
    assert row.state == OutboundState.DELIVERED and row.platform_message_id.startswith("wamid.")
    assert fake_graph.calls("message")[0].body["context"]["message_id"] == row.reply_target


def test_flood_waits_the_chosen_back_off_without_spending_a_resend(wa, fake_graph):
    fake_graph.fail_next("message", code=130429)
    row = through_the_ledger(wa)
    assert row.state == OutboundState.FAILED and row.flood_waits == 1 and row.attempts == 0  # refused: none spent
    assert (row.next_attempt_at - timezone.now()).total_seconds() == pytest.approx(FLOOD_BACKOFF, abs=5)


def test_outside_the_24_hour_window_is_unreachable_with_the_reason(wa, fake_graph):
    fake_graph.fail_next("message", code=131047)
    row = through_the_ledger(wa)
    assert row.state == OutboundState.UNREACHABLE and "the user must write first" in row.last_error
    assert "the user must write first" in UnreachableChat.objects.get(chat_id=USER).error


def test_a_temporary_error_is_resent_after_30_s(wa, fake_graph):
    fake_graph.fail_next("message", code=131000)
    row = through_the_ledger(wa)
    assert row.state == OutboundState.FAILED and row.last_outcome == Outcome.TEMPORARY
    # 30 s from the failure, which a starved machine may put a second or more after the claim
    # (31.1 s once, in the backfill at idle priority).
    assert 29 <= (row.next_attempt_at - row.claimed_at).total_seconds() <= 30 + 5


def test_a_dead_token_makes_the_channels_replies_wait(wa, fake_graph):
    fake_graph.fail_next("message", code=190)
    row = through_the_ledger(wa)
    wa.refresh_from_db()
    assert wa.send_blocked, "the channel is flagged"
    assert row.state in (OutboundState.PENDING, OutboundState.FAILED) and ledger.resends_used(row) == 0
    assert ledger.claim_due("test-owner") == []  # its rows wait for an operator


# --- the platform: settings, addchannel --------------------------------------------------------


def test_settings_are_checked_on_save(make_channel):
    with pytest.raises(ValidationError, match="phone number's id"):
        whatsapp_channel(make_channel, settings=whatsapp_settings(phone_number_id="+54 9 11 6555"))
    with pytest.raises(ValidationError, match="v23.0"):
        whatsapp_channel(make_channel, settings=whatsapp_settings(api_version="23"))
    with pytest.raises(ValidationError, match="unknown"):
        whatsapp_channel(make_channel, settings={**whatsapp_settings(), "bot_token": "x"})


def test_defaults_secrets_and_a_channel_without_token_waits(make_channel):
    channel = whatsapp_channel(make_channel, settings=whatsapp_settings(token=""))
    assert channel.setting("api_base") == "https://graph.facebook.com" and channel.setting("api_version") == "v23.0"
    assert channel.send_blocked and "token" in channel.send_blocked
    channel.platform_settings["token"] = TOKEN
    channel.save()
    assert channel.send_blocked == ""
    assert set(channel.platform.secrets(channel)) >= {TOKEN, APP_SECRET, VERIFY}


def test_addchannel_creates_a_whatsapp_channel(db, capsys):
    call_command("addchannel", "wa-cli", "--kind", "whatsapp", "--phone-number-id", PHONE, "--token", TOKEN,
                 "--app-secret", APP_SECRET, "--verify-token", VERIFY, "--api-version", "v22.0",
                 "--api-base", "http://127.0.0.1:9", "--template-name", "appointment_reminder",
                 "--template-language", "es")
    channel = Channel.objects.get(slug="wa-cli")
    assert channel.kind == "whatsapp" and channel.platform_settings == {
        "phone_number_id": PHONE, "token": TOKEN, "app_secret": APP_SECRET, "verify_token": VERIFY,
        "api_base": "http://127.0.0.1:9", "api_version": "v22.0", "messages_per_second": 78.0, "chat_interval": 0.0,
        "template_name": "appointment_reminder", "template_language": "es", "template_fill": "text"}


def test_bootstrap_adds_a_whatsapp_channel_from_the_environment(db, monkeypatch):
    from conversations.platforms.whatsapp import WhatsAppPlatform

    platform = WhatsAppPlatform()
    assert platform.bootstrap(None) == ""
    monkeypatch.setenv("WHATSAPP_TOKEN", TOKEN)
    assert "WHATSAPP_PHONE_NUMBER_ID" in platform.bootstrap(None)
    for name, value in (("WHATSAPP_PHONE_NUMBER_ID", PHONE), ("WHATSAPP_APP_SECRET", APP_SECRET),
                        ("WHATSAPP_VERIFY_TOKEN", VERIFY)):
        monkeypatch.setenv(name, value)
    line = platform.bootstrap(None)
    assert "/webhooks/whatsapp/whatsapp/" in line
    channel = Channel.objects.get(slug="whatsapp")
    assert (channel.kind, channel.agent, channel.send_blocked) == ("whatsapp", "demo", "")
    assert platform.bootstrap(None) == line and Channel.objects.filter(kind="whatsapp").count() == 1


def test_turns_thread_to_the_last_message_of_the_burst(client, wa):
    wamids = []
    for text in ("hola", "quería saber", "¿hay hora el lunes?"):
        message = graph_api.text_message(USER, text)
        wamids.append(message["id"])
        signed_post(client, body_with(message))
    [turn] = flushing.flush_due(now=MessageBuffer.objects.get().flush_at)
    assert turn.reply_target == wamids[-1] and Turn.objects.count() == 1


def test_the_admin_shows_a_whatsapp_channel_with_its_settings_and_no_secret(admin_client, wa):
    page = admin_client.get(f"/admin/conversations/channel/{wa.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "WhatsApp settings" in html and 'name="whatsapp_phone_number_id"' in html and PHONE in html
    for name in ("template_name", "template_language", "template_fill"):  # outside the 24-hour window
        assert f'name="whatsapp_{name}"' in html
    for secret in (TOKEN, APP_SECRET, VERIFY):
        assert secret not in html
    listing = admin_client.get("/admin/conversations/channel/").content.decode()
    assert "WhatsApp" in listing


@pytest.mark.parametrize("code, state, counted", [
    (130429, OutboundState.FAILED, "flood_waits"), (131056, OutboundState.FAILED, "flood_waits"),
    (80007, OutboundState.FAILED, "flood_waits"), (4, OutboundState.FAILED, "flood_waits"),
    (131047, OutboundState.UNREACHABLE, ""), (131026, OutboundState.UNREACHABLE, ""),
    (131051, OutboundState.UNREACHABLE, ""), (131021, OutboundState.UNREACHABLE, ""),
    (190, OutboundState.PENDING, "blocked"), (0, OutboundState.PENDING, "blocked"),
    (1, OutboundState.FAILED, "resend"), (2, OutboundState.FAILED, "resend"), (131000, OutboundState.FAILED, "resend"),
])
def test_every_mapped_code_through_the_ledger(wa, fake_graph, code, state, counted):
    fake_graph.fail_next("message", code=code)
    row = through_the_ledger(wa)
    assert row.state == state, (row.state, row.last_error)
    if counted == "flood_waits":
        assert row.flood_waits == 1 and ledger.resends_used(row) == 0
    elif counted == "blocked":
        assert row.attempts == 0 and Channel.objects.get(pk=wa.pk).send_blocked
    elif counted == "resend":
        assert row.flood_waits == 0 and row.next_attempt_at is not None
    else:
        assert UnreachableChat.objects.filter(chat_id=USER).exists() and row.next_attempt_at is None


@pytest.mark.parametrize("answer, outcome", [
    (None, Outcome.PERMANENT), ({"error": "x"}, Outcome.PERMANENT), ({"error": {"code": [1]}}, Outcome.PERMANENT),
    ({"error": {"code": "130429"}}, Outcome.PERMANENT), ({}, Outcome.PERMANENT),
])
def test_an_answer_without_a_usable_error_code_falls_back_on_the_status(wa, answer, outcome):
    result = transport(wa).outcome(400, answer)
    assert result.outcome == outcome and "HTTP 400" in result.error
    assert transport(wa).outcome(429, answer).outcome == Outcome.FLOOD
    assert transport(wa).outcome(503, answer).outcome == Outcome.TEMPORARY


# --- files users send --------------------------------------------------------------------

def test_a_media_message_names_its_file_by_its_media_id_and_a_location_names_none():
    from conversations.platforms.whatsapp.inbound import inbound_from

    photo = graph_api.media_message(USER, "image", "la boleta", media_id="1234567890123456")
    voice = graph_api.media_message(USER, "audio", media_id="2234567890123456", mime="audio/ogg; codecs=opus",
                                    voice=True)
    document = graph_api.media_message(USER, "document", media_id="3234567890123456", mime="application/pdf",
                                       filename="boleta.pdf")
    found = [inbound_from(m, {}).media for m in (photo, voice, document)]
    assert [(m.key, m.ref, m.kind) for m in found] == [
        ("1234567890123456", "1234567890123456", "image"), ("2234567890123456", "2234567890123456", "voice"),
        ("3234567890123456", "3234567890123456", "document")]
    assert (found[2].declared_type, found[2].file_name) == ("application/pdf", "boleta.pdf")
    location = {"from": USER, "id": "wamid.L", "type": "location", "location": {"latitude": 1, "longitude": 2}}
    assert inbound_from(location, {}).media is None


def fetch(channel, media_id, limit=10_000_000):
    return run(platforms.of(channel).fetch_media(channel, media_id, limit))


def test_a_file_is_fetched_by_its_media_id_then_its_url_both_with_the_token(wa, fake_graph):
    media_id = fake_graph.add_media(b"\xff\xd8\xff\xe0 a jpeg", "image/jpeg")
    assert fetch(wa, media_id) == b"\xff\xd8\xff\xe0 a jpeg"
    lookup, download = fake_graph.calls("media") + fake_graph.calls("download")
    assert lookup.token == download.token == TOKEN
    assert fake_graph.downloads == [media_id]


def test_a_media_id_meta_does_not_know_or_a_dead_token_fails_for_good_a_5xx_is_tried_again(wa, fake_graph):
    from conversations.media.download import FileTooLarge, FileUnavailable

    with pytest.raises(FileUnavailable, match="could not be looked up: HTTP 400, code 100") as unknown:
        fetch(wa, "9999999999999999")
    assert unknown.value.permanent
    media_id = fake_graph.add_media(b"x" * 5000)
    fake_graph.fail_next("media", code=1, status=500, message="An unknown error occurred")
    with pytest.raises(FileUnavailable, match="HTTP 500") as flaky:
        fetch(wa, media_id)
    assert not flaky.value.permanent
    with pytest.raises(FileTooLarge):  # by the size Meta gives: never downloaded
        fetch(wa, media_id, limit=1000)
    assert fake_graph.downloads == []
    fake_graph.tokens = {"EAAG-another"}
    with pytest.raises(FileUnavailable, match="access token was refused") as dead:
        fetch(wa, media_id)
    assert dead.value.permanent and TOKEN not in str(dead.value)


# --- templates (outside the 24-hour window) -------------------------------------------------------

REMINDER = {"name": "appointment_reminder", "language": "es", "parameters": ["mañana a las 10"]}


def test_a_template_goes_as_the_cloud_apis_template_message(wa, fake_graph):
    fake_graph.add_template("appointment_reminder", "es", parameters=1)
    result = run(transport(wa).send_template(Target(USER), REMINDER))
    assert result.ok and result.platform_message_id.startswith("wamid.")
    [call] = fake_graph.calls("message")
    assert call.body == {"messaging_product": "whatsapp", "recipient_type": "individual", "to": USER,
                         "type": "template", "template": {
                             "name": "appointment_reminder", "language": {"code": "es"},
                             "components": [{"type": "body", "parameters": [{"type": "text",
                                                                             "text": "mañana a las 10"}]}]}}


@pytest.mark.parametrize("template, code, phrase", [
    ({**REMINDER, "name": "no_such_template"}, 132001, "no such approved template in that language"),
    ({**REMINDER, "parameters": ["uno", "dos"]}, 132000, "parameter count differs"),
])
def test_a_refused_template_is_permanent_with_its_reason_and_the_chat_stays_reachable(wa, fake_graph, template,
                                                                                       code, phrase):
    fake_graph.add_template("appointment_reminder", "es", parameters=1)
    result = run(transport(wa).send_template(Target(USER), template))
    assert result.outcome == Outcome.PERMANENT and phrase in result.error and f"code {code}" in result.error
    assert not result.chat_unreachable
    row = ledger.enqueue(_conversation(wa), "Tu hora.", kind=OutboundKind.SCHEDULED)
    [claimed] = ledger.claim_many([row.pk], "w1")
    ledger.finish(claimed, "w1", result)
    row.refresh_from_db()
    assert row.state == OutboundState.UNREACHABLE and phrase in row.last_error
    assert not UnreachableChat.objects.exists()  # the message was refused, not the user
    assert AuditEvent.objects.get(kind=EventKind.REPLY_ABANDONED).summary.startswith("never retried: template")


def test_a_labelled_template_resend_carries_the_marker_in_its_first_parameter(wa, fake_graph):
    fake_graph.add_template("appointment_reminder", "es", parameters=1)
    row = ledger.enqueue_many([ledger.Reply(_conversation(wa), "mañana a las 10", OutboundKind.SCHEDULED,
                                            template=REMINDER)])[0]
    OutboundMessage.objects.filter(pk=row.pk).update(attempts=1, chunks_started=1)  # it may have gone once
    [claimed] = ledger.claim_many([row.pk], "w1")
    assert claimed.needs_marker
    result = run(ledger.send(claimed))  # one template message: nothing to record between chunks
    assert result.ok
    [sent] = fake_graph.templates_sent(USER)
    [value] = sent["components"][0]["parameters"]
    assert value["text"].startswith("♻️ Recovered reply") and value["text"].endswith(" mañana a las 10")
    assert "\n" not in value["text"]  # one line: WhatsApp refuses new lines in a parameter

