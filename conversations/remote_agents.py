"""Agents that live in another service.

`webhook`: the merged turn is POSTed to the agent's URL, signed as callbacks are (see
`delivery.signing`: `X-Agentloop-Timestamp`, and `X-Agentloop-Signature: sha256=…` an
HMAC-SHA256 over "<timestamp>.<body>", key `secret` in the channel's agent_config).
A 200 answer with `{"reply": "…"}` is the reply (or a stream of `{"delta": "…"}`
objects ending with that one, as newline-delimited JSON or Server-Sent Events:
`WebhookAgent.stream`, docs/streaming.md) (with `"files": [{"name", "data"
(base64), "caption"}]` it carries files, sent after the text through the ledger); a 202 (or 200 without a reply) hands
the turn over: the agent answers later through the API (`POST /api/v1/turns/<id>/reply`,
then `/done`), with an agent key for the channel. agent_config: `url`, `secret`,
`timeout` (default 30 s, for the whole exchange). The burst's files come as `media`:
each file's facts, its transcript or why it was not read, and a signed link to its
bytes (`url`, relative like `reply_url`, expiring after AGENTLOOP_MEDIA_URL_TTL).

`pull`: the worker never runs these turns; an external agent lists the ready ones,
claims one, replies and marks it done through the API. A claimed turn not finished
within AGENTLOOP_EXTERNAL_TURN_TIMEOUT is released to be claimed again.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings

from agentloop.core.tls import shared_tls_context
from conversations.agents import (
    Agent,
    AgentUnavailable,
    Answer,
    File,
    HandedOver,
    JsonObject,
    TurnContext,
    answer_of,
)
from conversations.media import for_agents
from delivery import signing

# A streamed answer (the agent's choice, by its Content-Type): newline-delimited JSON, or
# Server-Sent Events whose `data:` lines carry the same objects.
NDJSON, SSE = "application/x-ndjson", "text/event-stream"
STREAM_ACCEPT = f"{NDJSON}, {SSE};q=0.9, application/json;q=0.8"


class WebhookAgent(Agent):
    def streams_for(self, config: JsonObject) -> bool:
        return True  # the agent chooses: a stream, or one JSON answer (no previews then)

    async def respond(self, ctx: TurnContext) -> str | Answer:
        url, body, headers = await self._request(ctx)
        host, timeout = _host(url), float(ctx.config.get("timeout", 30))
        limit = settings.AGENTLOOP_AGENT_MAX_ANSWER_BYTES
        try:
            # One deadline for the whole exchange: httpx's timeouts are per phase, and an
            # agent trickling a byte a second would never trip them.
            status, content = await asyncio.wait_for(self._post(url, body, headers, timeout, limit), timeout)
        except AnswerTooLarge as exc:
            raise _too_large(host, limit) from exc
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise AgentUnavailable(f"the agent at {host} did not answer within {timeout:g} s") from exc
        except httpx.HTTPError as exc:
            raise AgentUnavailable(f"the agent at {host} could not be reached: {type(exc).__name__}") from exc
        return _answer_of(status, content, host)

    async def stream(self, ctx: TurnContext) -> AsyncIterator[str | Answer]:
        """The same request, accepting a stream: `{"delta": "…"}` objects as the agent
        writes, then `{"reply": "…", "files": […]}` (the whole reply, what the ledger
        sends), one per line (NDJSON) or per `data:` line (SSE). A JSON answer is taken
        as `respond` takes it. A stream counts against AGENTLOOP_AGENT_MAX_ANSWER_BYTES
        as a whole answer does."""
        url, body, headers = await self._request(ctx)
        host, timeout = _host(url), float(ctx.config.get("timeout", 30))
        limit = settings.AGENTLOOP_AGENT_MAX_ANSWER_BYTES
        headers["Accept"] = STREAM_ACCEPT
        try:
            async with asyncio.timeout(timeout), httpx.AsyncClient(
                    timeout=timeout, verify=shared_tls_context()) as client, client.stream(
                    "POST", url, content=body, headers=headers) as response:
                kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
                if response.status_code == 200 and kind in (NDJSON, SSE):
                    final = None
                    async for line in lines_at_most(response, limit):
                        item = _stream_item(line, kind)
                        if isinstance(item.get("delta"), str):
                            yield item["delta"]
                        elif "reply" in item or "files" in item:
                            final = item
                    if final is None:
                        raise AgentUnavailable(f"the agent at {host} ended its stream without a reply")
                    yield answer_of(_answer_of(200, json.dumps(final).encode(), host))
                    return
                status, content = response.status_code, await read_at_most(response, limit)
        except AnswerTooLarge as exc:
            raise _too_large(host, limit) from exc
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise AgentUnavailable(f"the agent at {host} did not answer within {timeout:g} s") from exc
        except httpx.HTTPError as exc:
            raise AgentUnavailable(f"the agent at {host} could not be reached: {type(exc).__name__}") from exc
        yield answer_of(_answer_of(status, content, host))

    @staticmethod
    async def _request(ctx: TurnContext) -> tuple[str, bytes, dict[str, str]]:
        config = ctx.config
        if not config.get("url"):
            raise AgentUnavailable("the channel's webhook agent has no url configured")
        history = await ctx.load_history() if ctx.load_history is not None else []
        body = json.dumps({
            "turn": ctx.turn_id, "conversation": ctx.conversation_id, "channel": ctx.channel_slug,
            "contact": ctx.contact_name, "text": ctx.text, "history": history,
            "media": [for_agents.for_remote(item) for item in ctx.media],
            "reply_url": f"/api/v1/turns/{ctx.turn_id}/reply", "done_url": f"/api/v1/turns/{ctx.turn_id}/done",
        }, ensure_ascii=False).encode()
        headers = {"Content-Type": "application/json", "X-Agentloop-Turn": str(ctx.turn_id)}
        if config.get("secret"):
            headers.update(signing.signed_headers(config["secret"], body))
        return config["url"], body, headers

    @staticmethod
    async def _post(url: str, body: bytes, headers: dict[str, str], timeout: float, limit: int) -> tuple[int, bytes]:
        async with httpx.AsyncClient(timeout=timeout, verify=shared_tls_context()) as client:
            async with client.stream("POST", url, content=body, headers=headers) as response:
                return response.status_code, await read_at_most(response, limit)


class AnswerTooLarge(Exception):
    pass


async def read_at_most(response: httpx.Response, limit: int) -> bytes:
    """The answer's body, read as it streams in; past `limit` bytes reading stops (the
    connection is dropped): a service must not make a worker hold its whole answer."""
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > limit:
        raise AnswerTooLarge(declared)
    chunks, size = [], 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise AnswerTooLarge(size)
        chunks.append(chunk)
    return b"".join(chunks)


async def lines_at_most(response: httpx.Response, limit: int) -> AsyncIterator[str]:
    """A streamed answer's lines as they arrive, its bytes counted as they arrive: past
    `limit` in all, AnswerTooLarge (the connection is dropped). Not httpx's aiter_lines,
    which holds a line until its newline comes: a stream that never ends its line would
    grow the worker's memory until the agent's timeout. A line is at most the limit too."""
    pending, size = bytearray(), 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise AnswerTooLarge(size)
        start = len(pending)
        pending += chunk
        while (end := pending.find(b"\n", start)) >= 0:
            yield pending[:end].decode("utf-8", "replace").rstrip("\r")
            del pending[:end + 1]
            start = 0
    if pending:
        yield pending.decode("utf-8", "replace").rstrip("\r")


def _too_large(host: str, limit: int) -> AgentUnavailable:
    return AgentUnavailable(f"the agent at {host} answered more than {limit} bytes "
                            f"(AGENTLOOP_AGENT_MAX_ANSWER_BYTES): not read further")


def _host(url: str) -> str:
    """Errors name the agent's host only: its URL may carry a key (…/hook?key=…)."""
    return urlsplit(url).netloc.rpartition("@")[2]


def _stream_item(line: str, kind: str) -> JsonObject:
    """One line of a stream as an object ({} for anything else: blank lines, SSE comments
    and event names, `[DONE]`, what does not parse)."""
    line = line.strip()
    if kind == SSE:
        if not line.startswith("data:"):
            return {}
        line = line[len("data:"):].strip()
    try:
        item = json.loads(line) if line else {}
    except ValueError:
        return {}
    return item if isinstance(item, dict) else {}


def _answer_of(status: int, content: bytes, host: str) -> str | Answer:
    if status == 202:
        raise HandedOver()
    if status >= 300:
        raise AgentUnavailable(f"the agent at {host} answered HTTP {status}")
    try:
        answer = json.loads(content) if content else {}
        reply, files = answer.get("reply"), answer.get("files") or []
    except (ValueError, AttributeError) as exc:
        raise AgentUnavailable(f"the agent at {host} answered something that is not a JSON object") from exc
    if not reply and not files:
        raise HandedOver()
    if not files:
        return str(reply)
    return Answer(str(reply or ""), files_from_json(files))


def files_from_json(values: Any) -> tuple[File, ...]:  # an agent's JSON: checked here
    """An agent's `files` (`[{"name", "data": base64, "caption"}]`) as Files; one whose
    data is not base64 has none (conversations.media.outbound refuses it, in the reply)."""
    if not isinstance(values, list):
        values = [values]
    found = []
    for value in values:
        value = value if isinstance(value, dict) else {}
        try:
            data = base64.b64decode(value.get("data") or "", validate=True) or None
        except (ValueError, TypeError):
            data = None
        found.append(File(name=str(value.get("name") or "file"), data=data, caption=str(value.get("caption") or "")))
    return tuple(found)


class PullAgent(Agent):
    """Never run by the worker (its turns wait for an external agent); present so the
    name is a valid choice."""

    async def respond(self, ctx: TurnContext) -> str:
        raise HandedOver()
