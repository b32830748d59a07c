"""Slack's sending, in process, against the local fake Web API over real HTTP through
slack-sdk: each error's outcome (alone and through the ledger), threads, splitting,
escaping, buttons, files, typing where the app is an assistant, and clicks on a
question's buttons on the interactivity URL (decided once, the question updated).

The request URL's checks and parsing are in test_slack.py; end to end in test_slack_e2e.py."""

import time

import pytest

from conversations.models import Channel, InboundMessage
from conversations.platforms.slack.transport import SlackTransport, close_clients
from delivery.models import Outcome
from delivery.transports import Target
from tests.fakes import slack_api
from tests.fakes.slack_api import BOT_USER, FakeSlackAPI
from tests.support.loops import run_then_close
from tests.support.slack import CHANNEL, DM, TOKEN, USER, signed_post, slack_channel, slack_settings


@pytest.fixture
def fake_slack():
    with FakeSlackAPI(tokens=[TOKEN]) as fake:
        yield fake


@pytest.fixture
def sl(make_channel, fake_slack):
    return slack_channel(make_channel, fake_slack)


# --- the transport, against the fake Web API ---------------------------------------------------


def run(coro):
    return run_then_close(coro, close_clients)


def test_a_reply_goes_into_the_thread_and_returns_its_ts(sl, fake_slack):
    result = run(SlackTransport(sl).send_text(Target(CHANNEL, "1700000000.000100", "1700000000.000100"),
                                              "Hola <b> & 👋"))
    assert result.ok and result.platform_message_id
    [call] = fake_slack.calls("chat.postMessage")
    assert call.token == TOKEN and call.body["channel"] == CHANNEL and call.body["thread_ts"] == "1700000000.000100"
    assert call.body["text"] == "Hola &lt;b&gt; &amp; 👋"


def test_a_chat_per_thread_sends_into_its_thread(sl, fake_slack):
    assert run(SlackTransport(sl).send_text(Target(f"{DM}:1700000000.000200"), "hola")).ok
    [call] = fake_slack.calls("chat.postMessage")
    assert (call.body["channel"], call.body["thread_ts"]) == (DM, "1700000000.000200")


def test_a_long_text_is_split_at_4000(sl, fake_slack):
    assert run(SlackTransport(sl).send_text(Target(DM), "a" * 9000)).ok
    assert [len(t) for t in fake_slack.texts()] == [4000, 4000, 1000]


def test_buttons_go_as_block_kit_on_the_message(sl, fake_slack):
    buttons = (("✅ Yes, do it", "c:" + "x" * 32 + ":y"), ("❌ No", "c:" + "x" * 32 + ":n"))
    assert run(SlackTransport(sl).send_text(Target(DM, buttons=buttons), "Please confirm: x.")).ok
    [call] = fake_slack.calls("chat.postMessage")
    section, actions = call.body["blocks"]
    assert section["text"]["text"] == "Please confirm: x."
    assert [(e["text"]["text"], e["value"], e["style"]) for e in actions["elements"]] == [
        ("✅ Yes, do it", buttons[0][1], "primary"), ("❌ No", buttons[1][1], "danger")]


@pytest.mark.parametrize("script, outcome, retry_after", [
    ({"status": 429, "retry_after": 3}, Outcome.FLOOD, 3),
    ({"error": "ratelimited"}, Outcome.TEMPORARY, 0),
    ({"error": "fatal_error"}, Outcome.TEMPORARY, 0),
    ({"status": 500}, Outcome.TEMPORARY, 0),
    ({"status": 503}, Outcome.TEMPORARY, 0),
    ({"error": "channel_not_found"}, Outcome.PERMANENT, 0),
    ({"error": "not_in_channel"}, Outcome.PERMANENT, 0),
    ({"error": "is_archived"}, Outcome.PERMANENT, 0),
    ({"error": "account_inactive"}, Outcome.PERMANENT, 0),
    ({"error": "invalid_auth"}, Outcome.CHANNEL_BLOCKED, 0),
    ({"error": "token_revoked"}, Outcome.CHANNEL_BLOCKED, 0),
    ({"error": "msg_too_long"}, Outcome.PERMANENT, 0),
    ({"status": 200}, Outcome.AMBIGUOUS, 0),  # a 200 that is no Slack answer
])
def test_each_web_api_error_maps_to_its_outcome_and_is_never_retried_by_the_sdk(sl, fake_slack, script, outcome,
                                                                               retry_after):
    fake_slack.fail_next("chat.postMessage", **script)
    result = run(SlackTransport(sl).send_text(Target(DM), "hola"))
    assert (result.outcome, result.retry_after) == (outcome, retry_after), result.error
    assert len(fake_slack.calls("chat.postMessage")) == 1  # the SDK's retry handlers are off
    assert TOKEN not in result.error


def test_a_dropped_connection_after_the_request_is_ambiguous(sl, fake_slack):
    fake_slack.drop_connection_next()
    assert run(SlackTransport(sl).send_text(Target(DM), "hola")).outcome == Outcome.AMBIGUOUS


def test_an_answer_that_never_comes_is_ambiguous_within_the_deadline(sl, fake_slack, settings):
    settings.AGENTLOOP_CALLBACK_TIMEOUT = 0.5
    with fake_slack.hold():
        began = time.monotonic()
        result = run(SlackTransport(sl).send_text(Target(DM), "hola"))
    assert result.outcome == Outcome.AMBIGUOUS and time.monotonic() - began < 2


def test_a_request_that_never_left_is_not_sent(make_channel, free_port_url):
    channel = slack_channel(make_channel, settings=slack_settings(api_base=free_port_url))
    result = run(SlackTransport(channel).send_text(Target(DM), "hola"))
    assert result.outcome == Outcome.NOT_SENT, result.error


@pytest.fixture
def free_port_url():
    from tests.conftest import free_port

    return f"http://127.0.0.1:{free_port()}/api/"


def test_typing_is_the_assistant_status_only_where_the_app_is_an_assistant(make_channel):
    with FakeSlackAPI(tokens=[TOKEN]) as plain:
        channel = slack_channel(make_channel, plain, slug="plain")
        run(SlackTransport(channel).send_typing(Target(DM, "1.1", "1700000000.000300")))
        assert [c.method for c in plain.calls()] == ["auth.test"] and SlackTransport.supports_typing
    other = TOKEN.replace("AbCd", "ZyXw")
    with FakeSlackAPI(tokens=[other], scopes=slack_api.SCOPES + ",assistant:write") as assistant:
        channel = slack_channel(make_channel, assistant, slug="assistant",
                                settings=slack_settings(assistant, bot_token=other))
        run(SlackTransport(channel).send_typing(Target(DM, "1.1", "1700000000.000300")))
        run(SlackTransport(channel).send_typing(Target(DM, "1.1", "1700000000.000300")))
        run(SlackTransport(channel).send_typing(Target(DM)))  # no thread: no status to set
        methods = [c.method for c in assistant.calls()]
        assert methods == ["auth.test", "assistant.threads.setStatus", "assistant.threads.setStatus"]
        assert assistant.calls("assistant.threads.setStatus")[0].body["thread_ts"] == "1700000000.000300"


# --- the outcomes through the ledger -------------------------------------------------------------


def through_the_ledger(client, channel, text="¿Me confirmas la hora?"):
    from delivery import ledger
    from delivery.models import OutboundKind

    # Unpaced: these tests map errors, not pacing. A paced send that wakes past its slot
    # (a loaded machine) reserves a fresh one from another thread, whose write then waits
    # on this test's open transaction on SQLite until it gives up ("no send slot").
    channel.refresh_from_db()
    channel.platform_settings.update(messages_per_second=0, chat_interval=0)
    channel.save(update_fields=["platform_settings"])
    event = slack_api.message_event(USER, "hola", thread_ts="1700000000.000900")
    signed_post(client, slack_api.envelope(event))
    message = InboundMessage.objects.get()
    row = ledger.enqueue(message.conversation, text, kind=OutboundKind.REPLY, reply_target=message.reply_target,
                         thread_id=message.thread_id)
    [claimed] = ledger.claim_due("test-owner")
    ledger.finish(claimed, "test-owner", run(ledger.send(claimed)))
    row.refresh_from_db()
    return row


@pytest.mark.parametrize("case", [
    ({"status": 429, "retry_after": 3}, "failed", "flood_waits"),
    ({"error": "ratelimited"}, "failed", "resend"),
    ({"status": 502}, "failed", "resend"),
    ({"error": "not_in_channel"}, "unreachable", ""),
    ({"error": "channel_not_found"}, "unreachable", ""),
    ({"error": "token_revoked"}, "pending", "blocked"),
    ({"error": "invalid_auth"}, "pending", "blocked"),
])
def test_every_mapped_error_through_the_ledger(client, sl, fake_slack, case):
    from delivery import ledger
    from delivery.models import UnreachableChat

    script, state, counted = case
    fake_slack.fail_next("chat.postMessage", **script)
    row = through_the_ledger(client, sl)
    assert row.state == state, (row.state, row.last_error)
    assert fake_slack.calls("chat.postMessage")[0].body["thread_ts"] == "1700000000.000900"
    if counted == "flood_waits":
        assert row.flood_waits == 1 and ledger.resends_used(row) == 0 and row.attempts == 0
    elif counted == "blocked":
        assert row.attempts == 0 and Channel.objects.get(pk=sl.pk).send_blocked
    elif counted == "resend":
        assert row.flood_waits == 0 and row.next_attempt_at is not None
    else:
        assert UnreachableChat.objects.filter(chat_id=DM).exists() and row.next_attempt_at is None


# --- files in replies ------------------------------------------------------------------------------


def send_files_through_the_ledger(client, channel, *files):
    from conversations.agents import Answer
    from conversations.media import outbound
    from delivery import ledger
    from delivery.models import OutboundKind

    signed_post(client, slack_api.envelope(slack_api.message_event(USER, "hola", thread_ts="1700000000.000900")))
    message = InboundMessage.objects.get()
    stored = outbound.stored_answer(channel.pk, Answer("", tuple(files)))[1]
    row = ledger.enqueue(message.conversation, "", kind=OutboundKind.REPLY, files=stored,
                         reply_target=message.reply_target, thread_id=message.thread_id)
    [claimed] = ledger.claim_due("test-owner")
    ledger.finish(claimed, "test-owner", run(ledger.send(claimed)))
    row.refresh_from_db()
    return row


@pytest.fixture
def files_root(settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path)


def test_a_file_is_uploaded_then_shared_into_the_thread_with_its_caption(client, sl, fake_slack, files_root):
    from conversations.agents import File
    from tests.faults.agent import ics

    row = send_files_through_the_ledger(client, sl, File("cita.ics", ics(), caption="Tu cita <lunes>"))
    assert row.state == "delivered" and row.platform_message_id.startswith("F")
    [shared] = fake_slack.shared_files()
    assert (shared["title"], shared["data"], shared["channel"], shared["thread_ts"], shared["comment"]) == (
        "cita.ics", ics(), DM, "1700000000.000900", "Tu cita &lt;lunes&gt;")
    assert not fake_slack.calls("chat.postMessage")


@pytest.mark.parametrize("fault", ["drop_upload_url", "refuse_upload_url"])
def test_an_upload_that_fails_before_sharing_is_not_sent_and_unlabelled(client, sl, fake_slack, files_root, fault):
    from conversations.agents import File
    from tests.faults.agent import ics

    if fault == "drop_upload_url":
        fake_slack.drop_connection_next("files.getUploadURLExternal")
    else:
        fake_slack.fail_next("files.getUploadURLExternal", status=500)
    row = send_files_through_the_ledger(client, sl, File("cita.ics", ics()))
    assert row.state == "failed" and row.last_outcome == Outcome.NOT_SENT and not row.needs_marker
    assert row.attempts == 0 and not fake_slack.shared_files()


# --- clicks on a question's buttons ---------------------------------------------------------------


def test_a_click_is_decided_once_only_by_the_asker_and_the_question_updated(client, sl, fake_slack):
    from delivery import ledger
    from delivery.models import OutboundMessage
    from tools import guard
    from tools.models import CalendarEvent, ToolPolicy
    from tools.registry import Scope

    ToolPolicy.objects.create(name="calendar_create_event", approval="user")
    event = slack_api.message_event(USER, f"<@{BOT_USER}> agenda", channel=CHANNEL, channel_type="channel",
                                    kind="app_mention")
    signed_post(client, slack_api.envelope(event))
    conversation = InboundMessage.objects.get().conversation
    guard.invoke("calendar_create_event", {"title": "Psicología", "start_datetime": "2026-12-07T10:00"},
                 Scope.of_conversation(conversation), actor="worker:w")
    [claimed] = ledger.claim_due("test-owner")
    ledger.finish(claimed, "test-owner", run(ledger.send(claimed)))
    [question] = fake_slack.calls("chat.postMessage")
    ts = OutboundMessage.objects.get(pk=claimed.pk).platform_message_id
    yes = question.body["blocks"][1]["elements"][0]["value"]

    def click(user, value=yes):
        response = signed_post(client, slack_api.block_actions(user, CHANNEL, ts, value), path="sl/interactivity/")
        assert response.status_code == 200, response.content
        return response.json()["callback"]

    assert click("U0SOMEONE1") == "not_yours"
    [whisper] = fake_slack.calls("chat.postEphemeral")
    assert whisper.body["user"] == "U0SOMEONE1" and "can confirm this" in whisper.body["text"]
    assert click(USER, "c:" + "A" * 32 + ":y") == "invalid"  # a forged token finds nothing
    assert [click(USER), click(USER)] == ["confirmed", "already_confirmed"]
    assert CalendarEvent.objects.count() == 1
    assert "✅ Confirmed at" in fake_slack.message(CHANNEL, ts)
    assert signed_post(client, slack_api.block_actions(USER, CHANNEL, ts, yes), path="sl/interactivity/",
                       secret="wrong").status_code == 403
