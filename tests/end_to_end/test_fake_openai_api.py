"""The OpenAI Chat Completions fake, driven by the official openai SDK.

Every test talks HTTP to a real server on 127.0.0.1; nothing is mocked.
These tests need no database.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai
import pytest

from tests.fakes.openai_api import Delay, Error, FakeOpenAI, Reply, Request, ToolCalls
from tests.support import local_http

KEY = "sk-test-key"
ROOT = Path(__file__).resolve().parents[2]

CALENDAR_TOOL = {
    "type": "function",
    "function": {
        "name": "calendar_create_event",
        "description": "Create a calendar event.",
        "parameters": {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "start": {"type": "string", "format": "date-time"},
            },
            "required": ["title", "start"],
        },
    },
}


@pytest.fixture
def fake():
    with FakeOpenAI() as server:
        yield server


def client(fake: FakeOpenAI, **kwargs) -> openai.OpenAI:
    kwargs.setdefault("api_key", KEY)
    kwargs.setdefault("max_retries", 0)
    return openai.OpenAI(base_url=fake.url, **kwargs)


def async_client(fake: FakeOpenAI, **kwargs) -> openai.AsyncOpenAI:
    kwargs.setdefault("api_key", KEY)
    kwargs.setdefault("max_retries", 0)
    return openai.AsyncOpenAI(base_url=fake.url, **kwargs)


def ask(sdk: openai.OpenAI, text: str, **kwargs):
    return sdk.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": text}], **kwargs
    )


# --------------------------------------------------------------------- replies


def test_scripted_text_reply_and_recorded_request(fake):
    fake.script(Reply("Hello from the fake"))
    before = time.time()
    with client(fake) as sdk:
        completion = sdk.chat.completions.create(
            model="fake-model",
            messages=[
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Hi"},
            ],
            temperature=0.2,
        )
    after = time.time()

    assert completion.object == "chat.completion"
    assert completion.id.startswith("chatcmpl-")
    assert completion.model == "fake-model"
    assert completion._request_id and completion._request_id.startswith("req_fake")
    [choice] = completion.choices
    assert choice.index == 0
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant"
    assert choice.message.content == "Hello from the fake"
    assert choice.message.tool_calls is None
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens

    [request] = fake.requests()
    assert isinstance(request, Request)
    assert request.model == "fake-model"
    assert request.messages == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
    ]
    assert request.tools is None and request.tool_choice is None
    assert request.body["temperature"] == 0.2
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.api_key == KEY
    assert before <= request.wall <= after


def test_empty_script_uses_default_answer(fake):
    with client(fake) as sdk:
        assert ask(sdk, "one").choices[0].message.content == "ok"
        fake.default = Reply("changed default")
        assert ask(sdk, "two").choices[0].message.content == "changed default"
        fake.script(Reply("scripted"))
        assert ask(sdk, "three").choices[0].message.content == "scripted"
        assert ask(sdk, "four").choices[0].message.content == "changed default"
    assert fake.scripted() == []


def test_default_answer_from_constructor_and_length_finish_reason():
    with FakeOpenAI(default=Reply("cut", finish_reason="length")) as fake, client(fake) as sdk:
        choice = ask(sdk, "long story").choices[0]
    assert (choice.message.content, choice.finish_reason) == ("cut", "length")


def test_async_client_text_reply(fake):
    fake.script(Reply("async hello"))

    async def scenario():
        async with async_client(fake) as sdk:
            return await sdk.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "hey"}]
            )

    completion = asyncio.run(scenario())
    assert completion.choices[0].message.content == "async hello"
    [request] = fake.wait_for(1)
    assert request.last_message == {"role": "user", "content": "hey"}


# ------------------------------------------------------------------ tool calls


def test_tool_call_round_trip_with_async_client(fake):
    fake.script(
        ToolCalls(
            [("calendar_create_event", {"title": "Dentist", "start": "2030-03-01T10:00:00"})]
        ),
        Reply("Booked the dentist."),
    )

    async def scenario():
        async with async_client(fake) as sdk:
            messages = [{"role": "user", "content": "Book the dentist on 1 March at 10"}]
            first = await sdk.chat.completions.create(
                model="fake-model", messages=messages, tools=[CALENDAR_TOOL], tool_choice="auto"
            )
            message = first.choices[0].message
            call = message.tool_calls[0]
            arguments = json.loads(call.function.arguments)
            messages.append(message.model_dump(exclude_none=True))
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"id": 42})}
            )
            second = await sdk.chat.completions.create(
                model="fake-model", messages=messages, tools=[CALENDAR_TOOL]
            )
            return first, call, arguments, second

    first, call, arguments, second = asyncio.run(scenario())

    assert first.choices[0].finish_reason == "tool_calls"
    assert first.choices[0].message.content is None
    assert call.id == "call_1"
    assert call.type == "function"
    assert call.function.name == "calendar_create_event"
    assert arguments == {"title": "Dentist", "start": "2030-03-01T10:00:00"}
    assert second.choices[0].message.content == "Booked the dentist."

    sent_first, sent_second = fake.wait_for(2)
    assert sent_first.tools == [CALENDAR_TOOL]
    assert sent_first.tool_choice == "auto"
    assert sent_first.messages == [
        {"role": "user", "content": "Book the dentist on 1 March at 10"}
    ]
    assistant, tool = sent_second.messages[-2:]
    assert assistant["role"] == "assistant"
    assert assistant["tool_calls"][0]["id"] == "call_1"
    assert assistant["tool_calls"][0]["function"]["name"] == "calendar_create_event"
    assert tool == {"role": "tool", "tool_call_id": "call_1", "content": '{"id": 42}'}
    assert sent_second.tools == [CALENDAR_TOOL]
    assert sent_second.tool_choice is None


def test_several_tool_calls_with_content_explicit_ids_and_raw_arguments(fake):
    fake.script(
        ToolCalls(
            [
                ("calendar_create_event", {"title": "A"}),
                ("calendar_create_event", {"title": "B"}, "call_custom"),
                ("calendar_create_event", '{"title": "broken'),
            ],
            content="Let me do that.",
        ),
        ToolCalls([("calendar_create_event", {})]),
    )
    with client(fake) as sdk:
        first = ask(sdk, "two events", tools=[CALENDAR_TOOL]).choices[0].message
        second = ask(sdk, "again", tools=[CALENDAR_TOOL]).choices[0].message

    assert first.content == "Let me do that."
    assert [c.id for c in first.tool_calls] == ["call_1", "call_custom", "call_2"]
    assert json.loads(first.tool_calls[0].function.arguments) == {"title": "A"}
    assert first.tool_calls[2].function.arguments == '{"title": "broken'
    assert [c.id for c in second.tool_calls] == ["call_3"]
    assert second.tool_calls[0].function.arguments == "{}"


# ---------------------------------------------------------------------- errors


def test_error_500_raises_internal_server_error(fake):
    fake.script(Error(500, "boom"), Reply("recovered"))
    with client(fake) as sdk:
        with pytest.raises(openai.InternalServerError) as caught:
            ask(sdk, "hi")
        assert ask(sdk, "again").choices[0].message.content == "recovered"
    assert caught.value.status_code == 500
    assert caught.value.type == "server_error"
    assert caught.value.body == {
        "message": "boom",
        "type": "server_error",
        "param": None,
        "code": None,
    }
    assert len(fake.requests()) == 2


def test_error_429_raises_rate_limit_error_with_retry_after(fake):
    fake.script(Error(429, "Rate limit reached for fake-model", retry_after=7))
    with client(fake) as sdk, pytest.raises(openai.RateLimitError) as caught:
        ask(sdk, "hi")
    assert caught.value.status_code == 429
    assert caught.value.code == "rate_limit_exceeded"
    assert caught.value.response.headers["retry-after"] == "7"
    assert "Rate limit reached" in caught.value.message


def test_other_error_statuses_map_to_sdk_exceptions(fake):
    fake.script(Error(400, "bad", param="messages"), Error(503), Error(404))
    with client(fake) as sdk:
        with pytest.raises(openai.BadRequestError) as bad:
            ask(sdk, "1")
        with pytest.raises(openai.InternalServerError) as overloaded:
            ask(sdk, "2")
        with pytest.raises(openai.NotFoundError):
            ask(sdk, "3")
    assert bad.value.param == "messages"
    assert overloaded.value.status_code == 503


def test_sdk_retries_a_500_when_retries_are_enabled(fake):
    # retry-after-ms keeps the SDK from its ~0.5 s default backoff.
    fake.script(Error(500, headers={"retry-after-ms": "10"}), Reply("second try"))
    with client(fake, max_retries=1) as sdk:
        assert ask(sdk, "hi").choices[0].message.content == "second try"
    assert len(fake.requests()) == 2


def test_missing_authorization_is_401_envelope(fake):
    response = local_http.post(
        f"{fake.url}/chat/completions",
        json={"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 401
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code"}
    assert error["type"] == "invalid_request_error"
    assert "API key" in error["message"]
    assert fake.requests() == []
    assert [status for status, _ in fake.rejected()] == [401]


def test_unknown_api_key_raises_authentication_error():
    with FakeOpenAI(api_keys=["sk-good"]) as fake:
        with client(fake, api_key="sk-bad-key-123") as sdk:
            with pytest.raises(openai.AuthenticationError) as caught:
                ask(sdk, "hi")
        with client(fake, api_key="sk-good") as sdk:
            assert ask(sdk, "hi").choices[0].message.content == "ok"
    assert caught.value.status_code == 401
    assert caught.value.code == "invalid_api_key"
    assert len(fake.requests()) == 1


def test_malformed_json_and_unknown_path_are_400_and_404(fake):
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    response = local_http.post(f"{fake.url}/chat/completions", content=b"{not json", headers=headers)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"

    response = local_http.post(f"{fake.url}/chat/completions", json={"model": "x"}, headers=headers)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages"

    response = local_http.post(f"{fake.url}/responses", json={}, headers=headers)
    assert response.status_code == 404
    assert "Invalid URL" in response.json()["error"]["message"]
    assert fake.requests() == []


def test_a_streamed_reply_is_server_sent_chunks_at_the_chosen_pace(fake):
    fake.script(Reply("Hola, ya casi termino.", pace=0.2))
    with client(fake) as sdk:
        began = time.monotonic()
        arrived = []
        for chunk in ask(sdk, "hi", stream=True):
            arrived.append((time.monotonic() - began, chunk))
    deltas = [(at, c.choices[0].delta.content) for at, c in arrived if c.choices[0].delta.content]
    assert "".join(text for _, text in deltas) == "Hola, ya casi termino."
    assert [text for _, text in deltas] == ["Hola, ", "ya ", "casi ", "termino."]
    assert all(c.object == "chat.completion.chunk" for _, c in arrived)
    assert arrived[-1][1].choices[0].finish_reason == "stop"
    # Paced: the four pieces 0.2 s apart, the first at once.
    assert deltas[0][0] < 0.15 and 0.55 <= deltas[-1][0] < 1.2
    [request] = fake.requests()
    assert request.body["stream"] is True


def test_streamed_tool_calls_assemble_as_the_sdk_assembles_them(fake):
    fake.script(ToolCalls([("calendar_create_event", {"title": "Dentist", "start": "2026-12-01T10:00"})],
                          content="Booking it."))
    async def run():
        async with async_client(fake) as sdk, sdk.chat.completions.stream(
                model="fake-model", messages=[{"role": "user", "content": "book"}], tools=[CALENDAR_TOOL]) as stream:
            partial = [event async for event in stream if event.type == "tool_calls.function.arguments.delta"]
            return partial, await stream.get_final_completion()

    partial, final = asyncio.run(run())
    assert len(partial) >= 2  # the arguments arrived in pieces
    message = final.choices[0].message
    assert message.content == "Booking it." and final.choices[0].finish_reason == "tool_calls"
    [call] = message.tool_calls
    assert call.function.name == "calendar_create_event" and call.id == "call_1"
    assert json.loads(call.function.arguments) == {"title": "Dentist", "start": "2026-12-01T10:00"}


def test_a_client_gone_mid_stream_leaves_the_fake_serving(fake):
    fake.script(Reply("one two three four five six", pace=0.3))
    with client(fake) as sdk:
        stream = ask(sdk, "hi", stream=True)
        next(iter(stream))
        stream.close()  # the client hangs up mid-stream
    assert ask(client(fake), "again").choices[0].message.content == "ok"


def test_strict_models_refuses_unknown_model():
    with FakeOpenAI(strict_models=True) as fake, client(fake) as sdk:
        with pytest.raises(openai.NotFoundError) as caught:
            sdk.chat.completions.create(
                model="gpt-unknown", messages=[{"role": "user", "content": "hi"}]
            )
        assert ask(sdk, "hi").choices[0].message.content == "ok"
    assert caught.value.code == "model_not_found"


# ---------------------------------------------------------------------- delays


def test_delay_longer_than_client_timeout_raises_api_timeout_error(fake):
    fake.script(Delay(2, then=Reply("too late")), Reply("on time"))

    async def scenario():
        async with async_client(fake, timeout=0.5) as sdk:
            started = time.monotonic()
            with pytest.raises(openai.APITimeoutError):
                await sdk.chat.completions.create(
                    model="fake-model", messages=[{"role": "user", "content": "slow"}]
                )
            waited = time.monotonic() - started
            later = await sdk.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "fast"}]
            )
            return waited, later

    waited, later = asyncio.run(scenario())
    assert 0.4 <= waited < 1.5
    assert later.choices[0].message.content == "on time"
    assert [r.last_message["content"] for r in fake.requests()] == ["slow", "fast"]


def test_short_delay_answers_after_waiting(fake):
    fake.script(Delay(0.3, then=Reply("patience")))
    with client(fake) as sdk:
        started = time.monotonic()
        completion = ask(sdk, "hi")
        elapsed = time.monotonic() - started
    assert completion.choices[0].message.content == "patience"
    assert elapsed >= 0.3


# ------------------------------------------------------------ answer functions


def test_answer_functions_see_the_request(fake):
    def echo(request: Request):
        return Reply(f"echo: {request.last_message['content']} ({request.model})")

    fake.script(echo, lambda request: Error(429), lambda request: 1 / 0)
    with client(fake) as sdk:
        assert ask(sdk, "ping").choices[0].message.content == "echo: ping (fake-model)"
        with pytest.raises(openai.RateLimitError):
            ask(sdk, "again")
        with pytest.raises(openai.InternalServerError) as caught:
            ask(sdk, "broken")
    assert "ZeroDivisionError" in caught.value.message


def test_script_rejects_non_answers(fake):
    with pytest.raises(TypeError):
        fake.script("just a string")


# ---------------------------------------------------------------------- models


def test_models_list_and_retrieve():
    with FakeOpenAI(models=["fake-model", "fake-mini"]) as fake, client(fake) as sdk:
        listed = [model.id for model in sdk.models.list()]
        retrieved = sdk.models.retrieve("fake-mini")
        with pytest.raises(openai.NotFoundError):
            sdk.models.retrieve("gpt-nope")
    assert listed == ["fake-model", "fake-mini"]
    assert retrieved.id == "fake-mini" and retrieved.object == "model"
    assert fake.requests() == []  # only chat completions are recorded


def test_default_models_list(fake):
    with client(fake) as sdk:
        assert [model.id for model in sdk.models.list()] == ["fake-model"]


# ------------------------------------------------------------- hold, concurrency


def test_hold_blocks_until_released(fake):
    fake.script(Reply("released"))
    results: list = []
    done = threading.Event()

    with client(fake) as sdk:

        def call():
            try:
                results.append(ask(sdk, "wait for me").choices[0].message.content)
            except Exception as error:  # surfaced by the assertion below
                results.append(error)
            done.set()

        hold = fake.hold()
        worker = threading.Thread(target=call)
        worker.start()
        assert hold.wait_held(1) == 1
        [request] = fake.requests()  # recorded before being held
        assert request.last_message["content"] == "wait for me"
        assert not done.is_set()
        hold.release()
        worker.join(5)

    assert results == ["released"]


def test_hold_as_context_manager_and_wait_held_timeout(fake):
    with fake.hold() as hold:
        with pytest.raises(AssertionError, match="expected 1 held"):
            hold.wait_held(1, timeout=0.05)
    with client(fake) as sdk:
        assert ask(sdk, "after release").choices[0].message.content == "ok"


def test_concurrent_requests_get_answers_in_order_of_arrival(fake):
    count = 8
    fake.script(*(Reply(f"answer-{n}") for n in range(count)))
    results: dict[str, str] = {}
    hold = fake.hold()

    with client(fake) as sdk:

        def call(question: str):
            results[question] = ask(sdk, question).choices[0].message.content

        threads = [threading.Thread(target=call, args=(f"q-{n}",)) for n in range(count)]
        for thread in threads:
            thread.start()
        hold.wait_held(count)  # all in flight at once
        hold.release()
        for thread in threads:
            thread.join(5)

    arrived = [request.last_message["content"] for request in fake.wait_for(count)]
    assert sorted(arrived) == sorted(results) and len(results) == count
    assert [results[question] for question in arrived] == [f"answer-{n}" for n in range(count)]


def test_concurrent_async_requests_all_answered(fake):
    fake.script(*(Reply(f"a{n}") for n in range(5)))

    async def scenario():
        async with async_client(fake) as sdk:
            return await asyncio.gather(
                *(
                    sdk.chat.completions.create(
                        model="fake-model", messages=[{"role": "user", "content": f"q{n}"}]
                    )
                    for n in range(5)
                )
            )

    completions = asyncio.run(scenario())
    assert sorted(c.choices[0].message.content for c in completions) == [f"a{n}" for n in range(5)]
    assert len(fake.requests()) == 5


# ------------------------------------------------------------ recording helpers


def test_wait_for_times_out_with_clear_message(fake):
    with pytest.raises(AssertionError, match=r"expected 1 chat completion request\(s\)"):
        fake.wait_for(1, timeout=0.05)


def test_requests_returns_a_copy_and_clear_forgets(fake):
    fake.script(Reply("kept"))
    hold = fake.hold()
    hold.release()
    with client(fake) as sdk:
        ask(sdk, "first")
        snapshot = fake.requests()
        snapshot.clear()
        assert len(fake.requests()) == 1
        fake.clear()
        assert fake.requests() == []
        ask(sdk, "second")
    assert [r.last_message["content"] for r in fake.requests()] == ["second"]


def test_reset_forgets_script_and_restores_default(fake):
    fake.script(Reply("never used"))
    fake.default = Reply("custom")
    fake.reset()
    assert fake.scripted() == []
    with client(fake) as sdk:
        assert ask(sdk, "hi").choices[0].message.content == "ok"


# -------------------------------------------------------------------- shutdown


def test_stop_is_prompt_with_held_and_delayed_requests():
    fake = FakeOpenAI().start()
    port = fake.server_address[1]
    fake.script(Delay(30, then=Reply("never")))
    outcomes: list = []

    def call(sdk: openai.OpenAI, text: str):
        try:
            outcomes.append(ask(sdk, text))
        except Exception as error:
            outcomes.append(error)

    try:
        with client(fake, timeout=20) as sdk:
            delayed = threading.Thread(target=call, args=(sdk, "delayed"))
            delayed.start()
            fake.wait_for(1)
            hold = fake.hold()
            held = threading.Thread(target=call, args=(sdk, "held"))
            held.start()
            hold.wait_held(1)

            started = time.monotonic()
            with fake:  # __exit__ stops it
                pass
            stopped_in = time.monotonic() - started
            delayed.join(5)
            held.join(5)
    finally:
        fake.stop()  # no-op once stopped

    assert stopped_in < 2
    assert not delayed.is_alive() and not held.is_alive()
    assert len(outcomes) == 2
    for outcome in outcomes:
        assert isinstance(outcome, openai.APIConnectionError)
        assert not isinstance(outcome, openai.APITimeoutError)
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass


def test_command_line_server_answers_sdk_requests():
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.openai_api", "--port", "0", "--reply", "from cli"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        with openai.OpenAI(api_key=KEY, base_url=url, max_retries=0) as sdk:
            completion = sdk.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "hi"}]
            )
        assert completion.choices[0].message.content == "from cli"
    finally:
        process.terminate()
        assert process.wait(10) == 0
        process.stdout.close()
