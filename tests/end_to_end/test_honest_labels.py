"""A label means "maybe twice" and nothing else: through python-telegram-bot and the real
HTTP stack against the local fake Bot API, a send that provably never left (waiting for
a pooled connection, refused, a 429) goes out again unlabelled and spends no attempt;
only a chunk whose own answer never came is labelled."""

import asyncio
import socket
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from conversations.platforms.telegram.transport import close_bots
from delivery import ledger
from delivery.models import OutboundKind, OutboundMessage, OutboundState, Outcome
from delivery.transports import Target, transport_for
from tests.conftest import wait_until
from tests.end_to_end.test_chunks import PARAGRAPHS
from tests.end_to_end.test_ledger_e2e import conversation_for
from tests.fakes.telegram_api import BotAPIError
from tests.support.e2e import UNPACED

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
PREFIX = ledger.RECOVERY_PREFIX


def channel_for(make_channel, fake, **settings):
    return make_channel("tg", kind="telegram", platform_settings={
        "bot_token": "77:HONEST", "api_base": fake.url, **settings})


def sent_texts(fake):
    return [m["text"] for m in fake.sent_messages()]


def deliver(rows):
    """Send claimed rows at once on one event loop (as the worker does); record each outcome."""
    async def each():
        try:
            return await asyncio.gather(*(ledger.send(row) for row in rows))
        finally:
            await close_bots()

    results = asyncio.run(each())
    ledger.finish_many(list(zip(rows, results, strict=True)), "w1")
    return results


def claim_later(seconds, owner="w1"):
    """A sweep `seconds` from now (injected time: the back-off and the pacing both count from it)."""
    return ledger.claim_due(owner, now=timezone.now() + timedelta(seconds=seconds))


def in_order(handler_for_call):
    """A sendMessage handler that asks `handler_for_call(n)` what to do with the n-th call
    (None: answer as Telegram would)."""
    calls = []

    def handle(fake):
        original = fake._api_send_message

        def send_message(token, params):
            calls.append(params["text"])
            action = handler_for_call(len(calls))
            if action is not None:
                action()
            return original(token, params)

        fake.set_handler("sendMessage", send_message)
        return calls

    return handle


def test_a_429_on_the_second_chunk_resumes_there_unlabelled_after_the_penalty(make_channel, fake_telegram):
    def flood_second(n):
        if n == 2:
            def refuse():
                raise BotAPIError(429, "Too Many Requests: retry after 1", {"retry_after": 1})
            return refuse
        return None

    in_order(flood_second)(fake_telegram)
    channel = channel_for(make_channel, fake_telegram)  # paced: chunks 1.05 s apart in the chat
    row = ledger.enqueue(conversation_for(channel), "\n\n".join(PARAGRAPHS[:3]), kind=OutboundKind.REPLY)
    [first] = ledger.claim_due("w1")
    [result] = deliver([first])
    assert result.outcome == Outcome.FLOOD
    flooded = OutboundMessage.objects.get(pk=row.pk)
    assert (flooded.state, flooded.chunks_delivered, flooded.chunks_started, flooded.attempts) == \
        (OutboundState.FAILED, 1, 1, 0)  # chunk 2 never started as far as a resend is concerned
    assert ledger.claim_due("w1") == []  # the bot is paused for the penalty (and the chat booked)
    flooded_at = time.monotonic()
    [again] = wait_until(lambda: ledger.claim_due("w1"), timeout=5, message="the flooded row due again")
    assert time.monotonic() - flooded_at >= 0.9 and not again.needs_marker
    deliver([again])
    assert sent_texts(fake_telegram) == PARAGRAPHS[:3]  # each chunk once, none labelled
    done = OutboundMessage.objects.get(pk=row.pk)
    assert (done.state, done.attempts, done.flood_waits) == (OutboundState.DELIVERED, 1, 1)


def test_only_the_chunk_whose_answer_never_came_is_labelled(make_channel, fake_telegram, settings):
    settings.AGENTLOOP_TELEGRAM_READ_TIMEOUT = 1.0
    in_order(lambda n: (lambda: time.sleep(2.0)) if n == 2 else None)(fake_telegram)  # lands, answers late
    channel = channel_for(make_channel, fake_telegram, **UNPACED)
    row = ledger.enqueue(conversation_for(channel), "\n\n".join(PARAGRAPHS[:3]), kind=OutboundKind.REPLY)
    [first] = ledger.claim_due("w1")
    [result] = deliver([first])
    assert result.outcome == Outcome.AMBIGUOUS
    wait_until(lambda: len(fake_telegram.sent_messages()) == 2, message="the late chunk landed after all")
    unknown = OutboundMessage.objects.get(pk=row.pk)
    assert (unknown.chunks_delivered, unknown.chunks_started, unknown.attempts) == (1, 2, 1)
    [again] = claim_later(31)  # after the first back-off
    assert again.needs_marker
    deliver([again])
    assert sent_texts(fake_telegram) == [PARAGRAPHS[0], PARAGRAPHS[1], PREFIX + PARAGRAPHS[1], PARAGRAPHS[2]]


def test_sends_queued_for_a_connection_go_out_unlabelled_once_the_platform_answers(
        make_channel, fake_telegram, settings):
    """Two connections, ten replies, the fake holding every request it gets: the eight
    that wait for a connection past the pool timeout never left — they come back not
    sent, their attempts given back, and go out plain once the fake answers."""
    settings.AGENTLOOP_TELEGRAM_CONNECTIONS = 2
    settings.AGENTLOOP_TELEGRAM_POOL_TIMEOUT = 0.5
    channel = channel_for(make_channel, fake_telegram, **UNPACED)
    rows = [ledger.enqueue(conversation_for(channel, str(500 + i)), f"respuesta {i}", kind=OutboundKind.REPLY)
            for i in range(10)]
    claimed = ledger.claim_due("w1")
    hold = fake_telegram.hold("sendMessage")

    async def each():
        try:
            tasks = [asyncio.create_task(ledger.send(row)) for row in claimed]
            while sum(task.done() for task in tasks) < 8:  # the queued ones give up on the pool
                await asyncio.sleep(0.05)
            hold.release()  # the two held answer
            return await asyncio.gather(*tasks)
        finally:
            await close_bots()

    results = asyncio.run(each())
    assert sorted(r.outcome for r in results) == [Outcome.DELIVERED] * 2 + [Outcome.NOT_SENT] * 8
    ledger.finish_many(list(zip(claimed, results, strict=True)), "w1")
    waiting = OutboundMessage.objects.filter(state=OutboundState.FAILED)
    assert waiting.count() == 8
    assert {(r.attempts, r.flood_waits, r.needs_marker, r.last_outcome) for r in waiting} == \
        {(0, 1, False, Outcome.NOT_SENT)}
    again = claim_later(1.5)
    assert len(again) == 8 and not any(r.needs_marker for r in again)
    deliver(again)
    assert sorted(sent_texts(fake_telegram)) == sorted(f"respuesta {i}" for i in range(10))
    assert all(OutboundMessage.objects.get(pk=r.pk).attempts == 1 for r in rows)


def test_a_refused_connection_is_not_sent_and_a_silent_server_is_ambiguous(make_channel, settings):
    """No server on the port: never left. A server that takes the request and never
    answers: it may have acted."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    refused = make_channel("refused", kind="telegram", platform_settings={
        "bot_token": "78:R", "api_base": f"http://127.0.0.1:{port}", **UNPACED})
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    quiet = make_channel("quiet", kind="telegram", platform_settings={
        "bot_token": "79:Q", "api_base": f"http://127.0.0.1:{silent.getsockname()[1]}", **UNPACED})

    settings.AGENTLOOP_TELEGRAM_READ_TIMEOUT = 0.5

    async def both():
        try:
            return [await transport_for(channel).send_text(Target("1"), "hola") for channel in (refused, quiet)]
        finally:
            await close_bots()

    try:
        first, second = asyncio.run(both())
    finally:
        silent.close()
    assert first.outcome == Outcome.NOT_SENT and "78:R" not in first.error
    assert second.outcome == Outcome.AMBIGUOUS
