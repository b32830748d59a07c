"""Peers that misbehave: absurd flood waits, a bad row inside a batch, a safety sweep
killed mid-way, services that trickle bytes, callbacks that must be signed."""

import asyncio
import socket
import sys
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from audit.models import AuditEvent, EventKind
from conversations.agents import AgentUnavailable, TurnContext
from conversations.models import Channel, Contact, Conversation
from conversations.platforms.api.transport import ApiCallbackTransport
from conversations.platforms.telegram.transport import close_bots
from conversations.remote_agents import WebhookAgent
from delivery import ledger, signing
from delivery.models import OutboundKind, OutboundMessage, OutboundState, Outcome
from delivery.transports import Target
from tests.support.e2e import UNPACED

GOOD, BAD = "5100:GOOD-token", "5200:BAD-token"


def conversation_on(channel, chat_id):
    contact = Contact.objects.create(channel=channel, platform_id=chat_id, display_name=chat_id)
    return Conversation.objects.create(channel=channel, contact=contact, chat_id=chat_id, sender_id=chat_id)


def send_batch(owner="w1"):
    """Claim what is due, send it all at once through python-telegram-bot, record the
    outcomes in one transaction — as the worker does."""
    rows = ledger.claim_due(owner)

    async def run():
        try:
            return list(zip(rows, await asyncio.gather(*(ledger.send(row) for row in rows))))
        finally:
            await close_bots()

    outcomes = asyncio.run(run())
    with transaction.atomic():
        ledger.finish_many(outcomes, owner)
    return outcomes


def row_state(row):
    return OutboundMessage.objects.get(pk=row.pk)


# --- flood waits -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("raw, wait", [("1e400", 3600), ("99999999999", 3600), ("1e12", 3600), ("-5", 1),
                                       ("0", 1), ('"soon"', 30), ("7", 7)])
def test_a_flood_wait_from_the_bot_api_is_clamped(make_channel, fake_telegram, raw, wait):
    channel = make_channel("tg", kind="telegram", platform_settings={"bot_token": BAD, "api_base": fake_telegram.url})
    row = ledger.enqueue(conversation_on(channel, "301"), "hola", kind=OutboundKind.REPLY)
    fake_telegram.fail_next("sendMessage", status=429, description="Too Many Requests: retry later",
                            retry_after=raw)
    before = timezone.now()
    [(_, result)] = send_batch()
    failed = row_state(row)
    assert (failed.state, failed.last_outcome, failed.flood_waits) == (OutboundState.FAILED, Outcome.FLOOD, 1)
    waited = (failed.next_attempt_at - before).total_seconds()
    assert wait <= waited < wait + 5, (raw, waited)


@pytest.mark.django_db(transaction=True)
def test_one_bad_row_never_undoes_the_others_in_a_batch(make_channel, fake_telegram):
    """Twenty replies delivered and one flood wait the clock cannot hold (now + 1e12 s is
    past year 9999), recorded in one transaction: the twenty stay delivered."""
    good = make_channel("good", kind="telegram", platform_settings={"bot_token": GOOD, "api_base": fake_telegram.url})
    bad = make_channel("bad", kind="telegram", platform_settings={"bot_token": BAD, "api_base": fake_telegram.url})
    rows = [ledger.enqueue(conversation_on(good, f"{400 + n}"), f"respuesta {n}", kind=OutboundKind.REPLY)
            for n in range(20)]
    flooded = ledger.enqueue(conversation_on(bad, "499"), "la mala", kind=OutboundKind.REPLY)
    fake_telegram.fail_next("sendMessage", status=429, description="Too Many Requests", retry_after="1e12",
                            token=BAD)
    assert len(send_batch()) == 21
    assert len(fake_telegram.calls("sendMessage", token=GOOD)) == 20
    assert {row_state(r).state for r in rows} == {OutboundState.DELIVERED}
    assert row_state(flooded).state == OutboundState.FAILED
    # Nothing delivered is claimable again (it would go out a second time, labelled).
    assert ledger.claim_due("w2", now=timezone.now() + timedelta(hours=2)) == [row_state(flooded)]


@pytest.mark.django_db(transaction=True)
def test_a_callbacks_retry_after_header_is_clamped(make_channel):
    with Service(status=429, headers={"Retry-After": "1e400"}) as service:
        channel = make_channel("shop", platform_settings={
            "callback_url": service.url, "callback_secret": "cb-secret-123"})
        for header, wait in [("1e400", 3600), ("0", 1), ("-3", 1), ("soon", 30),
                             ("Wed, 21 Oct 2015 07:28:00 GMT", 1), ("99999999999", 3600)]:
            service.headers = {"Retry-After": header}
            result = asyncio.run(ApiCallbackTransport(channel).send_text(Target("ana"), "hola"))
            assert (result.outcome, result.retry_after) == (Outcome.FLOOD, wait), header


# --- the django-q2 safety sweep ----------------------------------------------------------------


def stale_rows(channel, count):
    conversation = conversation_on(channel, "601")
    rows = [ledger.enqueue(conversation, f"pendiente {n}", kind=OutboundKind.REPLY) for n in range(count)]
    OutboundMessage.objects.filter(pk__in=[r.pk for r in rows]).update(
        created_at=timezone.now() - timedelta(minutes=2))
    return rows


def test_a_sweep_killed_mid_way_leaves_no_delivered_row_attempting_and_burns_no_attempt(
        processes, make_channel, fake_telegram):
    channel = make_channel("tg", kind="telegram", platform_settings={"bot_token": GOOD, "api_base": fake_telegram.url})
    rows = stale_rows(channel, 12)
    fake_telegram.delay("sendMessage", 0.3)
    sweep = processes.start("sweep", [sys.executable, "manage.py", "shell", "-c",
                                      "from delivery.ledger import safety_sweep; safety_sweep()"])
    fake_telegram.wait_for("sendMessage", count=4, timeout=30)
    sweep.kill()
    received = {call.params["text"] for call in fake_telegram.calls("sendMessage")}
    assert 4 <= len(received) < 12, sweep.output()
    states = {r.text: row_state(r) for r in rows}
    attempting = [text for text, row in states.items() if row.state == OutboundState.ATTEMPTING]
    # At most the one send in flight when the sweep died is left attempting (it may have
    # landed: it will be resent labelled); every answered send was recorded at once.
    assert len(attempting) <= 1 and set(attempting) <= received, attempting
    for text, row in states.items():
        if text in received and text not in attempting:
            assert row.state == OutboundState.DELIVERED, (text, row.state)
        elif text not in received:
            assert (row.state, row.attempts) == (OutboundState.PENDING, 0), (text, row.state, row.attempts)


@pytest.mark.django_db(transaction=True)
def test_a_sweep_out_of_time_gives_back_what_it_did_not_send(make_channel, fake_telegram):
    channel = make_channel("tg", kind="telegram", platform_settings={"bot_token": GOOD, "api_base": fake_telegram.url,
                                                                     **UNPACED})  # three rows into one chat at once
    rows = stale_rows(channel, 3)
    # The first send outlasts the budget. The budget leaves room for the claim before it:
    # at 0.2 s a loaded CI machine (both passes at once, PostgreSQL) used it all before
    # the first send began, and the sweep sent nothing.
    fake_telegram.delay("sendMessage", 2.5)
    assert ledger.safety_sweep(budget=1.0, batch=3) == {"abandoned": 0, "sent": 1}
    first, *rest = (row_state(r) for r in rows)
    assert first.state == OutboundState.DELIVERED
    assert [(r.state, r.attempts, r.owner) for r in rest] == [(OutboundState.PENDING, 0, "")] * 2
    # Given back as they were: the next sweep sends them plain.
    assert ledger.safety_sweep(batch=3)["sent"] == 2
    assert [c.params["text"] for c in fake_telegram.calls("sendMessage")] == [r.text for r in rows]


# --- services that trickle bytes ---------------------------------------------------------------


class Trickler:
    """A local server that reads the request, then answers one byte every `interval`
    seconds, forever: no per-phase timeout ever fires."""

    def __init__(self, interval=0.3):
        self.interval = interval
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}/hook?key=trickle-key-0042"
        self.stopping = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopping.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn):
        answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
        conn.recv(65536)
        try:
            for n in range(10**6):
                if self.stopping.is_set():
                    break
                conn.sendall(answer[n:n + 1] if n < len(answer) else b" ")
                time.sleep(self.interval)
        except OSError:
            pass
        conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        self.server.close()


@pytest.mark.django_db(transaction=True)
def test_a_callback_that_trickles_bytes_meets_the_deadline(make_channel, settings):
    settings.AGENTLOOP_CALLBACK_TIMEOUT = 1.5
    with Trickler() as trickler:
        channel = make_channel("shop", platform_settings={
            "callback_url": trickler.url, "callback_secret": "cb-secret-123"})
        started = time.monotonic()
        result = asyncio.run(asyncio.wait_for(ApiCallbackTransport(channel).send_text(Target("ana"), "hola"), 20))
        elapsed = time.monotonic() - started
    assert result.outcome == Outcome.AMBIGUOUS and 1.4 < elapsed < 3, (result, elapsed)
    assert "trickle-key-0042" not in result.error


def test_a_webhook_agent_that_trickles_bytes_meets_its_timeout():
    with Trickler() as trickler:
        ctx = TurnContext(turn_id=1, conversation_id=1, channel_slug="hooked", text="hola",
                          config={"url": trickler.url, "secret": "agent-secret", "timeout": 1.5})
        started = time.monotonic()
        with pytest.raises(AgentUnavailable) as failure:
            asyncio.run(asyncio.wait_for(WebhookAgent().respond(ctx), 20))
        elapsed = time.monotonic() - started
    assert 1.4 < elapsed < 3, elapsed
    assert "did not answer within 1.5 s" in str(failure.value) and "trickle-key-0042" not in str(failure.value)


# --- callback signatures -----------------------------------------------------------------------


class Service:
    """An operator's callback receiver: records each request's headers and body."""

    def __init__(self, status=200, headers=None):
        self.status, self.headers, self.received = status, headers or {}, []
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                service.received.append((dict(self.headers), body))
                self.send_response(service.status)
                for name, value in service.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/replies"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.django_db(transaction=True)
def test_a_callback_is_signed_over_its_timestamp_and_body(make_channel):
    with Service() as service:
        channel = make_channel("shop", platform_settings={
            "callback_url": service.url, "callback_secret": "cb-secret-123"})
        result = asyncio.run(ApiCallbackTransport(channel).send_text(Target("ana", "77"), "Su hora es el lunes."))
    assert result.ok
    [(headers, body)] = service.received
    assert signing.verify("cb-secret-123", headers, body)
    assert abs(int(headers["X-Agentloop-Timestamp"]) - time.time()) < 5
    assert not signing.verify("another-secret", headers, body)
    assert not signing.verify("cb-secret-123", headers, body + b" ")  # the body is signed
    forged = {**headers, "X-Agentloop-Timestamp": str(int(headers["X-Agentloop-Timestamp"]) + 1)}
    assert not signing.verify("cb-secret-123", forged, body)  # so is the timestamp
    # A captured request replayed later than the window is refused.
    assert not signing.verify("cb-secret-123", headers, body, now=time.time() + signing.REPLAY_WINDOW + 5)


@pytest.mark.django_db(transaction=True)
def test_a_callback_without_a_secret_is_refused_on_save_and_never_sent_unsigned(make_channel):
    unsigned = Channel(slug="shop", kind="api", platform_settings={"callback_url": "https://shop.example/replies"})
    with pytest.raises(ValidationError) as refused:
        unsigned.full_clean()
    assert "callback_secret" in str(refused.value)
    with pytest.raises(ValidationError):
        unsigned.save()  # a script's save is checked too
    with Service() as service:
        # Written straight into the database (an older row, a script)…
        channel = make_channel("shop")
        Channel.objects.filter(pk=channel.pk).update(platform_settings={"callback_url": service.url})
        channel.refresh_from_db()
        row = ledger.enqueue(conversation_on(channel, "ana"), "hola", kind=OutboundKind.REPLY)
        [claimed] = ledger.claim_due("w1")
        # …a send is refused, not sent unsigned: the row waits, its attempt given back, and
        # so do the channel's other replies, audited once.
        result = asyncio.run(ApiCallbackTransport(channel).send_text(Target("ana"), "hola"))
        assert result.outcome == Outcome.CHANNEL_BLOCKED and "no secret" in result.error
        ledger.finish(claimed, "w1", result)
        assert service.received == []
        waiting = row_state(row)
        assert (waiting.state, waiting.attempts) == (OutboundState.PENDING, 0)
        assert ledger.claim_due("w1") == []
        channel.refresh_from_db()
        assert "no secret" in channel.send_blocked
        assert AuditEvent.objects.filter(kind=EventKind.CHANNEL_BLOCKED).count() == 1
        # An operator saves it with a secret: its replies go.
        channel.platform_settings = {**channel.platform_settings, "callback_secret": "cb-secret-123"}
        channel.save()
        assert channel.send_blocked == ""
        assert [r.pk for r in ledger.claim_due("w1")] == [row.pk]
