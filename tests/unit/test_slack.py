"""Slack, in process: the Events API request URL (the challenge, the signature and its
age, events in the documented shapes, retries, edits, what is ignored), its lean ASGI
path, the platform's settings, the admin, addchannel and bootstrap.

Sending (outcomes, threads, buttons, files, typing, clicks) is in test_slack_sending.py;
end-to-end runs with the real web server and worker in test_slack_e2e.py."""

import asyncio
import json
import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from conversations import flushing
from conversations.models import Channel, InboundMessage, MessageBuffer, MessageEdit
from conversations.platforms.slack import SlackPlatform
from conversations.platforms.slack.webhook import check
from delivery import ledger
from delivery.models import OutboundKind
from tests.fakes import slack_api
from tests.fakes.slack_api import BOT_USER, FakeSlackAPI
from tests.support.slack import CHANNEL, DM, SIGNING_SECRET, TOKEN, USER, signed_post, slack_channel, slack_settings


@pytest.fixture
def fake_slack():
    with FakeSlackAPI(tokens=[TOKEN]) as fake:
        yield fake


@pytest.fixture
def sl(make_channel, fake_slack):
    return slack_channel(make_channel, fake_slack)


def nothing_stored():
    return not InboundMessage.objects.exists() and not MessageBuffer.objects.exists()


def event_body(text="hola", **event):
    return slack_api.envelope(slack_api.message_event(USER, text, **event))


# --- the request URL: challenge and signature --------------------------------------------------


def test_the_url_verification_challenge_is_echoed(client, sl):
    body = {"token": "legacy", "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
            "type": "url_verification"}
    response = signed_post(client, body)
    assert response.status_code == 200 and response.json() == {"challenge": body["challenge"]}


def test_a_dm_is_admitted_keyed_by_channel_and_ts(client, sl):
    body = event_body("Hola, quiero una hora")
    response = signed_post(client, body)
    assert response.status_code == 200 and response.json()["admitted"] == 1
    stored = InboundMessage.objects.get()
    event = body["event"]
    assert stored.platform_message_id == f"{DM}:{event['ts']}" and stored.reply_target == event["ts"]
    assert stored.thread_id == ""  # a DM's top-level message is answered in the DM
    assert (stored.conversation.chat_id, stored.conversation.sender_id) == (DM, USER)
    assert stored.sent_at is not None and not stored.conversation.is_group


@pytest.mark.parametrize("headers, status", [
    ({}, 401),
    ({"X-Slack-Request-Timestamp": str(int(time.time()))}, 401),
    ({"X-Slack-Request-Timestamp": str(int(time.time())), "X-Slack-Signature": ""}, 403),
    ({"X-Slack-Request-Timestamp": str(int(time.time())), "X-Slack-Signature": "v0=" + "0" * 64}, 403),
    ({"X-Slack-Request-Timestamp": "yesterday", "X-Slack-Signature": "v0=" + "0" * 64}, 403),
])
def test_a_missing_or_wrong_signature_is_refused_and_nothing_stored(client, sl, headers, status):
    response = signed_post(client, event_body(), headers=headers)
    assert response.status_code == status and "X-Slack" in response.json()["error"]
    assert nothing_stored()


def test_a_stale_request_is_refused_even_when_its_signature_is_right(client, sl):
    raw = json.dumps(event_body()).encode()
    old = int(time.time()) - 301
    response = signed_post(client, raw, headers=slack_api.sign(SIGNING_SECRET, raw, old))
    assert response.status_code == 403 and "stale" in response.json()["error"]
    assert nothing_stored()
    headers = slack_api.sign(SIGNING_SECRET, raw, 1_700_000_000)
    signature, stamp = headers["X-Slack-Signature"], headers["X-Slack-Request-Timestamp"]
    assert check(sl, signature, stamp, raw, now=1_700_000_000 + 299) is None  # the clock injected
    assert check(sl, signature, stamp, raw, now=1_700_000_000 + 301).status == 403
    assert check(sl, signature, stamp, raw, now=1_700_000_000 - 301).status == 403


def test_a_signature_with_another_secret_or_over_another_body_is_403(client, sl):
    raw = json.dumps(event_body("hola")).encode()
    assert signed_post(client, raw, secret="another-secret").status_code == 403
    headers = slack_api.sign(SIGNING_SECRET, raw)
    assert signed_post(client, raw.replace(b"hola", b"hole"), headers=headers).status_code == 403
    assert nothing_stored()


def test_a_channel_without_a_signing_secret_refuses_everything(client, make_channel, fake_slack):
    slack_channel(make_channel, fake_slack, settings=slack_settings(fake_slack, signing_secret=""))
    assert signed_post(client, event_body(), secret="").status_code == 403
    assert nothing_stored()


def test_unknown_or_other_kind_channels_are_404(client, sl, make_channel):
    make_channel("api-chan", kind="api")
    assert signed_post(client, event_body(), path="nope/").status_code == 404
    assert signed_post(client, event_body(), path="api-chan/").status_code == 404


def test_an_oversized_body_is_413_and_nothing_stored(client, sl, settings):
    body = event_body("x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 10))
    assert signed_post(client, body).status_code == 413
    assert nothing_stored()


@pytest.mark.parametrize("raw", [b"{not json", b"[]", b'{"type": "event_callback"}', b'"x"'])
def test_a_signed_body_that_is_no_envelope_is_400(client, sl, raw):
    assert signed_post(client, raw).status_code == 400
    assert nothing_stored()


# --- events ------------------------------------------------------------------------------------


def test_a_retry_of_the_same_event_is_a_duplicate(client, sl):
    body = event_body("¿hay hora el lunes?")
    assert signed_post(client, body).json()["admitted"] == 1
    raw = json.dumps(body).encode()
    for number in (1, 2):
        headers = {**slack_api.sign(SIGNING_SECRET, raw), "X-Slack-Retry-Num": str(number),
                   "X-Slack-Retry-Reason": "http_timeout"}
        answer = signed_post(client, raw, headers=headers).json()
        assert (answer["admitted"], answer["duplicates"]) == (0, 1)
    assert InboundMessage.objects.count() == 1


def test_a_channel_message_is_stored_with_its_mention_flag_once_for_both_events(client, sl):
    plain = slack_api.message_event(USER, "hola a todos", channel=CHANNEL, channel_type="channel")
    answer = signed_post(client, slack_api.envelope(plain)).json()
    assert answer["admitted"] == 1  # stored: the channel's group_replies decides at the flush
    text = f"<@{BOT_USER}> ¿me agendas el lunes?"
    message = slack_api.message_event(USER, text, channel=CHANNEL, channel_type="channel")
    mention = {**message, "type": "app_mention"}
    assert signed_post(client, slack_api.envelope(mention)).json()["admitted"] == 1
    assert signed_post(client, slack_api.envelope(message)).json()["duplicates"] == 1  # the same message
    stored = InboundMessage.objects.get(platform_message_id=f"{CHANNEL}:{message['ts']}")
    assert stored.text == "¿me agendas el lunes?" and stored.mentioned is True  # the mention is not the user's words
    assert stored.thread_id == message["ts"] and stored.conversation.is_group  # answered in a thread under it
    assert InboundMessage.objects.get(text="hola a todos").mentioned is False
    assert stored.sender_name == f"<@{USER}>"  # no profile in the event: Slack's own reference


def test_a_dm_carries_no_mention_flag_and_a_profile_names_the_sender(client, sl):
    event = slack_api.message_event(USER, "hola", user_profile={"display_name": "camila", "real_name": "Camila R"})
    assert signed_post(client, slack_api.envelope(event)).json()["admitted"] == 1
    stored = InboundMessage.objects.get()
    assert (stored.mentioned, stored.sender_name) == (None, "camila")


def test_a_reply_in_a_thread_the_app_is_in_counts_as_addressed(client, sl):
    """Under the app's own message (parent_user_id), or in a thread it has posted in
    (a ledger row went there); another thread, without a mention, does not."""
    def thread_reply(text, thread_ts, **fields):
        event = slack_api.message_event(USER, text, channel=CHANNEL, channel_type="channel", thread_ts=thread_ts,
                                        **fields)
        assert signed_post(client, slack_api.envelope(event)).json()["admitted"] == 1
        return InboundMessage.objects.get(text=text).mentioned

    assert thread_reply("bajo el mensaje del bot", "1700000000.000001", parent_user_id=BOT_USER) is True
    assert thread_reply("en un hilo ajeno", "1700000000.000002", parent_user_id="U0SOMEONE") is False
    top = slack_api.message_event(USER, "pregunta", channel=CHANNEL, channel_type="channel")
    signed_post(client, slack_api.envelope(top))
    conversation = InboundMessage.objects.get(text="pregunta").conversation
    assert thread_reply("antes de que respondamos", top["ts"], parent_user_id=USER) is False
    ledger.enqueue(conversation, "respuesta", kind=OutboundKind.REPLY, thread_id=top["ts"])  # we answered there
    assert thread_reply("gracias, y otra cosa", top["ts"], parent_user_id=USER) is True


def test_slack_channels_follow_group_replies(client, make_channel, fake_slack):
    """`never`: stored as context, no turn; `always`: the unmentioned burst is a turn
    (conversations.groups, the rule of Telegram groups)."""
    for mode, turns in (("never", 0), ("always", 1)):
        Channel.objects.all().delete()
        Channel.objects.forget_cached()
        slack_channel(make_channel, fake_slack, group_replies=mode)
        event = slack_api.message_event(USER, f"hola {mode}", channel=CHANNEL, channel_type="channel")
        assert signed_post(client, slack_api.envelope(event)).json()["admitted"] == 1
        assert len(flushing.flush_due(now=timezone.now() + timedelta(minutes=5))) == turns
        assert InboundMessage.objects.get().disposition == ("context" if mode == "never" else "buffered")


def test_a_thread_is_a_conversation_of_its_own_when_the_channel_says_so(client, make_channel, fake_slack):
    slack_channel(make_channel, fake_slack, settings=slack_settings(fake_slack, conversations="thread"))
    first = slack_api.message_event(USER, "hola")
    reply = slack_api.message_event(USER, "en el hilo", thread_ts=first["ts"])
    other = slack_api.message_event(USER, "otro tema")
    for event in (first, reply, other):
        assert signed_post(client, slack_api.envelope(event)).json()["admitted"] == 1
    chats = sorted({m.conversation.chat_id for m in InboundMessage.objects.all()})
    assert chats == sorted({f"{DM}:{first['ts']}", f"{DM}:{other['ts']}"})
    assert InboundMessage.objects.get(text="en el hilo").thread_id == first["ts"]


@pytest.mark.parametrize("event, why", [
    # Another bot's message is one (tests/end_to_end/test_slack_bot_loops.py); our app's, by its app id, not.
    (slack_api.message_event("U0LEGACY01", "from our app", bot_id="B0OTHER", app_id="A0AGENTLOOP"), "own"),
    (slack_api.message_event(BOT_USER, "our own reply"), "own"),
    (slack_api.message_event(USER, "joined", subtype="channel_join"), "subtype:channel_join"),
    (slack_api.message_event(USER, "   "), "empty"),
    # A reaction on no message of the app's (conversations/reactions.py takes those).
    ({"type": "reaction_added", "user": USER, "reaction": "thumbsup"}, "reaction:not_ours"),
    ({"type": "message", "subtype": "message_deleted", "channel": DM, "deleted_ts": "1.2",
      "previous_message": {"bot_id": slack_api.BOT_ID, "user": slack_api.BOT_USER, "ts": "1.2"}}, "bot"),
])
def test_what_is_not_acted_on_is_acknowledged_and_ignored(client, sl, event, why):
    response = signed_post(client, slack_api.envelope(event))
    assert response.status_code == 200 and response.json()["ignored"] == [why]
    assert nothing_stored()


def test_a_deletion_of_a_message_never_received_is_answered_and_audited(client, sl):
    event = {"type": "message", "subtype": "message_deleted", "channel": DM, "deleted_ts": "1.2",
             "previous_message": {"user": USER, "ts": "1.2", "text": "hola"}}
    response = signed_post(client, slack_api.envelope(event))
    assert response.status_code == 200 and response.json()["deletion"] == "unknown_message"
    assert nothing_stored()


def test_an_edit_inside_the_window_replaces_the_text_once(client, sl):
    event = slack_api.message_event(USER, "agenda el lunes,")
    signed_post(client, slack_api.envelope(event))
    edit = slack_api.edited_event(event, "agenda el martes,")
    assert signed_post(client, slack_api.envelope(edit)).json()["edits"] == 1
    assert signed_post(client, slack_api.envelope(edit)).json()["edits"] == 1  # a retry: the same edit row
    assert InboundMessage.objects.get().text == "agenda el martes,"
    assert MessageEdit.objects.get().outcome == "buffered"
    unfurl = {**edit, "message": {k: v for k, v in edit["message"].items() if k != "edited"}}
    assert signed_post(client, slack_api.envelope(unfurl)).json()["ignored"] == ["unfurl"]


# --- settings, addchannel, bootstrap -----------------------------------------------------------


def test_addchannel_creates_a_slack_channel(db):
    call_command("addchannel", "sl-cli", "--kind", "slack", "--token", TOKEN, "--signing-secret", SIGNING_SECRET,
                 "--api-base", "http://127.0.0.1:9/api/")
    channel = Channel.objects.get(slug="sl-cli")
    assert channel.kind == "slack" and channel.platform_settings == {
        "bot_token": TOKEN, "signing_secret": SIGNING_SECRET, "api_base": "http://127.0.0.1:9/api/",
        "conversations": "channel", "messages_per_second": 4.0,
        "chat_interval": 1.0}
    assert channel.send_blocked == ""
    assert TOKEN in channel.platform.secrets(channel) and SIGNING_SECRET in channel.platform.secrets(channel)


def test_a_channel_without_a_token_waits_to_send(make_channel):
    channel = slack_channel(make_channel, settings=slack_settings(bot_token=""))
    assert channel.send_blocked == "no bot_token set"


def test_bootstrap_adds_a_slack_channel_from_the_environment(db, monkeypatch):
    platform = SlackPlatform()
    monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)
    monkeypatch.delenv("SLACK_SIGNING_SECRET", raising=False)
    assert platform.bootstrap(None) == ""
    monkeypatch.setenv("SLACK_BOT_TOKEN", TOKEN)
    assert "SLACK_SIGNING_SECRET" in platform.bootstrap(None)
    monkeypatch.setenv("SLACK_SIGNING_SECRET", SIGNING_SECRET)
    line = platform.bootstrap(None)
    assert "/webhooks/slack/slack/" in line and "/webhooks/slack/slack/interactivity/" in line
    channel = Channel.objects.get(slug="slack")
    assert channel.agent == "demo" and channel.setting("bot_token") == TOKEN


def test_the_admin_shows_a_slack_channel_with_its_settings_and_no_secret(admin_client, sl):
    page = admin_client.get(f"/admin/conversations/channel/{sl.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Slack settings" in html and 'name="slack_conversations"' in html
    assert TOKEN not in html and SIGNING_SECRET not in html
    assert "Slack" in admin_client.get("/admin/conversations/channel/").content.decode()


# --- the lean ASGI path (conversations/lean_ingest.py) ----------------------------------------------


def test_events_take_the_lean_path_with_the_views_answers_and_clicks_go_to_django(transactional_db, fake_slack):
    """The Events API's POSTs are admitted in batches without Django's request stack (as
    Telegram's are); the answers are the view's own. Interactivity is Django's."""
    import httpx

    from conversations.lean_ingest import LeanIngest

    reached = []

    async def django(scope, receive, send):
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    Channel.objects.create(slug="sl", kind="slack", platform_settings=slack_settings(fake_slack))
    Channel.objects.forget_cached()
    app = LeanIngest(django)
    body = json.dumps(event_body("hola")).encode()
    challenge = json.dumps({"type": "url_verification", "challenge": "c-123"}).encode()
    requests = [(body, slack_api.sign(SIGNING_SECRET, body)), (body, slack_api.sign(SIGNING_SECRET, body)),
                (challenge, slack_api.sign(SIGNING_SECRET, challenge)), (body, {})]

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            answers = [await http.post("/webhooks/slack/sl/", content=raw, headers=headers) for raw, headers in requests]
            answers.append(await http.post("/webhooks/slack/sl/interactivity/", content=b"payload=%7B%7D"))
            return answers

    try:
        answers = asyncio.run(run())
    finally:
        app.admitter.stop()
    assert [a.status_code for a in answers] == [200, 200, 200, 401, 200]
    assert answers[0].json() == {"ok": True, "admitted": 1, "duplicates": 0}
    assert answers[1].json() == {"ok": True, "admitted": 0, "duplicates": 1}
    assert answers[2].json() == {"challenge": "c-123"}
    assert reached == ["/webhooks/slack/sl/interactivity/"]
    assert InboundMessage.objects.count() == 1


def test_only_the_apps_own_leading_mention_is_taken_out_of_the_text():
    from conversations.platforms.slack.inbound import without_mention

    assert without_mention(f"<@{BOT_USER}>: agenda el lunes", BOT_USER) == "agenda el lunes"
    assert without_mention(f"<@{BOT_USER}|agentbot> hola", BOT_USER) == "hola"
    assert without_mention("<@U0OTHER001> ¿puedes?", BOT_USER) == "<@U0OTHER001> ¿puedes?"
    assert without_mention(f"hola <@{BOT_USER}>", BOT_USER) == f"hola <@{BOT_USER}>"


@pytest.mark.django_db(transaction=True)
def test_the_migration_moves_channel_messages_onto_group_replies_both_ways(tmp_path):
    """On an empty database of its own: migrated to just before the move, the move alone
    forwards and backwards, read through its own migration's models, then forward to the
    leaves (every later migration of every app applied over the moved-back setting)."""
    from tests.support.fresh_database import fresh_database, latest, migrate, rows_at

    moving = ("conversations", "0018_slack_group_replies")
    before = [("conversations", "0017_choices_of_groups_and_handoff")]
    expected = {"all": ("always", False), "mentions": ("mention", False), "unset": ("mention", False),
                "tg": ("never", False)}
    with fresh_database(tmp_path) as alias:
        migrate(alias, before)
        old = rows_at(alias, before, "conversations.Channel")
        for slug, value in (("all", "all"), ("mentions", "mentions"), ("unset", None)):
            values = slack_settings() | ({"channel_messages": value} if value else {})
            old.create(slug=slug, kind="slack", platform_settings=values)
        old.create(slug="tg", kind="telegram", group_replies="never")
        migrate(alias, [moving])
        moved = rows_at(alias, [moving], "conversations.Channel")
        assert {c.slug: (c.group_replies, "channel_messages" in c.platform_settings) for c in moved} == expected
        migrate(alias, before)
        back = {c.slug: c.platform_settings.get("channel_messages")
                for c in rows_at(alias, before, "conversations.Channel").filter(kind="slack")}
        assert back == {"all": "all", "mentions": "mentions", "unset": "mentions"}
        migrate(alias, latest(alias))
        # Moved again from the setting it was moved back to, and as every later migration left it.
        channels = Channel.objects.using(alias)
        assert {c.slug: (c.group_replies, "channel_messages" in c.platform_settings) for c in channels} == expected
        for channel in channels.filter(kind="slack"):
            channel.full_clean()  # no unknown setting left behind
        assert not Channel.objects.exists()  # the test database untouched
