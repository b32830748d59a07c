"""A local fake of OpenAI's Chat Completions API that speaks the real HTTP protocol.

Tests drive it with the official ``openai`` SDK, so the whole HTTP path
(serialisation, status codes, error envelopes, timeouts) is exercised::

    with FakeOpenAI() as fake:
        fake.script(
            ToolCalls([("calendar_create_event", {"title": "Dentist"})]),
            Reply("Booked."),
        )
        client = openai.AsyncOpenAI(api_key="sk-test", base_url=fake.url, max_retries=0)
        ...                                # run the code under test
        first, second = fake.wait_for(2)
        assert second.messages[-1]["role"] == "tool"

A request with ``stream=True`` gets the same answers as Server-Sent Events, the
chunks the real API sends (``chat.completion.chunk``: a role, content pieces a word
each, tool calls as an id and name then their arguments in pieces, the finish reason,
``data: [DONE]``), ``pace`` seconds apart (the answer's, else ``fake.stream_pace``)::

    fake.script(Reply("Hola, ya casi.", pace=0.5))   # 3 pieces, 1 s of streaming

Each chat completion request takes the next scripted answer when it is
recorded (so answers go to requests in order of arrival, also when requests
are held); an empty script falls back to ``fake.default`` (``Reply("ok")``).

``python -m tests.fakes.openai_api --port N`` runs it in the foreground,
answering every request with the default reply.

Standard library only, so it works anywhere the tests run.
"""

from __future__ import annotations

import argparse
import email.parser
import email.policy
import itertools
import json
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from tests.fakes.server import FakeServer, TrackedHandler

DEFAULT_MODELS = ("fake-model",)

_MODEL_PATH = re.compile(r"^/v1/models/(?P<model>[^/]+)$")

MISSING_KEY_MESSAGE = (
    "You didn't provide an API key. You need to provide your API key in an "
    "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)


# ------------------------------------------------------------------ requests


@dataclass(frozen=True)
class Request:
    """One chat completion request as the fake received it."""

    wall: float  # time.time(), for comparing with timestamps in the product's records
    at: float  # time.monotonic(), for measuring intervals between requests
    model: str
    messages: list[dict[str, Any]]  # as received, e.g. {"role": "tool", "tool_call_id": ...}
    tools: list[dict[str, Any]] | None
    tool_choice: Any  # None when the request did not send it
    body: dict[str, Any]  # the whole JSON body
    headers: dict[str, str]  # names lower-cased

    @property
    def api_key(self) -> str | None:
        """The key from ``Authorization: Bearer <key>``."""
        return _bearer_key(self.headers.get("authorization", ""))

    @property
    def last_message(self) -> dict[str, Any] | None:
        return self.messages[-1] if self.messages else None


# ------------------------------------------------------------------- answers


@dataclass(frozen=True)
class Reply:
    """An assistant message with text content."""

    content: str
    finish_reason: str = "stop"  # "length" simulates a truncated answer
    pace: float | None = None  # streamed: seconds between chunks (None: fake.stream_pace)
    pieces: tuple[str, ...] = ()  # streamed: the content's pieces (default: a word each)


@dataclass(frozen=True)
class ToolCalls:
    """An assistant message calling tools.

    Each call is ``(name, arguments)`` or ``(name, arguments, id)``. A dict of
    arguments is sent JSON-encoded; a str is sent as is (to simulate a model
    producing malformed arguments). Without an id the fake assigns ``call_<n>``.
    """

    calls: list[tuple[Any, ...]]
    content: str | None = None
    pace: float | None = None  # streamed: seconds between chunks (None: fake.stream_pace)


@dataclass(frozen=True)
class Error:
    """An HTTP error with OpenAI's envelope ``{"error": {message, type, param, code}}``."""

    status: int
    message: str | None = None  # None: a message like the real API's for that status
    type: str | None = None  # None: derived from the status
    code: str | None = None  # None: derived from the status (e.g. 429 -> rate_limit_exceeded)
    param: str | None = None
    retry_after: float | None = None  # sent as the retry-after header
    headers: dict[str, str] = field(default_factory=dict)

    def envelope(self) -> dict[str, Any]:
        kind, code, message = _ERROR_DEFAULTS.get(
            self.status,
            ("server_error", None, "The server had an error while processing your request.")
            if self.status >= 500
            else ("invalid_request_error", None, "Bad request."),
        )
        return {
            "error": {
                "message": self.message if self.message is not None else message,
                "type": self.type if self.type is not None else kind,
                "param": self.param,
                "code": self.code if self.code is not None else code,
            }
        }

    def response_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.retry_after is not None:
            value = self.retry_after
            headers["retry-after"] = str(int(value)) if float(value).is_integer() else str(value)
        return headers


@dataclass(frozen=True)
class Delay:
    """Wait `seconds` before answering `then` (None: the default answer).

    The wait is cut short when the fake stops; the request is then left unanswered.
    """

    seconds: float
    then: Answer | None = None


# An answer function receives the recorded Request and returns another answer.
Answer = Reply | ToolCalls | Error | Delay | Callable[[Request], Any]

_ERROR_DEFAULTS: dict[int, tuple[str, str | None, str]] = {
    400: ("invalid_request_error", None, "Bad request."),
    401: ("invalid_request_error", None, "Incorrect API key provided."),
    403: ("invalid_request_error", "unsupported_country_region_territory", "Forbidden."),
    404: ("invalid_request_error", None, "Not found."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached. Please try again later."),
    500: ("server_error", None, "The server had an error while processing your request."),
    503: ("server_error", None, "The engine is currently overloaded, please try again later."),
}


# ---------------------------------------------------------------------- hold


class Hold:
    """Blocks chat completion requests (after they are recorded) until released."""

    def __init__(self, fake: FakeOpenAI):
        self._fake = fake
        self.released = False
        self.held = 0  # requests currently blocked by this hold

    def release(self) -> None:
        """Let every blocked request (and all later ones) through."""
        self._fake._release_hold(self)

    def wait_held(self, count: int = 1, timeout: float = 5.0) -> int:
        """Wait until at least `count` requests are blocked; returns how many."""
        with self._fake._cond:
            if not self._fake._cond.wait_for(lambda: self.held >= count, timeout):
                raise AssertionError(
                    f"expected {count} held chat completion request(s) within "
                    f"{timeout}s, {self.held} held"
                )
            return self.held

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


# -------------------------------------------------------------------- server


class FakeOpenAI(FakeServer):
    """An in-process OpenAI-compatible server on 127.0.0.1.

    Clients use ``openai.OpenAI(api_key="sk-...", base_url=fake.url)``.
    """

    def __init__(
        self,
        port: int = 0,
        *,
        host: str = "127.0.0.1",
        models: Iterable[str] = DEFAULT_MODELS,
        default: Answer | None = None,
        api_keys: Iterable[str] | None = None,
        strict_models: bool = False,
    ):
        super().__init__((host, port), _RequestHandler)
        self._handler_threads: set[threading.Thread] = set()

        self.models = list(models)
        # Answer when the script is empty; may be replaced at any time.
        self._initial_default: Answer = default if default is not None else Reply("ok")
        self.default: Answer = self._initial_default
        # None accepts any non-empty Bearer key; otherwise only these keys.
        self.api_keys: set[str] | None = set(api_keys) if api_keys is not None else None
        # When true, a model not in `models` gets 404 model_not_found, like the real API.
        self.strict_models = strict_models
        # Seconds between streamed chunks when the answer names no pace of its own.
        self.stream_pace = 0.0
        self.streamed_chunks = 0  # chunks written to streaming clients (for tests)
        # When each streamed answer's first content piece was written (time.monotonic()),
        # by the text of the request's last message (the benchmarks' first model token).
        self.first_tokens: dict[str, float] = {}
        self.last_tokens: dict[str, float] = {}  # and its last one

        self._requests: list[Request] = []
        # /v1/audio/transcriptions: what was sent, and what to answer (`transcript`: a
        # text; None answers "(<n> bytes of <file name>)"; an Error answers that error).
        self._transcriptions: list[Transcription] = []
        self.transcript: str | Error | None = None
        self._rejected: list[tuple[int, str]] = []  # (status, message) of refused requests
        self._script: list[Answer] = []
        self._holds: list[Hold] = []
        self._tool_call_ids = itertools.count(1)
        self._response_ids = itertools.count(1)

    # ----------------------------------------------------------------- lifecycle

    @property
    def url(self) -> str:
        """Base URL for the SDK (``base_url=``), ending in /v1."""
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/v1"

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving (held and delayed requests are dropped unanswered), then wait for
        the handler threads to end."""
        if self._stopping.is_set():
            return
        super().stop()
        with self._cond:
            threads = list(self._handler_threads)
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    # ---------------------------------------------------------------- scripting

    def script(self, *answers: Answer) -> None:
        """Append answers to the FIFO queue; each chat completion request takes one."""
        for answer in answers:
            _check_answer(answer)
        with self._cond:
            self._script.extend(answers)

    def scripted(self) -> list[Answer]:
        """Answers not yet taken by a request."""
        with self._cond:
            return list(self._script)

    def hold(self) -> Hold:
        """Block chat completion requests (after recording them) until released."""
        hold = Hold(self)
        with self._cond:
            self._holds.append(hold)
        return hold

    def _release_hold(self, hold: Hold) -> None:
        with self._cond:
            hold.released = True
            if hold in self._holds:
                self._holds.remove(hold)
            self._cond.notify_all()

    # ---------------------------------------------------------------- recording

    def requests(self) -> list[Request]:
        """Recorded chat completion requests, in order of arrival."""
        with self._cond:
            return list(self._requests)

    def transcriptions(self) -> list[Transcription]:
        """Recorded transcription requests, in order of arrival."""
        with self._cond:
            return list(self._transcriptions)

    def rejected(self) -> list[tuple[int, str]]:
        """(status, message) of requests refused before recording (auth, bad JSON, stream)."""
        with self._cond:
            return list(self._rejected)

    def wait_for(self, count: int = 1, timeout: float = 5.0) -> list[Request]:
        """Block until at least `count` requests were recorded; return them all."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._requests) >= count, timeout):
                raise AssertionError(
                    f"expected {count} chat completion request(s) within {timeout}s, "
                    f"got {len(self._requests)}; rejected: {self._rejected}"
                )
            return list(self._requests)

    def clear(self) -> None:
        """Forget recorded and rejected requests (script, default and holds stay)."""
        with self._cond:
            self._requests.clear()
            self._rejected.clear()

    def reset(self) -> None:
        """Forget requests, the script and holds; restore the default answer."""
        with self._cond:
            for hold in self._holds:
                hold.released = True
            self._holds.clear()
            self._requests.clear()
            self._rejected.clear()
            self._script.clear()
            self.default = self._initial_default
            self._cond.notify_all()

    # ------------------------------------------------------- request processing

    def _reject(self, status: int, message: str, **fields: Any) -> tuple[int, dict, dict]:
        with self._cond:
            self._rejected.append((status, message))
            self._cond.notify_all()
        error = Error(status, message, **fields)
        return status, error.envelope(), error.response_headers()

    def _check_auth(self, headers: dict[str, str]) -> tuple[int, dict, dict] | None:
        key = _bearer_key(headers.get("authorization", ""))
        if not key:
            return self._reject(401, MISSING_KEY_MESSAGE)
        if self.api_keys is not None and key not in self.api_keys:
            shown = key[:3] + "*" * 4 + key[-4:] if len(key) > 8 else key
            return self._reject(
                401,
                f"Incorrect API key provided: {shown}. You can find your API key at "
                "https://platform.openai.com/account/api-keys.",
                code="invalid_api_key",
            )
        return None

    def _serve(
        self, verb: str, path: str, headers: dict[str, str], raw: bytes
    ) -> tuple[int, dict, dict] | None:
        """Answer one request as (status, body, headers); None = answer nothing."""
        path = path.rstrip("/") or "/"
        if verb == "POST" and path == "/v1/chat/completions":
            return self._serve_chat(headers, raw)
        if verb == "POST" and path == "/v1/audio/transcriptions":
            return self._check_auth(headers) or self._serve_transcription(headers, raw)
        if verb == "GET" and (path == "/v1/models" or _MODEL_PATH.match(path)):
            return self._check_auth(headers) or self._serve_models(path)
        return self._reject(404, f"Invalid URL ({verb} {path})")

    def _serve_transcription(self, headers: dict[str, str], raw: bytes) -> tuple[int, dict, dict]:
        """Whisper's endpoint: a multipart form with `file` and `model` (required), as the
        real API checks them; JSON {"text": …} back."""
        fields, files = _multipart(headers.get("content-type", ""), raw)
        if "file" not in files:
            return self._reject(400, "Missing required parameter: 'file'.", param="file")
        if not fields.get("model"):
            return self._reject(400, "you must provide a model parameter", param="model")
        name, data = files["file"]
        with self._cond:
            self._transcriptions.append(Transcription(at=time.monotonic(), model=fields["model"], file_name=name,
                                                      data=data, language=fields.get("language", "")))
            answer = self.transcript
            self._cond.notify_all()
        if isinstance(answer, Error):
            return answer.status, answer.envelope(), answer.response_headers()
        return 200, {"text": answer if answer is not None else f"({len(data)} bytes of {name})"}, {}

    def _serve_models(self, path: str) -> tuple[int, dict, dict]:
        match = _MODEL_PATH.match(path)
        if match is None:
            data = [_model_object(name) for name in self.models]
            return 200, {"object": "list", "data": data}, {}
        name = unquote(match["model"])
        if name not in self.models:
            return self._model_not_found(name)
        return 200, _model_object(name), {}

    def _model_not_found(self, name: str) -> tuple[int, dict, dict]:
        return self._reject(
            404,
            f"The model `{name}` does not exist or you do not have access to it.",
            code="model_not_found",
        )

    def _serve_chat(self, headers: dict[str, str], raw: bytes) -> tuple[int, dict, dict] | None:
        refused = self._check_auth(headers)
        if refused:
            return refused
        try:
            body = json.loads(raw)
        except ValueError as error:
            return self._reject(
                400,
                f"We could not parse the JSON body of your request. ({error})",
            )
        if not isinstance(body, dict):
            return self._reject(400, "The JSON body of your request must be an object.")
        model, messages = body.get("model"), body.get("messages")
        if not isinstance(model, str) or not model:
            return self._reject(400, "you must provide a model parameter", param="model")
        if not isinstance(messages, list) or not messages:
            return self._reject(
                400, "Missing required parameter: 'messages'.", param="messages"
            )
        if self.strict_models and model not in self.models:
            return self._model_not_found(model)
        tools = body.get("tools")
        request = Request(
            wall=time.time(),
            at=time.monotonic(),
            model=model,
            messages=messages,
            tools=tools if isinstance(tools, list) else None,
            tool_choice=body.get("tool_choice"),
            body=body,
            headers=headers,
        )
        with self._cond:
            # Recording and taking the answer happen together, so the n-th
            # request to arrive gets the n-th scripted answer.
            self._requests.append(request)
            answer = self._script.pop(0) if self._script else self.default
            self._cond.notify_all()
        if not self._wait_while_held():
            return None
        return self._answer(answer, request)

    def _wait_while_held(self) -> bool:
        """Block while a hold is active; False when the fake is stopping."""
        with self._cond:
            hold = next((h for h in self._holds if not h.released), None)
            if hold is not None:
                hold.held += 1
                self._cond.notify_all()  # wakes wait_held
                self._cond.wait_for(lambda: hold.released or self._stopping.is_set())
                hold.held -= 1
            return not self._stopping.is_set()

    def _answer(self, answer: Any, request: Request) -> tuple[int, dict, dict] | None:
        for _ in range(100):  # answer functions may return further functions
            if isinstance(answer, Delay):
                if self._stopping.wait(answer.seconds):
                    return None
                answer = answer.then if answer.then is not None else self.default
            elif isinstance(answer, Error):
                return answer.status, answer.envelope(), answer.response_headers()
            elif isinstance(answer, (Reply, ToolCalls)):
                with self._cond:
                    number = next(self._response_ids)
                headers = {"x-request-id": f"req_fake{number}"}
                completion = self._completion(answer, request, number)
                if request.body.get("stream"):
                    streamed = Streamed(self, completion, answer)
                    # As the real API: the usage comes last, in a chunk of its own with no
                    # choices, only when the request asked for it.
                    streamed.with_usage = bool((request.body.get("stream_options") or {}).get("include_usage"))
                    streamed.key = str((request.last_message or {}).get("content", ""))
                    return 200, streamed, headers  # type: ignore[return-value]
                return 200, completion, headers
            elif callable(answer):
                try:
                    answer = answer(request)
                except Exception as error:  # the test's answer function is broken
                    return self._internal_error(f"answer function raised {error!r}")
            else:
                return self._internal_error(f"unsupported answer {answer!r}")
        return self._internal_error("answer functions nested too deeply")

    def _internal_error(self, message: str) -> tuple[int, dict, dict]:
        error = Error(500, f"FakeOpenAI: {message}")
        return 500, error.envelope(), {}

    def _completion(
        self, answer: Reply | ToolCalls, request: Request, number: int
    ) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "refusal": None, "annotations": []}
        if isinstance(answer, Reply):
            message["content"] = answer.content
            finish_reason = answer.finish_reason
            output = answer.content
        else:
            message["content"] = answer.content
            message["tool_calls"] = [self._tool_call(call) for call in answer.calls]
            finish_reason = "tool_calls"
            output = json.dumps(message["tool_calls"])
        prompt_tokens = _estimate_tokens(json.dumps(request.messages))
        completion_tokens = _estimate_tokens(output or "")
        return {
            "id": f"chatcmpl-fake{number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
            "service_tier": "default",
            "system_fingerprint": "fp_fake",
        }

    def _tool_call(self, call: tuple[Any, ...]) -> dict[str, Any]:
        name, arguments = call[0], call[1]
        if len(call) > 2:
            call_id = call[2]
        else:
            with self._cond:
                call_id = f"call_{next(self._tool_call_ids)}"
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        return {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }

    # -------------------------------------------------------------- connections

    def _track(self, connection: socket.socket) -> None:
        super()._track(connection)
        with self._cond:
            self._handler_threads.add(threading.current_thread())

    def _untrack(self, connection: socket.socket) -> None:
        super()._untrack(connection)
        with self._cond:
            self._handler_threads.discard(threading.current_thread())


class _RequestHandler(TrackedHandler):
    """Turns HTTP requests into FakeOpenAI calls; holds no state of its own."""

    server: FakeOpenAI

    def do_GET(self) -> None:
        self._dispatch()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET


    def _dispatch(self) -> None:
        body = self._read_body()
        headers = {name.lower(): value for name, value in self.headers.items()}
        outcome = self.server._serve(self.command, urlsplit(self.path).path, headers, body)
        if outcome is None:
            self.close_connection = True  # answer nothing; the socket closes after this
            return
        if isinstance(outcome[1], Streamed):
            self._send_events(outcome[0], outcome[1], outcome[2])
            return
        self._send_json(*outcome)

    def _send_events(self, status: int, streamed: Streamed, headers: dict[str, str]) -> None:
        """Server-Sent Events in HTTP/1.1 chunks, each event flushed as it is due."""
        try:
            self.send_response(status)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            for wait, event in streamed.events():
                if wait and self.server._stopping.wait(wait):
                    self.close_connection = True
                    return
                data = f"data: {event}\n\n".encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
                with self.server._cond:
                    self.server.streamed_chunks += 1
                    if '"content": "' in event and '"content": ""' not in event:
                        self.server.first_tokens.setdefault(streamed.key, time.monotonic())
                        self.server.last_tokens[streamed.key] = time.monotonic()
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True  # the client went away mid-stream (killed, cancelled)

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _read_chunked(self) -> bytes:
        chunks = []
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                # Skip trailers up to the blank line that ends the body.
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            chunks.append(self.rfile.read(size))
            self.rfile.readline()  # the CRLF after each chunk

    def _send_json(self, status: int, payload: dict[str, Any], headers: dict[str, str]) -> None:
        data = json.dumps(payload).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True  # the client gave up waiting; nothing to do


# ------------------------------------------------------------------- helpers


class Streamed:
    """A completion as the chunks the real API streams (`stream=True`)."""

    def __init__(self, fake: FakeOpenAI, completion: dict[str, Any], answer: Reply | ToolCalls):
        self.completion = completion
        self.answer = answer
        self.key = ""  # the request's last message (FakeOpenAI.first_tokens)
        self.with_usage = False  # stream_options.include_usage
        self.pace = answer.pace if answer.pace is not None else fake.stream_pace

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> str:
        base = {key: self.completion[key] for key in ("id", "created", "model", "system_fingerprint")}
        return json.dumps({**base, "object": "chat.completion.chunk",
                           "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                        "finish_reason": finish_reason}]})

    def events(self) -> Iterable[tuple[float, str]]:
        """(seconds to wait before it, event): the pace falls between the pieces."""
        choice = self.completion["choices"][0]
        message = choice["message"]
        yield 0.0, self._chunk({"role": "assistant", "content": "", "refusal": None})
        content = message.get("content") or ""
        pieces = getattr(self.answer, "pieces", ()) or re.findall(r"\s*\S+\s*", content)
        deltas = [{"content": piece} for piece in pieces]
        for index, call in enumerate(message.get("tool_calls") or []):
            deltas.append({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                           "function": {"name": call["function"]["name"], "arguments": ""}}]})
            arguments = call["function"]["arguments"]
            third = max(1, len(arguments) // 3)
            for start in range(0, len(arguments), third):  # a partial JSON in each piece
                deltas.append({"tool_calls": [{"index": index,
                                               "function": {"arguments": arguments[start:start + third]}}]})
        for number, delta in enumerate(deltas):
            yield (self.pace if number else 0.0), self._chunk(delta)
        yield 0.0, self._chunk({}, choice["finish_reason"])
        if self.with_usage:
            yield 0.0, json.dumps({**json.loads(self._chunk({})), "choices": [], "usage": self.completion["usage"]})
        yield 0.0, "[DONE]"


@dataclass
class Transcription:
    at: float
    model: str
    file_name: str
    data: bytes
    language: str = ""


def _multipart(content_type: str, body: bytes) -> tuple[dict[str, str], dict[str, tuple[str, bytes]]]:
    """A multipart/form-data body as its fields and its files ({name: (file name, bytes)})."""
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    fields: dict[str, str] = {}
    files: dict[str, tuple[str, bytes]] = {}
    if not message.is_multipart():
        return fields, files
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True) or b""
        if name and part.get_filename() is not None:
            files[name] = (part.get_filename(), payload)
        elif name:
            fields[name] = payload.decode("utf-8", "replace")
    return fields, files


def _bearer_key(authorization: str) -> str | None:
    scheme, _, key = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        return None
    return key.strip()


def _check_answer(answer: Any) -> None:
    if isinstance(answer, (Reply, ToolCalls, Error, Delay)) or callable(answer):
        return
    raise TypeError(f"not a FakeOpenAI answer: {answer!r}")


def _estimate_tokens(text: str) -> int:
    """Roughly four characters a token, like the usual rule of thumb."""
    return max(1, len(text) // 4)


def _model_object(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 1700000000, "owned_by": "fake-openai"}


# ---------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a fake OpenAI Chat Completions server.")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--model", action="append", default=[], help="known model (repeatable)")
    parser.add_argument("--reply", default="ok", help="text of every answer")
    args = parser.parse_args(argv)

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())

    with FakeOpenAI(
        args.port, host=args.host, models=args.model or DEFAULT_MODELS, default=Reply(args.reply)
    ) as fake:
        # One line, flushed: whoever started us reads it to learn the URL.
        print(fake.url, flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
