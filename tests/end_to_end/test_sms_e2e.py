"""SMS through Twilio end to end: the real web server receiving Twilio's form posts signed
with X-Twilio-Signature over the channel's public URL, the real worker replying through
the local fake Twilio API with the `twilio` library, the fake calling the status callback
each reply names, signed the same way. A storm of redeliveries and a burst are one reply,
sent again unlabelled after a 429's Retry-After; a status callback that says undelivered
after the ledger said sent brings the reply back, resent labelled; an opted-out number
(21610) is never retried and a STOP starts no turn; a worker killed mid-send resends once,
labelled; a "sí" delivered three times applies a confirmed action once; an MMS's photo
is fetched by the worker before its turn. SMS has no groups:
there is no mention gating to test."""

import threading
import time

import pytest
from django.utils import timezone

from audit.models import AuditEvent, EventKind
from conversations.models import InboundMessage, MessageBuffer, Turn
from delivery import ledger
from delivery.models import OutboundMessage, OutboundState, UnreachableChat
from tests.conftest import wait_until
from tests.fakes import twilio_api as twilio
from tests.fakes.twilio_api import PERSON, FakeTwilio
from tests.support.sms import sms_channel

pytestmark = pytest.mark.e2e

QUICK = {f"window_{kind}": 1.0 for kind in ("closed", "greeting", "open", "neutral", "media")}  # bursts not the subject


@pytest.fixture
def fake_twilio():
    with FakeTwilio() as fake:
        yield fake


def started(processes, make_channel, fake, env=None, **fields):
    """The web server (its address the channel's public base: the fake's status callbacks
    reach it), the channel, then the worker."""
    web = processes.web(wait=False, **(env or {}))
    sms_channel(make_channel, fake, public_base=web.base_url, **fields)
    processes.worker(**(env or {}))
    return web


def send(web, text, sender=PERSON, params=None):
    params = params or twilio.message_params(text, sender=sender)
    response = twilio.post(f"{web.url}/webhooks/sms/sms/", params)
    assert response.status_code == 200, response.text
    return params


def delivered(count):
    return lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).count() >= count


@pytest.mark.serial  # the resend's time after the 429: 2 s, within 1.8-8
def test_a_storm_of_redeliveries_and_a_burst_are_one_reply_after_a_429(processes, make_channel, fake_twilio):
    # The burst (twelve concurrent redeliveries, then two more messages) within 3 s of quiet:
    # within 1 s, a loaded run once split it into two turns.
    web = started(processes, make_channel, fake_twilio, **{field: 3.0 for field in QUICK})
    first = twilio.message_params("Hola,")
    url = f"{web.url}/webhooks/sms/sms/"
    # Refused before anything is stored: unsigned, signed with another token, signed for another URL.
    assert twilio.post(url, first, None).status_code == 401
    assert twilio.post(url, first, "not-the-auth-token").status_code == 403
    assert twilio.post(url, first, signed_url="https://elsewhere.example/webhooks/sms/sms/").status_code == 403
    assert not InboundMessage.objects.exists()

    fake_twilio.fail_next(429, 20429, retry_after=2)  # the reply's first send: too many requests
    start, answers = threading.Barrier(12), []

    def redeliver():
        start.wait()
        answers.append(twilio.post(url, first).status_code)

    threads = [threading.Thread(target=redeliver) for _ in range(12)]
    for each in threads:
        each.start()
    for each in threads:
        each.join()
    assert answers == [200] * 12
    for text in ("quería agendar psicología", "¿hay hora el lunes?"):
        send(web, text)
    refused, sent = fake_twilio.wait_for("create", count=2, timeout=30)
    assert refused.status == 429 and sent.status == 201
    assert 1.8 <= sent.at - refused.at < 8, sent.at - refused.at
    assert sent.value("Body") == "Hola,\nquería agendar psicología\n¿hay hora el lunes?"  # the echo agent
    assert sent.value("StatusCallback") == f"{web.url}/webhooks/sms/sms/status/"
    wait_until(delivered(1), timeout=10, message="the resend recorded")
    row = OutboundMessage.objects.get()
    assert row.flood_waits == 1 and row.attempts == 1 and not row.needs_marker
    assert InboundMessage.objects.count() == 3 and MessageBuffer.objects.count() == 1 and Turn.objects.count() == 1
    # Twilio's receipts: sent, then delivered, each signed and accepted; the row stays delivered.
    assert [(s, a) for _, s, a in fake_twilio.wait_for_callbacks(2)] == [("sent", 200), ("delivered", 200)]
    assert OutboundMessage.objects.get().state == OutboundState.DELIVERED


def test_undelivered_after_sent_is_resent_labelled_and_an_opted_out_number_never_retried(
        processes, make_channel, fake_twilio, tmp_path):
    """A status callback that says undelivered after the ledger said sent brings the reply
    back, resent labelled; an opted-out number (21610) is never retried and a STOP starts
    no turn; an MMS's photo is fetched by the worker with the account's credentials."""
    from conversations.models import MediaFile, MediaState

    web = started(processes, make_channel, fake_twilio, env={"AGENTLOOP_MEDIA_ROOT": tmp_path / "files"}, **QUICK)
    late, gone, other = "+56922223333", "+56955556666", "+56977778888"
    fake_twilio.undeliver_next("undelivered", 30003)  # the handset was off
    said = "¿Me confirmas la hora?"
    send(web, said, sender=late)
    [first] = fake_twilio.wait_for("create", timeout=20)
    assert [s for _, s, _ in fake_twilio.wait_for_callbacks(2)] == ["sent", "undelivered"]
    row = wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.FAILED).first(), timeout=10,
                     message="the row taken back by the receipt")
    assert "30003" in row.last_error and row.platform_message_id == first.sid
    OutboundMessage.objects.filter(pk=row.pk).update(next_attempt_at=timezone.now())  # …30 s later
    wait_until(delivered(1), timeout=20, message="resent")
    assert fake_twilio.texts() == [said, f"{ledger.RECOVERY_PREFIX}{said}"]
    assert [s for _, s, _ in fake_twilio.wait_for_callbacks(4)][2:] == ["sent", "delivered"]
    row.refresh_from_db()
    assert row.state == OutboundState.DELIVERED and row.needs_marker and row.attempts == 2
    assert row.platform_message_id == fake_twilio.sent()[1].sid != first.sid
    assert AuditEvent.objects.filter(kind=EventKind.REPLY_FAILED_AFTER_SEND).count() == 1

    fake_twilio.opt_out(gone)  # they replied STOP to this number before
    send(web, "¿sigues ahí?", sender=gone)
    wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.UNREACHABLE).exists(), timeout=20,
               message="the row unreachable")
    send(web, "STOP", sender=other)  # Twilio confirms the opt-out itself: no turn, no reply
    photo = fake_twilio.media(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64, "image/png")
    send(web, "", params=twilio.message_params("¿y el sábado?", media=((photo, "image/png"),)))
    wait_until(delivered(2), timeout=20, message="the third person's reply")
    assert MediaFile.objects.get().state == MediaState.STORED and len(fake_twilio.calls("file")) == 1
    assert "[photo]" in Turn.objects.get(conversation__chat_id=PERSON).merged_input
    time.sleep(1.0)  # sweeps pass: the unreachable row is not sent again
    assert [c.value("To") for c in fake_twilio.calls("create")] == [late, late, gone, PERSON]
    assert OutboundMessage.objects.get(state=OutboundState.UNREACHABLE).attempts == 1
    assert sorted(UnreachableChat.objects.values_list("chat_id", flat=True)) == sorted([gone, other])
    assert not InboundMessage.objects.filter(text="STOP").exists() and Turn.objects.count() == 3


def test_a_worker_killed_mid_send_resends_once_labelled_and_a_yes_sent_three_times_applies_once(
        processes, make_channel, fake_twilio):
    """Then, with the worker that took over: a question asked in words (SMS has no
    buttons), its "sí" delivered three times by Twilio's retries, the action applied once."""
    from tools.models import CalendarEvent, Proposal, ProposalState, ToolPolicy

    ToolPolicy.objects.create(name="calendar_create_event", approval="user")
    web = processes.web(wait=False)
    sms_channel(make_channel, fake_twilio, public_base=web.base_url, agent="demo", **QUICK)
    doomed = processes.worker(wait=False, AGENTLOOP_FAILPOINT="ledger.after_send")
    send(web, "hola", sender="+56922223333")
    wait_until(lambda: doomed.popen.poll() is not None, timeout=30, message="the worker killed after the send")
    processes.worker()  # its boot sweep finds the row mid-send
    wait_until(delivered(1), timeout=20, message="the row delivered after the restart")
    said, again = fake_twilio.texts()
    assert said and again == f"{ledger.RECOVERY_PREFIX}{said}"
    row = OutboundMessage.objects.get()
    assert row.attempts == 2 and row.needs_marker
    assert AuditEvent.objects.filter(kind=EventKind.REPLY_RECOVERED).count() == 1

    send(web, "Confirmo las horas de psicología: lunes a las 10")
    # The question (a notice row the tool call wrote) and the turn's "⏳" reply, in either
    # order: the reply goes out as its turn completes, the notice with the ledger's next look.
    bodies = sorted((call.value("Body") for call in fake_twilio.wait_for("create", count=4, timeout=30)[2:]),
                    key=lambda body: not body.startswith("⏳"))
    assert bodies[0].startswith("⏳") and bodies[1].endswith("yes or no.")  # asked in words
    yes = twilio.message_params("sí")
    for _ in range(3):  # Twilio's retries of one message: one answer
        send(web, "sí", params=yes)
    wait_until(lambda: Proposal.objects.filter(state=ProposalState.APPLIED).exists(), timeout=30,
               message="the proposal applied")
    assert CalendarEvent.objects.count() == 1
    times = [c.at for c in fake_twilio.sent()]
    assert fake_twilio.over_rate == 0, [b - a for a, b in zip(times, times[1:])]  # the number's 1 a second kept
