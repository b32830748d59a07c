"""Slack end to end: the real web server (daphne) receiving Events API requests signed as
Slack signs them, the real worker sending through slack-sdk's AsyncWebClient to the local
fake Web API. The challenge; signatures refused; a burst is one reply in the user's
thread; retries (one 5 minutes later, across a restart) and 20 concurrent copies are one
message; a 429 waits its Retry-After; an unreachable channel is never retried; a revoked
token blocks the channel; a worker killed mid-send resends once labelled; the incident of
the demo agent; confirmation buttons clicked twice apply once."""

import json
import threading
import time
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from audit.models import AuditEvent, EventKind
from conversations.models import Channel, InboundMessage, MessageBuffer, Turn, TurnState
from delivery import ledger
from delivery.models import OutboundMessage, OutboundState, UnreachableChat
from tests.conftest import wait_until
from tests.fakes import slack_api
from tests.fakes.slack_api import FakeSlackAPI
from tests.support.slack import CHANNEL, DM, SIGNING_SECRET, TOKEN, USER, deliver, send, slack_channel

pytestmark = pytest.mark.e2e
TOKEN2 = TOKEN.replace("AbCd", "NeW0")


@pytest.fixture
def fake_slack():
    with FakeSlackAPI(tokens=[TOKEN, TOKEN2]) as fake:
        yield fake


def started_worker(processes, **env):
    worker = processes.worker(**env)
    wait_until(lambda: " started" in worker.output(), timeout=30, message="worker started")
    return worker


def delivered(count):
    return lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).count() >= count


def post_raw(web, raw, headers, path=""):
    return httpx.post(f"{web.url}/webhooks/slack/sl/{path}", content=raw, timeout=10,
                      headers={"Content-Type": "application/json", **headers})


def test_the_challenge_and_bad_missing_or_stale_signatures(processes, make_channel, fake_slack):
    slack_channel(make_channel, fake_slack)
    web = processes.web()
    challenge = {"token": "legacy", "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY", "type": "url_verification"}
    status, answer = slack_api.post(f"{web.url}/webhooks/slack/sl/", challenge, SIGNING_SECRET)
    assert status == 200 and json.loads(answer) == {"challenge": challenge["challenge"]}
    raw = json.dumps(slack_api.envelope(slack_api.message_event(USER, "hola"))).encode()
    assert post_raw(web, raw, {}).status_code == 401
    assert post_raw(web, raw, slack_api.sign("not-the-secret", raw)).status_code == 403
    assert post_raw(web, raw, slack_api.sign(SIGNING_SECRET, raw, int(time.time()) - 360)).status_code == 403
    assert not InboundMessage.objects.exists() and not MessageBuffer.objects.exists()


def test_a_burst_of_three_is_one_reply_in_the_users_thread(processes, make_channel, fake_slack):
    slack_channel(make_channel, fake_slack)
    web, _ = processes.web(), started_worker(processes)
    parent = slack_api.new_ts()
    texts = ["Hola,", "quería agendar psicología", "¿hay hora el lunes?"]
    events = [send(web, text, thread_ts=parent) for text in texts]
    [reply] = fake_slack.wait_for("chat.postMessage", timeout=20)
    turn = Turn.objects.get()
    assert turn.merged_input == "\n".join(texts) and turn.reply_target == events[-1]["ts"]
    assert reply.body["channel"] == DM and reply.body["thread_ts"] == parent
    assert reply.body["text"] == "\n".join(texts)  # the echo agent
    wait_until(delivered(1), message="the reply recorded delivered")
    row = OutboundMessage.objects.get()
    assert row.platform_message_id == fake_slack.calls("chat.postMessage")[0].body.get("ts", row.platform_message_id)
    assert row.attempts == 1 and row.platform_message_id
    # Not an assistant app (no assistant:write): no status call, one auth.test to know it.
    assert not fake_slack.calls("assistant.threads.setStatus")


def test_retries_one_and_two_five_minutes_later_are_one_turn(processes, make_channel, fake_slack):
    slack_channel(make_channel, fake_slack)
    web, _ = processes.web(), started_worker(processes)
    body = slack_api.envelope(slack_api.message_event(USER, "¿Me confirmas la hora?"))
    assert deliver(web, body)["admitted"] == 1
    assert deliver(web, body, retry_num=1)["duplicates"] == 1
    fake_slack.wait_for("chat.postMessage", timeout=20)
    # Five minutes pass (injected: every stored time moved back), and the web server that
    # saw the first two deliveries is gone: nothing in memory can remember the event.
    earlier = timezone.now() - timedelta(minutes=5, seconds=5)
    InboundMessage.objects.update(received_at=earlier, sent_at=earlier)
    processes.stop_all()
    web = processes.web()
    started_worker(processes)
    answer = deliver(web, body, retry_num=2)
    assert (answer["admitted"], answer["duplicates"]) == (0, 1)
    time.sleep(1.0)
    assert Turn.objects.count() == 1 and len(fake_slack.calls("chat.postMessage")) == 1


def test_twenty_concurrent_copies_are_one_message(processes, make_channel, fake_slack):
    slack_channel(make_channel, fake_slack)
    web = processes.web()
    raw = json.dumps(slack_api.envelope(slack_api.message_event(USER, "hola"))).encode()
    start, answers = threading.Barrier(20), []

    def post():
        with httpx.Client(timeout=30) as http:
            start.wait()
            answer = http.post(f"{web.url}/webhooks/slack/sl/", content=raw,
                               headers={"Content-Type": "application/json", **slack_api.sign(SIGNING_SECRET, raw)})
            answers.append((answer.status_code, answer.json()["admitted"]))

    threads = [threading.Thread(target=post) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(answers) == [(200, 0)] * 19 + [(200, 1)]
    assert InboundMessage.objects.count() == 1 and MessageBuffer.objects.count() == 1


@pytest.mark.serial  # the resend's time after the 429: 3 s, within 2.8-8
def test_a_429_is_resent_after_its_retry_after_plain(processes, make_channel, fake_slack):
    """A 429 is a refusal: the message provably did not land, so the resend carries no
    label (the product's rule: a label means "maybe twice" and nothing else)."""
    slack_channel(make_channel, fake_slack)
    web, _ = processes.web(), started_worker(processes)
    fake_slack.fail_next("chat.postMessage", status=429, retry_after=3)
    send(web, "¿Hay hora el martes?")
    first, second = fake_slack.wait_for("chat.postMessage", count=2, timeout=30)
    assert 2.8 <= second.at - first.at < 8, second.at - first.at
    assert fake_slack.texts() == ["¿Hay hora el martes?"] * 2
    wait_until(delivered(1), timeout=10, message="the resend recorded")
    row = OutboundMessage.objects.get()
    assert row.flood_waits == 1 and row.attempts == 1 and not row.needs_marker


def test_not_in_channel_is_never_retried(processes, make_channel, fake_slack):
    slack_channel(make_channel, fake_slack)
    web, _ = processes.web(), started_worker(processes)
    fake_slack.fail_next("chat.postMessage", error="not_in_channel")
    send(web, f"<@{slack_api.BOT_USER}> ¿hola?", channel=CHANNEL, channel_type="channel", kind="app_mention")
    wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.UNREACHABLE).exists(), timeout=20,
               message="the row unreachable")
    send(web, "¿hola?")  # a DM is answered; the channel is not retried
    wait_until(delivered(1), timeout=20, message="the DM's reply")
    assert len(fake_slack.calls("chat.postMessage")) == 2
    mark = UnreachableChat.objects.get()
    assert mark.chat_id == CHANNEL and "not a member" in mark.error


def test_a_revoked_token_blocks_the_channel_and_burns_nothing(processes, make_channel, fake_slack):
    channel = slack_channel(make_channel, fake_slack)
    web, _ = processes.web(), started_worker(processes)
    fake_slack.revoke(TOKEN)
    send(web, "¿Hola?")
    wait_until(lambda: Channel.objects.get(pk=channel.pk).send_blocked, timeout=20, message="the channel blocked")
    send(web, "¿Sigues ahí?", user="U0OTHER001", channel="D0OTHERDM1")
    wait_until(lambda: OutboundMessage.objects.count() == 2, timeout=20, message="the second reply written")
    time.sleep(1.5)  # several sweeps: nothing is sent while the channel is blocked
    assert len(fake_slack.calls("chat.postMessage")) == 1
    assert set(OutboundMessage.objects.values_list("attempts", flat=True)) == {0}
    assert AuditEvent.objects.filter(kind=EventKind.CHANNEL_BLOCKED).count() == 1
    channel.refresh_from_db()
    channel.platform_settings["bot_token"] = TOKEN2  # the operator installs the app again
    channel.save()
    wait_until(delivered(2), timeout=20, message="both replies delivered once unblocked")


def test_a_worker_killed_mid_send_resends_once_labelled(processes, make_channel, fake_slack):
    slack_channel(make_channel, fake_slack)
    web = processes.web()
    doomed = processes.worker(wait=False, AGENTLOOP_FAILPOINT="ledger.after_send")
    parent = slack_api.new_ts()
    send(web, "¿Me confirmas la hora?", thread_ts=parent)
    wait_until(lambda: doomed.popen.poll() is not None, timeout=30, message="the worker killed after the send")
    started_worker(processes)  # its boot sweep finds the row mid-send
    wait_until(delivered(1), timeout=20, message="the row delivered after the restart")
    assert fake_slack.texts() == ["¿Me confirmas la hora?", f"{ledger.RECOVERY_PREFIX}¿Me confirmas la hora?"]
    assert all(c.body["thread_ts"] == parent for c in fake_slack.calls("chat.postMessage"))
    row = OutboundMessage.objects.get()
    assert row.attempts == 2 and row.needs_marker
    assert AuditEvent.objects.filter(kind=EventKind.REPLY_RECOVERED).count() == 1


def test_the_incident_replayed_over_slack_with_the_demo_agent(processes, make_channel, fake_slack):
    from tools.models import CalendarEvent

    slack_channel(make_channel, fake_slack, agent="demo")
    web, _ = processes.web(), started_worker(processes)
    send(web, "Confirmo las horas de psicología: lunes y miércoles a las 10")
    [first] = fake_slack.wait_for("chat.postMessage", timeout=20)
    assert first.body["text"].count("✅ Agendado: Psicología") == 2
    send(web, "Agéndame las horas en mi calendario")
    second = fake_slack.wait_for("chat.postMessage", count=2, timeout=20)[1]
    assert second.body["text"].count("ℹ️ Ya estaba agendado: Psicología") == 2
    assert CalendarEvent.objects.count() == 2
    assert Turn.objects.filter(state=TurnState.DONE).count() == 2
    assert AuditEvent.objects.filter(kind=EventKind.DUPLICATE_PREVENTED).count() == 2


def test_confirmation_buttons_clicked_twice_apply_once(processes, make_channel, fake_slack):
    from tools.models import CalendarEvent, Proposal, ProposalState, ToolPolicy

    slack_channel(make_channel, fake_slack, agent="demo")
    ToolPolicy.objects.create(name="calendar_create_event", approval="user")
    web, _ = processes.web(), started_worker(processes)
    send(web, "Confirmo las horas de psicología: lunes a las 10")
    wait_until(lambda: any("blocks" in c.body for c in fake_slack.calls("chat.postMessage")), timeout=30,
               message="the question with buttons")
    wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).count()
               >= len(fake_slack.calls("chat.postMessage")), timeout=10, message="the question recorded")
    [question] = [c for c in fake_slack.calls("chat.postMessage") if "blocks" in c.body]
    row = OutboundMessage.objects.get(text=question.body["text"])
    yes = next(e["value"] for e in question.body["blocks"][1]["elements"] if e["value"].endswith(":y"))
    click = slack_api.block_actions(USER, DM, row.platform_message_id, yes)
    answers = []
    for _ in range(2):
        status, answer = slack_api.post(f"{web.url}/webhooks/slack/sl/interactivity/", click, SIGNING_SECRET)
        assert status == 200, answer
        answers.append(json.loads(answer)["callback"])
    assert answers == ["confirmed", "already_confirmed"]
    assert CalendarEvent.objects.count() == 1
    assert Proposal.objects.get().state == ProposalState.APPLIED
    updates = fake_slack.calls("chat.update")
    assert updates and all(u.body["ts"] == row.platform_message_id for u in updates)
    assert "✅ Confirmed at" in fake_slack.message(DM, row.platform_message_id)
    unsigned = httpx.post(f"{web.url}/webhooks/slack/sl/interactivity/", content=click, timeout=10,
                          headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert unsigned.status_code == 401


def test_an_agents_files_are_uploaded_into_the_thread_once(processes, make_channel, fake_slack, tmp_path):
    from tests.faults.agent import ics
    from tests.support.agents_for_tests import jpeg

    agent = {"AGENTLOOP_EXTRA_AGENTS": "files=tests.support.agents_for_tests.FilesAgent",
             "AGENTLOOP_MEDIA_ROOT": tmp_path / "files"}
    slack_channel(make_channel, fake_slack, agent="files")
    web, _ = processes.web(wait=False, **agent), processes.worker(**agent)
    parent = slack_api.new_ts()
    send(web, "agenda el lunes", thread_ts=parent)
    wait_until(delivered(1), timeout=30, message="the reply with its files delivered")
    assert fake_slack.texts() == ["Agendado: agenda el lunes"]
    shared = fake_slack.shared_files()
    assert [(f["title"], f["data"], f["thread_ts"]) for f in shared] == [
        (shared[0]["title"], jpeg(1), parent), (shared[1]["title"], jpeg(2), parent), ("cita.ics", ics(), parent)]
    assert shared[2]["comment"] == "Tu cita" and len(fake_slack.calls("upload")) == 3


def test_an_assistant_app_shows_its_thread_status_while_the_agent_works(processes, make_channel):
    """An app with assistant:write (read from auth.test's X-OAuth-Scopes) shows "is
    thinking…" in the user's thread from the window on; Slack clears it with the reply."""
    with FakeSlackAPI(tokens=[TOKEN], scopes=slack_api.SCOPES + ",assistant:write") as fake:
        slack_channel(make_channel, fake, typing_mode="turn", agent_config={"delay": 2})
        web, _ = processes.web(), started_worker(processes)
        parent = slack_api.new_ts()
        send(web, "¿Me confirmas la hora?", thread_ts=parent)
        [reply] = fake.wait_for("chat.postMessage", timeout=30)
        statuses = fake.calls("assistant.threads.setStatus")
        assert statuses and all((c.body["channel_id"], c.body["thread_ts"]) == (DM, parent) for c in statuses)
        assert statuses[0].at < reply.at and len(fake.calls("auth.test")) == 1
