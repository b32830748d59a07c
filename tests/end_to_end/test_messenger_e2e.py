"""Messenger and Instagram end to end: the real web server (daphne) receiving events signed
as Meta signs them, the real worker sending through httpx to the local fake Send API
(tests/fakes/graph_messenger.py, WhatsApp's fake Graph API extended). A storm of
redeliveries is one message and a burst one turn, whose reply waits out a rate limit and
goes unlabelled; a worker killed mid-send resends once, labelled; a person who blocked
the account is never retried; an Instagram story reply is answered (its files as signed
links Meta fetches) and a mention's story fetched; a question's quick reply tapped three times applies its action once.
Messenger and Instagram DMs have no groups: no mention gating to test."""

import threading
import time

import pytest
from django.utils import timezone

from conversations.models import InboundMessage, MessageBuffer, Turn
from delivery.models import OutboundMessage, OutboundState, SendBudget, UnreachableChat
from tests.conftest import wait_until
from tests.fakes import graph_messenger as fb
from tests.fakes.graph_messenger import FakeMetaGraph
from tests.support.messenger import IG, IG_USER, PAGE, TOKEN, USER, deliver, meta_channel, say

pytestmark = pytest.mark.e2e

QUICK = {f"window_{kind}": 1.0 for kind in ("closed", "greeting", "open", "neutral", "media")}  # bursts not the subject
BURST = {f"window_{kind}": 2.0 for kind in ("closed", "greeting", "open", "neutral")}  # room for three texts


@pytest.fixture
def fake():
    with FakeMetaGraph(tokens=[TOKEN], accounts={PAGE: "messenger", IG: "instagram"}) as server:
        yield server


def delivered(count):
    return lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).count() >= count


def test_a_storm_of_redeliveries_and_a_burst_are_one_reply_sent_plain_after_the_rate_limit(processes, make_channel,
                                                                                           fake):
    meta_channel(make_channel, fake, **BURST)
    web, _ = processes.web(wait=False), processes.worker()
    fake.fail_next("send", code=613, regain_minutes=1)  # the reply's first send: the Page's rate limit
    first = fb.text_event(USER, PAGE, "Hola,")
    start, answers = threading.Barrier(12), []

    def redeliver():
        start.wait()
        answers.append(deliver(web, fake, first)["admitted"])

    threads = [threading.Thread(target=redeliver) for _ in range(12)]
    for each in threads:
        each.start()
    for each in threads:
        each.join()
    assert sorted(answers) == [0] * 11 + [1]
    mids = [first["message"]["mid"], *(say(web, fake, text) for text in ("quería agendar", "¿hay hora el lunes?"))]
    row = wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.FAILED).first(), timeout=25,
                     message="the rate limit recorded")
    assert row.flood_waits == 1 and row.attempts == 0  # refused: nothing reached the chat, nothing spent
    assert (row.next_attempt_at - timezone.now()).total_seconds() == pytest.approx(60, abs=5)  # Meta's estimate
    OutboundMessage.objects.filter(pk=row.pk).update(next_attempt_at=timezone.now())  # …a minute later
    SendBudget.objects.update(next_slot=0)
    wait_until(delivered(1), timeout=20, message="the retry delivered")
    said = "Hola,\nquería agendar\n¿hay hora el lunes?"
    assert fake.texts(USER) == [said]  # the echo agent; unlabelled
    refused, sent = fake.calls("send")
    assert sent.body["messaging_type"] == "RESPONSE" and sent.body["recipient"] == {"id": USER}
    row = OutboundMessage.objects.get()
    assert row.attempts == 1 and not row.needs_marker and row.platform_message_id.startswith("m_")
    assert InboundMessage.objects.count() == 3 and MessageBuffer.objects.count() == 1 and Turn.objects.count() == 1
    assert Turn.objects.get().reply_target == mids[-1]
    actions = [c.body["sender_action"] for c in fake.calls("action")]
    assert actions[0] == "mark_seen" and "typing_on" in actions  # seen, then typing while the turn ran


def test_a_worker_killed_mid_send_resends_once_labelled(processes, make_channel, fake):
    from audit.models import AuditEvent, EventKind
    from delivery import ledger

    meta_channel(make_channel, fake, **QUICK)
    web = processes.web(wait=False)
    doomed = processes.worker(wait=False, AGENTLOOP_FAILPOINT="ledger.after_send")
    say(web, fake, "¿Me confirmas la hora?")
    wait_until(lambda: doomed.popen.poll() is not None, timeout=30, message="the worker killed after the send")
    processes.worker()  # its boot sweep finds the row mid-send
    wait_until(delivered(1), timeout=20, message="the row delivered after the restart")
    said = "¿Me confirmas la hora?"
    assert fake.texts(USER) == [said, f"{ledger.RECOVERY_PREFIX}{said}"]
    row = OutboundMessage.objects.get()
    assert row.attempts == 2 and row.needs_marker
    assert AuditEvent.objects.filter(kind=EventKind.REPLY_RECOVERED).count() == 1


def test_instagram_a_story_reply_is_answered_with_files_by_link_and_a_blocked_person_never_retried(
        processes, make_channel, fake, tmp_path):
    """…the mention's story fetched too; the reply's files go as signed links to the
    deployment (`public_url`), which the fake fetches as Meta does (Instagram takes no uploads)."""
    from conversations.models import MediaFile, MediaState
    from tests.faults.agent import ics
    from tests.support.agents_for_tests import jpeg

    env = {"AGENTLOOP_EXTRA_AGENTS": "files=tests.support.agents_for_tests.FilesAgent",
           "AGENTLOOP_MEDIA_ROOT": str(tmp_path / "files")}
    web = processes.web(wait=False, **env)
    meta_channel(make_channel, fake, kind="instagram", agent="files", extra={"public_url": web.base_url}, **QUICK)
    processes.worker(**env)
    story, mentioned = (fake.add_attachment(b"\xff\xd8\xff" + bytes([shade]) * 200) for shade in (1, 2))
    answer = deliver(web, fake, fb.story_reply_event(IG_USER, IG, "¿Abren hoy?", story),
                     fb.story_mention_event(IG_USER, IG, mentioned), kind="instagram")
    assert answer["admitted"] == 2
    wait_until(delivered(1), timeout=25, message="the story reply answered")
    # One turn, each message's kind in front of it; the files after the text, the caption after its file.
    assert fake.texts(IG_USER) == ["Agendado: [story reply] ¿Abren hoy?\n[story mention]", "Tu cita"]
    assert [(f["type"], f["via"], f["data"]) for f in fake.received_files] == [
        ("image", "url", jpeg(1)), ("image", "url", jpeg(2)), ("file", "url", ics())]
    assert MediaFile.objects.filter(state=MediaState.STORED).count() == 2
    assert len(fake.fetched) == 2  # both stories, from the CDN URLs the events carried

    gone = "17850000099999999"
    fake.block(gone)  # turned the account's messages off
    deliver(web, fake, fb.text_event(gone, IG, "hola", kind="instagram"),
            fb.text_event(IG_USER, IG, "¿y mañana?", kind="instagram"), kind="instagram")
    wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.UNREACHABLE).exists(), timeout=20,
               message="the row unreachable")
    wait_until(delivered(2), timeout=20, message="the other person's reply")
    time.sleep(0.5)  # sweeps pass (every 0.05 s): the unreachable row is not sent again
    assert [c.body["recipient"]["id"] for c in fake.calls("send")].count(gone) == 1
    row = OutboundMessage.objects.get(state=OutboundState.UNREACHABLE)
    assert row.attempts == 1 and "isn't available" in row.last_error
    assert UnreachableChat.objects.get().chat_id == gone


def test_a_quick_reply_tapped_three_times_applies_the_action_once(processes, make_channel, fake):
    from tools.models import CalendarEvent, Proposal, ProposalState, ToolPolicy

    meta_channel(make_channel, fake, agent="demo", **QUICK)
    ToolPolicy.objects.create(name="calendar_create_event", approval="user")
    web, _ = processes.web(wait=False), processes.worker()
    say(web, fake, "Confirmo las horas de psicología: lunes a las 10")
    wait_until(lambda: any("quick_replies" in m for m in fake.sent(USER)), timeout=30,
               message="the question with its quick replies")
    [question] = [m for m in fake.sent(USER) if "quick_replies" in m]
    yes = next(q for q in question["quick_replies"] if q["payload"].endswith(":y"))
    tap = fb.quick_reply_event(USER, PAGE, yes["title"], yes["payload"])
    answers = [deliver(web, fake, tap) for _ in range(3)]  # a double tap, Meta's redelivery
    assert answers[0]["tap_confirmed"] == 1 and all(a.get("tap_already_confirmed") == 1 for a in answers[1:])
    assert CalendarEvent.objects.count() == 1
    assert Proposal.objects.get().state == ProposalState.APPLIED
    wait_until(lambda: any("✅" in t and "done" in t for t in fake.texts(USER)), timeout=20,
               message="the outcome told in the chat")
    time.sleep(0.5)
    assert sum("✅" in t and "done" in t for t in fake.texts(USER)) == 1  # told once
    assert not InboundMessage.objects.filter(text=yes["title"]).exists()  # a tap, not a message for the agent
