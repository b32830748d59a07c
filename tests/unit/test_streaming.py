"""The streaming forms of the agents, against the local OpenAI-compatible server driven by
the real openai SDK (no worker: the agent's own iterator), and the small pure parts."""

import asyncio
import json

import pytest

from conversations.agents import AgentUnavailable, Answer, EchoAgent, TurnContext
from conversations.openai_agent import OpenAIAgent
from conversations.platforms.telegram.previews import PREVIEW_MAX_UNITS, shown_text
from conversations.remote_agents import NDJSON, SSE, _stream_item
from delivery import chunks
from tests.fakes.openai_api import Error, FakeOpenAI, Reply, ToolCalls


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setenv("FAKE_OPENAI_API_KEY", "sk-test")
    with FakeOpenAI() as server:
        yield server


def context(fake, calls=None, **config):
    async def call_tool(name, arguments):
        calls.append((name, arguments))
        return {"status": "done", "duplicate": False}

    return TurnContext(turn_id=1, conversation_id=1, channel_slug="tg", text="hola",
                       config={"base_url": fake.url, "model": "fake-model", "api_key_env": "FAKE_OPENAI_API_KEY",
                               "timeout": 5, **config},
                       call_tool=call_tool if calls is not None else None)


def collect(agent, ctx):
    async def run():
        return [item async for item in agent.stream(ctx)]

    return asyncio.run(run())


def test_the_openai_agent_yields_deltas_as_they_come_then_the_answer(fake):
    fake.script(Reply("Hola, ya casi termino.", pace=0.05))
    *deltas, answer = collect(OpenAIAgent(), context(fake))
    assert deltas == ["Hola, ", "ya ", "casi ", "termino."]
    assert answer == Answer("Hola, ya casi termino.")
    assert fake.requests()[0].body["stream"] is True


def test_a_tool_call_runs_once_on_its_whole_arguments_and_the_steps_join(fake):
    event = {"title": "Dentista", "start_datetime": "2026-12-01T10:00"}
    fake.script(ToolCalls([("calendar_create_event", event)], content="Lo agendo."), Reply("Listo."))
    calls = []
    *deltas, answer = collect(OpenAIAgent(), context(fake, calls))
    assert calls == [("calendar_create_event", event)]  # never a partial delta
    assert "".join(deltas) == "Lo agendo.\n\nListo." == answer.text
    second = fake.requests()[1]
    [assistant] = [m for m in second.messages if m["role"] == "assistant"]
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == event


def test_a_provider_error_or_a_stream_cut_short_is_agent_unavailable(fake):
    fake.script(Error(500))
    with pytest.raises(AgentUnavailable, match="provider failed"):
        collect(OpenAIAgent(), context(fake))

    fake.script(Reply("uno dos tres cuatro cinco seis", pace=0.3))

    async def cut():
        got = []
        with pytest.raises(AgentUnavailable):
            async for item in OpenAIAgent().stream(context(fake)):
                got.append(item)
                if len(got) == 1:
                    asyncio.get_running_loop().call_later(0.1, fake.stop)  # the connection dies mid-stream
        return got

    got = asyncio.run(cut())
    # Cut 0.1 s after the first of six words paced 0.3 s apart: on a starved machine (the
    # backfill's idle priority) the cut once landed after the second. What is promised:
    # the words before the cut, then AgentUnavailable, never the whole answer.
    assert got[0] == "uno " and len(got) < 6 and "".join(got) == "uno dos tres cuatro cinco seis"[:len("".join(got))]


def test_stream_false_asks_for_whole_answers(fake):
    assert not OpenAIAgent().streams_for({"stream": False}) and OpenAIAgent().streams_for({})


def test_echo_streams_only_when_paced():
    assert not EchoAgent().streams_for({}) and EchoAgent().streams_for({"stream_pace": 0})
    ctx = TurnContext(turn_id=1, conversation_id=1, channel_slug="c", text="uno  dos tres", config={"stream_pace": 0})

    async def run():
        return [item async for item in EchoAgent().stream(ctx)]

    assert asyncio.run(run()) == ["uno  ", "dos ", "tres", Answer("uno  dos tres")]


def test_a_webhook_stream_line_is_an_object_or_nothing():
    assert _stream_item('{"delta": "a"}', NDJSON) == {"delta": "a"}
    assert _stream_item('data: {"reply": "b"}', SSE) == {"reply": "b"}
    assert _stream_item("data: [DONE]", SSE) == {} and _stream_item(": keep-alive", SSE) == {}
    assert _stream_item("event: delta", SSE) == {} and _stream_item("[1, 2]", NDJSON) == {}
    assert _stream_item("", NDJSON) == {} and _stream_item("{not json", NDJSON) == {}


def test_a_long_preview_shows_its_beginning_within_telegrams_limit():
    assert shown_text("hola") == "hola"
    long = "palabra " * 1000
    shown = shown_text(long)
    assert shown.endswith(" …") and chunks.units(shown) <= PREVIEW_MAX_UNITS + 2 < 4096


@pytest.mark.parametrize("kind", ["ndjson", "json"])
def test_a_webhook_agents_stream_counts_against_the_answer_cap(settings, kind):
    from conversations.remote_agents import WebhookAgent
    from tests.end_to_end.test_streaming_agents import StreamingAgent

    settings.AGENTLOOP_AGENT_MAX_ANSWER_BYTES = 40
    agent = StreamingAgent(kind, pace=0.01)
    try:
        ctx = TurnContext(turn_id=1, conversation_id=1, channel_slug="tg", text="hola",
                          config={"url": agent.url, "timeout": 5})
        with pytest.raises(AgentUnavailable, match="answered more than 40 bytes"):
            collect(WebhookAgent(), ctx)
        settings.AGENTLOOP_AGENT_MAX_ANSWER_BYTES = 10_000
        *deltas, answer = collect(WebhookAgent(), ctx)
    finally:
        agent.close()
    assert answer == Answer("Hola, te respondo por partes.") and len(deltas) == (5 if kind == "ndjson" else 0)
