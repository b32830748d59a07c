"""OpenTelemetry traces of a message's path, from the real web server and worker processes
to a local OTLP/HTTP collector (tests/fakes/otlp_collector.py: protobuf bodies decoded with
opentelemetry-proto): a burst of two Telegram messages is one trace from the first
webhook's admission span to the send span, the flush linking both admissions; the trace
crosses processes through the traceparents stored on the rows; a resend after a crash
stays in it. A collector that never answers slows no message, and is logged once."""

import time

import pytest

from agentloop.core import traceparent
from conversations.models import InboundMessage, Turn
from delivery import ledger
from delivery.models import OutboundMessage, OutboundState
from tests.conftest import wait_until
from tests.fakes.otlp_collector import OtlpCollector, silent_endpoint
from tests.support.e2e import send, telegram_channel

pytestmark = pytest.mark.e2e
AGENT = {"AGENTLOOP_EXTRA_AGENTS": "scripted=tests.support.agents_for_tests.ScriptedToolAgent"}
CALLS = [{"name": "calendar_create_event", "arguments": {"title": "Psicología", "start_datetime": "2026-12-01T10:00"}}]
TEXTS = ["Agéndame la hora de psicología", "la del martes a las diez"]
# The chat, big as Telegram's are: a whole attribute value equal to it is the chat, never
# a row id (PostgreSQL's sequences are not reset between tests: a row of id 101 was).
CHAT = 7_310_101
PRIVATE = [*TEXTS, "Camila", str(CHAT), "Psicología", "E2E-TOKEN"]  # never on a span


@pytest.fixture
def collector():
    with OtlpCollector() as server:
        yield server


def traced(endpoint, **more):
    """The environment of a traced process: spans exported every 0.1 s (not 5)."""
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100", **more}


def one(spans, name):
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, f"{len(found)} spans {name}: {found}"
    return found[0]


def ids_of(stored):
    trace_id, span_id, _ = traceparent.parse(stored)
    return f"{trace_id:032x}", f"{span_id:016x}"


def names(*wanted):
    return lambda spans: all(sum(s.name == name for s in spans) >= count for name, count in wanted)


def test_a_burst_is_one_trace_from_the_webhook_to_the_send(processes, make_channel, fake_telegram, collector):
    telegram_channel(make_channel, fake_telegram, agent="scripted",
                     agent_config={"tool_calls": CALLS, "model": "scripted-model-1"})
    web = processes.web(wait=False, **traced(collector.url))
    processes.worker(**AGENT, **traced(collector.url))
    for text in TEXTS:
        send(web, "tg", CHAT, text)
    fake_telegram.wait_for("sendMessage", timeout=15)
    spans = collector.wait_for(names(("agentloop.admit", 2), ("agentloop.flush", 1), ("agentloop.turn", 1),
                                     ("agentloop.agent", 1), ("agentloop.tool", 1), ("agentloop.send", 1)))

    admits = sorted((s for s in spans if s.name == "agentloop.admit"), key=lambda s: s.start_ns)
    flush, turn, agent = one(spans, "agentloop.flush"), one(spans, "agentloop.turn"), one(spans, "agentloop.agent")
    tool, sent = one(spans, "agentloop.tool"), one(spans, "agentloop.send")
    first = admits[0]
    # One trace, from the first webhook's admission to the send.
    assert {s.trace_id for s in (first, flush, turn, agent, tool, sent)} == {first.trace_id}
    assert first.parent_span_id == "" and first.kind == "server"
    assert flush.parent_span_id == first.span_id
    assert set(flush.links) == {(a.trace_id, a.span_id) for a in admits}  # both messages merged into it
    assert turn.parent_span_id == flush.span_id
    assert agent.parent_span_id == turn.span_id and agent.kind == "client"
    assert tool.parent_span_id == agent.span_id
    assert sent.parent_span_id == turn.span_id and sent.kind == "client"
    # Each from the process that did it.
    assert {a.resource["agentloop.process"] for a in admits} == {"web"}
    assert {s.resource["agentloop.process"] for s in (flush, turn, agent, tool, sent)} == {"worker"}
    assert first.resource["service.name"] == "agentloop"

    # What each says: ids, counts, outcomes.
    messages = list(InboundMessage.objects.order_by("pk"))
    [row] = OutboundMessage.objects.all()
    the_turn = Turn.objects.get()
    assert [a.attributes["agentloop.message.id"] for a in admits] == [m.pk for m in messages]
    assert {a.attributes["agentloop.admission.disposition"] for a in admits} == {"buffered"}
    assert {a.attributes["agentloop.channel.kind"] for a in admits} == {"telegram"}
    assert flush.attributes["agentloop.turn.messages"] == 2 and flush.attributes["agentloop.turn.id"] == the_turn.pk
    assert flush.attributes["agentloop.flush.reason"] == the_turn.flush_reason
    assert turn.attributes["agentloop.turn.state"] == "done" and turn.attributes["agentloop.turn.replied"] is True
    assert agent.attributes["gen_ai.request.model"] == "scripted-model-1"
    assert agent.attributes["agentloop.agent"] == "scripted"
    assert tool.attributes["agentloop.tool"] == "calendar_create_event"
    assert tool.attributes["agentloop.guard.outcome"] == "executed"
    assert sent.attributes["agentloop.ledger.row"] == row.pk
    assert sent.attributes["agentloop.send.outcome"] == "delivered"
    assert sent.attributes["agentloop.send.labelled"] is False
    assert {s.status for s in spans} == {"unset"}

    # The trace crossed the processes through the rows.
    assert [ids_of(m.traceparent) for m in messages] == [(a.trace_id, a.span_id) for a in admits]
    assert ids_of(the_turn.traceparent) == (flush.trace_id, flush.span_id)
    assert ids_of(row.traceparent) == (turn.trace_id, turn.span_id)
    # Inside any text an attribute holds, or as a whole value.
    said = [value for s in spans for value in s.attributes.values()]
    assert not [private for private in PRIVATE
                if any(private in value for value in said if isinstance(value, str)) or private in map(str, said)]

    # The same call again, in a new message's turn: the guard prevents it, and says so.
    send(web, "tg", CHAT, "¿quedó agendada?")
    fake_telegram.wait_for("sendMessage", count=2, timeout=15)
    spans = collector.wait_for(names(("agentloop.tool", 2), ("agentloop.send", 2)))
    again = [s for s in spans if s.name == "agentloop.tool" and s.span_id != tool.span_id][0]
    assert again.attributes["agentloop.guard.outcome"] == "duplicate_prevented"
    assert again.attributes["agentloop.tool.status"] == "duplicate"
    assert again.trace_id not in (first.trace_id, admits[1].trace_id)  # the third message's trace


def test_a_resend_after_a_crash_stays_in_the_trace_and_says_it_is_labelled(processes, make_channel, fake_telegram,
                                                                            collector):
    telegram_channel(make_channel, fake_telegram)
    web = processes.web(**traced(collector.url))
    hold = fake_telegram.hold("sendMessage")
    worker = processes.worker(**traced(collector.url))
    send(web, "tg", 101, "¿Me confirmas la hora?")
    hold.wait_held(1, timeout=15)  # the platform has the request; no answer yet
    worker.kill()  # its send span never ends: never exported
    hold.release()

    processes.worker(**traced(collector.url))
    fake_telegram.wait_for("sendMessage", count=2, timeout=15)
    wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).exists(), message="delivered")
    assert fake_telegram.calls("sendMessage")[-1].params["text"].startswith(ledger.RECOVERY_PREFIX)
    spans = collector.wait_for(names(("agentloop.send", 1)))
    sent = one(spans, "agentloop.send")
    [row] = OutboundMessage.objects.all()
    assert (sent.trace_id, sent.parent_span_id) == ids_of(row.traceparent)  # the killed worker's turn
    assert sent.trace_id == one(spans, "agentloop.admit").trace_id
    assert sent.attributes["agentloop.send.labelled"] is True
    assert sent.attributes["agentloop.send.attempt"] == 2
    assert sent.resource["process.pid"] != worker.pid


@pytest.fixture
def silent_collector():
    with silent_endpoint() as url:
        yield url


def test_a_collector_that_never_answers_slows_no_message_and_is_said_once(processes, make_channel, fake_telegram,
                                                                          silent_collector):
    telegram_channel(make_channel, fake_telegram, window_closed=0.3, window_neutral=0.3, window_open=0.3)
    # Exports every 0.05 s, each waiting 1 s for an answer that never comes; 16 spans at most queued.
    env = traced(silent_collector, OTEL_BSP_SCHEDULE_DELAY="50", OTEL_EXPORTER_OTLP_TIMEOUT="1",
                 OTEL_BSP_MAX_QUEUE_SIZE="16", OTEL_BSP_MAX_EXPORT_BATCH_SIZE="8")
    web = processes.web(wait=False, **env)
    worker = processes.worker(**env)
    answered, replied = [], []
    for n in range(6):
        started = time.monotonic()
        send(web, "tg", 200 + n, f"mensaje {n}.")
        answered.append(time.monotonic() - started)
        fake_telegram.wait_for("sendMessage", count=n + 1, timeout=15)
        replied.append(time.monotonic() - started)
    # Admission as fast as ever; each reply within its 0.3 s window and a turn.
    assert max(answered) < 0.5, answered
    assert max(replied) < 2.0, replied
    wait_until(lambda: "could not be sent to the collector" in worker.output(), timeout=15,
               message="the worker's export fault logged")
    time.sleep(2.5)  # two more export deadlines pass: still said once
    for process in (web, worker):
        assert process.output().count("could not be sent to the collector") <= 1, process.output()
        assert " opentelemetry." not in process.output()  # no line of the exporter's own
    # A stopping process does not wait for the collector either.
    started = time.monotonic()
    processes.stop_all()
    assert time.monotonic() - started < 8.0
